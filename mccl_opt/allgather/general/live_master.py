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

**Lazy link rows.**  The master may hold only some links' capacity rows
(:meth:`TreeMaster.__init__` ``rows``); a missing link's price is 0 and
:meth:`TreeMaster.add_rows` adds rows later (the caller adds the rows a solution
violates, :func:`.tree_colgen.tree_column_generation`).  While rows are missing each
tree's weight is capped (``weight_cap``) so that the relaxed master stays bounded; the
caps go once every row is in.  A solution that meets every link's capacity, rows
present or not, is a solution of the full master, and an optimal one when the relaxed
master's optimum meets them (it is a relaxation of the full master capped at a weight
no optimum needs, see the docs "Lazy link rows").
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
        width = int(arcs.max(initial=0)) + 1     # one int64 key sort (a lexsort took 2-4x)
        return self.append_flat(owner, start, arcs, np.sort(seg * width + arcs) - seg * width)

    def append_flat(self, owner: np.ndarray, start: np.ndarray, arcs: np.ndarray,
                    multiset: np.ndarray) -> np.ndarray:
        """:meth:`append` of columns in CSR form (``owner``, ``start``, ``arcs``) whose
        links, sorted within each column, are ``multiset``."""
        return self._add(owner, start, arcs, column_hash(owner, start, multiset))

    @classmethod
    def of_distinct(cls, owner: np.ndarray, start: np.ndarray, arcs: np.ndarray,
                    hashes: np.ndarray) -> "TreePool":
        """A pool of columns known to be pairwise distinct, identified by ``hashes`` (the
        symmetric expansion's multiset hashes, :mod:`.expansion`: such a pool is read,
        never appended to)."""
        pool = cls()
        pool.owner, pool.start, pool.arcs, pool.hash = owner, start, arcs, hashes
        return pool


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
                 pool: TreePool, rows: np.ndarray | None = None,
                 weight_cap: float = np.inf) -> None:
        """``rows``: the links whose capacity rows the master starts with (all when
        ``None``); ``weight_cap``: each tree's weight bound while rows are missing."""
        self.backend = backend
        self.n_roots = n_roots
        self.capacity = np.asarray(capacity, dtype=float)
        self.pool = pool
        n_links = self.capacity.size
        self.rows = np.arange(n_links) if rows is None else np.unique(np.asarray(rows, np.int64))
        self._slot = np.full(n_links, -1, dtype=np.int64)     # link -> its row among links
        self._slot[self.rows] = np.arange(self.rows.size)
        self.weight_cap = np.inf if self.rows.size == n_links else float(weight_cap)
        start, arcs = self._present(pool.start, pool.arcs)
        lp = build_tree_master_lp(n_roots, self.capacity[self.rows], pool.root, start, arcs)
        lp.col_hi[1:] = self.weight_cap
        backend.load(lp)

    @property
    def num_columns(self) -> int:
        return len(self.pool)

    @property
    def missing(self) -> np.ndarray:
        """The links whose capacity rows the master does not hold."""
        return np.flatnonzero(self._slot < 0)

    def _present(self, start: np.ndarray, arcs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Columns ``(start, arcs)`` restricted to the links with a row, as row slots."""
        slot = self._slot[arcs]
        keep = slot >= 0
        if keep.all():
            return start, slot
        seg = np.repeat(np.arange(start.size - 1), np.diff(start))
        kept = np.zeros(start.size, dtype=np.int64)
        np.cumsum(np.bincount(seg[keep], minlength=start.size - 1), out=kept[1:])
        return kept, slot[keep]

    def add(self, roots: list[int], trees: list[np.ndarray]) -> int:
        """Add new tree columns (duplicates skipped); returns how many were added."""
        before = len(self.pool)
        taken = self.pool.append(roots, trees)
        k = int(taken.size)
        if k:
            base = self.pool.start[before]
            start, arcs = self._present(self.pool.start[before:] - base, self.pool.arcs[base:])
            starts, indices, values = tree_columns(self.n_roots, self.pool.root[before:],
                                                   start, arcs)
            self.backend.add_columns(np.zeros(k), np.zeros(k), np.full(k, self.weight_cap),
                                     starts, indices, values)
        return k

    def violated(self, w: np.ndarray, rel_tol: float = 1e-9) -> np.ndarray:
        """The missing links whose load under tree weights ``w`` reaches their capacity
        within ``rel_tol`` (tight ones too: a row the solution holds at its capacity
        has a price the master's duals should see)."""
        missing = self.missing
        if not missing.size:
            return missing
        load = self.pool.loads(w, self.capacity.size)[missing]
        return missing[load >= self.capacity[missing] * (1.0 - rel_tol)]

    def add_rows(self, links: np.ndarray) -> None:
        """Add the capacity rows of ``links`` (missing ones); the weight caps go once
        every row is in."""
        links = np.unique(np.asarray(links, np.int64))
        links = links[self._slot[links] < 0]
        if not links.size:
            return
        self._slot[links] = self.rows.size + np.arange(links.size)
        self.rows = np.concatenate([self.rows, links])
        col = self.pool.column_of_arc()
        on = np.flatnonzero(self._slot[self.pool.arcs] >= self.rows.size - links.size)
        row = self._slot[self.pool.arcs[on]] - (self.rows.size - links.size)
        keys, counts = np.unique(row * (len(self.pool) + 1) + col[on] + 1, return_counts=True)
        row_of, col_of = np.divmod(keys, len(self.pool) + 1)  # col_of: backend column (x is 0)
        starts = np.zeros(links.size + 1, dtype=np.int64)
        np.cumsum(np.bincount(row_of, minlength=links.size), out=starts[1:])
        self.backend.add_rows(np.full(links.size, -np.inf), self.capacity[links], starts,
                              col_of, counts.astype(float))
        if self.rows.size == self.capacity.size and np.isfinite(self.weight_cap):
            self.weight_cap = np.inf
            n = len(self.pool)
            self.backend.set_column_bounds(np.arange(1, n + 1), np.zeros(n), np.full(n, np.inf))

    def drop(self, mask: np.ndarray) -> int:
        """Remove the pool columns where ``mask`` is true."""
        cols = np.flatnonzero(mask)
        if cols.size:
            self.backend.delete_columns(cols + 1)
            self.pool.keep(~np.asarray(mask, dtype=bool))
        return int(cols.size)

    def solve(self, where: str, method: str = "auto",
              time_limit: float | None = None) -> MasterPoint | None:
        """Solve the master within ``time_limit`` seconds (``None``: none); ``None`` when
        the limit stopped the LP solver first.  Raises :class:`SolveError` naming
        ``where`` on anything else but an optimum (the master is always feasible,
        ``x = 0``, and bounded by the capacities)."""
        sol = self.backend.solve(method=method, time_limit=time_limit)
        if sol.status is SolveStatus.TIME_LIMIT:
            return None
        if sol.status is not SolveStatus.OPTIMAL or sol.x is None or sol.row_duals is None:
            raise SolveError(
                f"{where}: the AllGather tree master ended with status {sol.status.value!r} on "
                f"{self.num_columns} columns; it is always feasible and bounded, so this is "
                f"numerical trouble: retry with another backend")
        duals, w = sol.row_duals, np.asarray(sol.x[1:], dtype=float)
        pi = np.zeros(self.capacity.size)
        pi[self.rows] = np.maximum(duals[self.n_roots:], 0.0)
        return MasterPoint(float(sol.x[0]), np.maximum(w, 0.0),
                           np.maximum(duals[:self.n_roots], 0.0), pi, sol.iterations, w < 0)
