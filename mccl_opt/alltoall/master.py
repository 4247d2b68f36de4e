"""The restricted master problem over a :class:`~mccl_opt.backends.Backend` (paper §4.2).

:class:`~.pool.ColumnPool` stores path columns (pair + link list, CSR); :class:`RestrictedMaster`
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
from .pool import ColumnPool

__all__ = ["ColumnPool", "MasterSolution", "RestrictedMaster", "MasterTimeUp", "BASIS_TRY_ITERATIONS"]


class MasterTimeUp(SolveError):
    """The time limit stopped a master solve before it had a solution (the backend
    reports none at a limit until it has a feasible basis): the round is over, the
    previous round's solution stands (:func:`~.colgen.column_generation`)."""

#: Pivots a solve started from a carried-over basis may take before the master is
#: rebuilt and solved from scratch (a reusable basis needs none; see :mod:`.warm`).
BASIS_TRY_ITERATIONS = 50


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


#: A pair that gets its row restarts the model from the previous optimum's basis (else
#: the rebuilt model is solved cold); a switch for measuring it (docs/alltoall.md, *Scale*).
WARM_RESTART = True


class RestrictedMaster:
    """The live restricted master: a :class:`ColumnPool` mirrored in a backend model.

    With ``fix_single_pairs`` a pair whose only column is its first one has no row in
    the backend model: that column is fixed at ``y = 1`` and loads the links as
    background, and its pair's dual is the column's price ``w(P)`` (its reduced cost
    is 0: the column is basic).  Adding a column for such a pair gives it its row (the
    model is rebuilt before the next solve).  The restricted master is the same LP --
    a pair with one column must route all of it there -- but the solver sees only the
    pairs that have a choice; with no such pair the optimum is the closed form of
    :meth:`_closed_form_solution`.  Solutions, duals and bases are always reported over
    the whole pool and every pair (docs/alltoall.md, *Scale*).
    """

    def __init__(self, backend: Backend, n_pairs: int, capacity: np.ndarray,
                 pool: ColumnPool, pairs: np.ndarray | None = None,
                 background: np.ndarray | None = None, *, fix_single_pairs: bool = False) -> None:
        """``pairs`` (bool per pair, default all): the pairs with a row (the pool holds
        columns of those pairs only); ``background``: a fixed load per link (the other
        pairs' routes, see :func:`formulations.master.build_master_lp`);
        ``fix_single_pairs``: see the class docstring (with ``pairs`` None only)."""
        self.backend = backend
        self.n_pairs = n_pairs
        self.capacity = np.asarray(capacity, dtype=float)
        self.pool = pool
        self._fix = fix_single_pairs and pairs is None
        if self._fix:
            pairs = np.bincount(pool.pair, minlength=n_pairs) != 1
        self._set_pairs(pairs)
        self.background = background
        self.lower = np.zeros(len(pool))
        self.basis_used = False
        self._basis_try = False
        self._kept: Basis | None = None     # a given basis the model still sits on
        self.presolve_each_solve = False
        self._rebuilt_method = "auto"
        self._batch_rows = 0.0
        self._dirty = 0                     # columns added since the last solve
        self._stale = True                  # the backend model is built when a solve needs it
        self._closed_form: Basis | None = None  # the model basis of a closed-form solve
        self._restart: Basis | None = None      # a full basis the next rebuild starts from

    def _set_pairs(self, pairs: np.ndarray | None) -> None:
        rows = np.arange(self.n_pairs) if pairs is None else np.flatnonzero(pairs)
        self.pair_rows = rows                           # global pair of each pair row
        self._row = np.full(self.n_pairs, -1, dtype=np.int64)
        self._row[rows] = np.arange(rows.size)
        self.n_rows = int(rows.size)
        self._stale = True

    def _in_model(self) -> np.ndarray:
        """Pool columns that are backend model columns (their pair has a row)."""
        return self._row[self.pool.pair] >= 0

    def _model_cols(self, cols: np.ndarray) -> np.ndarray:
        """Backend column index (``t`` is column 0) of pool columns ``cols`` in the model."""
        return np.cumsum(self._in_model())[cols]

    def _activate(self, pairs: np.ndarray) -> None:
        """Give ``pairs`` (indices) their rows; the model is rebuilt before the next solve."""
        mask = self._row >= 0
        mask[pairs] = True
        self._set_pairs(mask)
        self._kept = self._closed_form = None

    def presolve_every_time(self, method: str = "auto", batch_rows: float = 0.0) -> None:
        """Rebuild the model before each solve that follows added columns, so every
        solve is a cold, presolved one (with ``method`` where the caller asks for
        ``"auto"``).  For a master carried over from another topology without a usable
        basis: there, the warm primal simplex after adding columns pivots on the whole
        unpresolved model (0.1 s a pivot at 512 GPUs).

        ``batch_rows > 0``: only after a batch of at least ``batch_rows`` x pair rows new
        columns; smaller batches re-solve warm from the last basis.  For the local
        master (:mod:`.local`): its warm primal re-solve after one new column per free
        pair took twice as long as a cold one at 1024 GPUs, but re-solving cold after a
        few columns lands on another degenerate dual vertex each round, so column
        generation kept pricing new columns at an unchanged ``t`` (docs/alltoall.md,
        *The local try's budget*)."""
        self.presolve_each_solve = True
        self._rebuilt_method = method
        self._batch_rows = batch_rows

    def start_from(self, basis: Basis) -> None:
        """Start the next solve from ``basis`` (an optimal basis of a previous master over
        the same columns, every pair with its row).  That solve gets
        :data:`BASIS_TRY_ITERATIONS` pivots; if it needs more, the model is rebuilt and
        solved from scratch (with presolve)."""
        if self.n_rows < self.n_pairs:
            self._activate(np.arange(self.n_pairs))
        if self._stale:
            self._rebuild()
        self.backend.set_basis(basis)
        self._basis_try = True
        self._kept = basis

    def get_basis(self) -> Basis | None:
        """The current basis over the whole pool and every pair (``None`` if the backend
        holds none); the basis given to :meth:`start_from` itself while the model has
        not moved from it.  A fixed pair's column is basic, its row at its bound."""
        return self._full_basis(len(self.pool))

    def _full_basis(self, n_cols: int) -> Basis | None:
        """:meth:`get_basis` over the first ``n_cols`` pool columns (those the model has)."""
        if self._stale:
            model = self._closed_form
        else:
            model = self._kept if self._kept is not None else self.backend.get_basis()
        if model is None or not self._fix:
            return model
        inside = self._in_model()[:n_cols]
        cols = np.full(n_cols + 1, Basis.BASIC, dtype=np.int8)
        cols[0] = model.col_status[0]
        cols[1:][inside] = model.col_status[1:]
        rows = np.full(self.n_pairs + self.capacity.size, Basis.LOWER, dtype=np.int8)
        rows[self.pair_rows] = model.row_status[:self.n_rows]
        rows[self.n_pairs:] = model.row_status[self.n_rows:]
        return Basis(cols, rows, model.backend)

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
            new_pairs = self.pool.pair[before:]
            if self._fix and (self._row[new_pairs] < 0).any():
                if self._restart is None and WARM_RESTART:
                    self._restart = self._full_basis(before)   # optimal so far: restart there
                self._activate(new_pairs)
            self._kept = self._closed_form = None
            self._dirty += k
            self.lower = np.concatenate([self.lower, np.zeros(k)])
            if self._stale:
                return k                    # the rebuild brings them in
            sub_start = self.pool.start[before:] - self.pool.start[before]
            starts, indices, values = path_columns(self.n_rows, self._row[new_pairs], sub_start,
                                                   self.pool.arcs[self.pool.start[before]:])
            self.backend.add_columns(np.zeros(k), np.zeros(k), np.full(k, np.inf),
                                     starts, indices, values)
        return k

    def drop(self, mask: np.ndarray) -> int:
        """Remove the pool columns where ``mask`` is true (their lower bounds must be 0;
        fixed columns are never removed)."""
        mask = np.asarray(mask, dtype=bool) & self._in_model()
        cols = np.flatnonzero(mask)
        if cols.size:
            self._kept = self._closed_form = self._restart = None
            if not self._stale:
                self.backend.delete_columns(self._model_cols(cols))
            self.pool.keep(~mask)
            self.lower = self.lower[~mask]
        return int(cols.size)

    def set_lower(self, cols: np.ndarray, lower: np.ndarray) -> None:
        """Fix lower bounds on path shares (chunks fixed by the deep dive; a fixed
        column already carries ``y = 1``)."""
        cols = np.asarray(cols, dtype=np.int64)
        lower = np.asarray(lower, dtype=float)
        self._kept = self._closed_form = self._restart = None
        self.lower[cols] = lower
        above = self.pool.pair[cols[lower > 1.0]]
        if self._fix and (self._row[above] < 0).any():
            self._activate(above)
        if not self._stale:
            inside = self._row[self.pool.pair[cols]] >= 0
            self.backend.set_column_bounds(self._model_cols(cols[inside]), lower[inside],
                                           np.full(int(inside.sum()), np.inf))

    def set_rows(self, pairs: np.ndarray | None, background: np.ndarray | None) -> None:
        """New pair rows and link background loads (as in the constructor; the pool must
        hold columns of those pairs only).  The model is rebuilt before the next solve."""
        self._set_pairs(pairs)
        self.background = background
        self._kept = self._closed_form = self._restart = None

    def _model_background(self) -> np.ndarray | None:
        """``background`` plus the fixed columns' loads (``y = 1``)."""
        inside = self._in_model()
        if inside.all():
            return self.background
        fixed = self.pool.loads((~inside).astype(float), self.capacity.size)
        return fixed if self.background is None else fixed + self.background

    def _rebuild(self) -> bool:
        """Reload the model from the pool: cold, with presolve, or -- after pairs got
        their rows -- from the previous optimum's basis (still primal feasible: the
        new rows' fixed columns stay basic at 1, the new columns at 0).  Returns whether
        it starts from that basis."""
        self._stale = False
        inside = self._in_model()
        pair, start, arcs = self.pool.select(inside)
        self.backend.load(build_master_lp(self.n_rows, self.capacity, self._row[pair], start,
                                          arcs, self.lower[inside], self._model_background()))
        full, self._restart = self._restart, None
        if full is None:
            return False
        cols = np.full(len(self.pool) + 1, Basis.LOWER, dtype=np.int8)
        cols[:full.col_status.size] = full.col_status
        rows = np.concatenate([full.row_status[self.pair_rows], full.row_status[self.n_pairs:]])
        self.backend.set_basis(Basis(cols[np.concatenate([[True], inside])], rows, full.backend))
        return True

    def _closed_form_solution(self) -> MasterSolution | None:
        """The optimum when no pair has a row (every column fixed at ``y = 1``), else
        ``None``: ``t = max_a (load_a + background_a) / cap_a``.  A dual optimum: ``w =
        1/cap_a*`` on one link ``a*`` attaining the maximum, ``sigma_p = w(P_p)``
        (``sum_p sigma_p = load_a*/cap_a* = t``, ``cap·w = 1``); its model basis has
        ``t`` and every link slack but ``a*``'s basic."""
        if self.n_rows or self._basis_try or not len(self.pool):
            return None
        background = self._model_background()
        util = (np.zeros(self.capacity.size) if background is None else background) / self.capacity
        star = int(np.argmax(util))
        t = float(util[star])
        if not t > 0:
            return None
        rows = np.full(self.capacity.size, Basis.BASIC, dtype=np.int8)
        rows[star] = Basis.UPPER
        self._closed_form = Basis(np.array([Basis.BASIC], dtype=np.int8), rows, self.backend.name)
        w = np.zeros(self.capacity.size)
        w[star] = 1.0 / self.capacity[star]
        return MasterSolution(SolveStatus.OPTIMAL, t, np.ones(len(self.pool)), self._fixed_sigma(
            np.zeros(self.n_pairs), w), w, 0, 0.0)

    def _fixed_sigma(self, sigma: np.ndarray, w: np.ndarray) -> np.ndarray:
        """``sigma`` with each fixed pair's dual set to its column's price under ``w``."""
        out = ~self._in_model()
        if out.any():
            sigma[self.pool.pair[out]] = self.pool.costs(w)[out]
        return sigma

    def solve(self, where: str, *, method: str = "auto",
              time_limit: float | None = None) -> MasterSolution:
        """Solve the master; ``where`` names the round for error messages.

        Raises :class:`SolveError` on anything but an optimum or a limit with a
        solution (the master is always feasible: ``t`` can grow without bound)."""
        self._closed_form = None
        closed = self._closed_form_solution() if self._stale else None
        if closed is not None:
            return closed
        if self._stale or (self.presolve_each_solve and self._dirty
                           and self._dirty >= self._batch_rows * self.n_rows):
            if self._rebuild() and method == "auto":
                method = "primal"
            elif method == "auto" and self.presolve_each_solve:
                method = self._rebuilt_method
        self._dirty = 0
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
        if not ok and sol.status.is_limit and time_limit is not None:
            raise MasterTimeUp(f"{where}: the time limit ({time_limit:.3g} s) came before the restricted "
                               f"master had a solution")
        if not ok or sol.x is None or sol.row_duals is None:
            raise SolveError(
                f"{where}: the restricted master ended with status {sol.status.value!r} on "
                f"{self.num_columns} columns; the master is always feasible, so this is "
                f"numerical trouble: retry with another backend or method")
        duals = sol.row_duals
        w = np.maximum(-duals[self.n_rows:], 0.0)
        sigma = np.zeros(self.n_pairs)
        sigma[self.pair_rows] = np.maximum(duals[:self.n_rows], 0.0)
        y = np.ones(len(self.pool))
        y[self._in_model()] = np.maximum(sol.x[1:], 0.0)
        if self._fix:
            sigma = self._fixed_sigma(sigma, w)
        return MasterSolution(sol.status, float(sol.x[0]), y, sigma, w, sol.iterations,
                              sol.seconds)
