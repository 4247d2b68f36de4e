"""A time limit inside the long calls of an AllGather solve (issue 25: a limit that holds).

A compiled packing and an LP solve are single calls no check point reaches; under a
limit the packing is sized to the time left (:func:`.forestcoll.sized.limited_repair`)
and the LP solver gets the time left as its own limit.  These tests make the call
"too long" on purpose (rates measured as tiny, an LP solver that reports its limit)
and check what the solve *returns*: a valid schedule, its status, a bound at or above
the independent optimum.  Nothing is timed.
"""

from __future__ import annotations

import pytest

import mccl_opt as mo
from instances import hpn
from instances.aggregation import leaf_spine
from mccl_opt import anytime
from mccl_opt.allgather.forestcoll import sized
from mccl_opt.allgather.general import live_master
from mccl_opt.allgather.general.method import solve_general
from mccl_opt.allgather.general.tree_colgen import TreeCGOptions
from mccl_opt.report import Method, Termination

from .oracle_allgather import check_schedule, cut_bound


def test_a_packing_that_cannot_fit_the_time_left_stops_the_solve(monkeypatch):
    """The repair packing's growth measured as far slower than the time left: the solve
    stops before it (not after it, past the limit) with the first schedule, valid, at
    status ``time_limit`` and a bound at or above the optimum."""
    topo = hpn(1, 2, 8).with_capacity({("s0h0g0", "s0tor0"): 200.0,
                                       ("s0tor0", "s0h0g0"): 200.0})
    full = mo.solve_allgather(topo)
    monkeypatch.setattr(sized, "PACKING_ENTRIES_PER_S", 1e-3)
    limited = mo.solve_allgather(topo, time_limit=600.0)
    report = limited.report
    assert report.termination is Termination.TIME_LIMIT
    assert limited.stats["status"] == "time_limit"
    assert report.method is Method.FIRST
    assert any("repair packing" in a.outcome and "outlast the time left" in a.outcome
               for a in report.attempts)
    check_schedule(topo, limited)
    assert mo.validate(topo, limited).rate_gbps == pytest.approx(limited.rate_gbps, rel=1e-9)
    assert report.bound_gbps >= full.lp_rate_gbps * (1 - 1e-9) >= limited.rate_gbps
    # without a limit nothing is sized: the same rates change nothing
    assert mo.solve_allgather(topo).rate_gbps == pytest.approx(full.rate_gbps, rel=1e-12)


def test_a_packing_that_cannot_fit_a_warm_stage_stops_the_stage_only(monkeypatch):
    """Inside a warm stage the sized packing abandons the stage (its caller goes on
    cold), not the solve's own limit; with the time left the packing runs as without
    a limit."""
    from mccl_opt.allgather.forestcoll.packing.repair import repair_pack

    lg_args = _logical(hpn(1, 2, 8))
    plain, _ = repair_pack(*lg_args)
    assert plain is not None
    packed, _ = anytime.limited(600.0, lambda: sized.limited_repair("a test", *lg_args))
    assert [(c.root, c.mult) for c in packed[0]] == [(c.root, c.mult) for c in plain]
    monkeypatch.setattr(sized, "PACKING_ENTRIES_PER_S", 1e-3)
    inner, stopped = anytime.limited(
        600.0, lambda: anytime.stage(600.0, lambda: sized.limited_repair("a test", *lg_args)))
    assert stopped is None and inner == (None, True)


def _logical(topo: mo.Topology):
    """ForestColl's logical graph of ``topo`` at its own ``k`` (Phases 1-2)."""
    from mccl_opt.allgather.canonical import canonical
    from mccl_opt.allgather.forestcoll.pack_steps import spread_logical
    from mccl_opt.allgather.forestcoll.pipeline import balanced_split, phase_one_budget

    topo = canonical(topo)
    budget = phase_one_budget(topo, None, {}, None, None)
    balanced = balanced_split(budget.fab, topo.arrays.is_switch, budget.k, budget.y, None,
                              None, budget.p1.rate)
    lg = spread_logical(balanced.split, topo.arrays.rank_of)
    return lg.num_gpus, lg.tail, lg.head, lg.units, balanced.k


def _one_way_leaf_spine() -> mo.Topology:
    return leaf_spine(2, 2, 4).with_capacity(src="u0h1g3", dst="u0leaf0", gbps=360.0,
                                             both_directions=False)


