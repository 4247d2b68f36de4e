"""Minimum spanning arborescences (mccl_opt.allgather.general.arborescence) against brute force,
and the switch-only cheapest paths the general AllGather method prices with."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from mccl_opt import Topology
from mccl_opt.allgather.general.arborescence import min_arborescences
from mccl_opt.allgather.general.switch_paths import switch_paths


def _brute(D: np.ndarray, root: int) -> float:
    """Cheapest arborescence by enumerating every parent choice."""
    g = len(D)
    others = [v for v in range(g) if v != root]
    best = np.inf
    for choice in itertools.product(range(g), repeat=len(others)):
        par = dict(zip(others, choice))
        if any(par[v] == v or not np.isfinite(D[par[v], v]) for v in others):
            continue
        ok = True
        for v in others:
            u, steps = v, 0
            while u != root and steps <= g:
                u, steps = par[u], steps + 1
            ok &= u == root
        if ok:
            best = min(best, sum(D[par[v], v] for v in others))
    return best


def _spans(parent: np.ndarray, root: int) -> bool:
    for v in range(parent.size):
        u, steps = v, 0
        while u != root:
            u, steps = parent[u], steps + 1
            if u < 0 or steps > parent.size:
                return False
    return parent[root] == -1


@pytest.mark.parametrize("seed", range(6))
def test_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    for _ in range(25):
        g = int(rng.integers(2, 6))
        D = rng.integers(0, 4, size=(g, g)).astype(float) if seed % 2 else rng.random((g, g))
        D[rng.random((g, g)) < 0.3] = np.inf          # missing edges; ties when integer
        parents, costs = min_arborescences(D, np.arange(g))
        for r in range(g):
            ref = _brute(D, r)
            if np.isinf(ref):
                assert np.isinf(costs[r])
                continue
            assert costs[r] == pytest.approx(ref, abs=1e-12)
            assert _spans(parents[r], r)
            assert sum(D[parents[r][v], v] for v in range(g) if v != r) == pytest.approx(costs[r])


def test_cycle_contraction_needed():
    """Cheapest in-edges form a cycle 1 <-> 2; the optimum enters it once from the root."""
    inf = np.inf
    D = np.array([[0, 5, 6], [inf, 0, 1], [inf, 1, 0]])
    parents, costs = min_arborescences(D, np.array([0]))
    assert costs[0] == 6.0
    assert parents[0].tolist() == [-1, 0, 1]


def test_deterministic_and_unreachable():
    rng = np.random.default_rng(7)
    D = np.round(rng.random((30, 30)) * 2)           # many ties
    a = min_arborescences(D, np.arange(30))
    b = min_arborescences(D.copy(), np.arange(30))
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    D = np.full((3, 3), np.inf)
    D[0, 1] = 1.0
    assert np.isinf(min_arborescences(D, np.array([0]))[1][0])   # node 2 has no in-edge


def test_bad_input():
    with pytest.raises(ValueError):
        min_arborescences(np.zeros((2, 3)), np.array([0]))
    with pytest.raises(ValueError):
        min_arborescences(np.array([[0, np.nan], [1, 0]]), np.array([0]))
    with pytest.raises(ValueError):
        min_arborescences(np.zeros((2, 2)), np.array([2]))


def _fabric() -> Topology:
    nodes = [("a", "gpu"), ("b", "gpu"), ("c", "gpu"), ("s", "switch"), ("t", "switch")]
    links = [("a", "s", 1.0), ("s", "a", 1.0), ("b", "s", 1.0), ("s", "b", 1.0),
             ("s", "t", 1.0), ("t", "s", 1.0), ("t", "c", 1.0), ("c", "t", 1.0),
             ("a", "b", 1.0), ("b", "c", 1.0)]
    return Topology.from_dict({"format": "mccl-topology/1", "name": "f",
                               "nodes": [{"id": i, "kind": k} for i, k in nodes],
                               "links": [{"src": u, "dst": v, "capacity_gbps": c}
                                         for u, v, c in links]})


def test_switch_paths_cheapest_and_switch_only():
    topo = _fabric()
    price = np.ones(topo.num_links)
    price[topo.link_index("a", "b")] = 5.0            # the direct link is now dearer
    sp = switch_paths(topo, price)
    ra, rb, rc = (topo.rank(x) for x in "abc")
    assert sp.cost[ra, rb] == 2.0                     # a -> s -> b
    assert sp.cost[ra, rc] == 3.0                     # a -> s -> t -> c, never through GPU b
    assert sp.cost[rb, rc] == 1.0                     # the direct link
    parent = np.array([-1, ra, rb])                   # a -> b -> c
    arcs = sp.tree_arcs(ra, parent)
    hops = [(topo.links[a].src, topo.links[a].dst) for a in arcs]
    assert hops == [("a", "s"), ("s", "b"), ("b", "c")]
    with pytest.raises(ValueError):
        switch_paths(topo, -price)


def _networkx_cost(D: np.ndarray, root: int) -> float:
    """The minimum arborescence rooted at ``root`` by networkx's Edmonds (an independent
    implementation): every edge into ``root`` removed, so any spanning arborescence
    found is rooted there."""
    nx = pytest.importorskip("networkx")
    G = nx.DiGraph()
    G.add_nodes_from(range(len(D)))
    for u, v in zip(*np.nonzero(np.isfinite(D))):
        if u != v and v != root:
            G.add_edge(int(u), int(v), weight=float(D[u, v]))
    try:
        tree = nx.minimum_spanning_arborescence(G, attr="weight", preserve_attrs=True)
    except nx.exception.NetworkXException:
        return np.inf
    return float(sum(d["weight"] for _, _, d in tree.edges(data=True)))


@pytest.mark.parametrize("seed", range(12))
def test_matches_networkx_on_dense_digraphs_with_ties_and_odd_floats(seed):
    """Dense digraphs of up to 24 nodes (networkx's Edmonds, the oracle, costs ~2 s on
    all twelve; 8 s at up to 40): costs from a few values (many ties, where a wrong
    tie-break in the contraction shows), odd floats of mixed magnitude, and some missing
    edges; every root's cost equals networkx's and the parents span."""
    rng = np.random.default_rng(1000 + seed)
    g = int(rng.integers(5, 25))
    if seed % 3 == 0:
        D = rng.integers(1, 4, (g, g)).astype(float)
    elif seed % 3 == 1:
        D = rng.random((g, g)) * 10.0 ** rng.integers(-3, 4, (g, g)) + np.pi * 1e-7
    else:
        D = np.round(rng.random((g, g)) * 7, 1) + 1e-9 * rng.random((g, g))
    D[rng.random((g, g)) < 0.15] = np.inf
    roots = np.arange(g)
    parents, costs = min_arborescences(D, roots)
    for r in roots.tolist():
        expected = _networkx_cost(D, r)
        if not np.isfinite(expected):
            assert not np.isfinite(costs[r])
            continue
        assert costs[r] == pytest.approx(expected, rel=1e-12, abs=1e-12)
        assert _spans(parents[r], r)
        assert sum(D[parents[r][v], v] for v in range(g) if v != r) == pytest.approx(costs[r],
                                                                                     rel=1e-12)
