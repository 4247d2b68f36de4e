"""Instance generators: HPN counts and capacities, each failure's effect, test fabrics."""

from __future__ import annotations

import pytest

from instances import (FAILURES, apply_failure, dgx, fail1, fail2, fail3, full_mesh, hpn,
                       irregular, load_instance, parse_shape, ring, shipped_instances)
from mccl_opt import Topology, TopologyError


@pytest.mark.parametrize("s, h, n", [(1, 2, 4), (1, 2, 8), (1, 4, 8), (2, 2, 4), (2, 3, 8), (3, 1, 2)])
def test_hpn_counts_and_capacities(s, h, n):
    topo = hpn(s, h, n)
    gpus = s * h * n
    switches = s * h + s * n + (n if s > 1 else 0)
    links = 4 * gpus + (2 * s * n if s > 1 else 0)
    assert (topo.num_gpus, len(topo.switches), topo.num_links) == (gpus, switches, links)
    assert topo.name == f"hpn-{s}x{h}x{n}"
    for g in topo.gpus:
        sw, tor = topo.link(g, g[: g.index("g")] + "nvs"), None
        assert sw.capacity_gbps == 2880.0 and sw.latency_us == 0.025
        seg, rail = g[1:g.index("h")], g[g.index("g") + 1:]
        tor = topo.link(g, f"s{seg}tor{rail}")
        assert tor.capacity_gbps == 400.0 and tor.latency_us == 0.5
        # every GPU has exactly its NVSwitch and its rail ToR as neighbours
        assert sorted(l.dst for l in topo.links if l.src == g) == sorted([f"s{seg}h{g[g.index('h')+1:g.index('g')]}nvs", f"s{seg}tor{rail}"])
    if s > 1:
        up = topo.link("s0tor0", "agg0")
        assert up.capacity_gbps == h * 400.0
    # rank order is segment-major, host, GPU
    assert topo.gpus[:2] == ("s0h0g0", "s0h0g1")


def test_hpn_rejects_bad_shapes():
    for args in [(0, 2, 8), (1, 0, 8), (1, 2, -1), (1, 1, 1)]:
        with pytest.raises(TopologyError):
            hpn(*args)
    assert parse_shape("2x32X8") == (2, 32, 8)
    with pytest.raises(TopologyError, match="SxHxN"):
        parse_shape("2x32")


def _changed_links(a: Topology, b: Topology) -> dict:
    ca = {(l.src, l.dst): l.capacity_gbps for l in a.links}
    cb = {(l.src, l.dst): l.capacity_gbps for l in b.links}
    return {k: (ca.get(k), cb.get(k)) for k in set(ca) | set(cb) if ca.get(k) != cb.get(k)}


def test_fail1_degrades_only_the_nvswitch_cable():
    base = hpn(1, 2, 8)
    assert _changed_links(base, fail1(base)) == {
        ("s0h0g0", "s0h0nvs"): (2880.0, 800.0), ("s0h0nvs", "s0h0g0"): (2880.0, 800.0)}
    assert _changed_links(base, fail1(base, gpu=9)) == {
        ("s0h1g1", "s0h1nvs"): (2880.0, 800.0), ("s0h1nvs", "s0h1g1"): (2880.0, 800.0)}


def test_fail2_degrades_only_the_nic_cable():
    base = hpn(1, 2, 8)
    assert _changed_links(base, fail2(base)) == {
        ("s0h0g0", "s0tor0"): (400.0, 50.0), ("s0tor0", "s0h0g0"): (400.0, 50.0)}
    assert fail2(base, gpu="s0h1g3").link("s0h1g3", "s0tor3").capacity_gbps == 50.0


def test_fail3_replaces_the_gpu_by_a_remote_backup():
    base = hpn(1, 2, 4)
    topo = fail3(base)
    assert topo.gpus[0] == "s0h0g0-bk" and topo.gpus[1:] == base.gpus[1:]
    assert not topo.has_node("s0h0g0")
    host = topo.link("s0h0g0-bk", "s0h0nvs")
    nic = topo.link("s0h0g0-bk", "bk-tor")
    assert (host.capacity_gbps, nic.capacity_gbps) == (50.0, 100.0)
    assert host.latency_us == pytest.approx(0.025 + 1.0)
    assert nic.latency_us == pytest.approx(0.5 + 1.0)
    assert topo.link("bk-tor", "s0tor0").capacity_gbps == 400.0
    assert topo.num_links == base.num_links + 2


def test_failures_reject_unknown_gpus_and_names():
    base = hpn(1, 2, 4)
    with pytest.raises(TopologyError, match="out of range"):
        fail2(base, gpu=99)
    with pytest.raises(TopologyError, match="not a GPU"):
        fail1(base, gpu="s0tor0")
    with pytest.raises(TopologyError, match="unknown failure"):
        apply_failure(base, "fail9")
    assert apply_failure(base, None) is base
    assert set(FAILURES) == {"fail1", "fail2", "fail3"}


def test_small_fabrics():
    d = dgx()
    assert d.num_gpus == 8 and len(d.switches) == 5
    assert ring(5).num_links == 10 and ring(5, bidirectional=False).num_links == 5
    assert ring(2).num_links == 2
    assert full_mesh(4).num_links == 12
    with pytest.raises(TopologyError):
        ring(1)


def test_irregular_is_deterministic_and_varied():
    a, b = irregular(7), irregular(7)
    assert a == b
    sizes = {irregular(s).num_gpus for s in range(30)}
    assert len(sizes) > 4
    assert any(l.capacity_gbps != m.capacity_gbps
               for s in range(10) for t in [irregular(s)]
               for l in t.links for m in [t.link(l.dst, l.src)] if t.has_link(l.dst, l.src))


def test_shipped_instances_load():
    names = shipped_instances()
    assert "hpn-1x2x8-fail2" in names
    for name in names:
        topo = load_instance(name)
        assert topo.num_gpus >= 2
