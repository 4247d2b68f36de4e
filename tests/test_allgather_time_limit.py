"""AllGather under a time limit and a warm budget (issue: AllGather without cliffs).

No test here times anything: a limit shorter than any solve, and a warm start made slow
on purpose, check what the solve *returns* (a valid schedule, its report, the rate cold
reaches), not how fast it was.
"""

from __future__ import annotations

import dataclasses
import time
from types import SimpleNamespace

import numpy as np
import pytest

import mccl_opt as mo
from instances import fail2, hpn
from mccl_opt import anytime
from mccl_opt.allgather import solve as ag_solve
from mccl_opt.allgather.warm import certify, route as warm_route
from mccl_opt.report import Method, SolveReport, Termination, WarmUse

from .oracle_allgather import check_schedule, cut_bound


def _one_way(topo: mo.Topology, src: str, dst: str, gbps: float) -> mo.Topology:
    return topo.with_capacity({(src, dst): gbps})


@pytest.mark.parametrize("topo", [hpn(1, 2, 8), fail2(hpn(1, 2, 8)),
                                  _one_way(hpn(1, 2, 8), "s0h0g1", "s0tor1", 100.0)],
                         ids=["healthy", "fail2", "one-way"])
def test_a_limit_shorter_than_the_solve_returns_a_valid_schedule_with_a_true_bound(topo):
    full = mo.solve_allgather(topo)
    limited = mo.solve_allgather(topo, time_limit=1e-6)
    report = limited.report
    assert report.termination is Termination.TIME_LIMIT
    assert mo.validate(topo, limited).rate_gbps == pytest.approx(limited.rate_gbps, rel=1e-9)
    check_schedule(topo, limited)   # independent checker
    # the bound is an upper bound on the optimum, and on the cut bound's side of it
    assert report.bound_gbps >= full.lp_rate_gbps * (1 - 1e-9)
    assert report.bound_gbps >= limited.rate_gbps
    assert report.certified_gap(limited.rate_gbps) == pytest.approx(
        1 - limited.rate_gbps / report.bound_gbps)
    assert any("time limit" in a.outcome for a in report.attempts)


def test_a_generous_limit_changes_nothing():
    topo = fail2(hpn(1, 2, 8))
    plain, limited = mo.solve_allgather(topo), mo.solve_allgather(topo, time_limit=600)
    assert limited.rate_gbps == pytest.approx(plain.rate_gbps, rel=1e-12)
    assert limited.report.termination is Termination.OPTIMAL
    assert limited.report.method is plain.report.method is Method.FORESTCOLL
    assert [a.method for a in limited.report.attempts][:1] == [Method.FIRST]


def test_the_first_schedule_of_a_warm_limited_solve_is_the_previous_trees():
    topo = hpn(1, 2, 8)
    old = mo.solve_allgather(topo)
    after = topo.with_capacity({("s0h0g0", "s0tor0"): 50.0, ("s0tor0", "s0h0g0"): 50.0})
    limited = mo.solve_allgather(after, warm=old, time_limit=1e-6)
    assert limited.report.method is Method.FIRST and limited.report.warm is WarmUse.KEPT
    assert [c.edges for c in limited.chunks] == [c.edges for c in old.chunks]
    assert mo.validate(after, limited).rate_gbps == pytest.approx(limited.rate_gbps, rel=1e-9)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), "1", True])
def test_a_bad_time_limit_is_a_typed_error(bad):
    with pytest.raises(mo.MCCLError, match="time_limit"):
        mo.solve_allgather(hpn(1, 2, 2), time_limit=bad)


