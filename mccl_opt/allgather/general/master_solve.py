"""Solving the general method's tree master to a point its trees reach (docs/allgather.md
"The tree master's certificate, exact").

:func:`solve_reached` solves the live master (:class:`.live_master.TreeMaster`), adds the
lazy link rows its point violates (:mod:`.tree_colgen`, "Lazy link rows"), and cuts the
point to the rate its trees reach as the fractional schedule recomputes it
(:func:`reached`): the LP solver meets each row only within an absolute tolerance, so
its ``x`` can be above that rate, and the column generation's stopping test and
certificate must read the rate the schedule has.
"""

from __future__ import annotations

import time

import numpy as np

from mccl_opt import anytime
from mccl_opt.link_rate import LOAD_NOISE, rate_of_loads
from .live_master import MasterPoint, TreeMaster
from .tree_rounding import fractional_shares

__all__ = ["solve_reached", "reached"]

#: the LP solvers' default absolute primal feasibility tolerance (HiGHS's; Gurobi's and
#: SCIP's are 1e-6) and the least :func:`solve_reached` tightens it to (HiGHS's least)
_DEFAULT_FEASIBILITY_TOL = 1e-7
_TIGHTEST_FEASIBILITY_TOL = 1e-10


def _solve_feasible(master: TreeMaster, where: str, method: str,
                    deadline: float | None) -> MasterPoint | None:
    """Solve the master, adding the missing link rows its solution violates and
    re-solving (dual simplex) until it meets every link's capacity; ``None`` when the
    time left (the innermost limit's, :func:`mccl_opt.anytime.time_left`, or
    ``deadline``'s) ran out inside an LP solve, which the LP solver's own time limit
    stops (one master LP took 20 s at 512 GPUs, past a 10 s limit)."""
    pt = master.solve(where, method, _time_left(deadline))
    if pt is None:
        return None
    iterations = pt.iterations
    while True:
        violated = master.violated(pt.w)
        if not violated.size:
            pt.iterations = iterations
            return pt
        master.add_rows(violated)
        pt = master.solve(f"{where}, with {violated.size} more link rows", "dual",
                          _time_left(deadline))
        if pt is None:
            return None
        iterations += pt.iterations


def solve_reached(master: TreeMaster, where: str, method: str, deadline: float | None,
                  rel_tol: float) -> MasterPoint | None:
    """:func:`_solve_feasible`'s point cut to the rate its trees reach (:func:`reached`);
    where the cut costs more than ``rel_tol`` of ``x`` (rows met only within the LP
    solver's tolerance), the master is re-solved at a 100x tighter tolerance, down to
    :data:`_TIGHTEST_FEASIBILITY_TOL`, and the tolerance kept for the later solves."""
    iterations = 0
    while True:
        pt = _solve_feasible(master, where, method, deadline)
        if pt is None:
            return None
        iterations += pt.iterations
        pt.iterations = iterations
        x = pt.x
        pt = reached(master, pt)
        tol = master.backend.feasibility_tol
        tol = _DEFAULT_FEASIBILITY_TOL if tol is None else tol
        if pt.x >= x * (1 - rel_tol) or tol <= _TIGHTEST_FEASIBILITY_TOL:
            return pt
        master.backend.set_feasibility_tol(max(tol / 100, _TIGHTEST_FEASIBILITY_TOL))
        where = f"{where}, at a tighter feasibility tolerance"


def reached(master: TreeMaster, pt: MasterPoint) -> MasterPoint:
    """``pt`` with ``x`` the rate its trees reach: each root's weights normalised to
    shares (the fractional schedule's), the rate recomputed from the link loads as the
    schedule's is (:func:`mccl_opt.link_rate.rate_of_loads`), the weights scaled to
    ``x`` (each root's sum ``x``, no link over its capacity).
    The LP solver meets a row within an absolute tolerance: on a row of small capacity
    (a 83.3 Gbps port's, 0.026 in egress units) that overloaded the link by a relative
    1.5e-6, so the solver's ``x`` was above the rate its trees reach and a schedule 1.5e-6
    below its certificate was reported optimal (docs/allgather.md "The tree master's
    certificate, exact")."""
    g, pool = master.n_roots, master.pool
    shares = fractional_shares(pool, pt.w, g)
    every_root = np.bincount(pool.root, weights=shares, minlength=g).min() > 0
    rate = rate_of_loads(master.capacity, pool.loads(shares, master.capacity.size),
                         noise=LOAD_NOISE) if every_root else 0.0
    pt.x = min(pt.x, rate)
    pt.w = pt.x * shares
    return pt


def _time_left(deadline: float | None) -> float | None:
    """The LP solver's time limit: the innermost limit's time left
    (:func:`mccl_opt.anytime.lp_time_limit`) or ``deadline``'s, whichever is sooner."""
    lefts = [t for t in (anytime.lp_time_limit(), None if deadline is None
                         else max(deadline - time.perf_counter(), 1e-3)) if t is not None]
    return min(lefts) if lefts else None
