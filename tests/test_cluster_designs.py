"""The cluster designs of :mod:`instances.clusters` (the AllGather fuzz's fresh families,
docs/allgather.md "Fresh families"): every size the fuzz uses is a connected fabric with the
GPUs and the structure it claims, and AllGather on each family's smallest size is exact
against the independent oracle's cut bound (``tests/oracle_allgather.py``)."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest

import mccl_opt as mo
from bench.allgather_chains import FAMILIES
from instances.clusters import gpu_mesh, multi_plane, nvlink_islands
from mccl_opt.errors import TopologyError
from tests.oracle_allgather import check_schedule, cut_bound

FRESH = {"multi-plane": (16, 64, 128), "nvl-islands": (16, 64, 128), "gpu-mesh": (24, 56, 112)}


def _peers(topo: mo.Topology) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for l in topo.links:
        out[l.src][l.dst] = l.capacity_gbps
    return out


def _reachable(topo: mo.Topology, start: str) -> set[str]:
    peers, seen, todo = _peers(topo), {start}, [start]
    while todo:
        for nxt in peers[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


@pytest.mark.parametrize("family", sorted(FRESH))
def test_every_size_is_connected_with_its_gpus(family):
    for make, gpus in zip(FAMILIES[family], FRESH[family]):
        topo = make()
        assert topo.num_gpus == gpus
        assert _reachable(topo, topo.gpus[0]) == {n.id for n in topo.nodes}
        pairs = {(l.src, l.dst) for l in topo.links}
        assert all((b, a) in pairs for a, b in pairs)          # every cable both ways


def test_planes_meet_only_in_the_gpus():
    topo = multi_plane(2, 2, 4, planes=4, nic_gbps=800.0)
    peers = _peers(topo)
    ports = {s: c for s, c in peers["s1h0g3"].items() if not s.endswith("nvs")}
    assert ports == {f"p{p}s1tor3": 200.0 for p in range(4)}
    for switch in (s for s in topo.switches if s.startswith("p")):   # the planes' ToRs, aggs
        plane = re.match(r"p[0-9]+", switch).group()
        assert all(re.match(r"p[0-9]+", s).group() == plane for s in peers[switch]
                   if not topo.is_gpu(s))
    assert peers["p2s0tor1"]["p2agg1"] == 2 * 200.0


def test_islands_meet_through_the_sockets():
    topo = nvlink_islands(1, 2, 8, island=4)
    peers = _peers(topo)
    assert sorted(peers["s0h1nvs1"]) == [f"s0h1g{g}" for g in range(4, 8)]
    assert sorted(peers["s0h1cpu0"]) == ["s0h1cpu1"] + [f"s0h1g{g}" for g in range(4)]
    pairs = nvlink_islands(1, 2, 8, island=2)
    assert sorted(s for s in _peers(pairs)["s0h0g2"] if pairs.is_gpu(s)) == ["s0h0g3"]
    assert sum(s.startswith("s0h0cpu") for s in pairs.switches) == 4


def test_mesh_hosts_have_no_switch_inside():
    topo = gpu_mesh(2, 3, 7, spines=2)
    peers = _peers(topo)
    assert sorted(peers["p1h2g6"]) == ["leaf1"] + [f"p1h2g{i}" for i in range(6)]
    assert peers["leaf0"]["spine1"] == pytest.approx(3 * 7 * 400.0 / 2)
    assert "spine0" not in _peers(gpu_mesh(1, 3, 7)).keys()


@pytest.mark.parametrize("family", sorted(FRESH))
def test_smallest_size_is_exact(family):
    topo = FAMILIES[family][0]()
    sched = mo.solve_allgather(topo, max_chunks=None)
    mo.validate(topo, sched)
    assert check_schedule(topo, sched).rate_gbps == pytest.approx(sched.rate_gbps, rel=1e-6)
    assert sched.rate_gbps == pytest.approx(cut_bound(topo), rel=1e-6)


@pytest.mark.parametrize("make", [
    lambda: multi_plane(1, 2, 8, planes=0),
    lambda: nvlink_islands(1, 2, 8, island=3),
    lambda: nvlink_islands(1, 2, 4, island=4),
    lambda: gpu_mesh(1, 1, 1),
    lambda: gpu_mesh(1, 2, 4, mesh_gbps=-1.0),
])
def test_bad_shapes_are_typed_errors(make):
    with pytest.raises(TopologyError):
        make()


def test_certified_rate_is_reached_with_a_slow_plane_port():
    """The tree master's point overloaded the 83.3 Gbps port by 1.5e-6 of its capacity
    (inside HiGHS's absolute tolerance on the egress-scaled rows) and was reported
    optimal 1.5e-6 below its certificate (docs/allgather.md "The tree master's
    certificate, exact")."""
    base = multi_plane(2, 8, 8, planes=4)
    topo = base.with_capacity({("s0h0g5", "p1s0tor5"): 83.3, ("p1s0tor5", "s0h0g5"): 83.3})
    sched = mo.solve_allgather(topo, max_chunks=None)
    assert sched.report.termination.value == "optimal"
    assert sched.rate_gbps == pytest.approx(sched.lp_rate_gbps, rel=1e-9)
    assert sched.rate_gbps == pytest.approx(sched.report.bound_gbps, rel=1e-9)


@pytest.mark.parametrize("seed", [3530, 3531])
def test_an_optimal_general_solve_reaches_its_certificate(seed):
    """Every ``None`` state of the fresh families' 16- and 64-GPU chains (fuzz seeds 3530 /
    3531): a solve reported optimal has a schedule whose own rate (recomputed from its
    loads) is its ``lp_rate_gbps`` and its certified bound within 1e-9, and no rate is
    above the oracle's cut bound."""
    from bench.replay_allgather_state import draw_chains

    chains = draw_chains(seed, True, 2, ["None"], sorted(FRESH))
    general = 0
    for base, states in chains.values():
        if base.num_gpus > 64:
            continue
        for topo in [base] + [t for _, t in states]:
            sched = mo.solve_allgather(topo, max_chunks=None)
            general += sched.report.method.value == "general"
            if sched.report.termination.value == "optimal":
                assert sched.rate_gbps >= sched.lp_rate_gbps * (1 - 1e-9)
                assert sched.rate_gbps >= sched.report.bound_gbps * (1 - 1e-9)
            assert sched.rate_gbps <= cut_bound(topo) * (1 + 1e-9)
    assert general >= 3                     # the states exercise the general method