@pytest.mark.warm_budget
def test_a_warm_start_over_its_budget_is_abandoned_for_cold(monkeypatch):
    """A warm start made slow on purpose: the solve declines it at its budget and
    returns cold's schedule (same rate), saying so in the report."""
    topo = hpn(1, 2, 8)
    old = mo.solve_allgather(topo)
    old.report = dataclasses.replace(old.report, cold_seconds=0.0, cold_cpu_seconds=0.0)     # budget: the floor
    after = topo.with_capacity({("s0h0g0", "s0tor0"): 50.0, ("s0tor0", "s0h0g0"): 50.0})
    cold = mo.solve_allgather(after)
    real_guess = certify.warm_guess

    def slow_guess(run):
        burn = time.thread_time() + warm_route.WARM_FLOOR_S + 0.03     # the allowance is CPU
        while time.thread_time() < burn:
            pass
        anytime.check("a warm guess made slow on purpose")
        return real_guess(run)

    monkeypatch.setattr(ag_solve, "warm_guess", slow_guess)
    warm = mo.solve_allgather(after, warm=old)
    assert warm.report.warm is WarmUse.DECLINED
    assert warm.rate_gbps == pytest.approx(cold.rate_gbps, rel=1e-12)
    assert any(a.outcome.startswith("declined: the warm allowance of")
               for a in warm.report.attempts)
    assert warm.stats["warm_route"] == "declined"
    assert warm.report.cold_seconds is not None        # the next budget is measured again


def test_warm_budget_follows_the_cold_time_carried():
    topo = hpn(1, 2, 8)
    cold = mo.solve_allgather(topo)
    assert cold.report.cold_seconds == pytest.approx(cold.report.seconds)
    warm = mo.solve_allgather(fail2(topo), warm=cold)
    assert warm.report.warm is not WarmUse.COLD
    assert (warm.report.cold_seconds, warm.report.cold_cpu_seconds) == \
        (cold.report.cold_seconds, cold.report.cold_cpu_seconds)      # carried, not re-measured
    assert warm_route.warm_allowance_s(warm) == pytest.approx(
        max(warm_route.WARM_FLOOR_S, warm_route.WARM_SHARE * cold.report.cold_cpu_seconds))
    bare = dataclasses.replace(cold, report=None)
    assert warm_route.warm_allowance_s(bare) is None                   # nothing to go by


def _chain(seed: int):
    """A seeded chain of one-way and two-way degradations and repairs on HPN 1x2x6."""
    rng = np.random.default_rng(seed)
    base = hpn(1, 2, 6)
    topo = base
    links = list(base.links)
    for _ in range(4):
        link = links[int(rng.integers(len(links)))]
        gbps = link.capacity_gbps * float(rng.choice([0.05, 0.25, 0.5, 0.7, 1.0, rng.uniform(0.01, 1)]))
        change = {(link.src, link.dst): gbps}
        if rng.random() < 0.5:
            change[link.dst, link.src] = gbps
        topo = topo.with_capacity(change)
        yield topo


@pytest.mark.parametrize("seed", range(6))
def test_warm_reaches_cold_exact_rate_along_event_chains(seed):
    """``max_chunks=None``: warm and cold give the same (exact) rate after every event,
    at the forwarding-only optimum of the independent oracle where it is a cut bound."""
    prev = mo.solve_allgather(hpn(1, 2, 6), max_chunks=None)
    for topo in _chain(seed):
        cold = mo.solve_allgather(topo, max_chunks=None)
        warm = mo.solve_allgather(topo, warm=prev, max_chunks=None)
        assert warm.rate_gbps == pytest.approx(cold.rate_gbps, rel=1e-6)
        assert warm.rate_gbps <= cut_bound(topo) * (1 + 1e-6)
        assert mo.validate(topo, warm).rate_gbps == pytest.approx(warm.rate_gbps, rel=1e-9)
        prev = warm


