"""The fabric designs of :mod:`instances.designs` and the variants of
:mod:`bench.fabric_variants` (the AllGather fuzz's new families, docs/benchmarks.md): each
builds a connected fabric with the structure it claims, and AllGather on the smallest of
each is exact against the independent oracle's cut bound (``tests/oracle_allgather.py``)."""

from __future__ import annotations

import pytest

import mccl_opt as mo
from bench.fabric_variants import without_cables, without_node
from instances import hpn, multi_spine
from instances.designs import dragonfly, fat_tree, rail_hosts
from mccl_opt.errors import TopologyError
from tests.oracle_allgather import check_schedule, cut_bound

SMALLEST = [
    rail_hosts(1, (4, 2)),                                      # mixed hosts
    rail_hosts(1, 4, hosts=2, gpus_per_nic=2),                  # two GPUs per NIC
    rail_hosts(2, 2, hosts=2, nic_gbps=(400, 200)),             # mixed NIC speeds
    fat_tree(2, 2, 1, 2),
    dragonfly(3, 2, 1, 2),
    without_node(hpn(1, 2, 4), "s0tor1"),                       # a rail switch missing
    without_cables(multi_spine(2, 1, 2, spines=2), "s0tor0", ["spine1"]),
]


def _peers(topo: mo.Topology, node: str) -> dict[str, float]:
    return {l.dst: l.capacity_gbps for l in topo.links if l.src == node}


def test_designs_have_the_structure_they_claim():
    mixed = rail_hosts(1, (8, 4))
    assert mixed.num_gpus == 12
    assert sorted(_peers(mixed, "s0tor7")) == ["s0h0g7"]        # rail 7: the 8-GPU host only
    assert len(_peers(mixed, "s0tor0")) == 2
    shared = rail_hosts(2, 8, hosts=2, gpus_per_nic=2)
    assert len([s for s in shared.switches if s.startswith("s0tor")]) == 4
    assert _peers(shared, "s0h1pcie3") == {"s0h1g6": 512.0, "s0h1g7": 512.0, "s0tor3": 400.0}
    assert _peers(shared, "s1tor2")["agg2"] == 800.0
    speeds = rail_hosts(2, 2, hosts=2, nic_gbps=(400, 200))
    assert _peers(speeds, "s0tor1") == {"s0h0g1": 400.0, "s0h1g1": 200.0, "agg1": 600.0}
    tree = fat_tree(2, 2, 1, 8, aggs=2, cores=2, core_oversubscription=3.0)
    down = sum(c for peer, c in _peers(tree, "p0a0").items() if peer.startswith("p0e"))
    up = sum(c for peer, c in _peers(tree, "p0a0").items() if peer.startswith("core"))
    assert up == pytest.approx(down / 3)
    fly = dragonfly(4, 2, 1, 2)
    glob = {(l.src[:2], l.dst[:2]) for l in fly.links
            if l.src.count("r") == 1 and l.dst.count("r") == 1 and "h" not in l.src + l.dst
            and l.src[:2] != l.dst[:2]}
    assert len(glob) == 4 * 3                                   # one global cable per group pair
    assert not without_node(hpn(1, 2, 4), "s0tor1").has_node("s0tor1")
    assert not without_cables(multi_spine(2, 1, 2, spines=2), "s0tor0", ["spine1"]).has_link(
        "s0tor0", "spine1")


@pytest.mark.parametrize("topo", SMALLEST, ids=lambda t: t.name)
def test_smallest_of_each_family_is_exact(topo):
    sched = mo.solve_allgather(topo, max_chunks=None)
    mo.validate(topo, sched)
    assert check_schedule(topo, sched).rate_gbps == pytest.approx(sched.rate_gbps, rel=1e-6)
    assert sched.rate_gbps == pytest.approx(cut_bound(topo), rel=1e-6)


def test_bad_shapes_are_typed_errors():
    with pytest.raises(TopologyError):
        rail_hosts(1, (8, 6), gpus_per_nic=4)
    with pytest.raises(TopologyError):
        rail_hosts(1, (8, 4), nic_gbps=(400.0,))
    with pytest.raises(TopologyError):
        dragonfly(1)
    with pytest.raises(TopologyError):
        without_node(hpn(1, 2, 2), "s0h0g0")
    with pytest.raises(TopologyError):                          # rail 0's GPUs cut off
        without_node(hpn(1, 2, 1), "s0tor0")
    with pytest.raises(TopologyError):
        without_cables(hpn(1, 2, 2), "s0tor0", ["agg0"])
