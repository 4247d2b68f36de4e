"""Switch-only shortest paths (mccl_opt.paths): switch-only interiors over real links,
fewest hops, then lowest latency, then Dijkstra/node order; TopologyError when none."""

from __future__ import annotations

import itertools

import networkx as nx
import pytest

from instances import dgx, fail3, hpn, irregular, ring
from mccl_opt.errors import TopologyError
from mccl_opt.paths import path_nodes, switch_path, switch_paths_from
from mccl_opt.topology import Link, Node, Topology

FABRICS = [hpn(1, 2, 4), hpn(2, 2, 2), fail3(hpn(1, 2, 4)), dgx(), irregular(0), irregular(3)]


def _relay_graph(topo: Topology, src: str) -> nx.DiGraph:
    """Links a packet from ``src`` may take: leaving ``src`` or a switch (independent model)."""
    g = nx.DiGraph()
    g.add_nodes_from(n.id for n in topo.nodes)
    for l in topo.links:
        if l.src == src or not topo.is_gpu(l.src):
            g.add_edge(l.src, l.dst, lat=l.latency_us)
    return g


def _latency(topo: Topology, nodes: tuple[str, ...]) -> float:
    return sum(topo.link(u, v).latency_us for u, v in zip(nodes, nodes[1:]))


def _two_route_fabric(lat_a: float, lat_b: float) -> Topology:
    """g0 -> {swA, swB} -> g1 (two 2-hop routes) plus a zero-latency 3-hop route via swC, swD."""
    nodes = [Node("g0", "gpu"), Node("g1", "gpu"), Node("swA", "switch"), Node("swB", "switch"),
             Node("swC", "switch"), Node("swD", "switch")]
    links = [Link("g0", "swA", 10, lat_a), Link("swA", "g1", 10, 0.0),
             Link("g0", "swB", 10, lat_b), Link("swB", "g1", 10, 0.0),
             Link("g0", "swC", 10, 0.0), Link("swC", "swD", 10, 0.0), Link("swD", "g1", 10, 0.0),
             Link("g1", "g0", 10, 0.0)]
    return Topology("two-routes", nodes, links)


@pytest.mark.parametrize("topo", FABRICS, ids=lambda t: t.name)
def test_paths_are_switch_only_chains_of_real_links_with_fewest_hops_then_least_latency(topo):
    arr = topo.arrays
    for src in (int(g) for g in arr.gpu_nodes):
        sid = topo.nodes[src].id
        g = _relay_graph(topo, sid)
        hops = nx.single_source_shortest_path_length(g, sid)
        paths = switch_paths_from(topo, src)
        expected = {topo.node_index(v) for v in hops if topo.is_gpu(v) and v != sid}
        assert set(paths) == expected  # every reachable GPU, nothing else
        for dst, arcs in paths.items():
            assert int(arr.tail[arcs[0]]) == src and int(arr.head[arcs[-1]]) == dst
            assert all(int(arr.head[a]) == int(arr.tail[b]) for a, b in zip(arcs, arcs[1:]))
            nodes = path_nodes(topo, arcs)
            assert all(topo.has_link(u, v) for u, v in zip(nodes, nodes[1:]))
            assert all(not topo.is_gpu(x) for x in nodes[1:-1])
            assert len(arcs) == hops[nodes[-1]]
            best = min(_latency(topo, tuple(p)) for p in nx.all_shortest_paths(g, sid, nodes[-1]))
            assert _latency(topo, nodes) == pytest.approx(best)
            assert switch_path(topo, src, dst) == arcs


def test_fewer_hops_beat_lower_latency_and_latency_breaks_hop_ties():
    topo = _two_route_fabric(lat_a=5.0, lat_b=1.0)
    ix = topo.node_index
    assert path_nodes(topo, switch_path(topo, ix("g0"), ix("g1"))) == ("g0", "swB", "g1")
    topo = _two_route_fabric(lat_a=1.0, lat_b=5.0)
    assert path_nodes(topo, switch_path(topo, ix("g0"), ix("g1"))) == ("g0", "swA", "g1")


