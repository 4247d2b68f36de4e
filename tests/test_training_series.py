"""Series reduction of pass-through switches (mccl_opt.training.series): the optimum of
both collectives is unchanged (judged by the independent AllGather oracle and by the
AllToAll solver on the unreduced fabric), and the expanded schedule respects every original
link's capacity at its rate."""

from __future__ import annotations

import numpy as np
import pytest

import mccl_opt as mo
from instances import fail2, hpn
from mccl_opt.schedule import share_loads
from mccl_opt.training.builtin import builtin_workload
from mccl_opt.training.comms import communicators
from mccl_opt.training.placement import place_groups
from mccl_opt.training.series import series_reduced
from tests.oracle_allgather import forwarding_optimum, topology_dict


def _relay_group(topo: mo.Topology) -> mo.Topology:
    groups = place_groups(builtin_workload("llama3-405b", topo.num_gpus), topo.gpus)
    return communicators(topo, {"dp": groups["dp"][:1]}, "host")[0].sub.topology


def _split_links(seed: int) -> mo.Topology:
    """A random fabric of 5 GPUs and 2 switches where some cables pass through a
    pass-through switch (odd, one-way capacities), one through a chain of two, and one
    pass-through switch runs parallel to an existing link (it must stay)."""
    rng = np.random.default_rng(seed)
    gpus = [f"g{i}" for i in range(5)]
    nodes = [(g, "gpu") for g in gpus] + [("s0", "switch"), ("s1", "switch")]
    links = []

    def cable(a, b):
        links.append((a, b, float(rng.uniform(10, 400))))
        links.append((b, a, float(rng.uniform(10, 400))))

    for i, g in enumerate(gpus):
        hub = f"s{i % 2}"
        if rng.random() < 0.6:
            p = f"p{i}"
            nodes.append((p, "switch"))
            cable(g, p)
            cable(p, hub)
        else:
            cable(g, hub)
    nodes += [("c0", "switch"), ("c1", "switch"), ("q", "switch")]
    cable("s0", "c0")
    cable("c0", "c1")
    cable("c1", "s1")
    cable("g0", "g1")
    cable("g0", "q")
    cable("q", "g1")
    return mo.Topology.from_dict(topology_dict(nodes, links, f"split{seed}"))


@pytest.mark.parametrize("seed", range(8))
def test_reduced_fabric_has_the_same_optimum_and_its_schedule_fits_the_original(seed):
    topo = _split_links(seed)
    red = series_reduced(topo)
    assert not red.topology.has_node("c0") and not red.topology.has_node("c1")
    assert red.topology.has_node("q")                   # parallel to g0 <-> g1: kept
    assert red.topology.gpus == topo.gpus
    oracle = forwarding_optimum(topo).rate_gbps
    ag = mo.solve_allgather(red.topology, max_chunks=None)
    assert ag.lp_rate_gbps == pytest.approx(oracle, rel=1e-6)
    a2a_red = mo.solve_alltoall(red.topology)
    assert a2a_red.lp_rate_gbps == pytest.approx(mo.solve_alltoall(topo).lp_rate_gbps, rel=1e-6)
    cap = topo.arrays.capacity
    for sched in (ag, a2a_red):
        loads = red.expand(share_loads(red.topology, sched.chunks))
        assert np.all(loads * sched.rate_gbps <= cap * (1 + 1e-9))


def test_relay_group_of_an_hpn_fabric_loses_its_relays_and_none_of_its_rate():
    topo = fail2(hpn(1, 4, 4))
    sub = _relay_group(topo)
    red = series_reduced(sub)
    gone = [n for n in sub.switches if not red.topology.has_node(n)]
    relays = {n for n in sub.switches if topo.node(n).kind == "gpu"}
    assert relays and relays <= set(gone)      # every host relay (and ToRs left between two)
    full = mo.solve_allgather(sub, max_chunks=None)
    small = mo.solve_allgather(red.topology, max_chunks=None)
    assert small.lp_rate_gbps == pytest.approx(full.lp_rate_gbps, rel=1e-6)
    loads = red.expand(share_loads(red.topology, small.chunks))
    assert loads.shape == (sub.num_links,)
    used = loads > 0
    assert float(np.min(sub.arrays.capacity[used] / loads[used])) == pytest.approx(small.rate_gbps)


def test_nothing_to_reduce_keeps_the_fabric():
    topo = hpn(1, 4, 4)                 # every ToR joins four GPUs
    red = series_reduced(topo)
    assert red.topology is topo and red.parts == tuple((i,) for i in range(topo.num_links))
