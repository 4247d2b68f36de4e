"""Fluid mode: chunk-granularity flows at the schedule's own rate model."""

from __future__ import annotations

import pytest

from instances import fail2, hpn, ring
from mccl_opt.baselines import direct_alltoall, ring_allgather
from mccl_opt.schedule import Schedule, TreeChunk
from mccl_opt.sim import SimulationError, max_min_rates, simulate
from mccl_opt.topology import Link, Node, Topology

import numpy as np
import scipy.sparse as sp


def _star(gbps=100.0, lat=0.0):
    nodes = [Node(g, "gpu") for g in ("a", "b", "c")] + [Node("s", "switch")]
    links = []
    for g in ("a", "b", "c"):
        links += [Link(g, "s", gbps, lat), Link("s", g, gbps, lat)]
    return Topology("star", nodes, links)


def test_unequal_tree_shares_finish_at_the_claimed_rate():
    topo = _star()
    # root a: 0.75 over a star tree (a->s used twice), 0.25 over a chain a->b->c
    star = (("a", "s", "b"), ("a", "s", "c"))
    chain = (("a", "s", "b"), ("b", "s", "c"))
    trees = [TreeChunk("a", 0.75, star), TreeChunk("a", 0.25, chain),
             TreeChunk("b", 1.0, (("b", "s", "a"), ("b", "s", "c"))),
             TreeChunk("c", 1.0, (("c", "s", "a"), ("c", "s", "b")))]
    sched = Schedule("allgather", "star", topo.gpus, 1.0, 1.0, None, trees)
    res = simulate(topo, sched, 1e6, fluid=True)
    # loads: a->s = 2*0.75 + 0.25 = 1.75, b->s = 0.25 + 2 = 2.25 -> rate 100/2.25
    assert res.fluid_rate_gbps == pytest.approx(100 / 2.25)
    assert res.completion_s == pytest.approx(res.fluid_time_s, rel=1e-9)


@pytest.mark.parametrize("build", [ring_allgather, direct_alltoall])
def test_fluid_time_equals_rate_plus_latency(build):
    topo = fail2(hpn(1, 2, 4))
    sched = build(topo)
    res = simulate(topo, sched, 2**20, fluid=True)
    assert res.fluid_time_s <= res.completion_s <= res.fluid_time_s + 8 * 1.1e-6
    piecewise = simulate(topo, sched, 2**20)
    assert piecewise.completion_s >= res.fluid_time_s * (1 - 1e-9)


def test_weighted_sharing():
    inc = sp.csr_matrix(np.array([[1.0], [1.0]]))
    assert max_min_rates(inc, np.ones(2), np.array([90.0]), growth=np.array([2.0, 1.0])) == \
        pytest.approx([60.0, 30.0])


def test_fluid_mode_has_no_pieces():
    topo = ring(3)
    sched = direct_alltoall(topo)
    with pytest.raises(SimulationError, match="fluid"):
        simulate(topo, sched, 1e6, fluid=True, pieces=2)
