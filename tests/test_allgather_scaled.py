"""Scaled packing of many trees per root (mccl_opt.allgather.forestcoll.packing.scaled,
docs/allgather_history.md "Exact rate with many trees per root"): the classes it returns are a
packing of exactly ``k`` spanning trees per root within every link's units, and a solve
that takes it keeps the exact optimum (independent oracle)."""

from __future__ import annotations

import numpy as np
import pytest

import mccl_opt as mo
from instances.aggregation import shared_aggregation
from mccl_opt.allgather.forestcoll.packing.scaled import SCALED_MIN_K, scaled_pack
from mccl_opt.allgather.forestcoll.removal.cut_guard import violated_set
from tests.oracle_allgather import check_schedule, cut_bound


def _complete(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every ordered pair of ``n`` ranks, random units in [300, 420)."""
    rng = np.random.default_rng(seed)
    tail, head = (a.ravel() for a in np.meshgrid(np.arange(n), np.arange(n), indexing="ij"))
    keep = tail != head
    tail, head = tail[keep].astype(np.int64), head[keep].astype(np.int64)
    return tail, head, rng.integers(300, 420, tail.size).astype(np.int64)


def _most_trees(n: int, tail: np.ndarray, head: np.ndarray, units: np.ndarray) -> int:
    """The largest ``k`` the rooted cut condition admits (binary search)."""
    ranks = np.arange(n, dtype=np.int64)
    lo, hi = 0, int(units.sum())
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if violated_set(n, ranks, mid, (tail, head, units)) is None:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _check_packing(n: int, tail: np.ndarray, head: np.ndarray, units: np.ndarray, k: int,
                   classes) -> None:
    per_root = np.zeros(n, np.int64)
    load = np.zeros(units.size, np.int64)
    for c in classes:
        assert c.mult > 0 and c.parent_arc[c.root] == -1
        arcs = c.parent_arc[np.arange(n) != c.root]
        assert (arcs >= 0).all(), "the tree does not span"
        assert (head[arcs] == np.flatnonzero(np.arange(n) != c.root)).all()
        for v in range(n):                          # every rank reaches the root
            seen, u = 0, v
            while u != c.root:
                u, seen = int(tail[c.parent_arc[u]]), seen + 1
                assert seen < n, "a cycle"
        per_root[c.root] += c.mult
        np.add.at(load, arcs, c.mult)
    assert (per_root == k).all()
    assert (load <= units).all()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scaled_packing_is_a_packing_of_k_trees_per_root(seed):
    n = 7
    tail, head, units = _complete(n, seed)
    k = _most_trees(n, tail, head, units)
    assert k >= SCALED_MIN_K
    classes, counters = scaled_pack(n, tail, head, units, k)
    assert classes is not None
    assert counters["scaled"] > 1
    _check_packing(n, tail, head, units, k, classes)
    assert len(classes) < k * n                     # fewer classes than unit trees


def test_scaled_packing_refuses_more_trees_than_fit():
    n = 6
    tail, head, units = _complete(n, 3)
    k = _most_trees(n, tail, head, units)
    classes, _ = scaled_pack(n, tail, head, units, k + 1)
    assert classes is None


def test_odd_nvlink_solves_exactly_through_the_scaled_packing():
    """An NVLink degraded both ways to an odd capacity: the exact optimum needs 1137 trees
    per root; the solve packs them scaled and reaches the oracle's cut bound."""
    topo = shared_aggregation(2, 1, 8)
    topo = topo.with_capacity({("s1h0g2", "s1h0nvs"): 36.608, ("s1h0nvs", "s1h0g2"): 36.608})
    s = mo.solve_allgather(topo, max_chunks=None)
    check_schedule(topo, s)
    assert s.stats["k"] >= SCALED_MIN_K and s.stats["scaled"] > 1
    assert s.rate_gbps == pytest.approx(cut_bound(topo), rel=1e-6)



def _one_way_nic_logical(src: str, dst: str):
    """The spread split's logical graph and exact ``k`` of shared aggregation 2x4x8 with
    one NIC cable at 1 % of its speed (both ways) (103 trees per root over thin links)."""
    from mccl_opt.allgather.forestcoll.pack_steps import spread_logical
    from mccl_opt.allgather.forestcoll.pipeline import balanced_split, phase_one_budget
    topo = shared_aggregation(2, 4, 8).with_capacity(src=src, dst=dst, gbps=4.0)
    budget = phase_one_budget(topo, None, {})
    arr = topo.arrays
    split = balanced_split(budget.fab, arr.is_switch, budget.k, budget.y, None).split
    return topo, spread_logical(split, arr.rank_of), budget.k


@pytest.mark.parametrize("src,dst", [("s0h0g0", "s0tor0"), ("s0tor0", "s0h0g0")])
def test_wide_margins_scale_thin_links_into_a_tight_host(src, dst, proportional_spread):
    """Rounding ``units·k1/k`` down on the spread split's many thin links into a host
    loses more than the one-tree margin: the narrow scaled packing fails, the wide one
    (wider margins, several units on one link into a tight GPU) is a packing of exactly
    ``k`` trees per root, and the solve reaches the oracle's cut bound (no schedule
    exceeds it, so the rate is the forwarding-only optimum)."""
    topo, lg, k = _one_way_nic_logical(src, dst)
    assert k >= SCALED_MIN_K
    n = lg.num_gpus
    assert scaled_pack(n, lg.tail, lg.head, lg.units, k)[0] is None
    classes, counters = scaled_pack(n, lg.tail, lg.head, lg.units, k, wide=True)
    assert classes is not None and counters["scaled"] > 1
    _check_packing(n, lg.tail, lg.head, lg.units.astype(np.int64), k, classes)
    s = mo.solve_allgather(topo, max_chunks=None)
    check_schedule(topo, s)
    assert s.rate_gbps == pytest.approx(cut_bound(topo), rel=1e-6)


def test_the_wide_attempt_reuses_the_narrow_attempts_violated_sets(proportional_spread):
    """The narrow attempt's violated sets (``known``, filled in place) hold for every
    margin: the wide attempt started from them is still a packing of exactly ``k`` trees
    per root, and sweeps fewer times than the wide attempt alone (it does not find them
    again)."""
    _, lg, k = _one_way_nic_logical("s0h0g0", "s0tor0")
    n = lg.num_gpus
    known: list[np.ndarray] = []
    assert scaled_pack(n, lg.tail, lg.head, lg.units, k, known=known)[0] is None and known
    alone = scaled_pack(n, lg.tail, lg.head, lg.units, k, wide=True)[1]
    classes, counters = scaled_pack(n, lg.tail, lg.head, lg.units, k, wide=True, known=known)
    assert classes is not None
    _check_packing(n, lg.tail, lg.head, lg.units.astype(np.int64), k, classes)
    assert counters["rounding_sweeps"] < alone["rounding_sweeps"]
