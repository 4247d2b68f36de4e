"""NCCL-style baselines: valid schedules, rail-aligned rings, closed-form rates and times."""

from __future__ import annotations

import pytest

from instances import dgx, fail1, fail2, fail3, hpn, ring
from mccl_opt.baselines import (direct_alltoall, pxn_alltoall, rail_allgather, rail_alltoall,
                                 ring_allgather, ring_orders)
from mccl_opt.errors import TopologyError
from mccl_opt.sim import simulate
from mccl_opt.validate import validate

MB = 2**20
FABRICS = [hpn(1, 2, 4), hpn(1, 3, 4), hpn(2, 2, 4), fail1(hpn(1, 2, 4)), fail2(hpn(1, 2, 4)),
           fail3(hpn(1, 2, 4)), dgx(4), ring(5)]


@pytest.mark.parametrize("topo", FABRICS, ids=lambda t: t.name)
def test_baselines_are_valid_and_deliver_everything(topo):
    builders = [ring_allgather, direct_alltoall]
    if topo.extra.get("family") == "hpn":
        builders.append(pxn_alltoall)
    for build in builders:
        sched = build(topo)
        report = validate(topo, sched)   # every block delivered, every hop a link, rate recomputed
        assert sched.rate_gbps == pytest.approx(report.rate_gbps)
        assert sched.lp_rate_gbps == sched.rate_gbps
        assert sched.bottleneck, "a baseline saturates at least one link"


@pytest.mark.parametrize("shape", [(1, 2, 4), (1, 3, 4), (2, 2, 4), (1, 4, 3)])
def test_rings_keep_inter_host_hops_on_one_rail(shape):
    topo = hpn(*shape)
    n = shape[2]
    rings = ring_orders(topo)
    assert len(rings) == n
    for order in rings:
        assert sorted(order) == list(range(topo.num_gpus))
        for a, b in zip(order, order[1:] + order[:1]):
            if a // n != b // n:
                assert a % n == b % n, f"hop {a}->{b} leaves the rail"


def test_ring_on_odd_hosts_with_two_gpus_is_refused():
    with pytest.raises(TopologyError, match="even number of hosts"):
        ring_allgather(hpn(1, 3, 2))


@pytest.mark.parametrize("shape", [(1, 2, 4), (1, 2, 8), (1, 4, 4)])
def test_ring_rate_closed_form(shape):
    _, h, n = shape
    total = h * n
    sched = ring_allgather(hpn(*shape))
    # each NIC carries one ring edge: (N_tot - 1) shares of 1/n; NVSwitch links carry n-1 of them
    assert sched.rate_gbps == pytest.approx(min(400 * n / (total - 1), 2880 * n / ((n - 1) * (total - 1))))


@pytest.mark.parametrize("shape", [(1, 2, 4), (1, 3, 4), (1, 4, 2)])
def test_alltoall_rate_closed_form(shape):
    _, h, n = shape
    topo = hpn(*shape)
    for build in (direct_alltoall, pxn_alltoall):
        # every NIC uplink carries one block per remote GPU it serves: (h-1)*n
        assert build(topo).rate_gbps == pytest.approx(400 / ((h - 1) * n))


def test_pxn_relays_on_the_source_host_and_direct_on_the_destination_host():
    topo = hpn(1, 2, 4)
    pxn = {(c.src, c.dst): c.path for c in pxn_alltoall(topo).chunks}
    direct = {(c.src, c.dst): c.path for c in direct_alltoall(topo).chunks}
    assert pxn[("s0h0g0", "s0h1g2")] == ("s0h0g0", "s0h0nvs", "s0h0g2", "s0tor2", "s0h1g2")
    assert direct[("s0h0g0", "s0h1g2")] == ("s0h0g0", "s0tor0", "s0h1g0", "s0h1nvs", "s0h1g2")
    assert pxn[("s0h0g1", "s0h1g1")] == direct[("s0h0g1", "s0h1g1")] == ("s0h0g1", "s0tor1", "s0h1g1")
    assert pxn[("s0h0g1", "s0h0g3")] == ("s0h0g1", "s0h0nvs", "s0h0g3")


def test_fail3_backup_is_reached_through_its_own_links():
    topo = fail3(hpn(1, 2, 4))
    paths = [c.path for c in direct_alltoall(topo).chunks if c.src == "s0h0g0-bk"]
    assert all(p[1] in ("s0h0nvs", "bk-tor") for p in paths)


def test_pxn_needs_a_rail_fabric():
    with pytest.raises(TopologyError, match="HPN"):
        pxn_alltoall(ring(4, bidirectional=False))


@pytest.mark.parametrize("shape", [(1, 2, 4), (1, 3, 4)])
def test_simulated_baselines_match_closed_form_times(shape):
    _, h, n = shape
    topo = hpn(*shape)
    total = h * n
    shard = 8 * MB
    ring_s = shard * 8 * (total - 1) / n / (400e9)       # NCCL ring: (N-1) steps of shard/n per NIC
    res = simulate(topo, ring_allgather(topo), shard)
    depth = total - 1
    pieces = max(1, round(shard / n / (512 * 1024)))
    assert ring_s * (1 - 1e-9) <= res.completion_s <= ring_s * (1 + depth / pieces) + depth * 1.1e-6
    block = 8 * MB
    direct_s = block * 8 * (h - 1) * n / 400e9               # each NIC sends (h-1)*n blocks
    for build in (direct_alltoall, pxn_alltoall):
        res = simulate(topo, build(topo), block)
        # a relayed pair pays one extra piece (1/16 of its block) of pipeline fill
        assert direct_s * (1 - 1e-9) <= res.completion_s <= direct_s * (1 + 1 / 16) + 2e-6


def test_rail_references_are_the_pxn_schedule_and_its_two_route_split():
    topo = hpn(1, 2, 4)
    pxn, rail, split = pxn_alltoall(topo), rail_alltoall(topo, version=3), rail_alltoall(topo, split=True)
    assert [c.path for c in rail.chunks] == [c.path for c in pxn.chunks] and rail.version == 3
    # a cross-rail pair: 0.3 over the PXN relay, 0.7 over the direct relay (another route)
    pair = [c for c in split.chunks if (c.src, c.dst) == (topo.gpus[0], topo.gpus[5])]
    assert sorted(c.share for c in pair) == [0.3, 0.7] and pair[0].path != pair[1].path
    for sched in (rail, split, rail_allgather(topo), rail_allgather(topo, split=True)):
        assert validate(topo, sched).rate_gbps == pytest.approx(sched.rate_gbps)
    with pytest.raises(TopologyError, match="needs an HPN fabric"):
        rail_allgather(ring(4))


def test_ring_spreads_its_channels_over_every_nvswitch_plane():
    """On a DGX-like host each ring hop has one NVSwitch per plane: one channel per
    plane, so the ring runs at planes x NVLink / (n - 1) and never crosses the NIC leaf."""
    from instances import dgx

    from mccl_opt import validate
    from mccl_opt.baselines import ring_allgather

    topo = dgx(gpus=6, nvswitches=3, nvlink_gbps=100.0)
    sched = ring_allgather(topo)
    validate(topo, sched)
    assert sched.solver["channels"] == 3
    assert sched.rate_gbps == pytest.approx(3 * 100.0 / 5)
    used = {hop[1] for c in sched.chunks for hop in c.edges}
    assert used == {"nvs0", "nvs1", "nvs2"}
