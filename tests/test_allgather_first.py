"""The first schedule of a time-limited AllGather solve (mccl_opt.allgather.first): above
MWU_MAX_GPUS GPUs one shortest-path tree per root, built in arrays; checked against the
independent oracle's model (valid trees, the rate its loads give)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import mccl_opt as mo
from instances import hpn
from instances.aggregation import host_ring, leaf_spine, scrambled, shared_aggregation
from instances.fabrics import irregular
from mccl_opt.allgather.canonical import canonical
from mccl_opt.allgather.first import (BOTH_MAX_GPUS, MWU_MAX_GPUS, first_schedule,
                                     shortest_path_trees)
from mccl_opt.allgather.first_line import _line_paths, line_trees
from mccl_opt.schedule_chunks import TreeChunks, TreeTable
from tests.oracle_allgather import check_schedule


@pytest.mark.parametrize("make", [lambda: hpn(2, 8, 8), lambda: shared_aggregation(2, 5, 8),
                                  lambda: host_ring(12, 8)])
def test_large_fabric_first_schedule_is_valid(make):
    topo = canonical(make())
    assert topo.num_gpus > MWU_MAX_GPUS
    s = first_schedule(topo, None, 10)
    assert s.stats["method"] in ("shortest-path-trees", "line-trees")
    _, spt_loads = shortest_path_trees(topo)        # the better of the two is kept
    assert s.rate_gbps >= mo.schedule.schedule_rate(topo, spt_loads) * (1 - 1e-12)
    checked = check_schedule(topo, s, max_chunks=10)
    assert checked.rate_gbps == pytest.approx(s.rate_gbps, rel=1e-9)
    assert mo.validate(topo, s).rate_gbps == pytest.approx(s.rate_gbps, rel=1e-9)


def test_first_schedule_rate_is_not_above_the_optimum():
    topo = canonical(shared_aggregation(2, 5, 8))
    s = first_schedule(topo, None, 10)
    assert 0 < s.rate_gbps <= mo.solve_allgather(topo, max_chunks=None).lp_rate_gbps * (1 + 1e-9)


def test_validator_counts_a_path_a_table_lists_twice():
    """Loads of a tree table that names one path under two indices count both uses."""
    base = canonical(hpn(1, 1, 2))
    ids = [n.id for n in base.nodes]
    g0, g1 = (ids.index(g) for g in base.gpus)
    nvs = next(i for i, n in enumerate(base.nodes) if n.kind == "switch" and "nvs" in n.id)
    topo = base.with_capacity({(ids[g0], ids[nvs]): 100.0})      # path 0's link the bottleneck
    paths = [(g0, nvs, g1), (g1, nvs, g0), (g0, nvs, g1)]        # path 2 repeats path 0
    table = TreeTable(ids, paths, np.array([g0, g0, g1]), np.array([0.5, 0.5, 1.0]),
                      np.array([[0], [2], [1]]))
    sched = first_schedule(topo, None, None)
    loads = mo.schedule.share_loads(topo, TreeChunks(table))
    rate = mo.schedule.schedule_rate(topo, loads)
    tabled = dataclasses.replace(sched, chunks=TreeChunks(table), rate_gbps=rate,
                                 lp_rate_gbps=max(rate, sched.lp_rate_gbps))
    assert mo.validate(topo, tabled).rate_gbps == pytest.approx(rate, rel=1e-9)
    assert rate == pytest.approx(check_schedule(topo, tabled).rate_gbps, rel=1e-9)


@pytest.mark.parametrize("make", [lambda: hpn(2, 8, 8), lambda: shared_aggregation(2, 5, 8),
                                  lambda: hpn(1, 9, 8).with_capacity(
                                      src="s0h3g5", dst="s0tor5", gbps=90.0,
                                      both_directions=False)],
                         ids=["hpn", "shared-aggregation", "one-way-nic"])
def test_line_chains_are_valid_trees_whose_loads_the_oracle_confirms(make):
    topo = canonical(make())
    built = line_trees(topo)
    assert built is not None
    chunks, loads = built
    assert len(chunks) == topo.num_gpus and sorted(c.src for c in chunks) == sorted(topo.gpus)
    assert all(c.share == 1.0 and len(c.edges) == topo.num_gpus - 1 for c in chunks)
    rate = mo.schedule.schedule_rate(topo, loads)
    assert loads == pytest.approx(mo.schedule.share_loads(topo, chunks))
    s = dataclasses.replace(first_schedule(topo, None, 10), chunks=chunks, rate_gbps=rate,
                            lp_rate_gbps=rate)
    assert check_schedule(topo, s, max_chunks=10).rate_gbps == pytest.approx(rate, rel=1e-9)
    # every tree is two chains from its root: no GPU forwards to more than two others
    for c in chunks:
        fanout = np.unique([e[0] for e in c.edges], return_counts=True)[1]
        assert fanout.max() <= 2


def _gpu_star(leaves: int) -> mo.Topology:
    """GPU ``c`` cabled to every other GPU, no switch: a walk from a leaf reaches ``c``,
    then one more leaf, and is stuck there (paths do not pass through GPUs)."""
    nodes = [mo.Node("c", "gpu")] + [mo.Node(f"l{i:03d}", "gpu") for i in range(leaves)]
    links = [mo.Link(a, b, 100.0) for i in range(leaves)
             for a, b in ((f"l{i:03d}", "c"), ("c", f"l{i:03d}"))]
    return mo.Topology("star", nodes, links)


def test_no_line_over_switches_falls_back_to_shortest_path_trees():
    assert line_trees(canonical(_gpu_star(3))) is None
    topo = canonical(_gpu_star(MWU_MAX_GPUS + 1))
    assert line_trees(topo) is None
    s = first_schedule(topo, None, 10)
    assert s.stats["method"] == "shortest-path-trees"
    assert check_schedule(topo, s, max_chunks=10).rate_gbps == pytest.approx(s.rate_gbps)


@pytest.mark.parametrize("extra", [4, BOTH_MAX_GPUS - MWU_MAX_GPUS + 4],
                         ids=["at-most-both-max", "above-both-max"])
def test_under_a_limit_its_room_decides_whether_shortest_path_trees_are_tried(extra):
    """A full mesh of MWU_MAX_GPUS + 4 and BOTH_MAX_GPUS + 4 GPUs: the line's chains carry
    N-1 shards over one cable, the shortest-path trees one per cable.  Under a limit
    without room for them only the line is built, at any size (at 256 GPUs the trees
    took 0.5 s wall on a loaded machine before any clock check); with room, both, and
    the better (the trees) is kept; without a limit both up to BOTH_MAX_GPUS."""
    from mccl_opt import anytime
    from instances.fabrics import full_mesh

    topo = canonical(full_mesh(MWU_MAX_GPUS + extra))
    tight, _ = anytime.limited(1e-9, lambda: first_schedule(topo, None, 10))
    roomy, _ = anytime.limited(600.0, lambda: first_schedule(topo, None, 10))
    free = first_schedule(topo, None, 10)
    assert tight.stats["method"] == "line-trees"
    assert roomy.stats["method"] == "shortest-path-trees"
    assert free.stats["method"] == ("shortest-path-trees" if topo.num_gpus <= BOTH_MAX_GPUS
                                    else "line-trees")
    assert roomy.rate_gbps > tight.rate_gbps
    for s in (tight, roomy):
        assert check_schedule(topo, s, max_chunks=10).rate_gbps == pytest.approx(s.rate_gbps)


def _switch_only_costs(topo: mo.Topology, src: int) -> np.ndarray:
    """Cheapest cost ``1/capacity`` from node ``src`` to every node over paths that ride
    switches only (scipy's Dijkstra on the arcs out of switches and out of ``src``)."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import dijkstra

    arr = topo.arrays
    keep = arr.is_switch[arr.tail] | (arr.tail == src)
    cost = float(arr.capacity.max()) / arr.capacity
    n = topo.num_nodes
    graph = csr_matrix((cost[keep], (arr.tail[keep], arr.head[keep])), shape=(n, n))
    return dijkstra(graph, indices=src)


@pytest.mark.parametrize("make", [
    lambda: scrambled(shared_aggregation(2, 3, 8).with_capacity(
        src="s0h1g2", dst="s0tor2", gbps=100.0, both_directions=False), 5),
    lambda: leaf_spine(2, 2, 8).with_capacity(src="u0leaf0", dst="spine1", gbps=700.0,
                                              both_directions=False),
    lambda: irregular(5), lambda: host_ring(4, 4)], ids=["shared-agg", "leaf-spine",
                                                        "irregular", "host-ring"])
def test_the_line_takes_the_nearest_gpu_lowest_index_first_and_cheapest_paths(make):
    """The line's pruned search (switches only queued, bounded by each switch's cost to
    its nearest GPU) against plain Dijkstra: each next GPU is the nearest one not on the
    line, ties to the lowest index, and every step's path, forward and back, is a
    cheapest one (a search pruning too much takes a farther GPU or a dearer path)."""
    topo = canonical(make())
    arr = topo.arrays
    cost = float(arr.capacity.max()) / np.asarray(arr.capacity, float)
    line, nodes, arcs, lengths = _line_paths(
        *(np.asarray(a, np.int64) for a in (arr.out_start, arr.out_arcs, arr.in_start,
                                           arr.in_arcs, arr.tail, arr.head)),
        cost, np.asarray(arr.is_switch), int(arr.gpu_nodes[0]))
    g = topo.num_gpus
    assert line.size == g and lengths.all()
    starts = np.concatenate(([0], np.cumsum(lengths)))
    on_line = [int(line[0])]
    for i in range(g - 1):
        dist = _switch_only_costs(topo, int(line[i]))
        free = [int(v) for v in arr.gpu_nodes if int(v) not in on_line]
        nearest = min(dist[free])
        assert int(line[i + 1]) == min(v for v in free if dist[v] <= nearest * (1 + 1e-12))
        on_line.append(int(line[i + 1]))
        for path, src, dst in ((i, line[i], line[i + 1]), (g - 1 + i, line[i + 1], line[i])):
            hops = arcs[starts[path] + 1:starts[path + 1]]
            assert nodes[starts[path]] == src and arr.head[hops[-1]] == dst
            assert cost[hops].sum() == pytest.approx(_switch_only_costs(topo, int(src))[dst],
                                                     rel=1e-12)
