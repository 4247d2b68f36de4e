"""The sub-fabric a communicator's members induce (:mod:`mccl_opt.subfabric`): members in
rank order, no other GPU, only switches a member-to-member path can use, the parent's
capacities, member lists checked with typed errors, and the optimum unchanged by the
pruning of dead-end switches."""

from __future__ import annotations

import numpy as np
import pytest

import mccl_opt as mo
from instances import fail2, hpn
from mccl_opt.errors import TopologyError
from mccl_opt.subfabric import induced
from mccl_opt.topology import Link, Topology

TOPO = hpn(1, 4, 4)
TP0 = [f"s0h0g{i}" for i in range(4)]
DP0 = [f"s0h{h}g0" for h in range(4)]
EP0 = [f"s0h{h}g{i}" for h in (0, 1) for i in range(4)]


def test_members_are_the_ranks_in_order_and_links_map_to_the_parent():
    sub = induced(TOPO, list(reversed(EP0)))
    assert sub.topology.gpus == tuple(reversed(EP0))          # rank r is gpus[r]
    for k, link in enumerate(sub.topology.links):
        parent = TOPO.links[int(sub.links[k])]
        assert (parent.src, parent.dst, parent.capacity_gbps) == (link.src, link.dst, link.capacity_gbps)
    kept = {n for l in sub.topology.links for n in (l.src, l.dst)}
    assert not {g for g in TOPO.gpus if g not in EP0} & kept  # no other GPU, no link to one
    # every link of TOPO between kept nodes is in the sub-fabric
    nodes = set(sub.topology.gpus) | set(sub.topology.switches)
    assert {(l.src, l.dst) for l in TOPO.links if {l.src, l.dst} <= nodes} == {
        (l.src, l.dst) for l in sub.topology.links}


def test_dead_end_switches_are_pruned():
    """One host's group keeps its NVSwitch only (each ToR would reach one member); one
    rail's group keeps its ToR only (each NVSwitch would reach one member)."""
    assert induced(TOPO, TP0).topology.switches == ("s0h0nvs",)
    assert induced(TOPO, DP0).topology.switches == ("s0tor0",)
    assert set(induced(TOPO, EP0).topology.switches) == {"s0h0nvs", "s0h1nvs"} | {f"s0tor{g}" for g in range(4)}


def test_pruning_keeps_switch_chains_between_members():
    """A switch-only chain between two members stays; a branch of the chain leading only
    to non-members goes, switch by switch."""
    nodes = [mo.Node("a", "gpu"), mo.Node("b", "gpu"), mo.Node("c", "gpu"),
             mo.Node("s1", "switch"), mo.Node("s2", "switch"), mo.Node("s3", "switch"), mo.Node("s4", "switch")]
    cables = [("a", "s1"), ("s1", "s2"), ("s2", "b"), ("s2", "s3"), ("s3", "s4"), ("s4", "c")]
    links = [Link(u, v, 100.0) for x, y in cables for u, v in ((x, y), (y, x))]
    topo = Topology("chain", nodes, links)
    sub = induced(topo, ["a", "b"])
    assert set(sub.topology.switches) == {"s1", "s2"}
    assert sub.topology.num_links == 6


def test_whole_fabric_keeps_every_link_and_the_name():
    sub = induced(TOPO, list(TOPO.gpus))
    assert np.array_equal(sub.links, np.arange(TOPO.num_links))
    assert sub.topology.name == TOPO.name and sub.topology.gpus == TOPO.gpus


def test_capacities_follow_the_parent():
    degraded = fail2(TOPO).arrays.capacity
    sub = induced(TOPO, EP0)
    on = sub.measured(degraded)
    assert on.link("s0h0g0", "s0tor0").capacity_gbps == 50.0
    assert on.link("s0h1g0", "s0tor0").capacity_gbps == 400.0
    lifted = sub.lift(on.arrays.capacity)
    assert np.array_equal(lifted[sub.links], degraded[sub.links])
    assert not lifted[np.setdiff1d(np.arange(TOPO.num_links), sub.links)].any()
    with pytest.raises(TopologyError, match="has 64 links"):
        sub.capacities(np.ones(3))


@pytest.mark.parametrize("gpus, match", [
    (["s0h0g0", "s0h9g0"], r"member #1 's0h9g0' is not a node"),
    (["s0h0g0", "s0tor0"], r"member #1 's0tor0' is a switch"),
    (["s0h0g0", "s0h1g0", "s0h0g0"], r"'s0h0g0' is listed twice \(members #0 and #2\)"),
    (["s0h0g0"], "at least 2 GPUs"),
    ("s0h0g0", "must be a list of GPU ids"),
    (["s0h0g0", 7], "member #1 must be a GPU id string"),
    (["s0h0g0", "s0h1g1"], "do not form a connected sub-fabric"),   # cross-rail, nobody to relay
])
def test_bad_member_lists_raise_topology_errors(gpus, match):
    with pytest.raises(TopologyError, match=match):
        induced(TOPO, gpus)


def test_cross_rail_group_is_connected_through_a_member_relay():
    """``s0h0g1`` relays between rail 0 and rail 1 on host 0 because it is a member."""
    sub = induced(TOPO, ["s0h0g0", "s0h0g1", "s0h1g1"])
    assert set(sub.topology.switches) == {"s0h0nvs", "s0tor1"}


@pytest.mark.parametrize("gpus", [EP0, DP0, TP0])
def test_optimum_equals_the_unpruned_induced_fabric(gpus):
    """The pruned sub-fabric has the optimum of the fabric with only the other GPUs
    removed (every switch kept), for both collectives."""
    degraded = fail2(TOPO)
    keep = set(gpus) | set(degraded.switches)
    full = Topology("unpruned", [degraded.node(g) for g in gpus] + [degraded.node(s) for s in degraded.switches],
                    [l for l in degraded.links if {l.src, l.dst} <= keep])
    sub = induced(degraded, gpus).topology
    assert mo.solve_allgather(sub).lp_rate_gbps == pytest.approx(mo.solve_allgather(full).lp_rate_gbps, rel=1e-6)
    assert mo.solve_alltoall(sub).lp_rate_gbps == pytest.approx(mo.solve_alltoall(full).lp_rate_gbps, rel=1e-6)
