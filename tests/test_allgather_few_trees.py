"""The few-trees packing (:mod:`mccl_opt.allgather.forestcoll.packing.few_trees`, compiled
Lovász growth; docs/allgather_history.md "Narrow NIC links: the few-trees packing").

Leaf-spine fabrics whose every NIC link is narrow admit a packing (the rooted cut test
passes) that the repair and greedy packers miss; the few-trees packing must complete it,
and what it returns must be a packing: ``k`` trees per root, each a spanning arborescence
of the logical graph, no link above its units.  Where the graph does not admit ``k`` it
must return ``None``, never a partial or over-full packing."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import mccl_opt as mo
from instances import hpn
from instances.aggregation import leaf_spine, superpod
from instances.designs import dragonfly
from mccl_opt.allgather.canonical import canonical
from mccl_opt.allgather import quotient_stages
from mccl_opt.allgather.forestcoll.maxflow import INF, FlowNetwork
from mccl_opt.allgather.forestcoll.packing.few_trees import few_trees_pack
from mccl_opt.allgather.forestcoll.packing.growth_checks import _short_paths_flow
from mccl_opt.allgather.forestcoll.packing.forecast import (NO_FORECAST, TRUST, Forecast,
                                                             few_trees_visits, forecast,
                                                             hopeless)
from mccl_opt.allgather.forestcoll.packing.repair import repair_pack
from mccl_opt.allgather.forestcoll.packing.trees import greedy_pack
from mccl_opt.allgather.forestcoll.pipeline import balanced_split, phase_one_budget
from mccl_opt.allgather.forestcoll.removal.exact_split import split_all
from mccl_opt.allgather.forestcoll.removal.splitting import LogicalGraph
from mccl_opt.report import Method
from tests.oracle_allgather import check_schedule, cut_bound


def _exact_logical(topo: mo.Topology, max_chunks: int | None) -> tuple[LogicalGraph, int]:
    """The exact split's logical graph of ``topo`` at its chunk budget, and ``k``."""
    topo = canonical(topo)
    budget = phase_one_budget(topo, max_chunks, {})
    arr = topo.arrays
    balanced = balanced_split(budget.fab, arr.is_switch, budget.k, budget.y, max_chunks)
    g = balanced.split.copy()
    assert split_all(g)
    return LogicalGraph.from_split(g, arr.rank_of), balanced.k


def _assert_packing(lg: LogicalGraph, k: int, classes) -> None:
    """``k`` spanning arborescences per root within every link's units."""
    n = lg.num_gpus
    load = np.zeros(lg.units.size, np.int64)
    per_root = np.zeros(n, np.int64)
    for c in classes:
        assert c.mult >= 1 and c.parent_arc[c.root] == -1
        per_root[c.root] += c.mult
        for v in range(n):
            if v == c.root:
                continue
            a = int(c.parent_arc[v])
            assert a >= 0 and lg.head[a] == v, "every rank is entered by a link into it"
            load[a] += c.mult
            x, steps = v, 0
            while x != c.root:                  # the parent links lead to the root
                x = int(lg.tail[c.parent_arc[x]])
                steps += 1
                assert steps < n, "a cycle in a tree"
    assert (per_root == k).all()
    assert (load <= lg.units).all(), "a link above its units"


def test_narrow_nic_links_pack_where_the_fast_packers_get_stuck():
    """leaf-spine 8x2x4, 4 spines: one tree per root and every host's NIC ingress holds
    exactly one unit per tree of another host, so each tree must enter each host once."""
    lg, k = _exact_logical(leaf_spine(8, 2, 4, spines=4), 10)
    assert k == 1 and lg.admits(k)
    assert repair_pack(lg.num_gpus, lg.tail, lg.head, lg.units, k)[0] is None
    assert greedy_pack(lg.num_gpus, lg.tail, lg.head, lg.units, k, {}) is None
    classes = few_trees_pack(lg.num_gpus, lg.tail, lg.head, lg.units, k)
    assert classes is not None
    _assert_packing(lg, k, classes)