class _Clock:
    """A ``perf_counter`` that moves only when the test moves it: every limit passes at
    a known step, whatever the machine's load (a real 10 ms limit once passed before the
    first stage on a loaded machine)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_anytime_returns_the_best_offer_and_nests(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(anytime, "time", SimpleNamespace(perf_counter=clock,
                                                         thread_time=time.thread_time))

    class S:                        # anything with a rate can be offered
        def __init__(self, rate):
            self.rate_gbps = rate

    steps = []

    def solve():
        for rate in (1.0, 3.0, 2.0):
            anytime.offer(S(rate))
        result, declined = anytime.stage(0.0, lambda: anytime.check("inner") or S(9.0))
        assert result is None and declined            # its own sub-budget passed
        result, declined = anytime.stage(5.0, lambda: anytime.check("inner") or S(4.0))
        assert result.rate_gbps == 4.0 and not declined
        while True:
            clock.now += 1.0
            anytime.check("outer loop")
            steps.append(clock.now)

    best, stopped = anytime.limited(10.0, solve)
    assert best.rate_gbps == 3.0 and stopped.stopped_in == "outer loop" and stopped.offers == 3
    assert steps == [float(t) for t in range(1, 10)] and clock.now == 10.0

    lefts = []

    def nested():                   # the solve's limit passes inside a stage with time left
        anytime.offer(S(1.0))

        def attempt():
            lefts.append(anytime.time_left())         # the nearer of 60 s and the solve's 10
            clock.now += 20.0
            anytime.check("inside the stage")

        anytime.stage(60.0, attempt)
        raise AssertionError("the stage swallowed the solve's own limit")

    best, stopped = anytime.limited(10.0, nested)
    assert best.rate_gbps == 1.0 and stopped.stopped_in == "inside the stage"
    assert lefts == [10.0]
    assert anytime.limited(None, lambda: 5) == (5, None)
    anytime.check("no limit here")                   # a no-op outside a limit
    with pytest.raises(mo.SolveError, match="before any schedule"):
        anytime.limited(0.0, lambda: anytime.check("start"))


def test_late_lets_checks_run_past_the_limit_by_its_grace_only():
    """Inside ``late(g)`` a check passes up to ``g`` s past the solve's deadline (the time
    left still reads 0, and a stage inside gets no grace); after it, the limit stops."""
    class S:
        rate_gbps = 1.0

    seen = []

    def solve():
        anytime.offer(S())
        while anytime.limit_left() > 0:
            pass
        with anytime.late(600.0):
            anytime.check("late")                     # past the deadline, within the grace
            seen.append(anytime.limit_left())
            _, abandoned = anytime.stage(600.0, lambda: anytime.check("stage"))
            seen.append(abandoned)
        anytime.check("after")

    best, stopped = anytime.limited(0.001, solve)
    assert seen == [0.0, True] and stopped.stopped_in == "after"
    with anytime.late(1.0):                           # a no-op without a limit
        anytime.check("no limit")


def test_report_round_trips_through_a_file(tmp_path):
    sched = mo.solve_allgather(fail2(hpn(1, 2, 4)))
    path = tmp_path / "s.json"
    sched.save(path)
    again = mo.Schedule.load(path)
    assert again.report == sched.report and isinstance(again.report, SolveReport)
    bad = sched.to_dict()
    bad["report"] = {**bad["report"], "termination": "maybe"}
    with pytest.raises(mo.ScheduleError, match="'report' is malformed"):
        mo.Schedule.from_dict(bad)


def test_an_exact_packing_out_of_reach_hands_the_fabric_to_the_general_method(monkeypatch):
    """A leaf-spine fabric whose fast packers all get stuck (made to here: since sibling
    pairs go last in the spread split, the repair packer packs it), the few-trees packing
    given no max-flows (it packs this fabric: tests/test_allgather_few_trees.py), would reach
    Lovász's exact packing (one max-flow per tree edge: minutes there); with more than
    ``EXACT_PACK_MAX_EDGES`` tree edges ForestColl declines at once and the general
    method solves (at ``max_chunks=None``: with a chunk budget ForestColl is first asked
    for fewer chunks, tests/test_allgather_fewer_chunks.py)."""
    from instances.aggregation import leaf_spine
    from mccl_opt.allgather.forestcoll.packing import few_trees
    from mccl_opt.allgather.forestcoll import pack_steps
    from mccl_opt.allgather.forestcoll.packing.exact_packing import EXACT_PACK_MAX_EDGES

    monkeypatch.setattr(few_trees, "FEW_TREES_CHECKS_PER_N2", 0)
    monkeypatch.setattr(pack_steps, "_pack_repair", lambda *args, **kwargs: None)
    monkeypatch.setattr(pack_steps, "_pack_greedy", lambda *args, **kwargs: None)

    topo = leaf_spine(4, 2, 8).with_capacity({("spine1", "u0leaf0"): 80.0,
                                              ("u0leaf0", "spine1"): 80.0})
    assert topo.num_gpus * (topo.num_gpus - 1) > EXACT_PACK_MAX_EDGES
    sched = mo.solve_allgather(topo, max_chunks=None)
    assert sched.report.method is Method.GENERAL
    assert any(a.method is Method.FORESTCOLL and "exact tree packing" in a.outcome
               and "out of reach" in a.outcome for a in sched.report.attempts)
    assert mo.validate(topo, sched).rate_gbps == pytest.approx(sched.rate_gbps, rel=1e-9)
    assert sched.rate_gbps <= cut_bound(topo) * (1 + 1e-9)
    assert sched.rate_gbps >= 0.99 * sched.lp_rate_gbps


def test_a_large_fabric_under_a_short_limit_returns_the_line_schedule_with_a_true_bound():
    """128 GPUs (the first schedule is the compiled GPU line, :mod:`.first_line`), a
    limit shorter than the solve: a valid schedule, status ``time_limit``, and a bound
    at or above the optimum the unlimited solve reaches."""
    topo = hpn(2, 8, 8)
    full = mo.solve_allgather(topo)
    limited = mo.solve_allgather(topo, time_limit=1e-6)
    report = limited.report
    assert report.termination is Termination.TIME_LIMIT
    assert limited.stats["status"] == "time_limit"
    assert report.method is Method.FIRST
    assert limited.stats["method"] in ("line-trees", "shortest-path-trees")
    check_schedule(topo, limited)
    assert mo.validate(topo, limited).rate_gbps == pytest.approx(limited.rate_gbps, rel=1e-9)
    assert report.bound_gbps >= full.lp_rate_gbps * (1 - 1e-9)
    assert report.bound_gbps >= limited.rate_gbps > 0


def test_check_room_stops_before_a_phase_that_cannot_fit(monkeypatch):
    """A phase expected to take longer than the time left is not started: the solve
    stops there (named in the report) with the first schedule, not past the limit."""
    topo = hpn(2, 8, 8)
    monkeypatch.setattr(ag_solve, "PHASES_23_PER_PHASE_1", 1e9)
    limited = mo.solve_allgather(topo, time_limit=60.0)
    assert limited.report.termination is Termination.TIME_LIMIT
    assert any("before switch balancing" in a.outcome and "left" in a.outcome
               for a in limited.report.attempts)
    check_schedule(topo, limited)
    plain = mo.solve_allgather(topo)                   # no limit: check_room never stops
    assert plain.report.termination is Termination.OPTIMAL


def test_check_room_without_a_limit_or_with_room_does_nothing():
    anytime.check_room("nowhere", 1e9)                 # no limit: a no-op
    result, stopped = anytime.limited(60.0, lambda: anytime.check_room("here", 1.0) or "done")
    assert (result, stopped) == ("done", None)

    def too_long():
        anytime.check_room("the long phase", 1e9)
        return "finished"

    with pytest.raises(mo.MCCLError, match="the long phase"):
        anytime.limited(60.0, too_long)                 # nothing offered: a typed error


def test_numerical_trouble_under_a_limit_returns_the_first_schedule(monkeypatch):
    """Issue 27: a SolveError ("numerical trouble") after the first schedule was offered
    returns that schedule under a time limit, valid, the failure named in the report's
    attempts; without a limit the failure is still the caller's error."""
    topo = fail2(hpn(1, 2, 8))

    def trouble(*a, **k):
        raise mo.SolveError("tree master: numerical trouble (injected)")

    monkeypatch.setattr(ag_solve, "_chain", trouble)
    limited = mo.solve_allgather(topo, time_limit=60.0)
    assert limited.report.termination is Termination.TIME_LIMIT
    assert "numerical trouble (injected)" in limited.report.attempts[-1].outcome
    assert mo.validate(topo, limited).rate_gbps == pytest.approx(limited.rate_gbps, rel=1e-9)
    with pytest.raises(mo.SolveError, match="injected"):
        mo.solve_allgather(topo)
