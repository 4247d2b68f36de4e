"""Verified fabric automorphisms for the symmetric tree master (docs/allgather_history.md
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

The first schedule's images (:mod:`..first_images`) ask for automorphisms of the links
alone (``symmetry_generators(structural=True)``: capacities ignored), with one shift of
all parts of a switch class at once and every shift extended to the switches next to
it, so that HPN's rail shift (every segment's rail ToRs and the per-rail aggregation
switches) is found too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from mccl_opt import anytime
from mccl_opt.errors import SolveError
from mccl_opt.topology import Topology

from .colours import IN_SALT, mix, refine
from .permutation_group import clusters_of, coupling, cycle_order, elements, orbits

__all__ = ["Symmetry", "find_symmetry", "symmetry_generators", "twin_switch_generators",
           "MAX_CLUSTER_ELEMENTS"]

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
        return coupling([len(p) for p in self.nodes])

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
        node, link = self.element_maps(np.array([element], np.int64))
        return node[0], link[0]

    def element_maps(self, elements: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Node and link permutations of every row of ``elements`` (one index per
        cluster), as :meth:`piece_maps` gives each: ``(rows, nodes)``, ``(rows, links)``."""
        rows = elements.shape[0]
        node = np.broadcast_to(np.arange(self.nodes[0].shape[1]), (rows, self.nodes[0].shape[1]))
        link = np.broadcast_to(np.arange(self.link_orbit.size), (rows, self.link_orbit.size))
        for c in range(len(self.nodes)):
            node = np.take_along_axis(self.nodes[c][elements[:, c]], node, axis=1)
            link = np.take_along_axis(self.links[c][elements[:, c]], link, axis=1)
        return node, link


def _neighbours(topo: Topology) -> list[set[int]]:
    arr = topo.arrays
    nb: list[set[int]] = [set() for _ in range(topo.num_nodes)]
    for t, h in zip(arr.tail.tolist(), arr.head.tolist()):
        nb[t].add(h)
        nb[h].add(t)
    return nb


def _block_shifts(topo: Topology, color: np.ndarray, nb: list[set[int]],
                  extend: bool) -> list[np.ndarray]:
    """Cyclic shifts of switch classes' GPU blocks (module docstring), unchecked; with
    ``extend``, also one shift of every part of a class at once (:func:`_lined_up`),
    and every shift extended to the unmoved nodes next to it (:func:`_closed`)."""
    arr = topo.arrays
    is_gpu = ~arr.is_switch
    out: list[np.ndarray] = []
    for c in np.unique(color[arr.is_switch]).tolist():
        anytime.check("the fabric's symmetry search")
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
            anytime.check("the fabric's symmetry search")
            if len(part) >= 2:
                out.append(_shift([part], by_sig, topo.num_nodes))
            perm = np.arange(topo.num_nodes)      # twins within every block at once
            for s in part:
                for (other, k), u in by_sig[s].items():
                    perm[u] = by_sig[s].get((other, k + 1), by_sig[s][other, 0])
            if (perm != np.arange(topo.num_nodes)).any():
                out.append(perm)
        if extend and len(parts) >= 2:
            lined = _lined_up(list(parts.values()), nb, arr.is_switch)
            if lined is not None and len(lined[0]) >= 2:
                out.append(_shift(lined, by_sig, topo.num_nodes))
    if not extend:
        return out
    anytime.check("the fabric's symmetry search")
    by_nb = {frozenset(v): u for u, v in enumerate(nb)}
    closed = []
    for perm in out:
        anytime.check("the fabric's symmetry search")
        q = _closed(perm, nb, by_nb)
        if q is not None:
            closed.append(q)
    return closed


def _shift(parts: list[list[int]], by_sig: dict[int, dict[tuple, int]], n: int) -> np.ndarray:
    """Every part's switches shifted cyclically in list order, with their GPU blocks
    (each GPU onto the GPU of the same signature)."""
    perm = np.arange(n)
    for part in parts:
        for s, t in zip(part, part[1:] + part[:1]):
            perm[s] = t
            for key, u in by_sig[s].items():
                perm[u] = by_sig[t][key]
    return perm