def _stop_master_after(monkeypatch, solves: int) -> list[int]:
    """Make the master's LP report its time limit from solve ``solves + 1`` on, as HiGHS
    does when the time left runs out inside it."""
    real = live_master.TreeMaster.solve
    calls = [0]

    def solve(self, where, method="auto", time_limit=None):
        calls[0] += 1
        return None if calls[0] > solves else real(self, where, method, time_limit)

    monkeypatch.setattr(live_master.TreeMaster, "solve", solve)
    return calls


def test_a_master_lp_stopped_at_the_limit_returns_the_last_master_trees(monkeypatch):
    """Column generation whose third master LP stops at the solve's limit returns the
    second master's trees: a valid schedule at status ``time_limit`` whose certified bound
    is at or above the independent optimum (the oracle's cut bound is above it)."""
    topo = _one_way_leaf_spine()
    eager = TreeCGOptions(seed_rounds=1, drop_after=1, drop_min_pool=1)
    full = solve_general(topo, max_chunks=None, options=eager)
    assert full.stats["cg_rounds"] > 3               # the stop below is mid-way
    calls = _stop_master_after(monkeypatch, 2)
    s, stopped = anytime.limited(600.0, lambda: solve_general(topo, max_chunks=None,
                                                               options=eager))
    assert stopped is None and calls[0] == 3         # returned by the method, not the limit
    assert s.stats["cg_status"] == "time_limit" and s.report.termination is Termination.TIME_LIMIT
    check_schedule(topo, s)
    assert mo.validate(topo, s).rate_gbps == pytest.approx(s.rate_gbps, rel=1e-9)
    assert s.report.bound_gbps >= full.lp_rate_gbps * (1 - 1e-9)
    assert s.rate_gbps <= full.rate_gbps * (1 + 1e-9) <= cut_bound(topo) * (1 + 1e-9)


def test_a_first_master_lp_stopped_at_the_limit_returns_the_best_offered(monkeypatch):
    """The first master LP stopped at the limit: no master trees yet, so the solve's own
    limit returns its best offered schedule, and a warm stage is abandoned."""
    topo = _one_way_leaf_spine()
    _stop_master_after(monkeypatch, 0)
    offered = mo.solve_allgather(hpn(1, 2, 4))

    def solve():
        anytime.offer(offered)
        return solve_general(topo, max_chunks=None)

    best, stopped = anytime.limited(600.0, solve)
    assert best is offered and "master LP at the time limit" in stopped.stopped_in
    result, declined = anytime.stage(600.0, lambda: solve_general(topo, max_chunks=None))
    assert result is None and declined


def test_the_lp_time_limit_is_the_time_left():
    assert anytime.lp_time_limit() is None
    left, _ = anytime.limited(600.0, anytime.lp_time_limit)
    assert 0 < left <= 600.0
    tiny, _ = anytime.limited(1e-9, anytime.lp_time_limit)
    assert tiny == pytest.approx(1e-3)               # solvers refuse a limit of 0
    assert 0.0 < anytime.limited(600.0, anytime.cpu_share)[0] <= 1.0


def test_a_limit_passing_inside_a_rooted_sweep_stops_the_solve_there(monkeypatch):
    """A rooted sweep (one max-flow per GPU: one compiled call of ~1 s at 1024 GPUs)
    runs under a limit in spans of sinks with a clock check between; the limit made to
    pass at the first such check (Phase 1's sweep of a 16-GPU fabric, one sink a span)
    stops the solve there, with the first schedule: valid, status
    ``time_limit``, bound at or above the optimum."""
    from mccl_opt.allgather.forestcoll import sweep_spans

    topo = hpn(1, 2, 8)
    full = mo.solve_allgather(topo)
    monkeypatch.setattr(sweep_spans, "SWEEP_WORK", 1)     # one sink per span
    real_check = anytime.check

    def check(where: str) -> None:
        if "rooted sweep" in where:
            anytime.run_out(where)
        real_check(where)

    monkeypatch.setattr(anytime, "check", check)
    limited = mo.solve_allgather(topo, time_limit=600.0)
    report = limited.report
    assert report.termination is Termination.TIME_LIMIT and report.method is Method.FIRST
    assert "rooted sweep" in report.attempts[-1].outcome
    check_schedule(topo, limited)
    assert report.bound_gbps >= full.lp_rate_gbps * (1 - 1e-9) >= limited.rate_gbps
