"""profile_schedule (what Algorithm 1 needs from a schedule, paper §3.2) against a plain
per-chunk, per-hop reference, for both collectives, array trees (solver and ring
AllGather schedules are :class:`~mccl_opt.TreeChunks`) and per-edge tuples alike, on
healthy, failed and unbalanced fabrics."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import mccl_opt as mo
from instances import fail1, fail2, fail3, hpn
from mccl_opt.baselines import direct_alltoall, ring_allgather
from mccl_opt.schedule import SATURATION_TOL, TreeChunks
from mccl_runtime.drift import profile_schedule

UNBALANCED = hpn(1, 2, 8).with_capacity({("s0h0g1", "s0h0nvs"): 360.0})    # one direction only
FABRICS = [hpn(1, 2, 4), fail1(hpn(1, 2, 4)), fail2(hpn(2, 2, 4)), fail3(hpn(1, 2, 4)), UNBALANCED]


def _reference(topo, schedule):
    """``(n, cut, base_slack, loads)`` hop by hop; the cut is the schedule's, else the
    links the schedule saturates at its own rate."""
    loads = np.zeros(topo.num_links)
    for c in schedule.chunks:
        for path in ((c.path,) if schedule.collective == "alltoall" else c.edges):
            for u, v in zip(path, path[1:]):
                loads[topo.link_index(u, v)] += c.share
    cap = topo.arrays.capacity
    if schedule.bottleneck:
        cut = [topo.link_index(b.src, b.dst) for b in schedule.bottleneck]
        base = [b.base_slack for b in schedule.bottleneck]
    else:
        used = loads > 1e-12
        rate = min(cap[a] / loads[a] for a in np.flatnonzero(used))
        cut = [a for a in range(topo.num_links) if loads[a] > 0 and 1 - rate * loads[a] / cap[a] <= SATURATION_TOL]
        base = [max(0.0, 1 - rate * loads[a] / cap[a]) for a in cut]
    return loads * float(schedule.max_chunks or 1), np.array(cut, np.int64), np.array(base), loads


def _same(topo, schedule):
    got = profile_schedule(topo, schedule)
    n, cut, base, loads = _reference(topo, schedule)
    np.testing.assert_allclose(got.loads, loads, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got.n, n, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(got.cut, cut)
    np.testing.assert_allclose(got.base_slack, base, rtol=1e-12, atol=1e-12)
    assert got.cut.size > 0


def _schedules(topo):
    yield mo.solve_allgather(topo)
    yield mo.solve_alltoall(topo)
    yield ring_allgather(topo)
    yield direct_alltoall(topo)


@pytest.mark.parametrize("topo", FABRICS, ids=lambda t: t.name)
def test_profile_matches_the_hop_by_hop_reference(topo):
    for schedule in _schedules(topo):
        _same(topo, schedule)
        _same(topo, replace(schedule, bottleneck=()))           # the cut derived from the loads


def test_array_trees_and_tuple_trees_give_one_profile():
    """The ring AllGather's array trees and the same trees as per-edge tuples (the
    schedule before the trees became arrays), healthy and degraded, medium size."""
    healthy = hpn(2, 4, 8)
    ring = ring_allgather(healthy)
    assert isinstance(ring.chunks, TreeChunks)
    tuples = replace(ring, chunks=tuple(ring.chunks))
    for topo in (healthy, fail2(healthy), fail1(healthy)):
        for sched in (ring, replace(ring, bottleneck=())):
            a = profile_schedule(topo, sched)
            b = profile_schedule(topo, replace(tuples, bottleneck=sched.bottleneck))
            np.testing.assert_allclose(a.n, b.n, rtol=1e-12, atol=1e-12)
            np.testing.assert_allclose(a.loads, b.loads, rtol=1e-12, atol=1e-12)
            np.testing.assert_array_equal(a.cut, b.cut)
            np.testing.assert_allclose(a.base_slack, b.base_slack, rtol=1e-12, atol=1e-12)
    _same(fail2(healthy), replace(ring, bottleneck=()))


def test_ring_allgather_trees_are_rank_ordered_chains():
    """Each ring tree is a chain from its root through every other GPU (one hop per
    edge, each starting where the last ended), roots in rank order."""
    topo = hpn(2, 2, 4)
    ring = ring_allgather(topo)
    roots = [c.src for c in ring.chunks]
    assert roots == sorted(roots, key=topo.rank)
    for c in ring.chunks:
        heads = [e[-1] for e in c.edges]
        assert c.edges[0][0] == c.src and all(e[0] == h for e, h in zip(c.edges[1:], heads))
        assert sorted(heads + [c.src], key=topo.rank) == list(topo.gpus)


def test_groups_share_a_measured_topology_per_capacity_vector():
    """Collectives registered on one ``M`` get one fabric object (built once); another
    ``M`` or another member list gets its own, with its capacities."""
    from mccl_runtime.groups import Groups

    topo = hpn(1, 2, 4)
    groups = Groups(topo)
    cap = topo.arrays.capacity
    host = topo.gpus[:4]
    whole = groups.topology(None, cap.copy())
    assert groups.topology(None, cap.copy()) is whole
    sub = groups.topology(host, cap)
    assert sub is not whole and sub.num_gpus == 4 and groups.topology(host, cap.copy()) is sub
    m = fail2(topo).arrays.capacity
    degraded = groups.topology(None, m)
    assert degraded is not whole
    np.testing.assert_array_equal(degraded.arrays.capacity, m)
    np.testing.assert_array_equal(groups.topology(None, cap).arrays.capacity, cap)
