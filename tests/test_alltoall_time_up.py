"""AllToAll under a time limit when the LP backend stops a master solve before it has
any solution (HiGHS reports no ``x`` at a limit until it has a feasible basis): the
round ends, the previous round's schedule is returned with status ``time_limit``, not
a "numerical trouble" SolveError (issue #27, "time limits")."""

from __future__ import annotations

import numpy as np
import pytest

from instances import fail2, hpn
from mccl_opt.alltoall import solve_alltoall
from mccl_opt.alltoall import master as master_module
from mccl_opt.backends import SolveStatus
from mccl_opt.backends.solution import LPSolution
from mccl_opt.validate import validate


def test_a_master_cut_short_without_a_solution_ends_in_the_last_rounds_schedule(monkeypatch):
    topo = fail2(hpn(1, 4, 8))               # needs many rounds (tests/test_alltoall.py)
    real = master_module.RestrictedMaster.solve
    calls = {"n": 0, "limited": 0}

    def solve(self, where, *, method="auto", time_limit=None):
        calls["n"] += 1
        if time_limit is not None and calls["n"] >= 3:          # the third round hits the limit
            calls["limited"] += 1
            empty = LPSolution(SolveStatus.TIME_LIMIT, None, None, None, None, 0, time_limit)
            backend = self.backend
            monkeypatch.setattr(backend, "solve", lambda *a, **k: empty)
            try:
                return real(self, where, method=method, time_limit=time_limit)
            finally:
                monkeypatch.undo()
                monkeypatch.setattr(master_module.RestrictedMaster, "solve", solve)
        return real(self, where, method=method, time_limit=time_limit)

    monkeypatch.setattr(master_module.RestrictedMaster, "solve", solve)
    sched = solve_alltoall(topo, time_limit=60.0)
    assert calls["limited"] == 1
    assert sched.stats["status"] == "time_limit"
    rep = validate(topo, sched)                             # every block delivered, capacities respected
    assert np.isfinite(sched.rate_gbps) and 0 < sched.rate_gbps <= sched.lp_rate_gbps * (1 + 1e-9)
    assert rep is not None


def test_a_limit_shorter_than_the_solve_returns_a_valid_schedule_with_a_cut_bound():
    """A fabric whose column generation needs many rounds, limited to a few ms: a
    schedule made before the limit (the initial routing, or the first master's) comes
    back with status ``time_limit`` and a certified bound (the node-set cut bound where
    column generation had none) at or above the optimum."""
    from instances.aggregation import shared_aggregation
    from mccl_opt.alltoall.cut_bound import cut_bound_gbps
    from mccl_opt.report import Termination

    topo = fail2(shared_aggregation(2, 16, 8))
    optimum = solve_alltoall(topo, max_chunks=None).lp_rate_gbps
    sched = solve_alltoall(topo, time_limit=1e-3)
    assert sched.stats["status"] == "time_limit"
    assert sched.report.termination is Termination.TIME_LIMIT
    rate = validate(topo, sched).rate_gbps
    assert rate == sched.rate_gbps or abs(rate - sched.rate_gbps) <= 1e-9 * rate
    bound = sched.report.bound_gbps
    assert bound is not None and bound >= sched.rate_gbps
    assert bound >= optimum * (1 - 1e-9)
    assert cut_bound_gbps(topo) >= optimum * (1 - 1e-9)
    assert sched.report.certified_gap(sched.rate_gbps) == pytest.approx(
        1 - sched.rate_gbps / bound)


@pytest.mark.parametrize("make", ["hpn", "oneway", "sharedagg", "hostring"])
def test_the_cut_bound_is_above_the_lp_optimum(make):
    from instances.aggregation import host_ring, shared_aggregation
    from mccl_opt.alltoall.cut_bound import cut_bound_gbps

    topo = {"hpn": lambda: hpn(2, 2, 8), "sharedagg": lambda: fail2(shared_aggregation(2, 3, 8)),
            "hostring": lambda: host_ring(4, 4),
            "oneway": lambda: hpn(1, 2, 8).with_capacity(src="s0h0g0", dst="s0tor0", gbps=50.0,
                                                         both_directions=False)}[make]()
    optimum = solve_alltoall(topo, max_chunks=None).lp_rate_gbps
    assert cut_bound_gbps(topo) >= optimum * (1 - 1e-9)
    if make == "oneway":       # the degraded NIC is the single-GPU cut that binds
        assert cut_bound_gbps(topo) == pytest.approx(optimum, rel=1e-9)


