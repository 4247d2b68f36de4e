"""Gurobi adapter (pip ``gurobipy``; its bundled licence is size-limited).

Rows ``lo <= a x <= hi`` are stored as ``<=``, ``>=`` or ``=`` constraints; a range or
free row becomes ``a x - s = 0`` with a hidden slack ``s`` in ``[lo, hi]`` (what Gurobi's
own ``addRange`` does), so every user row keeps one dual and the hidden slacks never
appear in ``x``.  Gurobi's ``Pi`` is the shadow price d(obj)/d(rhs) and ``RC`` is
``c - A^T Pi`` for both senses (checked in ``tests/test_backends.py``).

Methods: ``"primal"``/``"dual"`` set ``Method`` 0/1, ``"ipm"`` sets barrier with
``Crossover=0`` (Gurobi still returns interior ``Pi``/``RC``), ``"auto"`` lets Gurobi
choose (it re-solves warm from the last basis after any modification).  Columns are
added in one batch of ``Column`` objects, which measured faster than ``addMVar`` plus
per-nonzero ``chgCoeff``.  A model over the pip licence's 2000 variables/constraints
raises :class:`~mccl_opt.errors.SolverLicenseError`.  At a limit ``x`` and the duals
are reported only when Gurobi holds a feasible point (``SolCount > 0``); an LP simplex
stopped early has none.
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from formulations.lp import LinearProgram

from ..errors import SolveError, SolverLicenseError
from ._common import (SparseBlock, as_bounds, as_coefficients, as_index_array, check_basis,
                      check_method)
from .base import Backend, Basis, LPSolution, SolveStatus

__all__ = ["GurobiBackend"]

#: Gurobi optimisation status code -> SolveStatus (anything else: OTHER).
_STATUS = {
    1: SolveStatus.NOT_SOLVED,        # LOADED
    2: SolveStatus.OPTIMAL,
    3: SolveStatus.INFEASIBLE,
    4: SolveStatus.INFEASIBLE_OR_UNBOUNDED,
    5: SolveStatus.UNBOUNDED,
    7: SolveStatus.ITERATION_LIMIT,
    9: SolveStatus.TIME_LIMIT,
    12: SolveStatus.NUMERICAL_ERROR,
}

_METHOD = {"auto": -1, "primal": 0, "dual": 1, "ipm": 2}

#: GurobiError code for "Model too large for size-limited license".
_SIZE_LIMIT_ERRNO = 10010
_PIP_LIMIT = 2000


class GurobiBackend(Backend):
    """A live gurobipy model (see module docstring for rows, methods and licence)."""

    name: ClassVar[str] = "gurobi"
    pip_package: ClassVar[str] = "gurobipy"
    module_name: ClassVar[str] = "gurobipy"

    def __init__(self, *, threads: int = 1, silent: bool = True, presolve: bool = True,
                 feasibility_tol: float | None = None) -> None:
        super().__init__(threads=threads, silent=silent, presolve=presolve,
                         feasibility_tol=feasibility_tol)
        import gurobipy as gp

        self._gp = gp
        try:
            self._env = gp.Env(empty=True)
            self._env.setParam("OutputFlag", 0 if silent else 1)
            self._env.setParam("Threads", int(threads))
            self._env.setParam("Presolve", -1 if presolve else 0)
            self._env.start()
        except gp.GurobiError as exc:
            raise SolverLicenseError(
                f"gurobipy is installed but no Gurobi licence could be started ({exc}); "
                f"install a licence (https://www.gurobi.com/academia/) or use backend='highs'"
            ) from exc
        self._model: Any = None
        self._vars: list[Any] = []      # user columns, in order
        self._constrs: list[Any] = []   # user rows, in order
        self._slacks: dict[int, Any] = {}  # row index -> hidden slack of a range/free row
        self._int_cols = np.zeros(0, dtype=np.int64)
        self._relaxed = False
        self._new_model()
        if feasibility_tol is not None:
            self._apply_feasibility_tol(feasibility_tol)

    def _apply_feasibility_tol(self, tol: float) -> None:
        self._env.setParam("FeasibilityTol", max(tol, 1e-9))      # Gurobi's least; the
        self._model.Params.FeasibilityTol = max(tol, 1e-9)        # model copied the env's

    def _new_model(self) -> None:
        if self._model is not None:
            self._model.dispose()
        self._model = self._gp.Model(env=self._env)        # with the env's tolerance
        self._vars, self._constrs, self._slacks = [], [], {}
        self._int_cols = np.zeros(0, dtype=np.int64)
        self._relaxed = False

    # ------------------------------------------------------------------ building
    def load(self, lp: LinearProgram) -> None:
        gp = self._gp
        self._new_model()
        m = self._model
        m.ModelSense = gp.GRB.MAXIMIZE if lp.sense == "max" else gp.GRB.MINIMIZE
        m.ObjCon = float(lp.objective_offset)
        vtype = np.where(lp.integrality, gp.GRB.INTEGER, gp.GRB.CONTINUOUS)
        x = m.addMVar(lp.num_cols, lb=_grb_bounds(lp.col_lo), ub=_grb_bounds(lp.col_hi),
                      obj=lp.c, vtype=vtype)
        self._vars = x.tolist()
        self._int_cols = np.flatnonzero(lp.integrality)
        self._constrs = self._add_constrs(lp.A, lp.row_lo, lp.row_hi)
        m.update()

    def _add_constrs(self, A: Any, lo: np.ndarray, hi: np.ndarray) -> list[Any]:
        """Add rows ``lo <= A x <= hi`` (A in CSR over the user columns)."""
        gp = self._gp
        k = A.shape[0]
        if k == 0:
            return []
        sense = np.full(k, "=", dtype="<U1")
        rhs = np.zeros(k)
        le = np.isneginf(lo) & np.isfinite(hi)
        ge = np.isfinite(lo) & np.isposinf(hi)
        eq = lo == hi
        sense[le], rhs[le] = "<", hi[le]
        sense[ge], rhs[ge] = ">", lo[ge]
        rhs[eq] = lo[eq]
        ranged = np.flatnonzero(~(le | ge | eq))       # range and free rows
        x = gp.MVar.fromlist(self._vars) if self._vars else None
        if ranged.size:
            s = self._model.addMVar(ranged.size, lb=_grb_bounds(lo[ranged]),
                                    ub=_grb_bounds(hi[ranged]))
            S = sp.csr_matrix((-np.ones(ranged.size), (ranged, np.arange(ranged.size))),
                              shape=(k, ranged.size))
            A = sp.hstack([A, S], format="csr")
            x = gp.MVar.fromlist(self._vars + s.tolist())
            offset = len(self._constrs)
            self._slacks.update(zip((offset + ranged).tolist(), s.tolist()))
        if x is None:  # rows over zero columns: constant constraints 0 (sense) rhs
            x = self._model.addMVar(1, lb=0.0, ub=0.0)
            A = sp.csr_matrix((k, 1))
        return self._model.addMConstr(sp.csr_matrix(A), x, sense, rhs).tolist()

    def _append_columns(self, cost: np.ndarray, lo: np.ndarray, hi: np.ndarray,
                        block: SparseBlock) -> None:
        gp = self._gp
        lo, hi = _grb_bounds(lo), _grb_bounds(hi)
        constrs = self._constrs
        m = self._model
        for j in range(cost.shape[0]):
            rows, vals = block.slice(j)
            col = gp.Column(vals.tolist(), [constrs[i] for i in rows.tolist()])
            self._vars.append(m.addVar(lb=lo[j], ub=hi[j], obj=cost[j], column=col))
        m.update()

    def _append_rows(self, lo: np.ndarray, hi: np.ndarray, block: SparseBlock) -> None:
        self._constrs += self._add_constrs(block.to_csr(self.num_cols), lo, hi)
        self._model.update()

    def set_column_bounds(self, cols: np.ndarray, lb: np.ndarray, ub: np.ndarray) -> None:
        ix = as_index_array(cols, self.num_cols, "set_column_bounds")
        lo, hi = as_bounds(ix.shape[0], lb, ub, "set_column_bounds")
        vs = [self._vars[j] for j in ix.tolist()]
        self._model.setAttr("LB", vs, _grb_bounds(lo).tolist())
        self._model.setAttr("UB", vs, _grb_bounds(hi).tolist())
        self._model.update()

    def delete_columns(self, cols: np.ndarray) -> None:
        ix = np.unique(as_index_array(cols, self.num_cols, "delete_columns"))
        if ix.size == 0:
            return
        self._model.remove([self._vars[j] for j in ix.tolist()])
        keep = np.ones(len(self._vars), dtype=bool)
        keep[ix] = False
        self._vars = [v for v, k in zip(self._vars, keep) if k]
        old_to_new = np.cumsum(keep) - 1
        self._int_cols = old_to_new[self._int_cols[keep[self._int_cols]]]
        self._model.update()

    def change_coefficients(self, rows: np.ndarray, cols: np.ndarray, values: np.ndarray) -> None:
        r, c, v = as_coefficients(rows, cols, values, self.num_rows, self.num_cols)
        for i, j, a in zip(r.tolist(), c.tolist(), v.tolist()):
            self._model.chgCoeff(self._constrs[i], self._vars[j], a)
        self._model.update()

    def set_row_bounds(self, rows: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
        """A range or free row keeps its hidden slack (whose bounds change); a one-sided
        or equality row changes sense and right-hand side, and gains a slack when it
        becomes a range."""
        gp = self._gp
        ix = as_index_array(rows, self.num_rows, "set_row_bounds")
        lo_a, hi_a = as_bounds(ix.shape[0], lo, hi, "set_row_bounds")
        m = self._model
        for i, l, u in zip(ix.tolist(), lo_a.tolist(), hi_a.tolist()):
            con, slack = self._constrs[i], self._slacks.get(i)
            if slack is None and not (np.isfinite(l) and np.isfinite(u) and l != u) \
                    and (np.isfinite(l) or np.isfinite(u)):
                sense, rhs = ("=", l) if l == u else ((">", l) if np.isfinite(l) else ("<", u))
                con.Sense, con.RHS = sense, rhs
                continue
            if slack is None:
                slack = m.addVar(column=gp.Column([-1.0], [con]))
                self._slacks[i] = slack
                con.Sense, con.RHS = "=", 0.0
            slack.LB, slack.UB = float(_grb_bounds(l)), float(_grb_bounds(u))
        m.update()

    def get_basis(self) -> Basis | None:
        m = self._model
        try:
            vb = np.array(m.getAttr("VBasis", self._vars), dtype=np.int64)
            cb = np.array(m.getAttr("CBasis", self._constrs), dtype=np.int64)
        except self._gp.GurobiError:
            return None
        cols = np.array([Basis.BASIC, Basis.LOWER, Basis.UPPER, Basis.ZERO], dtype=np.int8)[-vb]
        sense = np.array([c.Sense for c in self._constrs], dtype="<U1")
        rows = np.where(cb == 0, Basis.BASIC, np.where(sense == "<", Basis.UPPER, Basis.LOWER))
        for i, slack in self._slacks.items():
            rows[i] = _basis_code(int(slack.VBasis))
        return Basis(cols, rows.astype(np.int8), self.name)

    def set_basis(self, basis: Basis) -> None:
        check_basis(basis, self.name, self.num_cols, self.num_rows)
        vb = np.array([-1, 0, -2, -3])[basis.col_status.astype(np.int64)]
        cb = np.where(basis.row_status == Basis.BASIC, 0, -1)
        m = self._model
        m.setAttr("VBasis", self._vars, vb.tolist())
        for i, slack in self._slacks.items():
            slack.VBasis = int(np.array([-1, 0, -2, -3])[basis.row_status[i]])
            cb[i] = -1
        m.setAttr("CBasis", self._constrs, cb.tolist())
        m.update()

    @property
    def num_cols(self) -> int:
        return len(self._vars)

    @property
    def num_rows(self) -> int:
        return len(self._constrs)

    # ------------------------------------------------------------------ solving
    def solve(self, *, method: str = "auto", time_limit: float | None = None,
              iteration_limit: int | None = None) -> LPSolution:
        gp = self._gp
        check_method(method)
        m = self._model
        if self._int_cols.size and not self._relaxed:
            self._set_vtype(gp.GRB.CONTINUOUS)
            self._relaxed = True
        p = m.Params
        p.Method = _METHOD[method]
        p.Crossover = 0 if method == "ipm" else -1
        limit = gp.GRB.INFINITY if iteration_limit is None else float(iteration_limit)
        p.IterationLimit = limit
        p.BarIterLimit = (2**31 - 1) if iteration_limit is None else int(iteration_limit)
        p.DualReductions = 1
        sol = self._optimize(time_limit, mip=False)
        if sol.status is SolveStatus.INFEASIBLE_OR_UNBOUNDED:
            p.DualReductions = 0  # presolve could not tell which; this makes Gurobi decide
            sol = self._optimize(time_limit, mip=False)
            p.DualReductions = 1
        return sol

    def solve_mip(self, *, time_limit: float | None = None, mip_gap: float = 1e-4) -> LPSolution:
        if self._relaxed:
            self._set_vtype(self._gp.GRB.INTEGER)
            self._relaxed = False
        p = self._model.Params
        p.Method, p.Crossover = -1, -1
        p.IterationLimit = self._gp.GRB.INFINITY
        p.MIPGap = float(mip_gap)
        return self._optimize(time_limit, mip=True)

    def _set_vtype(self, vtype: str) -> None:
        vs = [self._vars[j] for j in self._int_cols.tolist()]
        self._model.setAttr("VType", vs, [vtype] * len(vs))
        self._model.update()

    def _optimize(self, time_limit: float | None, *, mip: bool) -> LPSolution:
        gp = self._gp
        m = self._model
        m.Params.TimeLimit = gp.GRB.INFINITY if time_limit is None else float(time_limit)
        t0 = time.perf_counter()
        try:
            m.optimize()
        except gp.GurobiError as exc:
            if exc.errno == _SIZE_LIMIT_ERRNO:
                raise SolverLicenseError(
                    f"Gurobi's size-limited licence cannot solve this model: it has "
                    f"{m.NumVars} variables and {m.NumConstrs} constraints, the pip licence "
                    f"allows at most {_PIP_LIMIT} of each; install a full licence "
                    f"(https://www.gurobi.com/academia/ or a commercial one) or use "
                    f"backend='highs'") from exc
            raise SolveError(f"Gurobi failed: {exc}") from exc
        seconds = time.perf_counter() - t0
        status = _STATUS.get(int(m.Status), SolveStatus.OTHER)
        if status is SolveStatus.NUMERICAL_ERROR:
            raise SolveError(f"Gurobi stopped on numerical trouble on a {self.num_rows}x"
                             f"{self.num_cols} model; check the model's scaling or try "
                             f"method='ipm' or another backend")
        has_x = m.SolCount > 0
        x = np.array(m.getAttr("X", self._vars), dtype=float) if has_x else None
        duals = rc = None
        if has_x and not mip:
            duals = np.array(m.getAttr("Pi", self._constrs), dtype=float)
            rc = np.array(m.getAttr("RC", self._vars), dtype=float)
        iterations = int(m.IterCount) + int(m.BarIterCount)
        sol = LPSolution(status=status, objective=float(m.ObjVal) if has_x else None, x=x,
                         row_duals=duals, reduced_costs=rc, iterations=iterations,
                         seconds=seconds)
        if mip:
            sol.mip_bound = _attr(m, "ObjBound")
            sol.mip_gap = _attr(m, "MIPGap") if has_x else None
        return sol

    def close(self) -> None:
        if self._model is not None:
            self._model.dispose()
            self._model = None
        self._env.dispose()


def _attr(model: Any, name: str) -> float | None:
    """A float model attribute, or None when Gurobi has no value for it."""
    try:
        return float(model.getAttr(name))
    except Exception:  # gurobipy raises AttributeError/GurobiError for "not available"
        return None


def _basis_code(vbasis: int) -> int:
    """A Gurobi ``VBasis`` code (0 basic, -1 lower, -2 upper, -3 superbasic) as a
    :class:`Basis` status."""
    return [Basis.BASIC, Basis.LOWER, Basis.UPPER, Basis.ZERO][-vbasis]


def _grb_bounds(v: np.ndarray) -> np.ndarray:
    """Map ``±inf`` to Gurobi's ``±GRB.INFINITY`` (1e100)."""
    return np.clip(np.asarray(v, dtype=float), -1e100, 1e100)
