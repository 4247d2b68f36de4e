"""The small interface every LP/MIP backend adapter implements.

One adapter per solver (HiGHS, Gurobi, SCIP) behind :class:`Backend`, chosen by
name through :func:`mccl_opt.backends.get_backend`.  The interface is exactly what
column generation and the small MIPs of later phases need:

* bulk build from a :class:`formulations.LinearProgram` (CSR/CSC arrays);
* adding columns and rows to the live model and re-solving warm from the basis;
* changing coefficients and row bounds in place (a capacity change keeps the model);
* reading and restoring a simplex basis (:class:`Basis`, one status coding for all);
* simplex or interior point;
* **one dual sign convention**: ``row_duals[i]`` is the shadow price
  d(objective)/d(rhs of row i), for max and min problems alike (so in a max problem a
  binding ``<=`` row has a dual >= 0, a binding ``>=`` row a dual <= 0);
* ``reduced_costs = c - A^T row_duals`` (same convention);
* time/iteration limits, threads, silence;
* a :class:`SolveStatus` mapped from each solver's own codes.

Optional solvers are imported lazily inside their adapters, never at module import.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from formulations.lp import LinearProgram

from ..errors import InputError

from ._common import SparseBlock, as_block, as_bounds
from .solution import Basis, LPMethod, LPSolution, SolveStatus

__all__ = ["Backend", "Basis", "LPSolution", "SolveStatus", "LPMethod"]


class Backend(ABC):
    """A live LP/MIP model in one solver.

    Lifecycle: ``b = get_backend("highs"); b.load(lp); sol = b.solve(); b.add_columns(...);
    sol = b.solve()`` (warm from the previous basis where the solver allows).
    Options: ``threads``, ``silent``, ``presolve`` (``False`` skips the solver's presolve:
    cheaper for the small, repeatedly re-solved LPs of warm starts), ``feasibility_tol``
    (the absolute primal feasibility tolerance of rows and bounds; ``None``: the solver's
    default, 1e-7 in HiGHS, 1e-6 in Gurobi and SCIP).
    """

    name: ClassVar[str]
    pip_package: ClassVar[str]
    module_name: ClassVar[str]

    def __init__(self, *, threads: int = 1, silent: bool = True, presolve: bool = True,
                 feasibility_tol: float | None = None) -> None:
        _check_tolerance(feasibility_tol)
        self.threads = threads
        self.silent = silent
        self.presolve = presolve
        self.feasibility_tol = feasibility_tol
        #: what changed since the last solve (``None``, ``"cols"``, ``"rows"``, ``"bounds"``
        #: or ``"mixed"``): picks the warm simplex variant (:func:`._common.warm_method`)
        self._last_change: str | None = None

    def _changed(self, kind: str) -> None:
        """Record a change of ``kind`` (``"cols"``, ``"rows"``, ``"bounds"``, ``"mixed"``):
        columns keep primal feasibility, rows and bounds dual feasibility; any mix keeps
        neither."""
        last = self._last_change
        keeps = {"cols": (None, "cols"), "rows": (None, "rows", "bounds"),
                 "bounds": (None, "rows", "bounds")}.get(kind, ())
        self._last_change = kind if last in keeps else "mixed"

    def set_feasibility_tol(self, tol: float) -> None:
        """Change the absolute primal feasibility tolerance for the next solves (the
        solver's smallest accepted value where ``tol`` is below it)."""
        _check_tolerance(tol)
        self.feasibility_tol = tol
        self._apply_feasibility_tol(tol)

    @abstractmethod
    def _apply_feasibility_tol(self, tol: float) -> None:
        """Set the solver's primal feasibility tolerance to the checked ``tol``."""

    @classmethod
    def is_available(cls) -> bool:
        """Whether the solver's Python package is importable (no import, no licence check)."""
        import importlib.util

        return importlib.util.find_spec(cls.module_name) is not None

    @abstractmethod
    def load(self, lp: LinearProgram) -> None:
        """Replace the model with ``lp`` (bulk build from its sparse arrays)."""

    def add_columns(self, cost: np.ndarray, lb: np.ndarray, ub: np.ndarray,
                    starts: np.ndarray, indices: np.ndarray, values: np.ndarray) -> None:
        """Append ``len(cost)`` columns given in CSC form: column ``j`` has row indices
        ``indices[starts[j]:starts[j+1]]`` (``starts`` has ``len(cost)+1`` entries)."""
        cost = np.asarray(cost, dtype=float).reshape(-1)
        k = cost.shape[0]
        lo, hi = as_bounds(k, lb, ub, "add_columns")
        block = as_block(k, starts, indices, values, self.num_rows, "add_columns")
        if k:
            self._append_columns(cost, lo, hi, block)
            self._changed("cols")

    def add_rows(self, lo: np.ndarray, hi: np.ndarray,
                 starts: np.ndarray, indices: np.ndarray, values: np.ndarray) -> None:
        """Append ``len(lo)`` rows given in CSR form over the existing columns."""
        lo = np.asarray(lo, dtype=float).reshape(-1)
        k = lo.shape[0]
        lo, hi = as_bounds(k, lo, hi, "add_rows")
        block = as_block(k, starts, indices, values, self.num_cols, "add_rows")
        if k:
            self._append_rows(lo, hi, block)
            self._changed("rows")

    @abstractmethod
    def _append_columns(self, cost: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                        block: SparseBlock) -> None:
        """Add checked, non-empty columns (``block``: CSC over the existing rows)."""

    @abstractmethod
    def _append_rows(self, lo: np.ndarray, hi: np.ndarray, block: SparseBlock) -> None:
        """Add checked, non-empty rows (``block``: CSR over the existing columns)."""

    @abstractmethod
    def set_column_bounds(self, cols: np.ndarray, lb: np.ndarray, ub: np.ndarray) -> None:
        """Change the bounds of existing columns."""

    @abstractmethod
    def delete_columns(self, cols: np.ndarray) -> None:
        """Remove columns; the remaining columns keep their relative order."""

    @abstractmethod
    def change_coefficients(self, rows: np.ndarray, cols: np.ndarray, values: np.ndarray) -> None:
        """Set ``A[rows[k], cols[k]] = values[k]`` in place (a zero removes the entry);
        the basis is kept, so the next solve starts from it."""

    @abstractmethod
    def set_row_bounds(self, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        """Change the bounds ``lo <= a_i x <= hi`` of existing rows in place."""

    @abstractmethod
    def get_basis(self) -> Basis | None:
        """The current simplex basis (``None`` when the solver holds none)."""

    @abstractmethod
    def set_basis(self, basis: Basis) -> None:
        """Start the next solve from ``basis`` (same shape as the model); raises
        :class:`~formulations.errors.FormulationError` on a shape or backend mismatch."""

    @property
    @abstractmethod
    def num_cols(self) -> int: ...

    @property
    @abstractmethod
    def num_rows(self) -> int: ...

    @abstractmethod
    def solve(self, *, method: LPMethod = "auto", time_limit: float | None = None,
              iteration_limit: int | None = None) -> LPSolution:
        """Solve the LP relaxation (integrality ignored), warm from the last basis."""

    @abstractmethod
    def solve_mip(self, *, time_limit: float | None = None, mip_gap: float = 1e-4) -> LPSolution:
        """Solve with integrality; ``mip_bound``/``mip_gap`` report the proven bound."""

    def close(self) -> None:
        """Release solver resources (environment, licence token)."""

    def __enter__(self) -> "Backend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_tolerance(tol: float | None) -> None:
    """A feasibility tolerance is ``None`` or in (0, 1)."""
    if tol is not None and not 0 < tol < 1:
        raise InputError(f"feasibility_tol must be in (0, 1) or None, got {tol!r}")