@pytest.mark.parametrize("max_chunks", [10, None])
def test_a_limit_with_no_room_for_the_first_master_returns_the_routing_itself(max_chunks):
    """A limit shorter than the initial routing: no master is built; the routing is the
    schedule (:mod:`mccl_opt.alltoall.direct`): one path per pair carrying its whole
    shard, valid, at the rate of the routing's busiest link, status ``time_limit`` and
    a certified bound at or above the optimum."""
    from instances.aggregation import shared_aggregation
    from mccl_opt.alltoall.initial import initial_columns
    from mccl_opt.alltoall.problem import problem_for

    topo = fail2(shared_aggregation(2, 8, 8))
    optimum = solve_alltoall(topo, max_chunks=None).lp_rate_gbps
    sched = solve_alltoall(topo, max_chunks=max_chunks, time_limit=1e-6)
    assert sched.stats["status"] == "time_limit"
    assert sched.stats["rounding"] == "routed" and sched.stats["rounds"] == 0
    n = topo.num_gpus
    assert len(sched.chunks) == n * (n - 1)                  # one path per pair
    assert validate(topo, sched).rate_gbps == pytest.approx(sched.rate_gbps, rel=1e-9)
    prob = problem_for(topo)
    routing = initial_columns(prob, topo.num_nodes - 1, np.ones(prob.num_pairs, dtype=bool))
    load = np.bincount(routing.arcs, minlength=prob.num_links)
    assert sched.rate_gbps == pytest.approx(float((prob.capacity / np.maximum(load, 1e-300))
                                                  [load > 0].min()), rel=1e-12)
    assert sched.lp_rate_gbps == pytest.approx(sched.rate_gbps, rel=1e-12)
    bound = sched.report.bound_gbps
    assert bound is not None and bound >= optimum * (1 - 1e-9) >= sched.rate_gbps * (1 - 1e-9)
    assert sched.rate_gbps < optimum * (1 - 1e-6)           # the routing alone is not optimal


def test_a_routed_schedule_warm_starts_the_next_solve():
    """The routed schedule's warm state (its paths as LP columns at ``y = 1``, no basis,
    no certificate) seeds a full solve that reaches the cold optimum."""
    topo = fail2(hpn(1, 4, 8))
    routed = solve_alltoall(topo, max_chunks=None, time_limit=1e-6)
    assert routed.stats["rounding"] == "routed"
    cold = solve_alltoall(topo, max_chunks=None)
    warm = solve_alltoall(topo, warm=routed, max_chunks=None)
    assert warm.stats["status"] == "optimal"
    assert warm.lp_rate_gbps == pytest.approx(cold.lp_rate_gbps, rel=1e-7)
    validate(topo, warm)


def test_a_limit_with_room_for_the_master_solves_it():
    """A generous limit on a small fabric takes the column-generation path, not the
    routing alone, and ends optimal."""
    topo = fail2(hpn(1, 4, 8))
    sched = solve_alltoall(topo, time_limit=60.0)
    assert sched.stats["status"] == "optimal" and sched.stats["rounding"] != "routed"


@pytest.mark.parametrize("failing", [1, 3])
def test_numerical_trouble_under_a_limit_returns_the_best_schedule_so_far(monkeypatch, failing):
    """Issue 27 (a 200k-link AllToAll exited 2 with "numerical trouble" and no schedule):
    under a time limit, a master failing in a later round keeps the last round's
    schedule (``failing=3``); the first master failing keeps the initial routing
    (``failing=1``); both valid, ``time_limit``, the failure named in ``stopped_by``.
    Without a limit the failure is still an error."""
    from mccl_opt.errors import SolveError

    topo = fail2(hpn(1, 4, 8))
    real = master_module.RestrictedMaster.solve
    calls = {"n": 0}

    def solve(self, where, *, method="auto", time_limit=None):
        calls["n"] += 1
        if calls["n"] == failing:
            raise SolveError(f"{where}: numerical trouble (injected)")
        return real(self, where, method=method, time_limit=time_limit)

    monkeypatch.setattr(master_module.RestrictedMaster, "solve", solve)
    sched = solve_alltoall(topo, time_limit=60.0)
    assert sched.stats["status"] == "time_limit"
    assert "numerical trouble (injected)" in sched.stats["stopped_by"]
    assert (sched.stats["rounding"] == "routed") == (failing == 1)
    rate = validate(topo, sched).rate_gbps
    assert rate == pytest.approx(sched.rate_gbps, rel=1e-9) and rate > 0
    calls["n"] = 0
    with pytest.raises(SolveError, match="injected"):
        solve_alltoall(topo)


def test_a_schedule_above_the_last_limited_master_reports_its_rate_as_the_lp_rate(monkeypatch):
    """A time limit can stop column generation at a master below the rounded schedule's
    rate (the repair and the dive price paths past it: irregular fabric 11013 at 5 ms,
    76.9 against 75.0 Gbps).  The schedule is a point of the LP, so the LP rate reported
    is at least its rate and the schedule validates; an optimal LP's rate is untouched."""
    import dataclasses

    from mccl_opt.alltoall import solve as solve_module
    from mccl_opt.alltoall.colgen import CGStatus

    topo = fail2(hpn(1, 2, 8))
    real = solve_module.keep_if_better

    def stopped_below(outcome, kept):
        out = real(outcome, kept)
        report = dataclasses.replace(out.report, status=CGStatus.TIME_LIMIT)
        return dataclasses.replace(out, lp_rate=0.97 * out.lp_rate, report=report)

    monkeypatch.setattr(solve_module, "keep_if_better", stopped_below)
    sched = solve_alltoall(topo, time_limit=60.0)
    assert sched.stats["status"] == "time_limit"
    assert sched.lp_rate_gbps == sched.rate_gbps
    assert validate(topo, sched).rate_gbps == pytest.approx(sched.rate_gbps, rel=1e-9)
    monkeypatch.setattr(solve_module, "keep_if_better", real)
    optimal = solve_alltoall(topo)
    assert optimal.stats["status"] == "optimal" and optimal.lp_rate_gbps > optimal.rate_gbps