def _lined_up(parts: list[list[int]], nb: list[set[int]], is_switch: np.ndarray
              ) -> list[list[int]] | None:
    """The parts of a switch class reordered so that the ``i``-th switches of all parts
    have the same switch neighbours (HPN: segment ``s``'s rail-``i`` ToR, all uplinked to
    rail ``i``'s aggregation switch), so that one shift moves them together (the rail
    shift); ``None`` where that match is not one to one."""
    def uplinks(s: int) -> frozenset:
        return frozenset(u for u in nb[s] if is_switch[u])

    out = []
    for part in parts:
        by_up = {uplinks(s): s for s in part}
        order = [by_up.get(uplinks(s), -1) for s in parts[0]]
        if len(part) != len(parts[0]) or len(by_up) != len(part) or -1 in order:
            return None
        out.append(order)
    return out


def _closed(perm: np.ndarray, nb: list[set[int]], by_nb: dict[frozenset, int]
            ) -> np.ndarray | None:
    """``perm`` with every unmoved node whose neighbours it moves elsewhere sent to the
    node whose neighbours are their images (``by_nb``: node by neighbour set; an
    aggregation switch of one rail onto the next rail's), ``None`` when that is no
    permutation."""
    moved = perm != np.arange(perm.size)
    image_of = perm.tolist()
    out = perm.copy()
    near = set().union(*(nb[v] for v in np.flatnonzero(moved).tolist()))
    for u in near:
        if not moved[u]:
            image = frozenset(image_of[v] for v in nb[u])
            if image != nb[u]:
                out[u] = by_nb.get(image, -1)
    if (out < 0).any() or np.unique(out).size != out.size:
        return None
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


def _twin_shifts(topo: Topology, capacity: np.ndarray, nodes: np.ndarray | None = None
                 ) -> list[np.ndarray]:
    """Cyclic shifts of twin GPUs (same neighbours at the same ``capacity``), unchecked:
    GPUs grouped by sums of 64-bit mixes of their (neighbour, capacity) pairs out and in
    (as in :func:`.colours.refine`; a collision only proposes a shift :func:`_link_map` rejects),
    groups in order of their first GPU; ``nodes``: twins among these nodes instead."""
    arr = topo.arrays
    n = topo.num_nodes
    _, cap_id = np.unique(capacity, return_inverse=True)
    cap_key = cap_id.astype(np.uint64) * np.uint64(n + 1)
    out = np.zeros(n, np.uint64)
    inn = np.zeros(n, np.uint64)
    np.add.at(out, arr.tail, mix(cap_key + arr.head.astype(np.uint64)))
    np.add.at(inn, arr.head, mix(cap_key + arr.tail.astype(np.uint64) + IN_SALT))
    gpus = np.asarray(arr.gpu_nodes if nodes is None else nodes, np.int64)
    if gpus.size < 2:
        return []
    with np.errstate(over="ignore"):
        key = mix(out[gpus]) + inn[gpus]
    _, first, group = np.unique(key, return_index=True, return_inverse=True)
    group = group.reshape(-1)
    result = []
    for g in np.argsort(first, kind="stable").tolist():
        part = gpus[group == g]
        if part.size >= 2:
            perm = np.arange(n)
            perm[part] = np.roll(part, -1)
            result.append(perm)
    return result


def twin_switch_generators(topo: Topology) -> list[tuple[np.ndarray, np.ndarray]]:
    """The cyclic shift of every class of twin switches (the same neighbours, capacities
    ignored: a leaf-spine's spines), checked: ``(node permutation, link permutation)``
    each.  Kept apart from :func:`symmetry_generators` (``structural``): a spine shift
    moves links of every unit, so it would merge the units' clusters into one."""
    ones = np.ones(topo.num_links)
    out = []
    for perm in _twin_shifts(topo, ones, np.flatnonzero(topo.arrays.is_switch)):
        link = _link_map(topo, perm, ones)
        if link is not None:
            out.append((perm, link))
    return out


def _link_map(topo: Topology, perm: np.ndarray, capacity: np.ndarray) -> np.ndarray | None:
    """The link permutation of the node permutation ``perm`` when it is an automorphism
    of the digraph with link capacities ``capacity`` (every link onto a link of equal
    capacity), else ``None``."""
    arr = topo.arrays
    n = topo.num_nodes
    key = arr.tail.astype(np.int64) * n + arr.head
    order = np.argsort(key, kind="stable")
    if np.any(np.diff(key[order]) == 0):          # parallel links: not handled
        return None
    image = perm[arr.tail].astype(np.int64) * n + perm[arr.head]
    pos = np.minimum(np.searchsorted(key, image, sorter=order), key.size - 1)
    link = order[pos]
    if not (np.array_equal(key[link], image) and np.array_equal(capacity[link], capacity)):
        return None
    return link