def test_exact_ties_go_to_the_lower_node_index_and_repeat_across_equal_topologies():
    topo = _two_route_fabric(lat_a=2.0, lat_b=2.0)
    ix = topo.node_index
    assert path_nodes(topo, switch_path(topo, ix("g0"), ix("g1"))) == ("g0", "swA", "g1")
    # Same fabric with the switches declared in the other order: the lower index wins.
    swapped = Topology("two-routes", [topo.nodes[i] for i in (0, 1, 3, 2, 4, 5)], topo.links)
    iy = swapped.node_index
    assert path_nodes(swapped, switch_path(swapped, iy("g0"), iy("g1"))) == ("g0", "swB", "g1")
    # Equal but distinct objects (and re-capacitated copies) give identical paths.
    for other in (Topology.from_dict(topo.to_dict()), topo.with_capacity({("g0", "swA"): 1.0})):
        for s, d in itertools.permutations(range(topo.num_nodes), 2):
            try:
                want = switch_path(topo, s, d)
            except TopologyError:
                with pytest.raises(TopologyError):
                    switch_path(other, s, d)
                continue
            assert switch_path(other, s, d) == want


def test_switch_endpoints_and_the_fail3_backup_route():
    topo = fail3(hpn(1, 2, 4))
    ix = topo.node_index
    assert path_nodes(topo, switch_path(topo, ix("s0h0g0-bk"), ix("s0tor0"))) == \
        ("s0h0g0-bk", "bk-tor", "s0tor0")
    assert path_nodes(topo, switch_path(topo, ix("s0tor0"), ix("s0h1g0"))) == ("s0tor0", "s0h1g0")


def test_gpus_never_relay_so_unreachable_pairs_raise_topology_error():
    topo = ring(4)  # direct GPU links only: g0 reaches g1 and g3, never g2
    ix = topo.node_index
    assert set(switch_paths_from(topo, ix("g0"))) == {ix("g1"), ix("g3")}
    with pytest.raises(TopologyError, match="no switch-only path 'g0' -> 'g2'"):
        switch_path(topo, ix("g0"), ix("g2"))
    with pytest.raises(TopologyError, match="same node"):
        switch_path(topo, ix("g0"), ix("g0"))
    with pytest.raises(TopologyError, match="out of range"):
        switch_paths_from(topo, topo.num_nodes)
    with pytest.raises(TopologyError, match="out of range"):
        switch_path(topo, 0, -1)


def test_results_are_read_only():
    topo = hpn(1, 2, 2)
    paths = switch_paths_from(topo, int(topo.arrays.gpu_nodes[0]))
    with pytest.raises(TypeError):
        paths[0] = ()  # type: ignore[index]


@pytest.mark.parametrize("topo", FABRICS + [hpn(2, 4, 8)], ids=lambda t: t.name)
def test_batched_paths_are_the_per_pair_paths(topo):
    """switch_paths_batch over every ordered node pair of GPUs (and a few from switches,
    in chunks smaller than the sources) gives switch_path's arcs, or no path where it raises."""
    from mccl_opt.paths import switch_paths_batch

    gpus = [int(g) for g in topo.arrays.gpu_nodes]
    switch = [v for v in range(topo.num_nodes) if topo.arrays.is_switch[v]][:2]
    pairs = [(s, d) for s in gpus + switch for d in gpus]
    arcs, hops = switch_paths_batch(topo, [s for s, _ in pairs], [d for _, d in pairs], chunk=5)
    reached = 0
    for (s, d), row, n in zip(pairs, arcs.tolist(), hops.tolist()):
        try:
            expected = switch_path(topo, s, d)
        except TopologyError:
            expected = ()
        assert tuple(row[:n]) == expected and all(a == -1 for a in row[n:])
        reached += bool(n)
    assert reached > len(gpus)
