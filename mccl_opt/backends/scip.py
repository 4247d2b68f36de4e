"""SCIP adapter (pip ``pyscipopt``): SoPlex for LPs, a SCIP ``Model`` for MIPs.

LP solves go through ``pyscipopt.LP`` (SCIP's LP interface to SoPlex), which keeps the
model and its basis between solves (warm) and keeps every row as a row: a
single-variable row is not turned into a bound as a SCIP ``Model`` would, so its dual
is reported.  ``LP.getDual`` is the shadow price d(obj)/d(rhs) and ``getRedcost`` is
``c - A^T y`` for both senses (checked in ``tests/test_backends.py``).

Methods: ``"primal"``/``"dual"`` run SoPlex primal/dual simplex; ``"auto"`` picks primal
after columns were added and dual otherwise; SoPlex has no interior-point solver, so
``"ipm"`` runs dual simplex (an exact basic solution, duals included).  SoPlex runs
single-threaded; ``threads`` is ignored.  ``solve_mip`` builds a fresh SCIP ``Model``
from the adapter's copy of the model each call (meant for the small MIPs of later
phases); SCIP stopping at its gap limit is reported as OPTIMAL, as HiGHS and Gurobi do.
The LP interface exposes no limit status, so a non-optimal SoPlex run without a ray is
ITERATION_LIMIT/TIME_LIMIT when it used up the limit given, else OTHER; at a limit ``x``
(duals) are reported only when SoPlex says primal (dual) feasible.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from formulations.lp import LinearProgram

from ._common import (SparseBlock, as_bounds, as_coefficients, as_index_array, check_basis,
                      check_method, warm_method)
from .base import Backend, Basis, LPSolution, SolveStatus

__all__ = ["ScipBackend"]

#: SCIP Model.getStatus() -> SolveStatus (anything else: OTHER).
_MIP_STATUS = {
    "optimal": SolveStatus.OPTIMAL,
    "gaplimit": SolveStatus.OPTIMAL,
    "infeasible": SolveStatus.INFEASIBLE,
    "unbounded": SolveStatus.UNBOUNDED,
    "inforunbd": SolveStatus.INFEASIBLE_OR_UNBOUNDED,
    "timelimit": SolveStatus.TIME_LIMIT,
    "unknown": SolveStatus.NOT_SOLVED,
}

_INT_MAX = 2**31 - 1


class ScipBackend(Backend):
    """A live SoPlex LP plus a column-wise copy for MIP solves (see module docstring)."""

    name: ClassVar[str] = "scip"
    pip_package: ClassVar[str] = "pyscipopt"
    module_name: ClassVar[str] = "pyscipopt"

    def __init__(self, *, threads: int = 1, silent: bool = True, presolve: bool = True,
                 feasibility_tol: float | None = None) -> None:
        super().__init__(threads=threads, silent=silent, presolve=presolve,
                         feasibility_tol=feasibility_tol)
        import pyscipopt

        self._ps = pyscipopt
        self._lp: Any = None
        self._load_arrays(LinearProgram(c=np.zeros(0), A=sp.csr_matrix((0, 0)),
                                        row_lo=[], row_hi=[], col_lo=[], col_hi=[]))

    # ------------------------------------------------------------------ building
    def _load_arrays(self, lp: LinearProgram) -> None:
        """Keep a copy (for MIPs) and build the SoPlex LP from it."""
        self._sense = lp.sense
        self._offset = float(lp.objective_offset)
        self._c = lp.c.copy()
        self._col_lo, self._col_hi = lp.col_lo.copy(), lp.col_hi.copy()
        self._int = lp.integrality.copy()
        self._row_lo, self._row_hi = lp.row_lo.copy(), lp.row_hi.copy()
        self._A = lp.A.tocsc()
        self._lp = self._ps.LP(name=lp.name, sense="maximize" if lp.sense == "max" else "minimize")
        self._inf = float(self._lp.infinity())
        P = self._ps.SCIP_LPPARAM
        self._lp.setIntParam(P.LPINFO, 0 if self.silent else 1)
        self._lp.setIntParam(P.PRESOLVING, 1 if self.presolve else 0)
        if self.feasibility_tol is not None:
            self._apply_feasibility_tol(self.feasibility_tol)
        if lp.num_rows:
            self._lp.addRows([[] for _ in range(lp.num_rows)],
                             lhss=self._clip(lp.row_lo), rhss=self._clip(lp.row_hi))
        self._lp_add_cols(lp.c, lp.col_lo, lp.col_hi, self._A)
        self._last_change = None

    def load(self, lp: LinearProgram) -> None:
        self._load_arrays(lp)

    def _apply_feasibility_tol(self, tol: float) -> None:
        """SoPlex's, and the MIP model's (:meth:`_build_model` reads it)."""
        self._lp.setRealParam(self._ps.SCIP_LPPARAM.FEASTOL, tol)

    def _clip(self, v: np.ndarray) -> list[float]:
        return np.clip(np.asarray(v, dtype=float), -self._inf, self._inf).tolist()

    def _lp_add_cols(self, cost: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                     A: sp.csc_matrix) -> None:
        if A.shape[1] == 0:
            return
        ind, val, ptr = A.indices.tolist(), A.data.tolist(), A.indptr.tolist()
        entries = [list(zip(ind[ptr[j]:ptr[j + 1]], val[ptr[j]:ptr[j + 1]]))
                   for j in range(A.shape[1])]
        self._lp.addCols(entries, objs=np.asarray(cost, float).tolist(),
                         lbs=self._clip(lo), ubs=self._clip(hi))

    def _append_columns(self, cost: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                        block: SparseBlock) -> None:
        csc = block.to_csc(self.num_rows)
        self._lp_add_cols(cost, lo, hi, csc)
        self._c = np.concatenate([self._c, cost])
        self._col_lo = np.concatenate([self._col_lo, lo])
        self._col_hi = np.concatenate([self._col_hi, hi])
        self._int = np.concatenate([self._int, np.zeros(cost.shape[0], dtype=bool)])
        self._A = sp.hstack([self._A, csc], format="csc")

    def _append_rows(self, lo: np.ndarray, hi: np.ndarray, block: SparseBlock) -> None:
        entries = [list(zip(*(a.tolist() for a in block.slice(i)))) for i in range(lo.shape[0])]
        self._lp.addRows(entries, lhss=self._clip(lo), rhss=self._clip(hi))
        self._row_lo = np.concatenate([self._row_lo, lo])
        self._row_hi = np.concatenate([self._row_hi, hi])
        self._A = sp.vstack([self._A, block.to_csr(self.num_cols)], format="csc")

    def set_column_bounds(self, cols: np.ndarray, lb: np.ndarray, ub: np.ndarray) -> None:
        ix = as_index_array(cols, self.num_cols, "set_column_bounds")
        lo, hi = as_bounds(ix.shape[0], lb, ub, "set_column_bounds")
        for j, l, u in zip(ix.tolist(), self._clip(lo), self._clip(hi)):
            self._lp.chgBound(j, l, u)
        self._col_lo[ix], self._col_hi[ix] = lo, hi
        self._changed("bounds")

    def delete_columns(self, cols: np.ndarray) -> None:
        ix = np.unique(as_index_array(cols, self.num_cols, "delete_columns"))
        if ix.size == 0:
            return
        # SoPlex deletes contiguous ranges; delete runs from the back so indices hold.
        breaks = np.flatnonzero(np.diff(ix) != 1) + 1
        for run in reversed(np.split(ix, breaks)):
            self._lp.delCols(int(run[0]), int(run[-1]))
        keep = np.ones(self.num_cols, dtype=bool)
        keep[ix] = False
        self._c, self._col_lo, self._col_hi, self._int = (
            self._c[keep], self._col_lo[keep], self._col_hi[keep], self._int[keep])
        self._A = self._A[:, np.flatnonzero(keep)]
        self._changed("mixed")

    def change_coefficients(self, rows: np.ndarray, cols: np.ndarray, values: np.ndarray) -> None:
        r, c, v = as_coefficients(rows, cols, values, self.num_rows, self.num_cols)
        if r.size == 0:
            return
        for i, j, a in zip(r.tolist(), c.tolist(), v.tolist()):
            self._lp.chgCoef(i, j, a)
        # the copy kept for MIPs: the last value given for an entry wins
        _, last = np.unique((r * self.num_cols + c)[::-1], return_index=True)
        keep = r.size - 1 - last
        r, c, v = r[keep], c[keep], v[keep]
        old = np.asarray(self._A[r, c]).reshape(-1)
        delta = sp.csc_matrix((v - old, (r, c)), shape=self._A.shape)
        self._A = (self._A + delta).tocsc()
        self._A.eliminate_zeros()
        self._changed("mixed")

    def set_row_bounds(self, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        ix = as_index_array(rows, self.num_rows, "set_row_bounds")
        lo_a, hi_a = as_bounds(ix.shape[0], lo, hi, "set_row_bounds")
        for i, l, u in zip(ix.tolist(), self._clip(lo_a), self._clip(hi_a)):
            self._lp.chgSide(i, l, u)
        self._row_lo[ix], self._row_hi[ix] = lo_a, hi_a
        self._changed("bounds")

    def get_basis(self) -> Basis | None:
        if self.num_cols == 0 or not self._lp.isOptimal():
            return None
        cstat, rstat = self._lp.getBase()
        return Basis(np.asarray(cstat, dtype=np.int8), np.asarray(rstat, dtype=np.int8), self.name)

    def set_basis(self, basis: Basis) -> None:
        check_basis(basis, self.name, self.num_cols, self.num_rows)
        self._lp.setBase(basis.col_status.astype(int).tolist(), basis.row_status.astype(int).tolist())
        self._changed("mixed")

    @property
    def num_cols(self) -> int:
        return int(self._c.shape[0])

    @property
    def num_rows(self) -> int:
        return int(self._row_lo.shape[0])

    # ------------------------------------------------------------------ solving
    def solve(self, *, method: str = "auto", time_limit: float | None = None,
              iteration_limit: int | None = None) -> LPSolution:
        method = warm_method(check_method(method), self._last_change)
        lp, P = self._lp, self._ps.SCIP_LPPARAM
        lp.setIntParam(P.LPITLIM, _INT_MAX if iteration_limit is None else int(iteration_limit))
        lp.setRealParam(P.LPTILIM, self._inf if time_limit is None else float(time_limit))
        t0 = time.perf_counter()
        if self.num_cols == 0:
            return self._empty_solution()
        lp.solve(dual=method != "primal")
        seconds = time.perf_counter() - t0
        self._last_change = None
        iterations = int(lp.getNIterations())
        if lp.isOptimal():
            status = SolveStatus.OPTIMAL
        elif lp.getDualRay() is not None:
            status = SolveStatus.INFEASIBLE
        elif lp.getPrimalRay() is not None:
            status = SolveStatus.UNBOUNDED
        elif iteration_limit is not None and iterations >= iteration_limit:
            status = SolveStatus.ITERATION_LIMIT
        elif time_limit is not None and seconds >= time_limit:
            status = SolveStatus.TIME_LIMIT
        else:
            status = SolveStatus.OTHER
        has_x = status is SolveStatus.OPTIMAL or (status.is_limit and lp.isPrimalFeasible())
        has_y = status is SolveStatus.OPTIMAL or (status.is_limit and lp.isDualFeasible())
        x = np.array(lp.getPrimal(), dtype=float) if has_x else None
        return LPSolution(
            status=status,
            objective=float(self._c @ x) + self._offset if x is not None else None,
            x=x,
            row_duals=np.array(lp.getDual(), dtype=float) if has_y else None,
            reduced_costs=np.array(lp.getRedcost(), dtype=float) if has_y else None,
            iterations=iterations, seconds=seconds)

    def _empty_solution(self) -> LPSolution:
        """A model without columns: feasible iff every row admits activity 0."""
        ok = bool(((self._row_lo <= 0) & (self._row_hi >= 0)).all())
        return LPSolution(status=SolveStatus.OPTIMAL if ok else SolveStatus.INFEASIBLE,
                          objective=self._offset if ok else None,
                          x=np.zeros(0) if ok else None,
                          row_duals=np.zeros(self.num_rows) if ok else None,
                          reduced_costs=np.zeros(0) if ok else None,
                          iterations=0, seconds=0.0)

    def solve_mip(self, *, time_limit: float | None = None, mip_gap: float = 1e-4) -> LPSolution:
        empty = np.diff(self._A.tocsr().indptr) == 0
        if ((self._row_lo[empty] > 0) | (self._row_hi[empty] < 0)).any():
            return LPSolution(status=SolveStatus.INFEASIBLE, objective=None, x=None,
                              row_duals=None, reduced_costs=None, iterations=0, seconds=0.0)
        model, xs = self._build_model()
        if time_limit is not None:
            model.setParam("limits/time", float(time_limit))
        model.setParam("limits/gap", float(mip_gap))
        t0 = time.perf_counter()
        model.optimize()
        seconds = time.perf_counter() - t0
        status = _MIP_STATUS.get(model.getStatus(), SolveStatus.OTHER)
        has_x = model.getNSols() > 0
        x = np.array([model.getVal(v) for v in xs], dtype=float) if has_x else None
        bound = float(model.getDualbound())
        return LPSolution(
            status=status, objective=float(model.getObjVal()) if has_x else None, x=x,
            row_duals=None, reduced_costs=None, iterations=int(model.getNLPIterations()),
            seconds=seconds,
            mip_bound=None if model.isInfinity(abs(bound)) else bound,
            mip_gap=float(model.getGap()) if has_x else None)

    def _build_model(self) -> tuple[Any, list[Any]]:
        """A SCIP Model of the current copy (rows over no column are left out)."""
        ps = self._ps
        model = ps.Model()
        if self.silent:
            model.hideOutput()
        if not self.presolve:
            model.setPresolve(ps.SCIP_PARAMSETTING.OFF)
        if self.feasibility_tol is not None:
            model.setParam("numerics/feastol", self.feasibility_tol)
        bound = _side
        xs = [model.addVar(lb=bound(lo), ub=bound(hi), obj=float(c),
                           vtype="I" if integer else "C")
              for lo, hi, c, integer in zip(self._col_lo, self._col_hi, self._c, self._int)]
        if self._offset:
            model.addObjoffset(self._offset)
        A = self._A.tocsr()
        for i in range(self.num_rows):
            s, e = A.indptr[i], A.indptr[i + 1]
            lo, hi = bound(self._row_lo[i]), bound(self._row_hi[i])
            if s == e:  # checked by solve_mip
                continue
            expr = ps.quicksum(float(v) * xs[j] for j, v in
                               zip(A.indices[s:e].tolist(), A.data[s:e].tolist()))
            model.addCons(ps.scip.ExprCons(expr, lhs=lo, rhs=hi))
        if self._sense == "max":
            model.setMaximize()
        return model, xs


def _side(v: float) -> float | None:
    """A SCIP Model bound/side: None for an infinite one."""
    return float(v) if np.isfinite(v) else None
