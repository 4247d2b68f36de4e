"""The AllGather warm route (``mccl_opt.allgather.warm.route``; docs/allgather.md, *Warm
never slower than cold*).

* over event chains on several small fabric families, a warm re-synthesis at
  ``max_chunks=None`` is valid and reaches cold's rate, and its report names the route;
* a warm start from a schedule of other GPUs is declined at once and reaches cold's rate;
* one allowance per solve: a warm step past it is declined once, and the later warm-started
  methods of the chain run cold (each had its own budget before);
* the general method is warm-started from its own columns only, never from ForestColl's trees;
* a previous schedule without a cold time gets a measured allowance, not none.

No test here times anything: a warm step made slow on purpose checks what the solve returns.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

import mccl_opt as mo
from instances import hpn
from instances.aggregation import leaf_spine, multi_spine, shared_aggregation, superpod
from mccl_opt import anytime
from mccl_opt.allgather import chain, solve as ag_solve
from mccl_opt.allgather.warm import certify, reroute as reroute_mod, route as warm_route
from mccl_opt.report import Method, SolveReport, WarmUse

from .oracle_allgather import check_schedule

FAMILIES = [hpn(1, 2, 4), shared_aggregation(2, 2, 4), leaf_spine(2, 2, 4),
            superpod(2, 2, 4, rails_per_leaf=2), multi_spine(2, 2, 2, spines=2)]

#: a one-way NIC degradation on HPN 1x2x4 that the weaker-direction fabric and then the
#: balanced restriction solve (two warm-started ForestColl runs in one solve)
ONE_WAY = {("s0h0g0", "s0h0nvs"): 180.0}


def _events(base: mo.Topology, seed: int, steps: int = 3):
    """One-way and two-way degradations (odd factors) and repairs of random cables."""
    rng = np.random.default_rng(seed)
    healthy = {(l.src, l.dst): l.capacity_gbps for l in base.links}
    topo = base
    for _ in range(steps):
        link = base.links[int(rng.integers(base.num_links))]
        kind = str(rng.choice(["one-way", "two-way", "repair"]))
        if kind == "repair":
            gbps = healthy[link.src, link.dst]
        else:
            gbps = round(link.capacity_gbps * float(rng.choice([0.05, 0.25, 0.5, 0.37])), 3)
        changes = {(link.src, link.dst): gbps}
        if kind != "one-way" and (link.dst, link.src) in healthy:
            changes[link.dst, link.src] = gbps if kind == "two-way" else healthy[link.dst, link.src]
        topo = topo.with_capacity(changes)
        yield topo


def _route_agrees(sched: mo.Schedule) -> None:
    """``stats["warm_route"]`` and ``report.warm`` tell the same story."""
    route = sched.stats["warm_route"]
    if sched.report.warm is WarmUse.COLD:
        assert route == "cold"
    elif sched.report.warm is WarmUse.DECLINED:
        assert route == "declined" and sched.stats["warm_declined"]
    else:
        assert route == "warm"


@pytest.mark.parametrize("base", FAMILIES, ids=lambda t: t.name)
@pytest.mark.parametrize("seed", [0, 1])
def test_warm_reaches_cold_rate_over_event_chains(base, seed):
    prev = mo.solve_allgather(base, max_chunks=None)
    assert prev.stats["warm_route"] == "cold"
    routes = []
    for topo in _events(base, seed):
        cold = mo.solve_allgather(topo, max_chunks=None)
        warm = mo.solve_allgather(topo, warm=prev, max_chunks=None)
        mo.validate(topo, warm)
        check_schedule(topo, warm, None)
        assert warm.rate_gbps == pytest.approx(cold.rate_gbps, rel=1e-9)
        _route_agrees(warm)
        routes.append(warm.stats["warm_route"])
        prev = warm
    assert set(routes) <= {"warm", "declined"} and "warm" in routes


@pytest.mark.parametrize("other", [hpn(1, 2, 2), leaf_spine(2, 1, 4)], ids=lambda t: t.name)
def test_a_warm_start_from_unrelated_trees_is_declined(other):
    topo = hpn(1, 2, 4).with_capacity(ONE_WAY)
    unrelated = mo.solve_allgather(other, max_chunks=None)
    cold = mo.solve_allgather(topo, max_chunks=None)
    warm = mo.solve_allgather(topo, warm=unrelated, max_chunks=None)
    mo.validate(topo, warm)
    assert warm.rate_gbps == pytest.approx(cold.rate_gbps, rel=1e-9)
    assert warm.report.warm is WarmUse.DECLINED and warm.stats["warm_route"] == "declined"
    assert warm.stats["warm_declined"].startswith("unrelated")
    assert warm.report.cold_seconds is not None       # measured again for the next start


@pytest.mark.warm_budget
def test_one_allowance_per_solve(monkeypatch):
    """The first warm guess overruns the allowance: it is declined once, and the
    balanced restriction's ForestColl later in the chain does not try its own guess."""
    base = hpn(1, 2, 4)
    old = mo.solve_allgather(base, max_chunks=None)
    topo = base.with_capacity(ONE_WAY)
    cold = mo.solve_allgather(topo, max_chunks=None)
    assert [a.method for a in cold.report.attempts] == [
        Method.WEAKER_DIRECTIONS, Method.BALANCED_RESTRICTION]
    calls = []
    real_guess = certify.warm_guess

    def slow_guess(run):
        calls.append(run.topo.name)
        burn = time.thread_time() + warm_route.WARM_FLOOR_S + 0.03     # the allowance is CPU
        while time.thread_time() < burn:
            pass
        anytime.check("a warm guess made slow on purpose")
        return real_guess(run)

    monkeypatch.setattr(ag_solve, "warm_guess", slow_guess)
    old.report = dataclasses.replace(old.report, cold_seconds=0.0, cold_cpu_seconds=0.0)     # allowance: the floor
    warm = mo.solve_allgather(topo, warm=old, max_chunks=None)
    assert len(calls) == 1
    declined = [a for a in warm.report.attempts if a.outcome.startswith("declined: the warm")]
    assert len(declined) == 1
    assert warm.report.warm is WarmUse.DECLINED and warm.stats["warm_route"] == "declined"
    assert warm.rate_gbps == pytest.approx(cold.rate_gbps, rel=1e-9)
    mo.validate(topo, warm)