def test_many_trees_per_root_pack_as_classes():
    """Classes with multiplicities: 7 trees per root (a spine cable at 80 Gbps), every
    link's load counted with the classes' multiplicities."""
    topo = leaf_spine(4, 2, 8).with_capacity({("spine1", "u0leaf0"): 80.0,
                                              ("u0leaf0", "spine1"): 80.0})
    lg, k = _exact_logical(topo, None)
    assert k == 7
    classes = few_trees_pack(lg.num_gpus, lg.tail, lg.head, lg.units, k)
    assert classes is not None and any(c.mult > 1 for c in classes)
    _assert_packing(lg, k, classes)


def test_a_graph_that_does_not_admit_k_is_refused():
    """One tree per root more than the rooted cut condition allows: ``None``; and a
    max-flow budget too small to finish: ``None`` too."""
    lg, k = _exact_logical(leaf_spine(8, 2, 4, spines=4), 10)
    assert not lg.admits(k + 1)
    assert few_trees_pack(lg.num_gpus, lg.tail, lg.head, lg.units, k + 1) is None
    info: dict[str, int] = {}
    assert few_trees_pack(lg.num_gpus, lg.tail, lg.head, lg.units, k, 100, info) is None
    assert info["few_trees_checks"] > 100


@pytest.mark.parametrize("max_chunks", [10, None])
def test_leaf_spine_with_narrow_nics_is_solved_by_forestcoll_at_the_optimum(max_chunks,
                                                                          proportional_spread):
    """The solve: ForestColl with a certified packing (the few-trees one, or the repair
    packing since the guarded split starts from the fabric's tight sets), not the general
    method, at the cut bound (the fabric is balanced: the forwarding-only optimum)."""
    topo = leaf_spine(8, 2, 4, spines=4)
    s = mo.solve_allgather(topo, max_chunks=max_chunks)
    assert s.report.method is Method.FORESTCOLL
    assert s.stats["packing"] in ("exact", "repair")
    check_schedule(topo, s, max_chunks)
    assert mo.validate(topo, s).rate_gbps == pytest.approx(s.rate_gbps, rel=1e-9)
    assert s.rate_gbps == pytest.approx(cut_bound(topo), rel=1e-9)


def test_restriction_with_hundreds_of_trees_per_root_packs_exactly(monkeypatch):
    """Leaf-spine 4x2x8 with rank 0's NIC uplink at 360 Gbps one way, ``None``: the
    balanced restriction needs 583 trees per root; the scaled packing cannot round the
    spread split's thin links into a leaf and the repair packers get stuck on the exact
    split, so the few-trees packing must pack it at the restriction's certified optimum
    (the seeded quotient, which certifies this state sooner, is kept out)."""
    monkeypatch.setattr(quotient_stages, "SEEDED_QUOTIENT_MAX_COPIES", 0)
    topo = leaf_spine(4, 2, 8).with_capacity(src="u0h0g0", dst="u0leaf0", gbps=360.0,
                                             both_directions=False)
    s = mo.solve_allgather(topo, max_chunks=None)
    assert s.report.method is Method.BALANCED_RESTRICTION
    assert s.stats["packing"] == "exact"
    check_schedule(topo, s, None)
    assert mo.validate(topo, s).rate_gbps == pytest.approx(s.rate_gbps, rel=1e-9)
    assert s.rate_gbps == pytest.approx(s.lp_rate_gbps, rel=1e-9)
    assert s.rate_gbps <= cut_bound(topo) * (1 + 1e-9)


