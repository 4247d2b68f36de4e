"""Verified fabric automorphisms for the symmetric tree master (docs/allgather.md
"Symmetric quotient").

Found without node names: colour refinement of the capacitated digraph (1-WL: node kind,
then the multisets of (capacity, neighbour colour) in and out) gives classes of nodes; a
class of switches whose GPU neighbourhoods are disjoint blocks of equal size, each GPU
told apart in its block by its other neighbours (a host's NVSwitch: the GPU's rail ToR;
a rail's ToR: the GPU's NVSwitch), or a set of twin GPUs (the same neighbours at the same
capacities), proposes the cyclic shift of its blocks.  Every proposal is checked to map
every link onto a link of the same capacity; a checked one that does not commute with an
accepted one it overlaps is dropped, so the accepted generators commute and the group
``H`` they generate is abelian.  Generators with disjoint supports fall in different
*clusters*; uniform weights over a cluster's elements ``g1^e1 ... gm^em`` are uniform over
its group (a homomorphism from ``Z_k1 x ... x Z_km``), which is what the expansion needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from math import lcm
from typing import Callable

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from mccl_opt.errors import SolveError
from mccl_opt.topology import Topology

__all__ = ["Symmetry", "find_symmetry", "MAX_CLUSTER_ELEMENTS"]

_REFINE_ROUNDS = 64

#: a cluster's elements are listed (node and link permutations each), and every tree is
#: copied over up to this many of them: larger groups are declined (the fabrics measured
#: had at most 256: a leaf-spine leaf's 4 hosts x 8 GPUs per host, with 4 units)
MAX_CLUSTER_ELEMENTS = 4096


@dataclass(frozen=True)
class Symmetry:
    """An abelian group ``H`` of automorphisms of a fabric: per cluster, every element's
    node and link permutations (``nodes[c][e]``, ``links[c][e]``; clusters move disjoint
    links); ``link_orbit`` / ``root_orbit`` label every link / rank by its ``H``-orbit."""

    nodes: tuple[np.ndarray, ...]
    links: tuple[np.ndarray, ...]
    link_orbit: np.ndarray
    root_orbit: np.ndarray

    @property
    def num_link_orbits(self) -> int:
        return int(self.link_orbit.max()) + 1

    @property
    def num_root_orbits(self) -> int:
        return int(self.root_orbit.max()) + 1

    def pieces(self) -> list[tuple[tuple[int, ...], float]]:
        """A coupling of the clusters' uniform distributions (north-west corner over the
        common refinement of their ``1/N_c`` grids): ``(element per cluster, weight)``,
        at most ``sum N_c - clusters + 1`` pieces, weights summing to 1, each cluster's
        marginal uniform."""
        sizes = [len(p) for p in self.nodes]
        if not sizes:
            return [((), 1.0)]
        den = lcm(*sizes)
        cuts = sorted({i * (den // n) for n in sizes for i in range(n + 1)})
        return [(tuple(lo * n // den for n in sizes), float(Fraction(hi - lo, den)))
                for lo, hi in zip(cuts, cuts[1:])]

    def carriers(self, gpu_nodes: np.ndarray, reps: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
        """Per rank ``s``, the node and link permutations (rows of ``(g, nodes)`` and
        ``(g, links)`` arrays) of an element of ``H`` mapping the representative
        ``reps[root_orbit[s]]`` onto ``s``: a GPU is moved by one cluster at most
        (clusters move disjoint links, so disjoint GPUs), whose elements carry its
        orbit's representative onto it."""
        g, n, m = gpu_nodes.size, self.nodes[0].shape[1], self.link_orbit.size
        rank = np.full(n, -1, np.int64)
        rank[gpu_nodes] = np.arange(g)
        node = np.tile(np.arange(n), (g, 1))
        link = np.tile(np.arange(m), (g, 1))
        done = reps[self.root_orbit] == np.arange(g)
        for nodes, links in zip(self.nodes, self.links):
            image = rank[nodes[:, gpu_nodes[reps]]]          # (elements, orbits)
            for o in range(reps.size):
                hit, first = np.unique(image[:, o], return_index=True)
                new = ~done[hit]
                node[hit[new]] = nodes[first[new]]
                link[hit[new]] = links[first[new]]
                done[hit[new]] = True
        if not done.all() or not np.array_equal(
                node[np.arange(g), gpu_nodes[reps[self.root_orbit]]], gpu_nodes):
            raise SolveError("symmetry: an orbit is not reached by its cluster's elements")
        return node, link

    def piece_maps(self, element: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Node and link permutations of one element (one index per cluster)."""
        node = np.arange(self.nodes[0].shape[1])
        link = np.arange(self.link_orbit.size)
        for c, e in enumerate(element):
            node = self.nodes[c][e][node]
            link = self.links[c][e][link]
        return node, link


def _refine(topo: Topology) -> np.ndarray:
    """Stable colour refinement of the capacitated digraph (node kind to start)."""
    arr = topo.arrays
    cap = arr.capacity.tolist()
    tail, head = arr.tail.tolist(), arr.head.tolist()
    out = [arr.out_arcs[arr.out_start[v]:arr.out_start[v + 1]].tolist()
           for v in range(topo.num_nodes)]
    inn = [arr.in_arcs[arr.in_start[v]:arr.in_start[v + 1]].tolist()
           for v in range(topo.num_nodes)]
    color = arr.is_switch.astype(np.int64).tolist()
    classes = len(set(color))
    for _ in range(_REFINE_ROUNDS):
        sig = [(color[v], tuple(sorted((cap[a], color[head[a]]) for a in out[v])),
                tuple(sorted((cap[a], color[tail[a]]) for a in inn[v])))
               for v in range(topo.num_nodes)]
        index: dict = {}
        color = [index.setdefault(s, len(index)) for s in sig]
        if len(index) == classes:
            break
        classes = len(index)
    return np.asarray(color, dtype=np.int64)


def _neighbours(topo: Topology) -> list[set[int]]:
    arr = topo.arrays
    nb: list[set[int]] = [set() for _ in range(topo.num_nodes)]
    for t, h in zip(arr.tail.tolist(), arr.head.tolist()):
        nb[t].add(h)
        nb[h].add(t)
    return nb


def _block_shifts(topo: Topology, color: np.ndarray, nb: list[set[int]]) -> list[np.ndarray]:
    """Cyclic shifts of switch classes' GPU blocks (module docstring), unchecked."""
    arr = topo.arrays
    is_gpu = ~arr.is_switch
    out: list[np.ndarray] = []
    for c in np.unique(color[arr.is_switch]).tolist():
        members = np.flatnonzero((color == c) & arr.is_switch).tolist()
        if len(members) < 2:
            continue
        blocks = {s: sorted(u for u in nb[s] if is_gpu[u]) for s in members}
        sizes = {len(b) for b in blocks.values()}
        gpus = [u for b in blocks.values() for u in b]
        if len(sizes) != 1 or 0 in sizes or len(set(gpus)) != len(gpus):
            continue
        by_sig = {s: _signatures(block, nb, s) for s, block in blocks.items()}
        parts: dict[frozenset, list[int]] = {}
        for s, sig in by_sig.items():
            parts.setdefault(frozenset(sig), []).append(s)
        for part in parts.values():
            if len(part) >= 2:
                perm = np.arange(topo.num_nodes)
                for s, t in zip(part, part[1:] + part[:1]):
                    perm[s] = t
                    for key, u in by_sig[s].items():
                        perm[u] = by_sig[t][key]
                out.append(perm)
            perm = np.arange(topo.num_nodes)      # twins within every block at once
            for s in part:
                for (other, k), u in by_sig[s].items():
                    perm[u] = by_sig[s].get((other, k + 1), by_sig[s][other, 0])
            if (perm != np.arange(topo.num_nodes)).any():
                out.append(perm)
    return out


def _signatures(block: list[int], nb: list[set[int]], s: int) -> dict[tuple, int]:
    """Each GPU of switch ``s``'s block keyed by its other neighbours and, among GPUs with
    the same ones (a leaf serving two rails: both GPUs of a host), its place in node order."""
    seen: dict[frozenset, int] = {}
    out = {}
    for u in block:
        other = frozenset(nb[u] - {s})
        out[other, seen.get(other, 0)] = u
        seen[other] = seen.get(other, 0) + 1
    return out


def _twin_shifts(topo: Topology) -> list[np.ndarray]:
    """Cyclic shifts of twin GPUs (same neighbours at the same capacities), unchecked."""
    arr = topo.arrays
    groups: dict[tuple, list[int]] = {}
    for v in arr.gpu_nodes.tolist():
        o = arr.out_arcs[arr.out_start[v]:arr.out_start[v + 1]]
        i = arr.in_arcs[arr.in_start[v]:arr.in_start[v + 1]]
        key = (tuple(sorted(zip(arr.head[o].tolist(), arr.capacity[o].tolist()))),
               tuple(sorted(zip(arr.tail[i].tolist(), arr.capacity[i].tolist()))))
        groups.setdefault(key, []).append(v)
    out = []
    for part in groups.values():
        if len(part) >= 2:
            perm = np.arange(topo.num_nodes)
            perm[part] = part[1:] + part[:1]
            out.append(perm)
    return out


def _link_map(topo: Topology, perm: np.ndarray) -> np.ndarray | None:
    """The link permutation of the node permutation ``perm`` when it is an automorphism
    of the capacitated digraph (every link onto a link of equal capacity), else ``None``."""
    arr = topo.arrays
    n = topo.num_nodes
    key = arr.tail.astype(np.int64) * n + arr.head
    order = np.argsort(key, kind="stable")
    if np.any(np.diff(key[order]) == 0):          # parallel links: not handled
        return None
    image = perm[arr.tail].astype(np.int64) * n + perm[arr.head]
    pos = np.minimum(np.searchsorted(key, image, sorter=order), key.size - 1)
    link = order[pos]
    if not (np.array_equal(key[link], image) and np.array_equal(arr.capacity[link], arr.capacity)):
        return None
    return link


def _order(perm: np.ndarray) -> int:
    k, p = 1, perm.copy()
    ident = np.arange(perm.size)
    while not np.array_equal(p, ident):
        p = perm[p]
        k += 1
    return k


def _elements(gens: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Every product ``g1^e1 ... gm^em`` of commuting generators, as stacked node and
    link permutations (uniform over the group they generate)."""
    nodes = [np.arange(gens[0][0].size)]
    links = [np.arange(gens[0][1].size)]
    for node, link in gens:
        k = _order(node)
        pn, pl = list(nodes), list(links)
        for _ in range(k - 1):
            pn = [node[p] for p in pn]
            pl = [link[p] for p in pl]
            nodes += pn
            links += pl
    return np.stack(nodes), np.stack(links)


def _components(n: int, maps: list[np.ndarray]) -> np.ndarray:
    """Orbit labels of ``range(n)`` under the permutations ``maps``."""
    if not maps:
        return np.arange(n)
    src = np.concatenate([np.arange(n)] * len(maps))
    dst = np.concatenate(maps)
    graph = coo_matrix((np.ones(src.size), (src, dst)), shape=(n, n))
    return connected_components(graph, directed=True, connection="weak")[1]


def find_symmetry(topo: Topology,
                  fits: Callable[[int, int], bool] | None = None) -> Symmetry | None:
    """The checked abelian automorphism group of ``topo`` found as in the module
    docstring, ``None`` when no proposal passes, or when ``fits(link orbits, root
    orbits)`` is false: it is asked before the group's elements are listed (up to
    :data:`MAX_CLUSTER_ELEMENTS` node and link permutations per cluster), so a quotient
    the caller would not solve costs no more than finding its generators."""
    color = _refine(topo)
    nb = _neighbours(topo)
    accepted = _commuting(topo, _block_shifts(topo, color, nb) + _twin_shifts(topo))
    if not accepted:
        return None
    link_orbit = _components(topo.num_links, [link for _, link in accepted])
    node_orbit = _components(topo.num_nodes, [node for node, _ in accepted])
    _, root_orbit = np.unique(node_orbit[topo.arrays.gpu_nodes], return_inverse=True)
    _, link_orbit = np.unique(link_orbit, return_inverse=True)
    if fits is not None and not fits(int(link_orbit.max()) + 1, int(root_orbit.max()) + 1):
        return None
    support = [np.flatnonzero(link != np.arange(link.size)) for _, link in accepted]
    owner = _clusters(support)
    clusters = [[accepted[i] for i in np.flatnonzero(owner == c)] for c in np.unique(owner)]
    if any(np.prod([float(_order(node)) for node, _ in gens]) > MAX_CLUSTER_ELEMENTS
           for gens in clusters):
        return None
    elems = [_elements(gens) for gens in clusters]
    return Symmetry(tuple(e[0] for e in elems), tuple(e[1] for e in elems),
                    link_orbit.astype(np.int64), root_orbit.astype(np.int64))


def _commuting(topo: Topology, proposals: list[np.ndarray]
               ) -> list[tuple[np.ndarray, np.ndarray]]:
    """The proposals that are automorphisms (with their link maps), in order, each kept
    when it commutes with every one kept before whose moved nodes overlap its own (the
    overlap found for all kept ones at once from a matrix of their moved nodes)."""
    ident = np.arange(topo.num_nodes)
    moved_kept = np.zeros((len(proposals), topo.num_nodes), dtype=bool)
    accepted: list[tuple[np.ndarray, np.ndarray]] = []
    for perm in proposals:
        link = _link_map(topo, perm)
        if link is None:
            continue
        moved = perm != ident
        overlap = np.flatnonzero(moved_kept[:len(accepted), moved].any(axis=1))
        if all(np.array_equal(perm[accepted[i][0]], accepted[i][0][perm])
               for i in overlap.tolist()):
            moved_kept[len(accepted)] = moved
            accepted.append((perm, link))
    return accepted


def _clusters(support: list[np.ndarray]) -> np.ndarray:
    """Cluster label per generator: connected components of 'moves a common link'."""
    m = len(support)
    owner = np.concatenate([np.full(s.size, i) for i, s in enumerate(support)])
    links = np.concatenate(support)
    order = np.argsort(links, kind="stable")
    same = np.flatnonzero(np.diff(links[order]) == 0)
    a, b = owner[order][same], owner[order][same + 1]
    graph = coo_matrix((np.ones(a.size), (a, b)), shape=(m, m))
    return connected_components(graph, directed=False)[1]