def test_the_general_method_warm_starts_from_its_own_columns_only(monkeypatch):
    monkeypatch.setattr(chain, "solve_by_restriction", lambda *args, **kwargs: None)
    monkeypatch.setattr(chain, "_restriction_seed",          # no certified seed
                        lambda *args, **kwargs: chain.SeedOnce(lambda: None))
    base = hpn(1, 2, 4)
    forestcoll = mo.solve_allgather(base, max_chunks=None)
    topo = base.with_capacity(ONE_WAY)
    from_trees = mo.solve_allgather(topo, warm=forestcoll, max_chunks=None)
    assert from_trees.report.method is Method.GENERAL
    assert from_trees.stats["warm_columns"] == 0                  # ForestColl's trees unused
    assert from_trees.report.warm is WarmUse.DECLINED
    later = topo.with_capacity({("s0h1g2", "s0tor2"): 150.0})
    cold = mo.solve_allgather(later, max_chunks=None)
    warm = mo.solve_allgather(later, warm=from_trees, max_chunks=None)
    assert warm.report.method is Method.GENERAL
    assert warm.stats["warm_columns"] > 0 and warm.report.warm is WarmUse.COLUMNS
    assert warm.stats["warm_route"] == "warm"
    assert warm.rate_gbps == pytest.approx(cold.rate_gbps, rel=1e-9)
    mo.validate(later, warm)