@pytest.mark.parametrize("build", [
    lambda: leaf_spine(8, 2, 4, spines=4),
    lambda: leaf_spine(4, 2, 8).with_capacity({("spine1", "u0leaf0"): 80.0,
                                               ("u0leaf0", "spine1"): 80.0}),
])
def test_exact_split_keeps_cut_condition_and_units(build):
    """The exact split (one flow network per switch, docs/allgather.md "The exact split's
    flow network") removes every switch, keeps the rooted cut condition for ``k`` and rides
    every physical link within its units."""
    topo = canonical(build())
    budget = phase_one_budget(topo, None, {})
    arr = topo.arrays
    balanced = balanced_split(budget.fab, arr.is_switch, budget.k, budget.y, None)
    physical = dict(balanced.split.units)
    lg, k = _exact_logical(build(), None)
    assert lg.admits(k) and (lg.units > 0).all()
    load: dict[tuple[int, int], int] = {}
    for i, bundle in enumerate(lg.bundles):
        assert sum(units for _, units in bundle) == lg.units[i]
        for path, units in bundle:
            assert not arr.is_switch[path[0]] and not arr.is_switch[path[-1]]
            for arc in zip(path, path[1:]):
                load[arc] = load.get(arc, 0) + units
    assert all(load[arc] <= physical.get(arc, 0) for arc in load), "a link above its units"


def test_repair_searches_before_the_exact_packing_are_forecast_at_none(monkeypatch):
    """At ``None`` a failed repair packing is followed by the exact few-trees packing, so
    every repair search carries the forecast (:mod:`...packing.forecast`): it decides at
    ``k·n²`` visits and stops by ``k·n²`` plus the few-trees estimate, the guarded split's
    too (uncapped they ran to the end: 6.2 s CPU on leaf-spine 8x2x8 with 4 spines), the
    rail-first retry's at ``k·n² / RAIL_FIRST_VISITS_SHARE``; and the solve still reaches
    the cut bound."""
    from mccl_opt.allgather.forestcoll import sized
    from mccl_opt.allgather.forestcoll.pack_steps import RAIL_FIRST_VISITS_SHARE

    calls: list[tuple[int, int, int, int, Forecast, bool]] = []
    real = sized.repair_pack

    def spy(n, tail, head, units, k, shapes=None, shift=1, max_visits=1 << 62,
            rail_first=None, fc=NO_FORECAST):
        classes, info = real(n, tail, head, units, k, shapes, shift, max_visits, rail_first, fc)
        calls.append((n, k, max_visits, info.get("repair_visits", 0), fc, bool(rail_first)))
        return classes, info

    monkeypatch.setattr(sized, "repair_pack", spy)
    topo = leaf_spine(8, 2, 4, spines=4)
    s = mo.solve_allgather(topo, max_chunks=None)
    assert calls and all(k == 1 for _, k, _, _, _, _ in calls)
    for n, k, cap, visits, fc, rail_first in calls:
        if rail_first:
            assert fc == NO_FORECAST and cap == k * n * n // RAIL_FIRST_VISITS_SHARE
        else:
            assert fc == Forecast(k * n * n, few_trees_visits(n))
            assert cap == k * n * n + few_trees_visits(n)
        assert visits <= cap + n * n
    check_schedule(topo, s, None)
    # the guarded split's repair packing completes since sibling pairs go last; where it
    # does not, the exact few-trees packing follows
    assert s.stats["packing"] in ("repair", "exact")
    assert s.rate_gbps == pytest.approx(cut_bound(topo), rel=1e-9)


#: the forecast of the test below made at ``k·n² / EARLY``: SuperPOD 2x2x8's first repair
#: packing completes at ~0.8 ``k·n²`` visits (1.4 before wide NIC links were narrowed)
EARLY = 4


