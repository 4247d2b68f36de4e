"""Balanced rounding of a restriction's tree units (mccl_opt.allgather.forestcoll.removal.unit_rounding,
docs/allgather_history.md "Balanced restriction rounding"): one-way degradations on aggregation
fabrics solve by ForestColl on the balanced restriction, at the independent
forwarding-only optimum with ``max_chunks=None``, whatever the node names and order."""

from __future__ import annotations

import numpy as np
import pytest

import mccl_opt as mo
from instances.aggregation import multi_spine, scrambled, shared_aggregation
from mccl_opt.allgather.forestcoll.throughput import Fabric, _violated_cut
from mccl_opt.allgather.forestcoll.removal.unit_rounding import MAX_LOSS, balanced_units
from tests.oracle_allgather import check_schedule, forwarding_optimum


def _one_way(topo: mo.Topology, src: str, dst: str, factor: float) -> mo.Topology:
    link = next(l for l in topo.links if (l.src, l.dst) == (src, dst))
    return topo.with_capacity({(src, dst): link.capacity_gbps * factor})


# small enough for the oracle LP: 8 GPUs, unbalanced switches after the fault
CASES = [
    (lambda: shared_aggregation(2, 1, 4), "s0h0g2", "s0tor2", 0.5),
    (lambda: shared_aggregation(2, 2, 2), "s1tor0", "agg", 0.3),
    (lambda: multi_spine(2, 1, 4, spines=2), "s0h0g1", "s0tor1", 0.37),
    (lambda: multi_spine(2, 2, 2, spines=2), "spine1", "s1tor1", 0.25),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_one_way_degradation_reaches_the_oracle_optimum(case):
    make, src, dst, factor = CASES[case]
    topo = _one_way(make(), src, dst, factor)
    optimum = forwarding_optimum(topo).rate_gbps
    exact = mo.solve_allgather(topo, max_chunks=None)
    check_schedule(topo, exact)
    assert exact.rate_gbps == pytest.approx(optimum, rel=1e-6)
    budget = mo.solve_allgather(topo, max_chunks=10)
    check_schedule(topo, budget, max_chunks=10)
    assert budget.rate_gbps <= optimum * (1 + 1e-6)
    for seed in (1, 2):                                  # names and order do not matter
        other = mo.solve_allgather(scrambled(topo, seed), max_chunks=None)
        assert other.rate_gbps == pytest.approx(exact.rate_gbps, rel=1e-6)


def test_shared_aggregation_nic_fault_rounds_on_the_restriction():
    """The cliff of issue 25: 2x2x8 with one NIC uplink at half speed one way.  At the
    default budget ForestColl on the restriction used to raise for every k (the floors
    unbalanced the ToRs) and the general method ran; now the restriction rounds within
    MAX_LOSS of its optimum and no general method runs."""
    topo = _one_way(shared_aggregation(2, 2, 8), "s0h1g6", "s0tor6", 0.5)
    s = mo.solve_allgather(topo, max_chunks=10)
    check_schedule(topo, s, max_chunks=10)
    methods = [a.method.value for a in s.report.attempts]
    assert "general" not in methods, s.report.attempts
    assert s.rate_gbps >= s.lp_rate_gbps * (1 - float(MAX_LOSS)) * (1 - 1e-9)


def _random_case(rng: np.random.Generator):
    """A random switch graph whose floors are unbalanced: GPUs 0..3, switches 4..6."""
    n, gpus = 7, np.arange(4)
    is_switch = np.zeros(n, bool)
    is_switch[4:] = True
    pairs = [(a, b) for a in range(n) for b in range(n)
             if a != b and (is_switch[a] or is_switch[b]) and rng.random() < 0.6]
    tail = np.array([a for a, _ in pairs], np.int64)
    head = np.array([b for _, b in pairs], np.int64)
    floors = rng.integers(0, 6, tail.size).astype(np.int64)
    room = floors + rng.integers(0, 3, tail.size)
    return Fabric.build(n, tail, head, np.maximum(room, 1), gpus), is_switch, floors, room


@pytest.mark.parametrize("seed", range(30))
def test_balanced_units_are_balanced_and_bounded(seed):
    fab, is_switch, floors, room = _random_case(np.random.default_rng(seed))
    u = balanced_units(fab, is_switch, floors, room, 1)
    if u is None:
        return
    net = np.bincount(fab.head, weights=u, minlength=fab.n) - \
        np.bincount(fab.tail, weights=u, minlength=fab.n)
    assert not net[is_switch].any()
    assert (u <= np.maximum(floors, room)).all() and (u >= 0).all()
    into_gpu = ~is_switch[fab.head]
    assert (u[into_gpu] >= floors[into_gpu]).all()       # a GPU's ingress never shrinks
    if (u < floors).any():                               # rounded down: rooted test passed
        assert _violated_cut(fab, u, 1, fab.num_gpus, fab.gpus)[0] < 0


def test_balanced_units_refuse_when_only_a_gpu_ingress_could_give():
    # GPU 0 -> switch 2 (3 units, no room) and switch 2 -> GPU 1 (4 units): only the
    # link into GPU 1 could shrink, and a GPU's ingress is never rounded down
    fab = Fabric.build(3, np.array([0, 2]), np.array([2, 1]), np.array([3, 4]), np.array([0, 1]))
    is_switch = np.array([False, False, True])
    assert balanced_units(fab, is_switch, np.array([3, 4]), np.array([3, 4]), 1) is None
    up = balanced_units(fab, is_switch, np.array([3, 4]), np.array([4, 4]), 1)
    assert up is not None and up.tolist() == [4, 4]
