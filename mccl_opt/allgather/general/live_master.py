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

from mccl_opt.backends import Backend, SolveStatus
from mccl_opt.errors import SolveError
from mccl_opt.ragged import RaggedColumns, column_hash

__all__ = ["TreePool", "TreeMaster", "MasterPoint"]


class TreePool(RaggedColumns):
    """Tree columns (module docstring); a tree's hash is that of its sorted links (its
    link multiset), its links are kept in edge order."""

    @property
    def root(self) -> np.ndarray:
        return self.owner

    def append(self, roots: list[int], trees: list[np.ndarray]) -> np.ndarray:
        """Add the new (non-duplicate) trees; returns the positions taken from the input."""
        owner = np.asarray(roots, dtype=np.int64).reshape(-1)
        parts = [np.asarray(t, dtype=np.int64).reshape(-1) for t in trees]
        start = np.zeros(owner.size + 1, dtype=np.int64)
        np.cumsum([p.size for p in parts], out=start[1:])
        arcs = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        seg = np.repeat(np.arange(owner.size), np.diff(start))
        multiset = arcs[np.lexsort((arcs, seg))]
        return self._add(owner, start, arcs, column_hash(owner, start, multiset))


@dataclass
class MasterPoint:
    """One master solve: rate ``x`` (scaled units), tree weights ``w`` (pool order),
    root duals ``sigma`` and link prices ``pi``; ``below``: the trees whose weight the LP
    solver returned below zero (within its feasibility tolerance), clipped to zero in
    ``w``.  Clipping raises every link row by that weight times the tree's crossings of
    the link, so such a point's trees may reach less than ``x``
    (:func:`.tree_colgen.tree_column_generation` re-solves without them)."""

    x: float
    w: np.ndarray
    sigma: np.ndarray
    pi: np.ndarray
    iterations: int
    below: np.ndarray


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
        duals, w = sol.row_duals, np.asarray(sol.x[1:], dtype=float)
        return MasterPoint(float(sol.x[0]), np.maximum(w, 0.0),
                           np.maximum(duals[:self.n_roots], 0.0),
                           np.maximum(duals[self.n_roots:], 0.0), sol.iterations, w < 0)