def test_previous_columns_wait_until_the_restriction_seed_falls_short(monkeypatch):
    """With a restriction seed that reaches its certified bound at once, the previous
    columns are not loaded (they only made the first master LP larger: multi-spine 2x4x8,
    warm 1.2-1.5x cold); the rate is cold's."""
    monkeypatch.setattr(chain, "solve_by_restriction", lambda *args, **kwargs: None)
    topo = hpn(1, 2, 4).with_capacity(ONE_WAY)
    first = mo.solve_allgather(topo, max_chunks=None)
    assert first.report.method is Method.GENERAL and first.stats["seed"] == "balanced restriction"
    later = topo.with_capacity({("s0h1g2", "s0tor2"): 150.0})
    cold = mo.solve_allgather(later, max_chunks=None)
    warm = mo.solve_allgather(later, warm=first, max_chunks=None)
    assert cold.stats["pricing_s"] == 0.0 and "seed_more_columns" not in cold.stats, \
        "the test needs a seed whose own trees certify"
    assert warm.stats["warm_columns"] == 0 and warm.stats["cg_rounds"] == cold.stats["cg_rounds"]
    assert warm.stats["columns"] == cold.stats["columns"]
    assert warm.rate_gbps == pytest.approx(cold.rate_gbps, rel=1e-9)
    mo.validate(later, warm)


def test_a_seeded_general_method_is_not_a_warm_stage(monkeypatch):
    """With a restriction seed the general method's first master is the seed's alone,
    as cold's: it runs once, not as a warm stage whose expiry would redo it cold
    (SuperPOD 2x2x8 after two one-way faults: the allowance spent in that master, then
    the master again)."""
    monkeypatch.setattr(chain, "solve_by_restriction", lambda *args, **kwargs: None)
    steps: list[str] = []
    attempt = warm_route.WarmRoute.attempt

    def recorded(self, step, *args, **kwargs):
        steps.append(step)
        return attempt(self, step, *args, **kwargs)

    monkeypatch.setattr(warm_route.WarmRoute, "attempt", recorded)
    topo = hpn(1, 2, 4).with_capacity(ONE_WAY)
    first = mo.solve_allgather(topo, max_chunks=None)
    later = topo.with_capacity({("s0h1g2", "s0tor2"): 150.0})
    steps.clear()
    warm = mo.solve_allgather(later, warm=first, max_chunks=None)
    assert warm.report.method is Method.GENERAL and warm.stats["seed"] == "balanced restriction"
    assert "the general method" not in steps
    assert [a.method for a in warm.report.attempts].count(Method.GENERAL) == 1
    assert warm.rate_gbps == pytest.approx(mo.solve_allgather(later, max_chunks=None).rate_gbps,
                                           rel=1e-9)
    mo.validate(later, warm)


@pytest.mark.warm_budget
def test_a_previous_schedule_without_its_cold_time_gets_a_measured_allowance():
    """A schedule written without a report carries no cold time: the allowance is the
    measured proxy (this fabric's exact Phase 1), not unbounded, and the warm start runs."""
    base = hpn(1, 2, 4)
    bare = dataclasses.replace(mo.solve_allgather(base, max_chunks=None), report=None)
    assert warm_route.warm_allowance_s(bare) is None
    topo = base.with_capacity({("s0h1g2", "s0tor2"): 150.0, ("s0tor2", "s0h1g2"): 150.0})
    route = warm_route.WarmRoute.plan(topo, bare)
    assert route.active and warm_route.WARM_FLOOR_S <= route.total < float("inf")
    warm = mo.solve_allgather(topo, warm=bare, max_chunks=None)
    assert warm.rate_gbps == pytest.approx(mo.solve_allgather(topo, max_chunks=None).rate_gbps,
                                           rel=1e-9)
    _route_agrees(warm)
    mo.validate(topo, warm)


