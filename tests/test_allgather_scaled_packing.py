"""ForestColl above the tree limit (docs/allgather_history.md "Above the tree limit"): at
``max_chunks=None`` an exact ``k0`` of more than ``EXACT_TREES_LIMIT`` trees per root is
packed by the scaled packing only; its schedule delivers every chunk within every link's
capacity at the certified optimum, and the scaled packing's rounding raises every GPU's
ingress in one pass (without it, fabrics of more GPUs than the sweep's rounds fail)."""

from __future__ import annotations

import numpy as np
import pytest

import mccl_opt as mo
from instances import hpn
from mccl_opt.allgather import solve
from mccl_opt.allgather.budget import EXACT_TREES_LIMIT
from mccl_opt.allgather.chain import weaker_directions
from mccl_opt.allgather.forestcoll import sized
from mccl_opt.allgather.forestcoll.packing import scaled
from mccl_opt.allgather.forestcoll.removal.cut_guard import violated_set, violated_sets
from tests.oracle_allgather import check_schedule, cut_bound
from tests.test_allgather_scaled import _check_packing


@pytest.fixture(autouse=True)
def scaled_packing_at_every_size(monkeypatch):
    """The scaled packing runs from ``SEEDED_GENERAL_MAX_GPUS + 1`` GPUs (fabrics up to
    that size take the seeded general method first); tested here on small fabrics."""
    monkeypatch.setattr(solve, "SEEDED_GENERAL_MAX_GPUS", 0)


def _nic_degraded(shape: tuple[int, int, int], factor: float, both: bool = True) -> mo.Topology:
    """HPN with GPU 0's NIC cable at an odd fraction of its 400 Gbps (``both``: both ways)."""
    return hpn(*shape).with_capacity(src="s0h0g0", dst="s0tor0", gbps=round(400 * factor, 3),
                                     both_directions=both)


@pytest.mark.parametrize("shape,factor", [((1, 2, 8), 0.6181), ((2, 2, 8), 0.3137),
                                          ((1, 4, 8), 0.127)])
def test_above_the_limit_the_scaled_packing_reaches_the_certified_optimum(shape, factor):
    topo = _nic_degraded(shape, factor)
    sched = mo.solve_allgather(topo, max_chunks=None)
    assert sched.stats["k"] > EXACT_TREES_LIMIT         # main declined these to the general method
    assert sched.stats["scaled"] > 1 and sched.report.method.value == "forestcoll"
    assert sched.report.termination.value == "optimal"
    checked = check_schedule(topo, sched)               # every chunk delivered, capacities kept
    bound = cut_bound(topo)                             # independent of the solver
    assert sched.lp_rate_gbps == pytest.approx(bound, rel=1e-9)
    assert checked.rate_gbps == pytest.approx(sched.lp_rate_gbps, rel=1e-6)


@pytest.mark.parametrize("changes", [
    {("s0h0g1", "s0h0nvs"): 28.8, ("s0h0nvs", "s0h0g1"): 28.8, ("s0h0g5", "s0tor5"): 337.086},
    {("s0h0g0", "s0h0nvs"): 1780.128}])
def test_a_sub_fabric_above_the_limit_is_declined_its_own_solve_packs_it(changes):
    # unbalanced HPN 1x2x8: the weaker-direction fabric needs more than the limit; on the
    # chain's path it is declined at once as before (its scaled packing, where the weaker
    # optimum is the cut bound, measured 4x slower than the chain's next methods on
    # shared aggregation 2x8x8), while a solve of that balanced fabric itself packs it
    topo = hpn(1, 2, 8).with_capacity(changes)
    sched = mo.solve_allgather(topo, max_chunks=None)
    weaker = [a for a in sched.report.attempts if a.method.value == "forestcoll-weaker-directions"]
    # (or, earlier still, because its optimum is below the fabric's cut bound: at
    # max_chunks=None it could not certify, docs/allgather_history.md "Balanced fabrics past
    # the exact tree limit")
    assert weaker and weaker[0].outcome.startswith(
        ("declined: more than", "declined: its optimum is below the cut bound"))
    assert sched.report.termination.value == "optimal"
    checked = check_schedule(topo, sched)
    assert checked.rate_gbps <= cut_bound(topo) * (1 + 1e-9)
    sub = weaker_directions(topo)
    alone = mo.solve_allgather(sub, max_chunks=None)
    assert alone.stats["k"] > EXACT_TREES_LIMIT and alone.stats["scaled"] > 1
    assert check_schedule(sub, alone).rate_gbps == pytest.approx(cut_bound(sub), rel=1e-6)


