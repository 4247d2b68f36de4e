"""The restricted master problem over a :class:`~mccl_opt.backends.Backend` (paper §4.2).

:class:`ColumnPool` stores path columns (pair + link list, CSR); :class:`RestrictedMaster`
keeps the pool and the live LP (built by :func:`formulations.master.build_master_lp`) in
step: adding, dropping and bounding columns, solving, and reading ``t``, the path shares
and the duals.  Model and dual conventions: see :mod:`formulations.master`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from formulations.master import build_master_lp, path_columns

from ..backends import Backend, SolveStatus
from ..backends.base import Basis
from ..errors import SolveError

__all__ = ["ColumnPool", "MasterSolution", "RestrictedMaster", "BASIS_TRY_ITERATIONS"]

#: Pivots a solve started from a carried-over basis may take before the master is
#: rebuilt and solved from scratch (a reusable basis needs none; see :mod:`.warm`).
BASIS_TRY_ITERATIONS = 50


class ColumnPool:
    """Path columns: column ``j`` routes pair ``pair[j]`` over links
    ``arcs[start[j]:start[j+1]]`` (in path order).  Duplicates (same pair and links,
    detected by a 64-bit hash of the column) are refused.  ``origin[j]`` is the column's
    index in the warm start it was carried over from (-1: new), so chunks that did not
    change can be reused."""

    def __init__(self) -> None:
        self.pair = np.zeros(0, dtype=np.int64)
        self.start = np.zeros(1, dtype=np.int64)
        self.arcs = np.zeros(0, dtype=np.int64)
        self.hash = np.zeros(0, dtype=np.uint64)
        self.origin = np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return int(self.pair.size)

    @staticmethod
    def _hash(pair: np.ndarray, start: np.ndarray, arcs: np.ndarray) -> np.ndarray:
        """Polynomial hash of (pair, arcs) per column, wrapping modulo 2^64."""
        lengths = np.diff(start)
        seg = np.repeat(np.arange(pair.size), lengths)
        pos = np.arange(arcs.size) - start[:-1][seg]
        with np.errstate(over="ignore"):
            mult = np.uint64(0x9E3779B97F4A7C15) ** (pos.astype(np.uint64) + np.uint64(1))
            terms = (arcs.astype(np.uint64) + np.uint64(1)) * mult
            h = np.zeros(pair.size, dtype=np.uint64)
            np.add.at(h, seg, terms)
            return h ^ (pair.astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F))

    def append(self, pair: np.ndarray, start: np.ndarray, arcs: np.ndarray,
               origin: np.ndarray | None = None) -> np.ndarray:
        """Add the new (non-duplicate) columns; returns the positions taken from the input."""
        pair = np.asarray(pair, dtype=np.int64)
        start = np.asarray(start, dtype=np.int64)
        arcs = np.asarray(arcs, dtype=np.int64)
        h = self._hash(pair, start, arcs)
        _, first = np.unique(h, return_index=True)
        fresh = np.zeros(pair.size, dtype=bool)
        fresh[first] = True
        if self.hash.size:
            known = np.sort(self.hash)
            pos = np.minimum(np.searchsorted(known, h), known.size - 1)
            fresh &= known[pos] != h
        idx = np.flatnonzero(fresh)
        if idx.size:
            lengths = np.diff(start)
            seg = np.repeat(np.arange(pair.size), lengths)
            self.pair = np.concatenate([self.pair, pair[idx]])
            self.start = np.concatenate([self.start, self.start[-1] + np.cumsum(lengths[idx])])
            self.arcs = np.concatenate([self.arcs, arcs[fresh[seg]]])
            self.hash = np.concatenate([self.hash, h[idx]])
            new_origin = np.full(idx.size, -1, dtype=np.int64) if origin is None else \
                np.asarray(origin, dtype=np.int64)[idx]
            self.origin = np.concatenate([self.origin, new_origin])
        return idx

    def keep(self, mask: np.ndarray) -> None:
        """Keep only the columns where ``mask`` is true (order preserved)."""
        mask = np.asarray(mask, dtype=bool)
        lengths = np.diff(self.start)
        seg = np.repeat(np.arange(self.pair.size), lengths)
        self.arcs = self.arcs[mask[seg]]
        self.pair = self.pair[mask]
        self.hash = self.hash[mask]
        self.origin = self.origin[mask]
        self.start = np.concatenate([[0], np.cumsum(lengths[mask])]).astype(np.int64)

    def path(self, j: int) -> np.ndarray:
        return self.arcs[self.start[j]:self.start[j + 1]]

    def loads(self, weights: np.ndarray, n_links: int) -> np.ndarray:
        """Per-link sum of ``weights[j]`` over the columns crossing it."""
        seg = np.repeat(np.arange(self.pair.size), np.diff(self.start))
        return np.bincount(self.arcs, weights=np.asarray(weights)[seg], minlength=n_links)

    def steps(self, is_step_arc: np.ndarray) -> np.ndarray:
        """Steps (arcs into a GPU) of every column."""
        seg = np.repeat(np.arange(self.pair.size), np.diff(self.start))
        return np.bincount(seg, weights=is_step_arc[self.arcs].astype(float),
                           minlength=self.pair.size).astype(np.int64)


@dataclass
class MasterSolution:
    """One master solve: ``t = 1/z``, path shares ``y`` (pool order), pair duals
    ``sigma >= 0`` and arc prices ``w = -capacity duals >= 0``."""

    status: SolveStatus
    t: float
    y: np.ndarray
    sigma: np.ndarray
    w: np.ndarray
    iterations: int
    seconds: float

    @property
    def rate(self) -> float:
        return 1.0 / self.t if self.t > 0 else float("inf")


class RestrictedMaster:
    """The live restricted master: a :class:`ColumnPool` mirrored in a backend model."""

    def __init__(self, backend: Backend, n_pairs: int, capacity: np.ndarray,
                 pool: ColumnPool, pairs: np.ndarray | None = None,
                 background: np.ndarray | None = None) -> None:
        """``pairs`` (bool per pair, default all): the pairs with a row (the pool holds
        columns of those pairs only); ``background``: a fixed load per link (the other
        pairs' routes, see :func:`formulations.master.build_master_lp`)."""
        self.backend = backend
        self.n_pairs = n_pairs
        self.capacity = np.asarray(capacity, dtype=float)
        self._set_pairs(pairs)
        self.background = background
        self.pool = pool
        self.lower = np.zeros(len(pool))
        self.basis_used = False
        self._basis_try = False
        self._kept: Basis | None = None     # a given basis the model still sits on
        self.presolve_each_solve = False
        self._dirty = False
        # the backend model is built on the first solve that needs it (a master with one
        # column per pair row is solved in closed form, :meth:`_single_column_solution`)
        self._stale = True
        self._closed_form: Basis | None = None  # the basis of a closed-form solve

    def _set_pairs(self, pairs: np.ndarray | None) -> None:
        rows = np.arange(self.n_pairs) if pairs is None else np.flatnonzero(pairs)
        self.pair_rows = rows                           # global pair of each pair row
        self._row = np.full(self.n_pairs, -1, dtype=np.int64)
        self._row[rows] = np.arange(rows.size)
        self.n_rows = int(rows.size)

    def presolve_every_time(self) -> None:
        """Rebuild the model before each solve that follows added columns, so every
        solve is a cold, presolved one.  For a master carried over from another
        topology without a usable basis: there, the warm primal simplex after adding
        columns pivots on the whole unpresolved model (0.1 s a pivot at 512 GPUs)."""
        self.presolve_each_solve = True

    def start_from(self, basis: Basis) -> None:
        """Start the next solve from ``basis`` (an optimal basis of a previous master over
        the same columns).  That solve gets :data:`BASIS_TRY_ITERATIONS` pivots; if it
        needs more, the model is rebuilt and solved from scratch (with presolve)."""
        if self._stale:
            self._rebuild()
        self.backend.set_basis(basis)
        self._basis_try = True
        self._kept = basis

    def get_basis(self) -> Basis | None:
        """The current basis (``None`` if the backend holds none); the basis given to
        :meth:`start_from` itself while the model has not moved from it."""
        if self._stale:
            return self._closed_form
        return self._kept if self._kept is not None else self.backend.get_basis()

    @property
    def num_columns(self) -> int:
        return len(self.pool)

    def add(self, pair: np.ndarray, start: np.ndarray, arcs: np.ndarray,
            origin: np.ndarray | None = None) -> int:
        """Add new path columns (duplicates skipped); returns how many were added."""
        before = len(self.pool)
        taken = self.pool.append(pair, start, arcs, origin)
        k = taken.size
        if k:
            self._kept = self._closed_form = None
            self._dirty = True
            self.lower = np.concatenate([self.lower, np.zeros(k)])
            if self._stale:
                return k                    # the rebuild brings them in
            sub_start = self.pool.start[before:] - self.pool.start[before]
            starts, indices, values = path_columns(self.n_rows, self._row[self.pool.pair[before:]],
                                                   sub_start,
                                                   self.pool.arcs[self.pool.start[before]:])
            self.backend.add_columns(np.zeros(k), np.zeros(k), np.full(k, np.inf),
                                     starts, indices, values)
        return k

    def drop(self, mask: np.ndarray) -> int:
        """Remove the pool columns where ``mask`` is true (their lower bounds must be 0)."""
        cols = np.flatnonzero(mask)
        if cols.size:
            self._kept = self._closed_form = None
            if not self._stale:
                self.backend.delete_columns(cols + 1)
            self.pool.keep(~np.asarray(mask))
            self.lower = self.lower[~np.asarray(mask)]
        return int(cols.size)

    def set_lower(self, cols: np.ndarray, lower: np.ndarray) -> None:
        """Fix lower bounds on path shares (chunks fixed by the deep dive)."""
        cols = np.asarray(cols, dtype=np.int64)
        lower = np.asarray(lower, dtype=float)
        self._kept = self._closed_form = None
        if not self._stale:
            self.backend.set_column_bounds(cols + 1, lower, np.full(cols.size, np.inf))
        self.lower[cols] = lower

    def set_rows(self, pairs: np.ndarray | None, background: np.ndarray | None) -> None:
        """New pair rows and link background loads (as in the constructor; the pool must
        hold columns of those pairs only).  The model is rebuilt before the next solve."""
        self._set_pairs(pairs)
        self.background = background
        self._kept = self._closed_form = None
        self._stale = True

    def _rebuild(self) -> None:
        """Reload the model from the pool (the next solve is cold, with presolve)."""
        self._stale = False
        self.backend.load(build_master_lp(self.n_rows, self.capacity, self._row[self.pool.pair],
                                          self.pool.start, self.pool.arcs, self.lower,
                                          self.background))

    def _single_column_solution(self) -> MasterSolution | None:
        """The optimum in closed form when every pair row has exactly one column (a cold
        master over the initial columns), else ``None``.

        Then ``y_j = 1`` (each pair row is ``y_j >= 1`` and ``t`` only grows with ``y``)
        and ``t = max_a (load_a + background_a) / cap_a``.  A dual optimum: ``w`` =
        ``1/cap_a*`` on one link ``a*`` attaining the maximum, ``sigma_p = w(P_p)``
        (``sum_p sigma_p = load_a*/cap_a* = t``, ``cap·w = 1``).  Its basis -- ``t`` and
        every ``y_j`` basic, the slacks of all links but ``a*`` basic, pair rows and
        ``a*`` nonbasic -- is kept for warm starts."""
        pool = self.pool
        if (not len(pool) or len(pool) != self.n_rows or self.lower.max() > 1.0
                or np.bincount(self._row[pool.pair], minlength=self.n_rows).min() != 1):
            return None
        y = np.ones(len(pool))
        load = pool.loads(y, self.capacity.size)
        if self.background is not None:
            load = load + self.background
        util = load / self.capacity
        star = int(np.argmax(util))
        t = float(util[star])
        if not t > 0:
            return None
        w = np.zeros(self.capacity.size)
        w[star] = 1.0 / self.capacity[star]
        seg = np.repeat(np.arange(len(pool)), np.diff(pool.start))
        sigma = np.zeros(self.n_pairs)
        sigma[pool.pair] = np.bincount(seg, weights=w[pool.arcs], minlength=len(pool))
        row_status = np.full(self.n_rows + self.capacity.size, Basis.BASIC, dtype=np.int8)
        row_status[:self.n_rows] = Basis.LOWER
        row_status[self.n_rows + star] = Basis.UPPER
        self._closed_form = Basis(np.full(len(pool) + 1, Basis.BASIC, dtype=np.int8),
                                  row_status, self.backend.name)
        return MasterSolution(SolveStatus.OPTIMAL, t, y, sigma, w, 0, 0.0)

    def solve(self, where: str, *, method: str = "auto",
              time_limit: float | None = None) -> MasterSolution:
        """Solve the master; ``where`` names the round for error messages.

        Raises :class:`SolveError` on anything but an optimum or a limit with a
        solution (the master is always feasible: ``t`` can grow without bound)."""
        self._closed_form = None
        if self._stale and not self._basis_try:
            closed = self._single_column_solution()
            if closed is not None:
                return closed
        if self._stale or (self.presolve_each_solve and self._dirty):
            self._rebuild()
        self._dirty = False
        if self._basis_try:
            self._basis_try = False
            sol = self.backend.solve(method=method, time_limit=time_limit,
                                     iteration_limit=BASIS_TRY_ITERATIONS)
            self.basis_used = sol.status is SolveStatus.OPTIMAL
            if not self.basis_used:
                self._rebuild()
                sol = self.backend.solve(method=method, time_limit=time_limit)
        else:
            sol = self.backend.solve(method=method, time_limit=time_limit)
        if sol.iterations or not self.basis_used:
            self._kept = None
        ok = sol.status is SolveStatus.OPTIMAL or (sol.status.is_limit and sol.x is not None
                                                   and sol.row_duals is not None)
        if not ok or sol.x is None or sol.row_duals is None:
            raise SolveError(
                f"{where}: the restricted master ended with status {sol.status.value!r} on "
                f"{self.num_columns} columns; the master is always feasible, so this is "
                f"numerical trouble: retry with another backend or method")
        duals = sol.row_duals
        sigma = np.maximum(duals[:self.n_rows], 0.0)
        if self.n_rows != self.n_pairs:
            sigma = np.zeros(self.n_pairs)
            sigma[self.pair_rows] = np.maximum(duals[:self.n_rows], 0.0)
        return MasterSolution(sol.status, float(sol.x[0]), np.maximum(sol.x[1:], 0.0), sigma,
                              np.maximum(-duals[self.n_rows:], 0.0),
                              sol.iterations, sol.seconds)