def test_the_report_says_whether_the_cold_solve_was_costly():
    """``cold_costly``: true when the cold solve went past ForestColl on the fabric itself
    (here an unbalanced fabric: the weaker directions and the balanced restriction),
    false for ForestColl, carried by a warm solve with ``cold_seconds``, and kept by the
    report's JSON view (a value that is not a flag is a typed error)."""
    base = hpn(1, 2, 4)
    plain = mo.solve_allgather(base, max_chunks=None)
    assert plain.report.method is Method.FORESTCOLL and plain.report.cold_costly is False
    topo = base.with_capacity(ONE_WAY)
    costly = mo.solve_allgather(topo, max_chunks=None)
    assert costly.report.method is not Method.FORESTCOLL and costly.report.cold_costly is True
    later = topo.with_capacity({("s0h1g2", "s0tor2"): 150.0, ("s0tor2", "s0h1g2"): 150.0})
    warm = mo.solve_allgather(later, warm=costly, max_chunks=None)
    assert warm.report.warm not in (WarmUse.COLD, WarmUse.DECLINED)      # the trees reused
    assert (warm.report.cold_seconds, warm.report.cold_costly) == \
        (costly.report.cold_seconds, True)
    view = costly.report.to_dict()
    assert SolveReport.from_dict(view) == costly.report
    with pytest.raises(mo.ScheduleError, match="flag"):
        SolveReport.from_dict({**view, "cold_costly": "yes"})


@pytest.mark.warm_budget
def test_a_costly_cold_time_does_not_size_the_allowance_on_a_balanced_fabric():
    """A previous schedule whose cold solve was costly (unbalanced fabric) and long, warm
    starting a repaired, balanced fabric: ForestColl solves that cold in a fraction of
    the carried time, so the allowance is the measured proxy, not 0.25 x the carried
    time; on an unbalanced fabric, or from a cheap cold solve, the carried time counts.
    Either way the warm solve reaches cold's rate."""
    base = hpn(1, 2, 4)
    costly = mo.solve_allgather(base.with_capacity(ONE_WAY), max_chunks=None)
    assert costly.report.cold_costly is True
    long_ago = dataclasses.replace(costly.report, cold_seconds=1000.0, cold_cpu_seconds=1000.0)
    costly.report = long_ago
    carried = warm_route.WARM_SHARE * 1000.0
    repaired = warm_route.WarmRoute.plan(base, costly)
    assert repaired.active and repaired.total < carried
    still = base.with_capacity({("s0h0g0", "s0h0nvs"): 200.0})      # unbalanced again
    assert warm_route.WarmRoute.plan(still, costly).total == pytest.approx(carried)
    costly.report = dataclasses.replace(long_ago, cold_costly=False)
    assert warm_route.WarmRoute.plan(base, costly).total == pytest.approx(carried)
    costly.report = long_ago
    warm = mo.solve_allgather(base, warm=costly, max_chunks=None)
    mo.validate(base, warm)
    assert warm.rate_gbps == pytest.approx(mo.solve_allgather(base, max_chunks=None).rate_gbps,
                                           rel=1e-9)


#: a two-way NVLink halving on HPN 1x2x4 whose warm solve reroutes the previous trees
HALVED = {("s0h0g0", "s0h0nvs"): 150.0, ("s0h0nvs", "s0h0g0"): 150.0}


def test_a_warm_start_predicted_costlier_than_cold_is_declined_before_rerouting(monkeypatch):
    """Rerouting predicted costlier than this state's cold solve (here: cold predicted
    free, no floor) declines the route before any rerouting pass runs; the schedule is cold's,
    valid at cold's rate.  With the measured constants the same state is rerouted."""
    base = hpn(1, 2, 4)
    old = mo.solve_allgather(base, max_chunks=None)
    topo = base.with_capacity(HALVED)
    cold = mo.solve_allgather(topo, max_chunks=None)
    warm = mo.solve_allgather(topo, warm=old, max_chunks=None)
    assert warm.stats["warm_route"] == "warm" and warm.stats["reroute"] == "done"
    passes = []
    monkeypatch.setattr(reroute_mod, "_edit", lambda *args: passes.append(1))
    monkeypatch.setattr(reroute_mod, "COLD_S_PER_ENTRY", 0.0)
    monkeypatch.setattr(reroute_mod, "REROUTE_FLOOR_S", 0.0)
    warm = mo.solve_allgather(topo, warm=old, max_chunks=None)
    assert passes == []
    assert warm.stats["warm_route"] == "declined" and warm.report.warm is WarmUse.DECLINED
    assert warm.stats["warm_declined"].startswith("rerouting")
    assert warm.rate_gbps == pytest.approx(cold.rate_gbps, rel=1e-9)
    check_schedule(topo, warm)


