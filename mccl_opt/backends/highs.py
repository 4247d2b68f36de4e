"""HiGHS adapter (the default backend; ``highspy`` is a core dependency).

Methods: ``"primal"``/``"dual"`` run HiGHS simplex with ``simplex_strategy`` 4/1;
``"ipm"`` runs the interior-point solver with crossover off (HiGHS still returns
interior duals, which column generation can use directly); ``"auto"`` picks primal
simplex after columns were added, dual simplex after rows or bounds changed, and
HiGHS' own choice on a cold model.  HiGHS keeps its basis across ``addCols``/
``addRows``/bound changes, so every re-solve is warm.  HiGHS' ``row_dual`` already is
the shadow price d(obj)/d(rhs) and ``col_dual`` is ``c - A^T y`` for both senses
(checked in ``tests/test_backends.py``).  At a limit, ``x`` (``row_duals``) is reported
only when HiGHS marks that point primal (dual) feasible.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import numpy as np

from formulations.lp import LinearProgram

from ..errors import SolveError
from ._common import (SparseBlock, as_bounds, as_coefficients, as_index_array, check_basis,
                      check_method, warm_method)
from .base import Backend, Basis, LPSolution, SolveStatus

__all__ = ["HighsBackend"]

_INT_MAX = 2**31 - 1

#: HighsModelStatus member name -> SolveStatus (anything else: OTHER).
_STATUS = {
    "kNotset": SolveStatus.NOT_SOLVED,
    "kModelEmpty": SolveStatus.OPTIMAL,
    "kOptimal": SolveStatus.OPTIMAL,
    "kInfeasible": SolveStatus.INFEASIBLE,
    "kUnbounded": SolveStatus.UNBOUNDED,
    "kUnboundedOrInfeasible": SolveStatus.INFEASIBLE_OR_UNBOUNDED,
    "kTimeLimit": SolveStatus.TIME_LIMIT,
    "kIterationLimit": SolveStatus.ITERATION_LIMIT,
    "kSolveError": SolveStatus.NUMERICAL_ERROR,
    "kPresolveError": SolveStatus.NUMERICAL_ERROR,
    "kPostsolveError": SolveStatus.NUMERICAL_ERROR,
}

_SIMPLEX_STRATEGY = {"dual": 1, "primal": 4}

#: HiGHS solution status "feasible" (primal_solution_status / dual_solution_status).
_FEASIBLE = 2


def _new_highs(highspy: Any, silent: bool) -> Any:
    """A HiGHS instance; when silent, the core class, whose constructor prints no banner
    (``highspy.Highs()`` prints one to stdout before any option can be set)."""
    if silent:
        try:
            from highspy._core import _Highs

            return _Highs()
        except ImportError:  # a highspy without the private core module
            pass
    return highspy.Highs()


class HighsBackend(Backend):
    """A live HiGHS model (see module docstring for methods and warm starts)."""

    name: ClassVar[str] = "highs"
    pip_package: ClassVar[str] = "highspy"
    module_name: ClassVar[str] = "highspy"

    def __init__(self, *, threads: int = 1, silent: bool = True, presolve: bool = True,
                 feasibility_tol: float | None = None) -> None:
        super().__init__(threads=threads, silent=silent, presolve=presolve,
                         feasibility_tol=feasibility_tol)
        import highspy

        self._highspy = highspy
        self._h = _new_highs(highspy, silent)
        self._h.setOptionValue("output_flag", not silent)
        # Threads only take effect before the first run().
        self._h.setOptionValue("threads", int(threads))
        self._h.setOptionValue("presolve", self._presolve_option)
        if feasibility_tol is not None:
            self._apply_feasibility_tol(feasibility_tol)
        self._has_int = False

    def _apply_feasibility_tol(self, tol: float) -> None:
        self._h.setOptionValue("primal_feasibility_tolerance", max(tol, 1e-10))  # its least

    @property
    def _presolve_option(self) -> str:
        return "choose" if self.presolve else "off"

    # ------------------------------------------------------------------ building
    def load(self, lp: LinearProgram) -> None:
        A = lp.A.tocsc()
        A.sort_indices()
        sense = (self._highspy.ObjSense.kMaximize if lp.sense == "max"
                 else self._highspy.ObjSense.kMinimize)
        self._h.clearModel()
        status = self._h.passModel(
            lp.num_cols, lp.num_rows, int(A.nnz), 1, int(sense.value), float(lp.objective_offset),
            lp.c, lp.col_lo, lp.col_hi, lp.row_lo, lp.row_hi,
            A.indptr.astype(np.int32), A.indices.astype(np.int32), A.data.astype(float),
            lp.integrality.astype(np.int32))  # length n, even for an LP (HiGHS needs it)
        self._check(status, "passModel")
        self._has_int = bool(lp.integrality.any())
        self._last_change = None

    def _append_columns(self, cost: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                        block: SparseBlock) -> None:
        status = self._h.addCols(cost.shape[0], cost, lo, hi, int(block.indices.shape[0]),
                                 block.starts[:-1], block.indices, block.values)
        self._check(status, "addCols")

    def _append_rows(self, lo: np.ndarray, hi: np.ndarray, block: SparseBlock) -> None:
        status = self._h.addRows(lo.shape[0], lo, hi, int(block.indices.shape[0]),
                                 block.starts[:-1], block.indices, block.values)
        self._check(status, "addRows")

    def set_column_bounds(self, cols: np.ndarray, lb: np.ndarray, ub: np.ndarray) -> None:
        ix = as_index_array(cols, self.num_cols, "set_column_bounds")
        lo, hi = as_bounds(ix.shape[0], lb, ub, "set_column_bounds")
        if ix.size == 0:
            return
        self._check(self._h.changeColsBounds(int(ix.size), ix, lo, hi), "changeColsBounds")
        self._changed("bounds")

    def delete_columns(self, cols: np.ndarray) -> None:
        ix = np.unique(as_index_array(cols, self.num_cols, "delete_columns"))
        if ix.size == 0:
            return
        self._check(self._h.deleteCols(int(ix.size), ix), "deleteCols")
        self._changed("mixed")

    def change_coefficients(self, rows: np.ndarray, cols: np.ndarray, values: np.ndarray) -> None:
        r, c, v = as_coefficients(rows, cols, values, self.num_rows, self.num_cols)
        for i, j, a in zip(r.tolist(), c.tolist(), v.tolist()):
            self._check(self._h.changeCoeff(i, j, a), "changeCoeff")
        if r.size:
            self._changed("mixed")

    def set_row_bounds(self, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        ix = as_index_array(rows, self.num_rows, "set_row_bounds")
        lo_a, hi_a = as_bounds(ix.shape[0], lo, hi, "set_row_bounds")
        if ix.size == 0:
            return
        self._check(self._h.changeRowsBounds(int(ix.size), ix, lo_a, hi_a), "changeRowsBounds")
        self._changed("bounds")

    def get_basis(self) -> Basis | None:
        b = self._h.getBasis()
        if not b.valid:
            return None
        return Basis(np.array([s.value for s in b.col_status], dtype=np.int8),
                     np.array([s.value for s in b.row_status], dtype=np.int8), self.name)

    def set_basis(self, basis: Basis) -> None:
        check_basis(basis, self.name, self.num_cols, self.num_rows)
        hb = self._highspy.HighsBasis()
        st = self._highspy.HighsBasisStatus
        codes = np.array([st.kLower, st.kBasic, st.kUpper, st.kZero], dtype=object)
        hb.col_status = codes[basis.col_status].tolist()
        hb.row_status = codes[basis.row_status].tolist()
        hb.valid = True
        self._check(self._h.setBasis(hb), "setBasis")
        self._changed("mixed")

    @property
    def num_cols(self) -> int:
        return int(self._h.getNumCol())

    @property
    def num_rows(self) -> int:
        return int(self._h.getNumRow())

    # ------------------------------------------------------------------ solving
    def solve(self, *, method: str = "auto", time_limit: float | None = None,
              iteration_limit: int | None = None) -> LPSolution:
        method = warm_method(check_method(method), self._last_change)
        h = self._h
        if method == "ipm":
            h.setOptionValue("solver", "ipm")
            h.setOptionValue("run_crossover", "off")
        elif method in _SIMPLEX_STRATEGY:
            h.setOptionValue("solver", "simplex")
            h.setOptionValue("simplex_strategy", _SIMPLEX_STRATEGY[method])
        else:
            h.setOptionValue("solver", "choose")
            h.setOptionValue("simplex_strategy", 1)
        it = _INT_MAX if iteration_limit is None else int(iteration_limit)
        h.setOptionValue("simplex_iteration_limit", it)
        h.setOptionValue("ipm_iteration_limit", it)
        if self._has_int:
            h.setOptionValue("solve_relaxation", True)
        sol = self._run(time_limit, mip=False)
        self._last_change = None
        return sol

    def solve_mip(self, *, time_limit: float | None = None, mip_gap: float = 1e-4) -> LPSolution:
        h = self._h
        h.setOptionValue("solve_relaxation", False)
        h.setOptionValue("solver", "choose")
        h.setOptionValue("mip_rel_gap", float(mip_gap))
        return self._run(time_limit, mip=True)

    def _run(self, time_limit: float | None, *, mip: bool) -> LPSolution:
        h = self._h
        # HiGHS before 2.0 compares ``time_limit`` with the run time of every run() of this
        # object so far (ERGO-Code/HiGHS issues 1331, 1477): a column generation's later
        # solves would stop at once, so the limit is counted from this run on
        h.setOptionValue("time_limit", float("inf") if time_limit is None
                         else h.getRunTime() + float(time_limit))
        t0 = time.perf_counter()
        run_status = h.run()
        status = self._model_status()
        if run_status == self._highspy.HighsStatus.kError and status is SolveStatus.NOT_SOLVED:
            # HiGHS's thread pool is process-wide: if another Highs object in this process
            # started it with a different thread count, run() refuses.  Restart the pool
            # with ours and retry once.
            h.resetGlobalScheduler(True)
            h.run()
            status = self._model_status()
        if status is SolveStatus.INFEASIBLE_OR_UNBOUNDED and not mip:
            # Presolve could not tell which; a plain simplex run on the original model can.
            h.setOptionValue("presolve", "off")
            h.run()
            h.setOptionValue("presolve", self._presolve_option)
            status = self._model_status()
        seconds = time.perf_counter() - t0
        if status is SolveStatus.NUMERICAL_ERROR:
            raise SolveError(f"HiGHS reported {h.modelStatusToString(h.getModelStatus())!r} "
                             f"on a {self.num_rows}x{self.num_cols} model; check the model's "
                             f"scaling or try method='ipm' or another backend")
        info = h.getInfo()
        sol = h.getSolution()
        # Report a point only when HiGHS marks it feasible (a dual simplex stopped at a
        # limit has primal values that violate rows), the same rule as Gurobi's SolCount.
        x = (np.array(sol.col_value, dtype=float)
             if sol.value_valid and info.primal_solution_status == _FEASIBLE else None)
        has_duals = sol.dual_valid and info.dual_solution_status == _FEASIBLE and not mip
        iterations = int(max(info.simplex_iteration_count, 0) + max(info.ipm_iteration_count, 0)
                         + max(info.crossover_iteration_count, 0))
        result = LPSolution(
            status=status,
            objective=float(info.objective_function_value) if x is not None else None,
            x=x,
            row_duals=np.array(sol.row_dual, dtype=float) if has_duals else None,
            reduced_costs=np.array(sol.col_dual, dtype=float) if has_duals else None,
            iterations=iterations,
            seconds=seconds,
        )
        if mip:
            result.mip_bound = float(info.mip_dual_bound)
            result.mip_gap = float(info.mip_gap)
        return result

    def _model_status(self) -> SolveStatus:
        return _STATUS.get(self._h.getModelStatus().name, SolveStatus.OTHER)

    def _check(self, status: Any, call: str) -> None:
        if status == self._highspy.HighsStatus.kError:
            raise SolveError(f"HiGHS {call} failed on a {self.num_rows}x{self.num_cols} model "
                             f"(bad arrays or infinite coefficients?)")

    def close(self) -> None:
        self._h.clearModel()