def _tight_complete(n: int, k: int, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every ordered pair of ``n`` ranks; ``k ± d`` units on the links into each rank, so
    that every rank's ingress is exactly ``k·(n-1)``: each single-GPU cut is tight, and
    rounding ``units·k1/k`` down leaves every GPU short."""
    tail, head = (a.ravel() for a in np.meshgrid(np.arange(n), np.arange(n), indexing="ij"))
    keep = tail != head
    tail, head = tail[keep].astype(np.int64), head[keep].astype(np.int64)
    units = np.full(tail.size, k, np.int64)
    for v in range(n):
        into = np.flatnonzero(head == v)
        half = into.size // 2
        units[into[:half]] += d
        units[into[half: 2 * half]] -= d
    return tail, head, units


@pytest.mark.parametrize("n,k,d", [(40, 97, 3), (36, 131, 7)])
def test_every_tight_gpu_is_raised_without_running_out_of_rounds(n, k, d, monkeypatch):
    """More tight GPUs than rounding rounds: the ingress pass raises them all before any
    sweep (one passing sweep), and without it the lifts of the GPUs still short
    (:func:`scaled._short_gpus`, no sweep either); without both the sweep that goes on
    past a failing sink finds them all at once (one failing sweep, then a capped packing
instead of a passing sweep: the same packing as testing first); a sweep
    of one set per round (as before all three) runs out of rounds and the packing fails."""
    tail, head, units = _tight_complete(n, k, d)
    ranks = np.arange(n, dtype=np.int64)
    assert violated_set(n, ranks, k, (tail, head, units)) is None
    assert violated_set(n, ranks, k + 1, (tail, head, units)) is not None     # k is the most
    assert n > scaled.ROUNDING_ROUNDS
    classes, counters = scaled.scaled_pack(n, tail, head, units, k)
    assert classes is not None
    _check_packing(n, tail, head, units, k, classes)
    assert counters["scaled_tries"] == 1 and counters["ingress_raised"] >= n
    assert counters["rounding_sweeps"] == 1

    monkeypatch.setattr(scaled, "raise_ingress", lambda *args: 0)
    lifted, counters = scaled.scaled_pack(n, tail, head, units, k)  # the short GPUs' lifts
    assert lifted is not None and counters["rounding_sweeps"] == 1
    _check_packing(n, tail, head, units, k, lifted)

    monkeypatch.setattr(scaled, "_short_gpus", lambda *args: [])
    swept, counters = scaled.scaled_pack(n, tail, head, units, k)
    assert swept is not None and counters["rounding_sweeps"] == 1   # then a capped packing
    _check_packing(n, tail, head, units, k, swept)

    repair = scaled._repair                    # no capped packing: a second, passing sweep
    monkeypatch.setattr(scaled, "_repair", lambda g, u, kk, c, cap=None:
                        None if cap is not None else repair(g, u, kk, c))
    tested, counters = scaled.scaled_pack(n, tail, head, units, k)
    assert counters["rounding_sweeps"] == 2
    assert [(c.root, c.mult, c.parent_arc.tolist()) for c in tested] == \
        [(c.root, c.mult, c.parent_arc.tolist()) for c in swept]
    monkeypatch.setattr(scaled, "_repair", repair)

    every = scaled.violated_sets
    monkeypatch.setattr(scaled, "violated_sets", lambda *args: every(*args)[:1])
    without, counters = scaled.scaled_pack(n, tail, head, units, k)
    assert without is None and counters["scaled"] == 0
    assert counters["rounding_sweeps"] == scaled.ROUNDING_ROUNDS


def test_raise_ingress_meets_every_single_gpu_cut_within_the_room():
    n, k = 40, 97
    tail, head, units = _tight_complete(n, k, 3)
    s = -(-k // scaled.SCALED_TREES)
    k1 = k // s - 1
    u1 = units * k1 // k
    remainder = units * k1 - u1 * k
    fresh = (u1 + 1) * s <= units
    assert (np.bincount(head, weights=u1, minlength=n) < k1 * (n - 1)).all()
    scaled.raise_ingress(scaled.Logical(n, tail, head), u1, k1, remainder, fresh)
    assert (np.bincount(head, weights=u1, minlength=n) >= k1 * (n - 1)).all()
    assert (s * u1 <= units).all()


def test_repair_packings_inside_the_scaled_one_see_at_most_k_n_units(monkeypatch):
    # at 2.9 M trees per root the last residual keeps millions of units on links no tight
    # cut needs; each repair packing gets them capped at its k·n unit trees
    seen: list[tuple[int, int, int]] = []
    real = sized.repair_pack                    # every repair packing runs sized

    def spy(n, tail, head, units, k, *args, **kwargs):
        seen.append((n, k, int(units.max())))
        return real(n, tail, head, units, k, *args, **kwargs)

    monkeypatch.setattr(sized, "repair_pack", spy)
    topo = _nic_degraded((1, 2, 8), 0.3137)
    sched = mo.solve_allgather(topo, max_chunks=None)
    assert sched.stats["scaled"] > 1 and len(seen) > 2
    assert all(top <= k * n for n, k, top in seen)
    assert any(top == k * n for n, k, top in seen)       # the cap was binding
    assert check_schedule(topo, sched).rate_gbps == pytest.approx(cut_bound(topo), rel=1e-6)


def test_a_sweep_of_some_sinks_finds_the_sets_around_them():
    """The rounding's probe (:func:`scaled._sweep` of the GPUs short alone): the sets a
    sweep of chosen sinks finds each hold their failing sink and are violated, and those
    of the first sink are the whole sweep's first."""
    n, k = 12, 9
    tail, head, units = _tight_complete(n, k, 2)
    ranks = np.arange(n, dtype=np.int64)
    arcs = (tail, head, units)
    every = violated_sets(n, ranks, k + 1, arcs, n)
    assert len(every) and violated_sets(n, ranks, k, arcs, n, ranks[:3]).shape[0] == 0
    for v in (0, n - 1):
        some = violated_sets(n, ranks, k + 1, arcs, n, np.array([v]))
        assert some.shape[0] == 1 and some[0, v]
        inside = some[0]
        assert (k + 1) * int((~inside).sum()) > int(units[inside[head] & ~inside[tail]].sum())
    assert (violated_sets(n, ranks, k + 1, arcs, n, ranks[:1])[0] == every[0]).all()