def test_rerouting_is_sized_by_the_previous_cold_solve(monkeypatch):
    """The cold cost rerouting is capped by is the previous cold solve's measured time
    scaled by ``k / k_prev`` (never above it) where that is below the ``k·n²``
    prediction: a previous cold solve measured free declines the route before any
    rerouting pass, where the prediction alone reroutes (the test above).  Only a
    schedule solved cold carries a ``k`` and a time of one solve."""
    base = hpn(1, 2, 4)
    old = mo.solve_allgather(base, max_chunks=None)
    k_prev, cold_prev = old.stats["k"], old.report.cold_cpu_seconds
    n = base.num_gpus
    assert reroute_mod.calibrated_cold_seconds(2 * k_prev, n, old) == cold_prev
    assert reroute_mod.calibrated_cold_seconds(1, n, old) == pytest.approx(cold_prev / k_prev)
    assert reroute_mod.calibrated_cold_seconds(1, n + 1, old) is None
    topo = base.with_capacity(HALVED)
    paid = mo.solve_allgather(topo, warm=old, max_chunks=None)
    assert paid.report.warm is WarmUse.REROUTED
    assert reroute_mod.calibrated_cold_seconds(1, n, paid) is None
    assert reroute_mod.calibrated_cold_seconds(1, n, dataclasses.replace(old, report=None)) is None
    passes = []
    monkeypatch.setattr(reroute_mod, "_edit", lambda *args: passes.append(1))
    monkeypatch.setattr(reroute_mod, "REROUTE_FLOOR_S", 0.0)
    old.report = dataclasses.replace(old.report, cold_seconds=0.0, cold_cpu_seconds=0.0)
    warm = mo.solve_allgather(topo, warm=old, max_chunks=None)
    assert passes == [] and warm.report.warm is WarmUse.DECLINED
    assert warm.stats["warm_declined"].startswith("rerouting")
    assert warm.rate_gbps == pytest.approx(paid.rate_gbps, rel=1e-9)
    check_schedule(topo, warm)


def test_rerouting_counts_the_warm_steps_already_spent(monkeypatch):
    """One budget for the warm path: rerouting's cap is what is left of it after the
    solve's earlier warm steps (``WarmRoute.spent``), so with the cap spent before it the
    route is declined before any move is weighed, where the same state (a cold solve
    made costly, no floor) is rerouted otherwise; the schedule is cold's."""
    monkeypatch.setattr(reroute_mod, "REROUTE_FLOOR_S", 0.0)
    monkeypatch.setattr(reroute_mod, "COLD_S_PER_ENTRY", 1.0)
    base = hpn(1, 2, 4)
    old = mo.solve_allgather(base, max_chunks=None)
    old.report = dataclasses.replace(old.report, cold_seconds=1e3, cold_cpu_seconds=1e3)
    topo = base.with_capacity(HALVED)
    paid = mo.solve_allgather(topo, warm=old, max_chunks=None)
    assert paid.report.warm is WarmUse.REROUTED
    passes = []
    monkeypatch.setattr(reroute_mod, "_reroute_edges", lambda *args: passes.append(1))
    monkeypatch.setattr(warm_route.WarmRoute, "spent", lambda self, since: 1e6)
    warm = mo.solve_allgather(topo, warm=old, max_chunks=None)
    assert passes == [] and warm.report.warm is WarmUse.DECLINED
    assert "spent warm" in warm.stats["warm_declined"]
    assert warm.rate_gbps == pytest.approx(paid.rate_gbps, rel=1e-9)
    check_schedule(topo, warm)


