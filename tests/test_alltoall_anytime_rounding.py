"""Bounded, never-worse rounding (docs/alltoall.md, *The warm schedule is a floor* and
*The dive's budget*): a warm AllToAll solve, time-limited or not, never returns a
schedule slower than the warm start's own schedule re-rated on the new fabric, and the
deep dive stops at its time budget with the plain roundings' best, reported as such."""

from __future__ import annotations

import pytest

from instances import degrade, dgx, hpn
from mccl_opt import validate
from mccl_opt.alltoall import solve_alltoall
from mccl_opt.alltoall.assemble import make_schedule
from mccl_opt.alltoall.direct import routed_outcome
from mccl_opt.alltoall.driver import cold_routing
from mccl_opt.alltoall.kept import keep_if_better, kept_schedule
from mccl_opt.alltoall.problem import problem_for
from mccl_opt.alltoall import rounding


@pytest.mark.parametrize("limit", [1e-6, None])
def test_a_warm_solve_is_never_slower_than_the_warm_schedule_re_rated(limit):
    fabric = hpn(1, 2, 8)
    g = fabric.gpus[0]
    tor = next(l.dst for l in fabric.links if l.src == g and "tor" in l.dst)
    # a NIC at half speed (one path per pair is then not optimal), solved; then it
    # falls a little further: the old schedule stays near-optimal
    base = degrade(fabric, g, tor, fabric.link(g, tor).capacity_gbps * 0.5)
    healthy = solve_alltoall(base)
    topo = degrade(base, g, tor, base.link(g, tor).capacity_gbps * 0.9)
    kept = kept_schedule(problem_for(topo), healthy.warm_state, 10, topo.num_nodes - 1)
    assert kept is not None and kept.rate > 0
    sched = solve_alltoall(topo, warm=healthy, time_limit=limit)
    validate(topo, sched)
    assert sched.rate_gbps >= kept.rate * (1 - 1e-9)
    # the routed first schedule of a time-limited full path is slower: the floor lifts it
    prob = problem_for(topo)
    steps = topo.num_nodes - 1
    routed = routed_outcome(prob, cold_routing(prob, steps, None)[0], 10, "highs", steps)
    lifted = make_schedule(prob, keep_if_better(routed, kept), 10)
    assert make_schedule(prob, routed, 10).rate_gbps < kept.rate
    assert lifted.rate_gbps == pytest.approx(kept.rate, rel=1e-12)
    assert lifted.stats["rounding"] == "kept" and lifted.lp_rate_gbps >= lifted.rate_gbps
    validate(topo, lifted)


def test_no_floor_when_the_old_schedule_is_not_valid_on_the_new_fabric():
    base = hpn(1, 2, 4)
    healthy = solve_alltoall(base)
    assert kept_schedule(problem_for(hpn(1, 2, 8)), healthy.warm_state, 10, 15) is None
    prob = problem_for(base)
    assert kept_schedule(prob, healthy.warm_state, 4, base.num_nodes - 1) is None   # other K
    assert kept_schedule(prob, healthy.warm_state, 10, base.num_nodes - 1) is not None


def test_the_dive_stops_at_its_budget_with_an_honest_gap(monkeypatch):
    topo = dgx()                      # 10-chunk roundings lose 5 % against the LP here
    # ... which is the whole-chunk cut bound (no 10-chunk schedule does better, so no
    # dive runs: test_alltoall_chunk_bound.py); without it, the dive tries
    monkeypatch.setattr(rounding, "chunk_bound_gbps", lambda topo, k: float("inf"))
    full = solve_alltoall(topo)
    assert full.stats["dive_steps"] > 0 and "stopped_by" not in full.stats
    monkeypatch.setattr(rounding, "DIVE_BUDGET_FACTOR", 0.0)
    monkeypatch.setattr(rounding, "DIVE_BUDGET_MIN_S", 0.0)
    cut = solve_alltoall(topo)
    validate(topo, cut)
    assert cut.stats["dive_steps"] == 0 and cut.stats["stopped_by"] == "dive budget"
    assert cut.rate_gbps < cut.lp_rate_gbps and cut.lp_rate_gbps == pytest.approx(full.lp_rate_gbps)
    assert cut.rate_gbps >= cut.stats["lr_rate"]      # at least the plain roundings' best