@pytest.mark.parametrize("variant", ["forecast", "always stop", "never stop"])
def test_the_forecast_path_does_not_change_the_optimum(monkeypatch, variant):
    """SuperPOD 2x2x8 at ``None``, the forecast made at ``k·n² / EARLY`` visits: whether the
    first repair packing goes on past it (the forecast), stops there (the few-trees
    packing of the exact split follows) or is never stopped, the schedule is
    valid at the cut bound."""
    from mccl_opt.allgather.forestcoll import pack_steps

    alt = {"forecast": None, "always stop": 1, "never stop": 0}[variant]

    def early(n: int, k: int) -> tuple[Forecast, int]:
        fc, cap = forecast(n, k)
        if alt == 0:
            return NO_FORECAST, 1 << 62
        return Forecast(fc.decide_at // EARLY, fc.alt_visits if alt is None else alt), cap

    monkeypatch.setattr(pack_steps, "forecast", early)
    topo = superpod(2, 2, 8)
    s = mo.solve_allgather(topo, max_chunks=None)
    check_schedule(topo, s, None)
    assert s.rate_gbps == pytest.approx(cut_bound(topo), rel=1e-9)
    decide_at = s.stats["k"] * topo.num_gpus ** 2 // EARLY
    if variant == "always stop":                # the few-trees packing follows
        assert s.stats.get("repair_forecast_stop") == 1
    else:                           # went on past the decision and completed
        assert s.stats["packing"] == "repair" and s.stats["repair_visits"] > decide_at
        assert "repair_forecast_stop" not in s.stats


def test_forecast_decides_once_from_the_progress_rate():
    """:func:`hopeless`: nothing before ``decide_at``; there, stop when the entries left at
    the rate placed since half of it would take more visits than the few-trees estimate
    (or nothing was placed), else go on for ``TRUST`` times that rest, at most the
    estimate."""
    fc = Forecast(100, 1000)

    def run(steps):
        mark = np.full(3, -1, np.int64)
        return [bool(hopeless(fc, v, missing, mark)) for v, missing in steps]

    # placed 100 entries in 50 visits: 300 left take 150 visits, so it may run TRUST x that
    limit = 100 + TRUST * 150
    assert run([(50, 400), (99, 310), (100, 300), (limit, 10), (limit + 1, 5)]) == \
        [False, False, False, False, True]
    assert run([(50, 400), (100, 390)]) == [False, True]      # 390 left at 0.2 / visit
    assert run([(50, 400), (100, 400)]) == [False, True]      # no progress
    # a rest forecast near the estimate (617 visits): the estimate bounds the run
    assert run([(50, 400), (100, 370), (1100, 1), (1101, 1)]) == [False, False, False, True]



def test_weaker_direction_leaves_the_exact_packing_to_the_general_method(monkeypatch):
    """At ``None`` the weaker-direction fabric's exact split and few-trees packing are left
    to the chain's next method (docs/allgather_history.md "Few-trees cliffs at 128 GPUs"): with
    the fast packers made to fail, ForestColl on it fails typed, never reaching the
    few-trees packing (which would pack it), and a later method solves the fabric at the
    cut bound."""
    from mccl_opt.allgather.forestcoll import pack_steps

    monkeypatch.setattr(pack_steps, "_pack_repair", lambda *a, **kw: None)
    monkeypatch.setattr(pack_steps, "_pack_greedy", lambda *a, **kw: None)
    monkeypatch.setattr(pack_steps, "plain_pack", lambda *a, **kw: None)
    topo = leaf_spine(2, 2, 8).with_capacity(src="u0h0nvs", dst="u0h0g1", gbps=210.0,
                                             both_directions=False)   # 61 trees per root
    s = mo.solve_allgather(topo, max_chunks=None)
    first = s.report.attempts[0]
    assert first.method is Method.WEAKER_DIRECTIONS
    assert first.outcome.startswith("failed") and "left to the next method" in first.outcome
    assert s.report.method is not Method.WEAKER_DIRECTIONS
    check_schedule(topo, s, None)
    assert s.rate_gbps == pytest.approx(cut_bound(topo), rel=1e-9)


def test_weaker_direction_past_the_cheap_entries_skips_the_guarded_split(monkeypatch):
    """A declinable weaker-direction packing whose spread split fails the rooted test (one
    global dragonfly cable at 0.9 one way) is left to the next method before the guarded
    split (docs/allgather_history.md "One-way dragonfly: no guarded split, half the seed first"); the
    chain still returns a valid schedule at the next method's certified optimum."""
    from mccl_opt.allgather.forestcoll import pack_steps
    from mccl_opt.allgather.forestcoll.pack_plan import Goal

    goals: list[Goal] = []                  # the goal of each pack, in order
    guarded: list[bool] = []                # per guarded split: whether in a declinable pack
    real_plan, real = pack_steps.plan_pack, pack_steps.guarded_spread

    def plan_spy(goal, k, n):
        goals.append(goal)
        return real_plan(goal, k, n)

    def spy(*a, **kw):
        guarded.append(goals[-1] is Goal.DECLINABLE)
        return real(*a, **kw)

    monkeypatch.setattr(pack_steps, "plan_pack", plan_spy)
    monkeypatch.setattr(pack_steps, "guarded_spread", spy)
    topo = dragonfly(4, 2, 1, 8).with_capacity(src="d0r0", dst="d1r0", gbps=720.0,
                                               both_directions=False)
    s = mo.solve_allgather(topo, max_chunks=None)
    first = s.report.attempts[0]
    assert first.method is Method.WEAKER_DIRECTIONS and "left to the next method" in first.outcome
    # the next method: ForestColl packing the balanced restriction exactly (few exact trees
    # per root) or the seeded general method, either at its certified optimum
    assert Goal.DECLINABLE in goals and not any(guarded)
    assert s.report.method in (Method.BALANCED_RESTRICTION, Method.GENERAL) and s.report.optimal
    assert s.report.bound_gbps == pytest.approx(s.lp_rate_gbps, rel=1e-9)
    check_schedule(topo, s, None)


def test_short_paths_flow_never_exceeds_the_checks_max_flow():
    """The flow that skips a check's max-flow must be a lower bound on the check's
    ``{s, u} -> v`` max-flow (else a check that fails would pass) and sometimes reach it: random
    multigraphs with parallel links and unstarted trees, against Dinic."""
    rng = np.random.default_rng(7)
    tight = 0
    for _ in range(40):
        n = int(rng.integers(3, 8))
        tail = rng.integers(0, n, 24)
        head = rng.integers(0, n, 24)
        keep = tail != head
        tail, head = tail[keep].astype(np.int64), head[keep].astype(np.int64)
        units = rng.integers(0, 5, tail.size).astype(np.int64)
        unstarted = rng.integers(0, 3, n).astype(np.int64)
        pair = np.zeros((n, n), np.int64)
        np.add.at(pair, (tail, head), units)
        net = FlowNetwork(n, tail, head)
        left, short = np.zeros(n, np.int64), np.zeros(n, np.int64)
        for u in range(n):
            for v in range(n):
                if u == v:
                    continue
                caps = np.concatenate([units, unstarted, np.zeros(n, np.int64)])
                caps[tail.size + u] = INF
                caps[tail.size + n + v] = INF
                flow = net.max_flow(caps)
                bound = _short_paths_flow(u, v, n, pair, unstarted, INF, left, short)
                assert bound <= flow
                tight += bound == flow
    assert tight > 0


def test_tight_graphs_made_of_known_trees_always_pack():
    """A union of ``k`` random spanning arborescences per root is a tight graph (every
    rank's in-units exactly the ``k (n - 1)`` trees owed to it) that admits ``k``: the
    packing must complete it (Lovász) within every link's units.  Links taken unchecked
    and verified in batches (a failed sweep rolling the class back), and classes grown
    lazily in batches verified by one sweep (a failed one rolling the batch back, which
    happens on these graphs), may keep no state a check would refuse, else a later class
    gets stuck, nor a rolled-back class's units; with ``max_checks=0`` no sweep runs and
    nothing is returned."""
    rng = np.random.default_rng(11)
    swept = rolled = kept = 0
    for _ in range(30):
        n, k = int(rng.integers(4, 11)), int(rng.integers(1, 4))
        units: dict[tuple[int, int], int] = {}
        for r in range(n):
            for _ in range(k):
                order = [r] + [int(v) for v in rng.permutation([v for v in range(n) if v != r])]
                for i in range(1, n):       # each rank's parent: one placed before it
                    u = order[int(rng.integers(0, i))]
                    units[u, order[i]] = units.get((u, order[i]), 0) + 1
        pairs = sorted(units)
        lg = SimpleNamespace(num_gpus=n, tail=np.array([p[0] for p in pairs], np.int64),
                             head=np.array([p[1] for p in pairs], np.int64),
                             units=np.array([units[p] for p in pairs], np.int64))
        info: dict[str, int] = {}
        classes = few_trees_pack(n, lg.tail, lg.head, lg.units, k, info=info)
        assert classes is not None
        _assert_packing(lg, k, classes)
        swept += info["few_trees_checks"] > 0
        rolled += info["few_trees_rollbacks"]
        kept += info["few_trees_batches"] > info["few_trees_rollbacks"]
        assert few_trees_pack(n, lg.tail, lg.head, lg.units, k, 0) is None
    assert swept > 0 and rolled > 0 and kept > 0


def test_tight_graph_sums_every_ranks_in_units():
    """``tight``: every rank's in-units are exactly the ``k (n - 1)`` trees owed to it;
    one unit more anywhere, or one tree fewer, and it is not."""
    from mccl_opt.allgather.forestcoll.pack_steps import tight

    lg, k = _exact_logical(superpod(2, 2, 8), None)
    assert tight(lg, k) and not tight(lg, k - 1)
    lg.units[0] += 1
    assert not tight(lg, k)


def test_tight_graph_tries_the_few_trees_packing_before_greedy(monkeypatch):
    """At ``None`` on a tight logical graph where the repair packings fail, the exact
    few-trees packing runs before the greedy portfolio (which must use every unit there),
    and the solve reaches the cut bound without it."""
    from mccl_opt.allgather.forestcoll import pack_steps

    order: list[str] = []
    real_few = pack_steps._few_trees
    monkeypatch.setattr(pack_steps, "_pack_repair", lambda *a, **kw: None)
    monkeypatch.setattr(pack_steps, "_pack_greedy",
                        lambda *a, **kw: order.append("greedy"))
    monkeypatch.setattr(pack_steps, "_few_trees",
                        lambda *a, **kw: order.append("few") or real_few(*a, **kw))
    topo = superpod(2, 2, 8)
    sched = mo.solve_allgather(topo, max_chunks=None)
    assert order == ["few"] and sched.stats["packing"] == "exact"
    check_schedule(topo, sched)
    assert sched.rate_gbps == pytest.approx(cut_bound(topo), rel=1e-9)


def test_loose_graph_tries_the_few_trees_packing_before_greedy(monkeypatch):
    """At ``None`` the few-trees packing goes before greedy on a graph that is *not* tight
    too, once the repair packings failed (one-way scrambled dragonfly 4x4x1x8 at ``k = 31``:
    greedy 1.0 s, failing); the solve still reaches the cut bound."""
    from mccl_opt.allgather.forestcoll import pack_steps

    order: list[str] = []
    real_few = pack_steps._few_trees

    def few(split, rank_of, k, stats, lg, kind):
        order.append("few" if not pack_steps.tight(lg, k) else "few on a tight graph")
        return real_few(split, rank_of, k, stats, lg, kind)

    monkeypatch.setattr(pack_steps, "_pack_repair", lambda *a, **kw: None)
    monkeypatch.setattr(pack_steps, "_pack_greedy", lambda *a, **kw: order.append("greedy"))
    monkeypatch.setattr(pack_steps, "_few_trees", few)
    topo = hpn(1, 2, 4).with_capacity(src="s0h0g1", dst="s0tor1", gbps=150.0,
                                      both_directions=True)
    sched = mo.solve_allgather(topo, max_chunks=None)
    assert order == ["few"] and sched.stats["packing"] == "exact"
    check_schedule(topo, sched)
    assert sched.rate_gbps == pytest.approx(cut_bound(topo), rel=1e-9)


def test_many_trees_per_root_try_the_few_trees_packing_before_rail_first_and_greedy(
        monkeypatch):
    """From ``FEW_BEFORE_FAST_K`` trees per root at ``None``, where the repair packing
    (whose plain search has had its ``k·n²`` visits) fails on a graph that admits ``k``,
    the few-trees packing runs next, before the rail-first repair and the greedy portfolio
    (narrow-NIC dragonfly 4x2x1x8: 0.1-0.2 s each, both failing), and the solve still
    reaches the cut bound."""
    from mccl_opt.allgather.forestcoll import pack_steps
    from mccl_opt.allgather.forestcoll.pack_plan import FEW_BEFORE_FAST_K

    order: list[str] = []
    real_few = pack_steps._few_trees
    monkeypatch.setattr(pack_steps, "_pack_repair",
                        lambda *a, **kw: order.append("rail-first" if kw.get("rail_first")
                                                      else "repair"))
    monkeypatch.setattr(pack_steps, "_pack_greedy", lambda *a, **kw: order.append("greedy"))
    monkeypatch.setattr(pack_steps, "_few_trees",
                        lambda *a, **kw: order.append("few") or real_few(*a, **kw))
    topo = hpn(1, 2, 4).with_capacity(src="s0h0g1", dst="s0tor1", gbps=4.0,
                                      both_directions=True)
    sched = mo.solve_allgather(topo, max_chunks=None)
    assert sched.stats["k"] >= FEW_BEFORE_FAST_K
    assert order == ["repair", "few"] and sched.stats["packing"] == "exact"
    check_schedule(topo, sched)
    assert sched.rate_gbps == pytest.approx(cut_bound(topo), rel=1e-9)


@pytest.mark.parametrize("topo, skipped", [
    (dragonfly(4, 1, 1, 8).with_capacity(src="d0r0h0g2", dst="d0r0", gbps=20.0,
                                         both_directions=True), True),
    (dragonfly(3, 1, 1, 4).with_capacity(src="d0r0h0g2", dst="d0r0", gbps=4.0,
                                         both_directions=True), False)])
def test_a_narrow_tight_rank_leaves_the_guarded_split_to_the_few_trees_packing(
        monkeypatch, topo, skipped):
    """From ``FEW_BEFORE_FAST_K`` trees per root at ``None``, on a guarded graph where a
    rank is its own tight set with an in-link of fewer than ``k`` units (a narrow NIC), the
    guarded split's repair packing is skipped for the few-trees packing (narrow-NIC
    dragonfly 4x2x1x8: 0.44 s, failing); a guarded graph without one still runs it.
    Both solves reach the cut bound."""
    from mccl_opt.allgather.forestcoll import pack_steps
    from mccl_opt.allgather.forestcoll.pack_plan import FEW_BEFORE_FAST_K

    guarded: list[bool] = []
    real_repair = pack_steps._pack_repair

    def repair(*a, **kw):
        guarded.append(bool(kw.get("guarded")))
        return real_repair(*a, **kw)

    monkeypatch.setattr(pack_steps, "_pack_repair", repair)
    sched = mo.solve_allgather(topo, max_chunks=None)
    assert sched.stats["k"] >= FEW_BEFORE_FAST_K
    assert (True not in guarded) == skipped
    assert sched.stats["packing"] == ("exact" if skipped else "repair")
    check_schedule(topo, sched)
    assert sched.rate_gbps == pytest.approx(cut_bound(topo), rel=1e-9)