def test_the_rerouting_forecast_counts_the_chain_searches(monkeypatch):
    """The forecast's chain term is :func:`reroute._chain_work` summed over the crossing
    edges (repeated heads counted each time) whose head has no in-path with room on every
    link (only there the chain search runs): all of them when every link is full, none
    when one link into a head is free."""
    rng = np.random.default_rng(5)
    n, m = 9, 40
    head = rng.integers(0, n, m)
    into = np.argsort(head, kind="stable").astype(np.int64)
    into_start = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(head, minlength=n), out=into_start[1:])
    tail = rng.integers(0, n, m).astype(np.int64)
    paths = reroute_mod.Paths(np.arange(m + 1), np.arange(m), tail, into_start, into)
    cand_v = rng.integers(0, n, 15).astype(np.int64)
    for name in ("REROUTE_S_PER_PATH", "REROUTE_S_PER_SLOT"):
        monkeypatch.setattr(reroute_mod, name, 0.0)
    monkeypatch.setattr(reroute_mod, "REROUTE_S_PER_CHAIN_PATH", 1.0)
    cap = np.full(m, 2, np.int64)
    full = reroute_mod.Units(cap.copy(), cap)
    chain, _ = reroute_mod.predicted_seconds(paths, cand_v, full, 3, 1, n)
    assert chain == sum(reroute_mod._chain_work(int(v), paths) for v in cand_v) > 0
    one_free = cap.copy()
    one_free[into[into_start[cand_v[0]]]] = 1          # a first choice into cand_v[0]
    chain_free, _ = reroute_mod.predicted_seconds(paths, cand_v, reroute_mod.Units(one_free, cap),
                                                  3, 1, n)
    hits = int((cand_v == cand_v[0]).sum())
    assert chain_free == chain - hits * reroute_mod._chain_work(int(cand_v[0]), paths)
    free = reroute_mod.Units(np.zeros(m, np.int64), cap)
    assert reroute_mod.predicted_seconds(paths, cand_v, free, 3, 1, n)[0] == 0.0


def test_a_warm_stage_counts_cpu_seconds_not_wall():
    """A warm stage is a budget of this thread's CPU seconds: waiting (a loaded machine,
    modelled by a sleep) does not spend it, computing does."""
    def wait():
        time.sleep(0.03)
        anytime.check("after waiting")
        return "done"

    def compute():
        until = time.thread_time() + 0.03
        while time.thread_time() < until:
            pass
        anytime.check("after computing")
        return "done"

    assert anytime.stage(0.01, wait, cpu=True) == ("done", False)
    assert anytime.stage(0.01, compute, cpu=True) == (None, True)
    assert anytime.stage(0.01, wait) == (None, True)          # a wall-clock stage


def test_the_warm_caps_follow_the_cold_cpu_time(tmp_path):
    """The report carries the cold solve's CPU seconds next to its wall seconds (kept by
    a schedule file, carried by a warm solve); the warm allowance and rerouting's
    calibrated cold cost are sized by the CPU time, not by a wall time inflated by load;
    a file written before the field loads, its wall time standing in."""
    base = hpn(1, 2, 4)
    old = mo.solve_allgather(base, max_chunks=None)
    assert old.report.cold_cpu_seconds is not None
    path = tmp_path / "old.json"
    old.save(path)
    assert mo.Schedule.load(path).report.cold_cpu_seconds == old.report.cold_cpu_seconds
    warm = mo.solve_allgather(base.with_capacity(HALVED), warm=old, max_chunks=None)
    assert warm.report.warm is WarmUse.REROUTED
    assert warm.report.cold_cpu_seconds == old.report.cold_cpu_seconds
    old.report = dataclasses.replace(old.report, cold_seconds=2000.0, cold_cpu_seconds=400.0)
    assert warm_route.warm_allowance_s(old) == pytest.approx(warm_route.WARM_SHARE * 400.0)
    k_prev, n = old.stats["k"], base.num_gpus
    assert reroute_mod.calibrated_cold_seconds(k_prev, n, old) == pytest.approx(400.0)
    view = old.report.to_dict()
    del view["cold_cpu_seconds"]                                  # a file written before
    before = SolveReport.from_dict(view)
    assert before.cold_cpu_seconds is None and before.cold_cpu == 2000.0
    old.report = before
    assert warm_route.warm_allowance_s(old) == pytest.approx(warm_route.WARM_SHARE * 2000.0)
    assert reroute_mod.calibrated_cold_seconds(k_prev, n, old) == pytest.approx(2000.0)