def symmetry_generators(topo: Topology, *, structural: bool = False
                        ) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """The checked commuting generators found as in the module docstring, grouped by
    cluster: per cluster, ``(node permutation, link permutation)`` of each generator
    (empty when no proposal passes).  ``structural``: automorphisms of the digraph
    alone, capacities ignored (a degraded link breaks no symmetry: every link still maps
    onto a link, so trees onto trees), joint shifts of a class's parts proposed too
    (:func:`_block_shifts`).  20-50 ms CPU at 1,024 GPUs: listing the clusters' elements
    (:func:`find_symmetry`) is most of that function's cost."""
    capacity = np.ones(topo.num_links) if structural else topo.arrays.capacity
    return _generators(topo, refine(topo, capacity), capacity, structural)


def _generators(topo: Topology, color: np.ndarray, capacity: np.ndarray, structural: bool
                ) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """:func:`symmetry_generators` at the refined colours ``color``."""
    nb = _neighbours(topo)
    accepted: list[tuple[np.ndarray, np.ndarray]] = []
    moves = np.zeros((0, topo.num_nodes), bool)      # the nodes each accepted one moves
    for perm in _block_shifts(topo, color, nb, structural) + _twin_shifts(topo, capacity):
        anytime.check("the fabric's symmetry search")
        link = _link_map(topo, perm, capacity)
        if link is None:
            continue
        moved = perm != np.arange(perm.size)
        # commuting with every accepted permutation whose moved nodes meet its own
        if all(np.array_equal(perm[accepted[i][0]], accepted[i][0][perm])
               for i in np.flatnonzero(moves[:, moved].any(axis=1)).tolist()):
            accepted.append((perm, link))
            moves = np.vstack([moves, moved])
    if not accepted:
        return []
    support = [np.flatnonzero(link != np.arange(link.size)) for _, link in accepted]
    owner = clusters_of(support)
    return [[accepted[i] for i in np.flatnonzero(owner == c)] for c in np.unique(owner)]


def find_symmetry(topo: Topology, too_big: Callable[[int, int, int], bool] | None = None
                  ) -> Symmetry | None:
    """The checked abelian automorphism group of ``topo`` found as in the module
    docstring, ``None`` when no proposal passes, or (with ``too_big``, a test of the
    quotient's rows, root orbits and the expansion's pieces, :meth:`Symmetry.pieces`)
    when the colour classes already fail it or the group does, before its elements are
    listed (0.07 s for dragonfly 4x4x1x8's 518 pieces): every automorphism keeps the
    refined colours, so a link's orbit lies in its class of (tail colour, head colour,
    capacity) and a root's in its colour, and the classes count the rows from below
    (with one piece; the shift and twin proposals are the search's cost)."""
    capacity = topo.arrays.capacity
    color = refine(topo, capacity)
    if too_big is not None and _too_big_by_colours(topo, color, too_big):
        return None
    clusters = _generators(topo, color, capacity, structural=False)
    if not clusters:
        return None
    sizes = [math.prod(cycle_order(node) for node, _ in gens) for gens in clusters]
    if max(sizes) > MAX_CLUSTER_ELEMENTS:
        return None
    accepted = [gen for gens in clusters for gen in gens]
    link_orbit = orbits(topo.num_links, [link for _, link in accepted])
    node_orbit = orbits(topo.num_nodes, [node for node, _ in accepted])
    _, root_orbit = np.unique(node_orbit[topo.arrays.gpu_nodes], return_inverse=True)
    _, link_orbit = np.unique(link_orbit, return_inverse=True)
    roots = int(root_orbit.max()) + 1
    if too_big is not None and too_big(int(link_orbit.max()) + 1 + roots, roots,
                                       len(coupling(sizes))):
        return None
    elems = [elements(gens) for gens in clusters]
    return Symmetry(tuple(e[0] for e in elems), tuple(e[1] for e in elems),
                    link_orbit.astype(np.int64), root_orbit.astype(np.int64))


def _too_big_by_colours(topo: Topology, color: np.ndarray,
                        too_big: Callable[[int, int, int], bool]) -> bool:
    """``too_big`` at the colour classes' counts (:func:`find_symmetry`): link classes
    plus root classes as the rows, root classes as the root orbits, one piece."""
    arr = topo.arrays
    roots = int(np.unique(color[arr.gpu_nodes]).size)
    links = int(np.unique(np.column_stack([color[arr.tail], color[arr.head], arr.capacity]),
                          axis=0).shape[0])
    return too_big(links + roots, roots, 1)
