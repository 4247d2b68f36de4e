"""Fluid fabric simulator: analytic cases, conservation, capacity changes, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.sparse as sp

from instances import hpn, ring
from mccl_opt.errors import MCCLError, ScheduleError
from mccl_opt.schedule import PathChunk, Schedule, TreeChunk, share_loads
from mccl_opt.sim import SimulationError, max_min_rates, simulate
from mccl_opt.topology import Link, Node, Topology

MB = 2**20


def _topo(gpus, switches, links, name="t"):
    nodes = [Node(g, "gpu") for g in gpus] + [Node(s, "switch") for s in switches]
    return Topology(name, nodes, [Link(*l) for l in links])


def _a2a(topo, chunks):
    return Schedule("alltoall", topo.name, topo.gpus, 1.0, 1.0, None, chunks)


def _tau(nbytes, gbps):
    return nbytes * 8 / (gbps * 1e9)


# ---------------------------------------------------------------------- analytic cases
@pytest.mark.parametrize("kw", [{}, {"pieces": 1}, {"pieces": 7}, {"slice_bytes": 100_000}])
def test_one_link_time_is_bytes_over_capacity_plus_latency(kw):
    topo = ring(2, gbps=100.0, latency_us=2.0)
    sched = _a2a(topo, [PathChunk("g0", "g1", 1.0, ("g0", "g1")), PathChunk("g1", "g0", 1.0, ("g1", "g0"))])
    res = simulate(topo, sched, 1e6, **kw)
    assert res.completion_s == pytest.approx(_tau(1e6, 100) + 2e-6, rel=1e-9)
    assert res.algbw_gbytes_per_s == pytest.approx(2 * 1e6 / res.completion_s / 1e9)


def _line(c1, c2, l1, l2):
    return _topo(["a", "b", "c"], [], [("a", "b", c1, l1), ("b", "c", c2, l2),
                                       ("b", "a", c1, l1), ("c", "b", c2, l2)])


@pytest.mark.parametrize("n", [1, 2, 8])
def test_two_hop_relay_store_and_forward(n):
    topo = _line(100.0, 100.0, 1.0, 3.0)
    sched = _a2a(topo, [PathChunk("a", "c", 1.0, ("a", "b", "c"))])
    res = simulate(topo, sched, 8e6, pieces=n)
    piece = _tau(8e6 / n, 100)
    assert res.completion_s == pytest.approx((n + 1) * piece + 1e-6 + 3e-6, rel=1e-9)


def test_two_hop_relay_with_a_slower_second_hop():
    topo = _line(400.0, 100.0, 0.0, 0.0)
    sched = _a2a(topo, [PathChunk("a", "c", 1.0, ("a", "b", "c"))])
    res = simulate(topo, sched, 4e6, pieces=4)
    assert res.completion_s == pytest.approx(_tau(1e6, 400) + 4 * _tau(1e6, 100), rel=1e-9)
    assert res.fluid_time_s == pytest.approx(_tau(4e6, 100))
    assert res.efficiency < 1.0  # pipeline fill is exposed, not hidden


@pytest.mark.parametrize("lat", [0.0, 1.5])
def test_ring_of_four_allgather_takes_three_steps(lat):
    topo = ring(4, gbps=100.0, latency_us=lat, bidirectional=False)
    hops = [("g0", "g1"), ("g1", "g2"), ("g2", "g3"), ("g3", "g0")]
    trees = [TreeChunk(f"g{r}", 1.0, tuple(hops[(r + k) % 4] for k in range(3))) for r in range(4)]
    sched = Schedule("allgather", topo.name, topo.gpus, 100 / 3, 100 / 3, 1, trees)
    res = simulate(topo, sched, 3e6, pieces=1)
    assert res.completion_s == pytest.approx(3 * _tau(3e6, 100) + 3 * lat * 1e-6, rel=1e-9)
    assert res.fluid_rate_gbps == pytest.approx(100 / 3)
    # pipelined pieces approach the fluid time from above
    fine = simulate(topo, sched, 3e6, pieces=64)
    assert res.fluid_time_s * (1 - 1e-9) <= fine.completion_s <= res.fluid_time_s * (1 + 3 / 64) + 3 * lat * 1e-6


def test_max_min_rates_progressive_filling():
    # links: L0 cap 1, L1 cap 2; f0 on both, f1 on L0, f2 on L1
    inc = sp.csr_matrix(np.array([[1, 1], [1, 0], [0, 1]], dtype=float))
    assert max_min_rates(inc, np.ones(3), np.array([1.0, 2.0])) == pytest.approx([0.5, 0.5, 1.5])
    # f1 stands for two identical flows
    assert max_min_rates(inc, np.array([1.0, 2.0, 1.0]), np.array([1.0, 2.0])) == \
        pytest.approx([1 / 3, 1 / 3, 2 - 1 / 3])


def _shared_link_topo():
    return _topo(["a", "b", "c"], ["s"], [("a", "s", 100.0, 0.0), ("b", "s", 30.0, 0.0),
                                          ("s", "c", 100.0, 0.0), ("c", "s", 100.0, 0.0),
                                          ("s", "a", 100.0, 0.0), ("s", "b", 100.0, 0.0)])


def test_two_flows_share_a_link_max_min_fairly():
    topo = _shared_link_topo()
    sched = _a2a(topo, [PathChunk("a", "c", 1.0, ("a", "s", "c")), PathChunk("b", "c", 1.0, ("b", "s", "c"))])
    res = simulate(topo, sched, 7e6, pieces=1)
    # b is capped at 30 by its private link, a gets the other 70 of s->c
    t_a = _tau(7e6, 70)
    assert res.completion_s == pytest.approx(_tau(7e6, 30), rel=1e-9)
    times, gbps = res.link_throughput(("s", "c"))
    assert times[0] == 0 and times[1] == pytest.approx(t_a) and times[-1] == pytest.approx(res.completion_s)
    assert gbps == pytest.approx([100.0, 30.0])
    _, a_gbps = res.link_throughput(("a", "s"))
    assert a_gbps == pytest.approx([70.0, 0.0])


def test_capacity_drop_mid_run():
    topo = ring(2, gbps=100.0, latency_us=0.0)
    sched = _a2a(topo, [PathChunk("g0", "g1", 1.0, ("g0", "g1")), PathChunk("g1", "g0", 1.0, ("g1", "g0"))])
    tau = _tau(1e6, 100)
    res = simulate(topo, sched, 1e6, capacity_timeline=[(tau / 2, {("g0", "g1"): 50.0})])
    assert res.completion_s == pytest.approx(tau / 2 + tau, rel=1e-9)
    times, gbps = res.link_throughput(("g0", "g1"))
    assert times == pytest.approx([0, tau / 2, tau, 1.5 * tau])
    assert gbps == pytest.approx([100.0, 50.0, 50.0])
    _, other = res.link_throughput(("g1", "g0"))
    assert other == pytest.approx([100.0, 100.0, 0.0])


# ---------------------------------------------------------------------- conservation
def test_every_byte_delivered_and_capacities_respected():
    from mccl_opt.baselines import pxn_alltoall, ring_allgather

    topo = hpn(1, 2, 4)
    for sched in (pxn_alltoall(topo), ring_allgather(topo)):
        res = simulate(topo, sched, 4 * MB)
        expect = share_loads(topo, sched.chunks) * 4 * MB
        assert res.link_bytes() == pytest.approx(expect, rel=1e-6, abs=1.0)
        assert (res.link_gbps <= topo.arrays.capacity * (1 + 1e-9)).all()
        assert res.mean_link_throughput() == pytest.approx(expect * 8 / 1e9 / res.completion_s)
        starts, binned = res.sampled_throughput(res.completion_s / 10)
        assert starts.size == 10
        assert binned.sum(0) * res.completion_s / 10 == pytest.approx(expect * 8 / 1e9, rel=1e-6, abs=1e-9)


def test_optimal_schedule_runs_at_its_rate_within_pipeline_fill():
    from mccl_opt.baselines import direct_alltoall

    topo = hpn(1, 2, 4)   # direct AllToAll is optimal here: the host cut allows 100 Gbps
    sched = direct_alltoall(topo)
    assert sched.rate_gbps == pytest.approx(100.0)
    for pieces in (1, 4, 32):
        res = simulate(topo, sched, 8 * MB, pieces=pieces)
        fill = 2 / pieces          # two GPU-to-GPU segments at most
        latency = 2 * 0.5e-6 + 2 * 0.025e-6
        assert res.fluid_time_s * (1 - 1e-9) <= res.completion_s
        assert res.completion_s <= res.fluid_time_s * (1 + fill) + latency


# ---------------------------------------------------------------------- bad input
@pytest.fixture()
def one_link():
    topo = ring(2, gbps=100.0)
    sched = _a2a(topo, [PathChunk("g0", "g1", 1.0, ("g0", "g1")), PathChunk("g1", "g0", 1.0, ("g1", "g0"))])
    return topo, sched


@pytest.mark.parametrize("size", [0, -5, math.nan, math.inf])
def test_bad_message_size(one_link, size):
    with pytest.raises(SimulationError, match="message size"):
        simulate(*one_link, size)
    assert issubclass(SimulationError, (MCCLError, ValueError))


def test_schedule_for_another_topology(one_link):
    _, sched = one_link
    with pytest.raises(ScheduleError, match="do not match"):
        simulate(ring(3), sched, 1e6)


def test_path_hop_that_is_not_a_link():
    topo = ring(4, bidirectional=False)
    sched = _a2a(topo, [PathChunk("g0", "g2", 1.0, ("g0", "g2"))])
    with pytest.raises(ScheduleError, match="no link"):
        simulate(topo, sched, 1e6)


def test_slices_larger_than_chunks(one_link):
    with pytest.raises(SimulationError, match="larger than the largest chunk"):
        simulate(*one_link, 1e6, slice_bytes=2e6)
    with pytest.raises(SimulationError, match="not both"):
        simulate(*one_link, 1e6, slice_bytes=1e5, pieces=2)
    with pytest.raises(SimulationError, match="pieces"):
        simulate(*one_link, 1e6, pieces=0)


@pytest.mark.parametrize("timeline,match", [
    ([(-1.0, {("g0", "g1"): 10.0})], "time"),
    ([(0.0, {("g0", "g7"): 10.0})], "not a link"),
    ([(0.0, {("g0", "g1"): 0.0})], "> 0 Gbps"),
    ([(0.0, {})], "non-empty"),
    ([1.0], "entry 0"),
])
def test_bad_capacity_timeline(one_link, timeline, match):
    with pytest.raises(SimulationError, match=match):
        simulate(*one_link, 1e6, capacity_timeline=timeline)


def test_bad_link_reference(one_link):
    res = simulate(*one_link, 1e6)
    with pytest.raises(SimulationError):
        res.link_throughput(("g0", "g9"))
    with pytest.raises(SimulationError):
        res.sampled_throughput(0.0)