def test_a_guess_is_not_certified_by_a_packing_as_costly_as_cold(monkeypatch):
    """A wrong ``x*`` guess certified by packing adds a whole Phase 3 (cold's own work
    at the guessed budget) to the cold solve that follows (multi-spine 2x2x8 at
    ``max_chunks=None`` after a one-way fault, fuzz seed 3414): with the allowance and
    the rerouting cap out of the way, no such packing runs where it is predicted above
    the floor, and warm still reaches cold's rate."""
    monkeypatch.setattr(warm_route, "WARM_SHARE", 1e3)
    monkeypatch.setattr(reroute_mod, "REROUTE_COLD_SHARE", 1e6)
    packings = []
    real = certify._certify_by_packing
    monkeypatch.setattr(certify, "_certify_by_packing",
                        lambda *args: packings.append(1) or real(*args))
    base = multi_spine(2, 2, 8, spines=2)
    old = mo.solve_allgather(base, max_chunks=None)
    topo = base.with_capacity({("spine0", "s1tor4"): 100.0})
    warm = mo.solve_allgather(topo, warm=old, max_chunks=None)
    cold = mo.solve_allgather(topo, max_chunks=None)
    assert packings == []
    assert warm.rate_gbps == pytest.approx(cold.rate_gbps, rel=1e-9)
    check_schedule(topo, warm)


@pytest.mark.warm_budget
def test_a_declined_seeded_packing_leaves_its_spread_split_to_cold(monkeypatch):
    """The spread split does not depend on the previous trees: a warm solve whose packing
    seeded with them overruns its cap computes it once, and the cold fallback packs that
    same logical graph to cold's rate."""
    from mccl_opt.allgather.forestcoll import pack_steps

    base = hpn(1, 2, 4)
    old = mo.solve_allgather(base, max_chunks=None)
    topo = base.with_capacity(src="s0h0g1", dst="s0tor1", gbps=131.0, both_directions=True)
    cold = mo.solve_allgather(topo, max_chunks=None)
    splits: list[int] = []
    real_spread, real_pack = pack_steps.spread_logical, ag_solve.pack

    def counted(*args, **kwargs):
        splits.append(1)
        return real_spread(*args, **kwargs)

    def slow_seeded(*args, **kwargs):
        packed = real_pack(*args, **kwargs)
        if args[5] is None:                                # shapes: cold's own packing
            return packed
        while True:                                        # the seeded packing overruns
            burn = time.thread_time() + 0.01
            while time.thread_time() < burn:
                pass
            anytime.check("a seeded packing made slow on purpose")

    monkeypatch.setattr(pack_steps, "spread_logical", counted)
    monkeypatch.setattr(ag_solve, "spread_logical", counted, raising=False)
    monkeypatch.setattr(ag_solve, "pack", slow_seeded)
    monkeypatch.setattr(ag_solve, "_certified_guess", lambda run: None)
    monkeypatch.setattr(ag_solve, "keep_or_reroute", lambda run, budget: None)
    warm = mo.solve_allgather(topo, warm=old, max_chunks=None)
    assert any("the packing seeded" in a.outcome for a in warm.report.attempts)
    assert len(splits) == 1 and warm.stats["warm_route"] == "declined"
    assert warm.rate_gbps == pytest.approx(cold.rate_gbps, rel=1e-9)
    check_schedule(topo, warm)
