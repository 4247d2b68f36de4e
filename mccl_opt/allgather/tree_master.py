"""Tree columns and the live restricted master of the general AllGather method.

:class:`TreePool` stores tree columns: column ``j`` is a spanning arborescence over the
GPUs rooted at rank ``root[j]``; ``arcs[start[j]:start[j+1]]`` are the links of its edge
paths (each edge a switch-only path ending at the first GPU it reaches, so the edge
boundaries are implied), repeats allowed.  Two columns with the same root and the same
link multiset are the same LP column: the second is refused (64-bit hash).

:class:`TreeMaster` mirrors the pool in a backend model built by
:func:`formulations.tree_master.build_tree_master_lp` and reads the rate ``x``, the tree
weights and the duals ``sigma`` (root rows) and ``pi`` (link rows) in the backend
layer's one sign convention (shadow prices; >= 0 here).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from formulations.tree_master import build_tree_master_lp, tree_columns

from ..backends import Backend, SolveStatus
from ..errors import SolveError

__all__ = ["TreePool", "TreeMaster", "MasterPoint"]


class TreePool:
    """Tree columns (module docstring)."""

    def __init__(self) -> None:
        self.root = np.zeros(0, dtype=np.int64)
        self.start = np.zeros(1, dtype=np.int64)
        self.arcs = np.zeros(0, dtype=np.int64)
        self.hash = np.zeros(0, dtype=np.uint64)

    def __len__(self) -> int:
        return int(self.root.size)

    @staticmethod
    def _hash(root: int, arcs: np.ndarray) -> np.uint64:
        with np.errstate(over="ignore"):
            a = np.sort(arcs).astype(np.uint64) + np.uint64(1)
            mult = np.uint64(0x9E3779B97F4A7C15) ** (np.arange(a.size, dtype=np.uint64)
                                                      + np.uint64(1))
            return np.uint64(np.sum(a * mult, dtype=np.uint64)) ^ (
                np.uint64(root + 1) * np.uint64(0xC2B2AE3D27D4EB4F))

    def append(self, roots: list[int], trees: list[np.ndarray]) -> np.ndarray:
        """Add the new (non-duplicate) trees; returns the positions taken from the input."""
        taken: list[int] = []
        known = set(self.hash.tolist())
        hashes, parts = [], []
        for i, (r, arcs) in enumerate(zip(roots, trees)):
            h = self._hash(int(r), np.asarray(arcs, dtype=np.int64))
            if int(h) in known:
                continue
            known.add(int(h))
            taken.append(i)
            hashes.append(h)
            parts.append(np.asarray(arcs, dtype=np.int64))
        if taken:
            lengths = np.array([p.size for p in parts], dtype=np.int64)
            self.root = np.concatenate([self.root, np.asarray(roots, np.int64)[taken]])
            self.start = np.concatenate([self.start, self.start[-1] + np.cumsum(lengths)])
            self.arcs = np.concatenate([self.arcs, *parts])
            self.hash = np.concatenate([self.hash, np.array(hashes, dtype=np.uint64)])
        return np.array(taken, dtype=np.int64)

    def keep(self, mask: np.ndarray) -> None:
        """Keep only the columns where ``mask`` is true (order preserved)."""
        mask = np.asarray(mask, dtype=bool)
        lengths = np.diff(self.start)
        seg = np.repeat(np.arange(self.root.size), lengths)
        self.arcs = self.arcs[mask[seg]]
        self.root = self.root[mask]
        self.hash = self.hash[mask]
        self.start = np.concatenate([[0], np.cumsum(lengths[mask])]).astype(np.int64)

    def tree(self, j: int) -> np.ndarray:
        return self.arcs[self.start[j]:self.start[j + 1]]

    def loads(self, weights: np.ndarray, n_links: int) -> np.ndarray:
        """Per-link sum of ``weights[j]`` times the crossings of column ``j``."""
        seg = np.repeat(np.arange(self.root.size), np.diff(self.start))
        return np.bincount(self.arcs, weights=np.asarray(weights, float)[seg],
                           minlength=n_links)


@dataclass
class MasterPoint:
    """One master solve: rate ``x`` (scaled units), tree weights ``w`` (pool order),
    root duals ``sigma`` and link prices ``pi``."""

    x: float
    w: np.ndarray
    sigma: np.ndarray
    pi: np.ndarray
    iterations: int


class TreeMaster:
    """The live restricted master over a :class:`TreePool` (module docstring)."""

    def __init__(self, backend: Backend, n_roots: int, capacity: np.ndarray,
                 pool: TreePool) -> None:
        self.backend = backend
        self.n_roots = n_roots
        self.capacity = np.asarray(capacity, dtype=float)
        self.pool = pool
        backend.load(build_tree_master_lp(n_roots, self.capacity, pool.root, pool.start,
                                          pool.arcs))

    @property
    def num_columns(self) -> int:
        return len(self.pool)

    def add(self, roots: list[int], trees: list[np.ndarray]) -> int:
        """Add new tree columns (duplicates skipped); returns how many were added."""
        before = len(self.pool)
        taken = self.pool.append(roots, trees)
        k = int(taken.size)
        if k:
            base = self.pool.start[before]
            starts, indices, values = tree_columns(
                self.n_roots, self.pool.root[before:], self.pool.start[before:] - base,
                self.pool.arcs[base:])
            self.backend.add_columns(np.zeros(k), np.zeros(k), np.full(k, np.inf),
                                     starts, indices, values)
        return k

    def drop(self, mask: np.ndarray) -> int:
        """Remove the pool columns where ``mask`` is true."""
        cols = np.flatnonzero(mask)
        if cols.size:
            self.backend.delete_columns(cols + 1)
            self.pool.keep(~np.asarray(mask, dtype=bool))
        return int(cols.size)

    def solve(self, where: str, method: str = "auto") -> MasterPoint:
        """Solve the master; raises :class:`SolveError` naming ``where`` on anything but an
        optimum (the master is always feasible, ``x = 0``, and bounded by the capacities)."""
        sol = self.backend.solve(method=method)
        if sol.status is not SolveStatus.OPTIMAL or sol.x is None or sol.row_duals is None:
            raise SolveError(
                f"{where}: the AllGather tree master ended with status {sol.status.value!r} on "
                f"{self.num_columns} columns; it is always feasible and bounded, so this is "
                f"numerical trouble: retry with another backend")
        duals = sol.row_duals
        return MasterPoint(float(sol.x[0]), np.maximum(sol.x[1:], 0.0),
                           np.maximum(duals[:self.n_roots], 0.0),
                           np.maximum(duals[self.n_roots:], 0.0), sol.iterations)
