"""ForestColl-warm by rerouting the previous physical trees (paper §4.3).

A localised degradation (Fail1: NVSwitch lanes of one GPU; Fail2: one NIC) moves the
optimum and with it the tree bandwidth, so Phase 2's logical graph and Phase 3's
packing change everywhere.  The previous *physical* trees, however, are still spanning
trees over real switch paths: at the new rate only the tree edges that cross a link
now over capacity are wrong.  :func:`reroute` keeps every previous tree with its
multiplicity (``k_old`` unit trees per root, shares ``m / k_old``) and moves each
offending edge ``(t, v)`` to another parent ``u`` of ``v`` -- any GPU outside ``v``'s
subtree in ``t``, over a switch-only path into ``v`` whose links still have room
(widest first) -- splitting the tree when only part of its multiplicity fits.  Moving
``v``'s in-edge keeps ``t`` a spanning arborescence.  When no link is left over capacity
the trees carry ``target`` per root; the caller has certified ``target`` as an upper
bound of the chunk-budget optimum, so the result is optimal.  If some link stays over
capacity nothing is returned and the caller packs from scratch.

Capacities are counted in unit trees exactly as Phase 3 does: ``floor(cap_a / b)`` for
the unit bandwidth ``b = target / k_old`` in capacity quanta.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from itertools import chain
from typing import Sequence

import numpy as np
from numba import njit

from ..schedule import TreeChunk, distinct_paths
from ..topology import Topology
from .mapping import MappedTrees

__all__ = ["PhysicalForest", "Rerouted", "requantized", "reroute"]

#: largest tree count per root a schedule read without warm state is taken apart into
MAX_TREES_PER_ROOT = 1 << 16
#: passes over the edges still crossing over-capacity links
REROUTE_PASSES = 4
#: attempts per pass to make room for a chain in other trees ...
MAKE_ROOM_CALLS = 32
#: ... and blocked links each attempt tries to free
FREE_TRIES = 32


@dataclass(frozen=True)
class PathTable:
    """Switch paths by index: node indices ``nodes[j]``, links
    ``links[start[j]:start[j+1]]``, tail and head ranks, for one-switch paths the
    key ``(u·n + s)·n + v`` (``-1`` for longer ones) that finds duplicates, and a
    cache ``names[j]`` of the node-id tuple that is path ``j`` in a schedule (``None``
    until needed; tables and forests share name tuples with their schedules)."""

    nodes: tuple[tuple[int, ...], ...]
    start: np.ndarray
    links: np.ndarray
    tail: np.ndarray
    head: np.ndarray
    key: np.ndarray
    names: list

    def named(self, paths: np.ndarray, ids: Sequence[str]) -> list:
        """``names``, with the entries of ``paths`` filled in."""
        names, nodes = self.names, self.nodes
        for j in paths.tolist():
            if names[j] is None:
                names[j] = tuple([ids[v] for v in nodes[j]])
        return names

    @classmethod
    def build(cls, paths: Sequence[tuple[int, ...]], topo: Topology) -> "PathTable":
        arr, n = topo.arrays, topo.num_nodes
        link_of = np.full((n, n), -1, np.int64)
        link_of[arr.tail, arr.head] = np.arange(arr.tail.size)
        lens = np.fromiter(map(len, paths), np.int64, count=len(paths))
        nodes = np.fromiter(chain.from_iterable(paths), np.int64, count=int(lens.sum()))
        ends = np.cumsum(lens)
        first = ends - lens
        hop = np.ones(nodes.size, bool)
        hop[ends - 1] = False
        start = np.zeros(len(paths) + 1, np.int64)
        np.cumsum(lens - 1, out=start[1:])
        key = np.where(lens == 3, (nodes[first] * n + nodes[np.minimum(first + 1, nodes.size - 1)])
                       * n + nodes[ends - 1], -1)
        return cls(tuple(paths), start, link_of[nodes[hop], nodes[np.flatnonzero(hop) + 1]],
                   arr.rank_of[nodes[first]], arr.rank_of[nodes[ends - 1]], key,
                   [None] * len(paths))

    def extended(self, paths: Sequence[tuple[int, ...]], topo: Topology) -> "PathTable":
        """This table followed by ``paths``."""
        if not paths:
            return self
        more = PathTable.build(paths, topo)
        return PathTable(self.nodes + more.nodes,
                         np.concatenate([self.start, more.start[1:] + self.start[-1]]),
                         np.concatenate([self.links, more.links]),
                         np.concatenate([self.tail, more.tail]),
                         np.concatenate([self.head, more.head]),
                         np.concatenate([self.key, more.key]), self.names + more.names)


@dataclass(frozen=True)
class PhysicalForest:
    """A schedule's trees in rank space: tree ``t`` has root rank ``roots[t]``,
    multiplicity ``mults[t]`` (of ``k`` unit trees per root), the parent rank of every
    rank ``parent[t, v]`` over switch path ``via[t, v]`` of ``paths`` (``-1`` at the
    root), maximum depth ``depth[t]`` and schedule edges ``edges[t]`` (node-id paths,
    parents first)."""

    k: int
    roots: np.ndarray
    mults: np.ndarray
    parent: np.ndarray
    via: np.ndarray
    depth: np.ndarray
    paths: PathTable
    edges: tuple[tuple[tuple[str, ...], ...], ...]

    @classmethod
    def from_mapped(cls, mapped: MappedTrees, k: int, depths: np.ndarray, topo: Topology,
                    chunks: Sequence[TreeChunk]) -> "PhysicalForest":
        """From Phase 3's mapped trees (one chunk per tree, in order, its edges in the
        order of ``mapped.edges``) on ``topo``."""
        num_trees, num_gpus = len(mapped.roots), topo.num_gpus
        edges = mapped.edge_matrix
        if edges is None:
            edges = np.array(mapped.edges, np.int64)
        edges = edges.reshape(num_trees, num_gpus - 1)
        table = PathTable.build(mapped.paths, topo)
        parent, via, first = _index_trees(edges, table.tail, table.head, num_gpus,
                                          len(table.nodes))
        tree_edges = tuple(c.edges for c in chunks)
        used = np.flatnonzero(first >= 0)
        for j, t, i in zip(used.tolist(), (first[used] // (num_gpus - 1)).tolist(),
                           (first[used] % (num_gpus - 1)).tolist()):
            table.names[j] = tree_edges[t][i]
        return cls(int(k), np.asarray(mapped.roots, np.int64), np.asarray(mapped.mults, np.int64),
                   parent, via, np.asarray(depths, np.int64), table, tree_edges)

    @classmethod
    def from_chunks(cls, chunks: Sequence[TreeChunk], topo: Topology) -> "PhysicalForest | None":
        """From a schedule's tree chunks alone (one read from a file has no warm state)
        on ``topo``; ``None`` unless every chunk is a spanning tree of ``topo``'s GPUs over
        its switch-only paths and all shares are multiples of one ``1/k``."""
        n = topo.num_gpus
        rank = {g: i for i, g in enumerate(topo.gpus)}
        if not chunks or any(not isinstance(c, TreeChunk) or c.src not in rank
                             or len(c.edges) != n - 1 for c in chunks):
            return None
        exact = {s: Fraction(s).limit_denominator(MAX_TREES_PER_ROOT)
                 for s in {c.share for c in chunks}}
        k = math.lcm(*(f.denominator for f in exact.values()))
        mults = np.array([int(exact[c.share] * k) for c in chunks], np.int64)
        roots = np.array([rank[c.src] for c in chunks], np.int64)
        if k > MAX_TREES_PER_ROOT or (mults <= 0).any() or \
                not (np.bincount(roots, weights=mults, minlength=n) == k).all():
            return None
        paths, ids = distinct_paths(list(chain.from_iterable(c.edges for c in chunks)))
        index = {nd.id: i for i, nd in enumerate(topo.nodes)}
        if any(v not in index for p in paths for v in p):
            return None
        table = PathTable.build([tuple(index[v] for v in p) for p in paths], topo)
        inner = np.array([v for p in table.nodes for v in p[1:-1]], np.int64)
        if (table.links < 0).any() or (table.tail < 0).any() or (table.head < 0).any() \
                or not topo.arrays.is_switch[inner].all():
            return None
        table.names[:] = paths
        parent, via, _ = _index_trees(ids.reshape(len(chunks), n - 1), table.tail, table.head,
                                      n, len(paths))
        depth = _spanning_depths(parent, roots)
        if (depth < 0).any():
            return None
        return cls(int(k), roots, mults, parent, via, depth, table,
                   tuple(c.edges for c in chunks))

    def tree_chunks(self, gpu_ids: Sequence[str]) -> tuple[TreeChunk, ...]:
        """The schedule chunks: share ``mults[t] / k`` of root ``roots[t]``'s shard."""
        k = self.k
        return tuple(TreeChunk(gpu_ids[r], m / k, e) for r, m, e in
                     zip(self.roots.tolist(), self.mults.tolist(), self.edges))


@njit(cache=True)
def _rank_depths(parents, depth):
    """Fill ``depth`` with every rank's hops below the parentless rank its parent
    links lead to; ``False`` if some rank's links run in a cycle instead."""
    n = parents.size
    depth[:] = -1
    for v in range(n):
        d, w = 0, v                      # climb to a rank of known depth
        while w >= 0 and depth[w] < 0:
            d += 1
            if d > n:
                return False
            w = parents[w]
        base, w = (-1 if w < 0 else depth[w]), v
        while w >= 0 and depth[w] < 0:   # write the depths on the way up
            depth[w] = base + d
            d -= 1
            w = parents[w]
    return True


@njit(cache=True)
def _spanning_depths(parent, roots):
    """Per tree: its depth, or -1 unless every rank reaches the root through parent
    links (a rank without a parent or on a cycle, or a root with a parent)."""
    num_trees, n = parent.shape
    out = np.full(num_trees, -1, np.int64)
    depth = np.empty(n, np.int64)
    for t in range(num_trees):
        if (parent[t] < 0).sum() == 1 and parent[t, roots[t]] < 0 \
                and _rank_depths(parent[t], depth):
            out[t] = depth.max()
    return out


@njit(cache=True)
def _index_trees(edges, p_tail, p_head, num_gpus, num_paths):
    """``(parent, via, first)`` of trees given as rows of path indices: ``first[j]``
    is the flat position in ``edges`` of path ``j``'s first use (``-1`` if unused)."""
    num_trees, per_tree = edges.shape
    parent = np.full((num_trees, num_gpus), -1, np.int32)
    via = np.full((num_trees, num_gpus), -1, np.int32)
    first = np.full(num_paths, -1, np.int64)
    for t in range(num_trees):
        for i in range(per_tree):
            q = edges[t, i]
            parent[t, p_head[q]] = p_tail[q]
            via[t, p_head[q]] = q
            if first[q] < 0:
                first[q] = t * per_tree + i
    return parent, via, first


@dataclass(frozen=True)
class Rerouted:
    """A rerouted forest, its share load per link, and how many trees it rebuilt."""

    forest: PhysicalForest
    loads: np.ndarray
    moved_edges: int
    rebuilt_trees: int


@njit(cache=True)
def _over(g, p_start, p_links, load, cap):
    """Whether path ``g`` crosses a link over capacity."""
    for e in range(p_start[g], p_start[g + 1]):
        if load[p_links[e]] > cap[p_links[e]]:
            return True
    return False


@njit(cache=True)
def _climb(parent, via, t, u, v, p_start, p_links, load, cap):
    """``-1`` if ``u`` lies in ``v``'s subtree of tree ``t``, else ``u``'s depth, plus
    the number of ranks for every ancestor edge still over capacity (to be moved)."""
    depth = 0
    w = u
    while w >= 0:
        if w == v:
            return -1
        depth += 1
        g = via[t, w]
        if g >= 0 and _over(g, p_start, p_links, load, cap):
            depth += parent.shape[1]
        w = parent[t, w]
    return depth


@njit(cache=True)
def _room(q, p, m, p_start, p_links, load, cap):
    """Units (at most ``m``) that can move from path ``p`` to path ``q``: a link on both
    keeps its load, so it must not be over capacity; any other link of ``q`` needs room."""
    room = m
    for e in range(p_start[q], p_start[q + 1]):
        a = p_links[e]
        shared = False
        for f in range(p_start[p], p_start[p + 1]):
            if p_links[f] == a:
                shared = True
        if shared:
            if load[a] > cap[a]:
                return 0
        elif cap[a] - load[a] < room:
            room = cap[a] - load[a]
    return room


@njit(cache=True)
def _move(parent, via, load, t, v, q, take, p_start, p_links, p_tail):
    """Re-hang rank ``v`` of tree ``t`` (carrying ``take``) on path ``q``."""
    p = via[t, v]
    for e in range(p_start[p], p_start[p + 1]):
        load[p_links[e]] -= take
    for e in range(p_start[q], p_start[q + 1]):
        load[p_links[e]] += take
    parent[t, v] = p_tail[q]
    via[t, v] = q


@njit(cache=True)
def _take(parent, via, mult, roots, changed, num_trees, t, units):
    """``(slot, trees)``: the tree carrying ``units`` of tree ``t``'s multiplicity --
    ``t`` itself if it has no more, else a copy split off from it (``slot = -1`` when no
    slot is left)."""
    if units >= mult[t]:
        return t, num_trees
    if num_trees >= mult.size:
        return -1, num_trees
    parent[num_trees, :] = parent[t, :]
    via[num_trees, :] = via[t, :]
    roots[num_trees] = roots[t]
    mult[num_trees] = units
    mult[t] -= units
    changed[t] = True
    return num_trees, num_trees + 1


@njit(cache=True)
def _uses(q, b, p_start, p_links):
    """Whether path ``q`` crosses link ``b``."""
    for e in range(p_start[q], p_start[q + 1]):
        if p_links[e] == b:
            return True
    return False


@njit(cache=True)
def _best_parent(parent, via, t, v, avoid, m, p_start, p_links, p_tail, in_start, in_paths,
                 load, cap, skip_link):
    """``(path, units, tail depth)``: the path into ``v`` (not crossing ``skip_link``;
    ``-1``: any) whose tail is outside ``avoid``'s subtree in tree ``t`` and that takes
    the most of ``m`` units (all of them first), then has the shallowest tail;
    ``(-1, 0, 0)`` if none has room."""
    p = via[t, v]
    best_q, best_r, best_d = -1, 0, 0
    for qi in range(in_start[v], in_start[v + 1]):
        q = in_paths[qi]
        if q == p or (skip_link >= 0 and _uses(q, skip_link, p_start, p_links)):
            continue
        depth = _climb(parent, via, t, p_tail[q], avoid, p_start, p_links, load, cap)
        if depth < 0:
            continue
        room = _room(q, p, m, p_start, p_links, load, cap)
        if room <= 0:
            continue
        if best_q < 0 or room > best_r or (room == best_r and depth < best_d):
            best_q, best_r, best_d = q, room, depth
    return best_q, best_r, best_d


@njit(cache=True)
def _chain(parent, via, t, v, m, p_start, p_links, p_tail, in_start, in_paths, load, cap):
    """A chain re-hanging ``v`` (all of whose candidate parents lie in its own subtree
    of tree ``t``): ``v`` below ``u1`` below (``u2`` below) ``w``, with ``u1``, ``u2``
    from ``v``'s subtree and ``w`` outside it, every new path with room.  The result is
    a tree: only chain ranks change parents, and ``w``'s ancestors are outside ``v``'s
    subtree.  Returns the shallowest as ``(q, u1, q1, u2, q2, units, depth of v)``,
    ``q = -1`` if none."""
    p = via[t, v]
    best = (-1, -1, -1, -1, -1, 0, 1 << 30)
    for ai in range(in_start[v], in_start[v + 1]):
        q = in_paths[ai]
        u1 = p_tail[q]
        if q == p or _climb(parent, via, t, u1, v, p_start, p_links, load, cap) >= 0:
            continue
        r = _room(q, p, m, p_start, p_links, load, cap)
        if r <= 0:
            continue
        q1, r1, d1 = _best_parent(parent, via, t, u1, v, m, p_start, p_links, p_tail,
                                  in_start, in_paths, load, cap, -1)
        if q1 >= 0 and d1 + 2 < best[6]:
            best = (q, u1, q1, -1, -1, min(r, r1), d1 + 2)
            if best[6] <= 3:                 # a tail at the root: nothing is shallower
                break
            continue
        if best[6] <= 4:                     # a two-step chain reaches depth 4 at best
            continue
        for bi in range(in_start[u1], in_start[u1 + 1]):
            q1 = in_paths[bi]
            u2 = p_tail[q1]
            if q1 == via[t, u1] or u2 == v or _climb(parent, via, t, u2, v, p_start, p_links,
                                                     load, cap) >= 0:
                continue
            r1 = _room(q1, via[t, u1], m, p_start, p_links, load, cap)
            if r1 <= 0:
                continue
            q2, r2, d2 = _best_parent(parent, via, t, u2, v, m, p_start, p_links, p_tail,
                                      in_start, in_paths, load, cap, -1)
            if q2 >= 0 and d2 + 3 < best[6]:
                best = (q, u1, q1, u2, q2, min(r, r1, r2), d2 + 3)
                if best[6] <= 4:
                    break
    return best


@njit(cache=True)
def _last_link_blocks(q, p_start, p_links, load, cap):
    """Whether only the last link of path ``q`` (the one into its head) is full."""
    last = p_links[p_start[q + 1] - 1]
    if load[last] < cap[last]:
        return False
    for e in range(p_start[q], p_start[q + 1] - 1):
        if load[p_links[e]] >= cap[p_links[e]]:
            return False
    return True


@njit(cache=True)
def _free_into(parent, via, mult, roots, changed, num_trees, x, b, need, skip, p_start, p_links,
               p_tail, in_start, in_paths, load, cap):
    """Free up to ``need`` units on link ``b`` into rank ``x`` by re-hanging ``x`` in
    other trees than ``skip`` onto paths that avoid ``b`` and have room.  Returns
    ``(trees, units freed)``; ``trees = -1`` when the split slots ran out."""
    freed = 0
    for t in range(num_trees):
        if freed >= need:
            break
        p = via[t, x]
        if t == skip or p < 0:
            continue
        if not _uses(p, b, p_start, p_links):
            continue
        q, room, _ = _best_parent(parent, via, t, x, x, min(mult[t], need - freed), p_start,
                                  p_links, p_tail, in_start, in_paths, load, cap, b)
        if q < 0:
            continue
        moved, num_trees = _take(parent, via, mult, roots, changed, num_trees, t, room)
        if moved < 0:
            return -1, freed
        _move(parent, via, load, moved, x, q, mult[moved], p_start, p_links, p_tail)
        changed[moved] = True
        freed += mult[moved]
    return num_trees, freed


@njit(cache=True)
def _make_room(parent, via, mult, roots, changed, num_trees, t, v, p_start, p_links, p_tail,
               in_start, in_paths, load, cap):
    """For a rank ``v`` of tree ``t`` that neither a parent nor a chain can take: find a
    rank ``u`` of ``v``'s subtree that could feed ``v``, whose only outside parent path
    is blocked by a full link into ``u``, and free that link in other trees
    (:func:`_free_into`: a scan of every tree, at most :data:`FREE_TRIES` links, so a
    target that cannot be reached fails in bounded time).  Returns ``(trees, freed)``."""
    p = via[t, v]
    m = mult[t]
    tries = FREE_TRIES
    for ai in range(in_start[v], in_start[v + 1]):
        q = in_paths[ai]
        u = p_tail[q]
        if q == p or _climb(parent, via, t, u, v, p_start, p_links, load, cap) >= 0 \
                or _room(q, p, m, p_start, p_links, load, cap) <= 0:
            continue
        for bi in range(in_start[u], in_start[u + 1]):
            q1 = in_paths[bi]
            if q1 == via[t, u] or _climb(parent, via, t, p_tail[q1], v, p_start, p_links,
                                         load, cap) < 0:
                continue
            if tries > 0 and _last_link_blocks(q1, p_start, p_links, load, cap):
                tries -= 1
                b = p_links[p_start[q1 + 1] - 1]
                trees, freed = _free_into(parent, via, mult, roots, changed, num_trees, u, b, m,
                                          t, p_start, p_links, p_tail, in_start, in_paths,
                                          load, cap)
                if trees < 0 or freed > 0:
                    return trees, freed
    return num_trees, 0


@njit(cache=True)
def _reroute_edges(parent, via, mult, roots, num_trees, p_start, p_links, p_tail, in_start,
                   in_paths, load, cap, cand_t, cand_v, changed, room_calls):
    """Move every candidate edge ``(t, v)`` whose path crosses an over-capacity link
    (module docstring).  First choice: a parent outside ``v``'s subtree taking the
    most of the multiplicity, then the shallowest (an ancestor edge still over
    capacity counts as deep).  A chain through ``v``'s subtree (:func:`_chain`) when
    there is no such parent or the chain leaves ``v`` shallower; when neither exists,
    room made for a chain in other trees (:func:`_make_room`, at most ``room_calls``
    times: on a target that cannot be reached it would search every tree each time).
    Splits the tree when only
    part of its multiplicity fits (a chain whose steps turn out to share a full link is
    undone).  Returns ``(trees, moves)``; ``trees = -1`` when the split slots ran out."""
    moves = 0
    for i in range(cand_t.size):
        t = cand_t[i]
        v = cand_v[i]
        made_room = False
        while _over(via[t, v], p_start, p_links, load, cap):
            p = via[t, v]
            m = mult[t]
            q, room, depth = _best_parent(parent, via, t, v, v, m, p_start, p_links, p_tail,
                                          in_start, in_paths, load, cap, -1)
            q1, u1, q2, u2 = -1, -1, -1, -1
            if q < 0 or depth > 3:               # a chain: w -> (u2 ->) u1 -> v, u's below v
                c = _chain(parent, via, t, v, m, p_start, p_links, p_tail, in_start, in_paths,
                           load, cap)
                if c[0] >= 0 and (q < 0 or c[6] < depth + 1):
                    q, u1, q1, u2, q2, room = c[0], c[1], c[2], c[3], c[4], c[5]
            if q < 0 and room_calls > 0 and not made_room:    # make room elsewhere, retry
                room_calls -= 1
                made_room = True
                num_trees, freed = _make_room(parent, via, mult, roots, changed, num_trees, t,
                                              v, p_start, p_links, p_tail, in_start, in_paths,
                                              load, cap)
                if num_trees < 0:
                    return -1, moves
                if freed > 0:
                    moves += 1
                    continue
            if q < 0:
                break
            moved, num_trees = _take(parent, via, mult, roots, changed, num_trees, t, room)
            if moved < 0:
                return -1, moves
            take = mult[moved]
            old_v, old_u1, old_u2 = via[moved, v], -1, -1
            if q2 >= 0:
                old_u2 = via[moved, u2]
                _move(parent, via, load, moved, u2, q2, take, p_start, p_links, p_tail)
            if q1 >= 0:
                old_u1 = via[moved, u1]
                _move(parent, via, load, moved, u1, q1, take, p_start, p_links, p_tail)
            _move(parent, via, load, moved, v, q, take, p_start, p_links, p_tail)
            if _over(q, p_start, p_links, load, cap) or (
                    q1 >= 0 and _over(q1, p_start, p_links, load, cap)) or (
                    q2 >= 0 and _over(q2, p_start, p_links, load, cap)):
                # steps of a chain shared a link: undo, give up on this edge
                _move(parent, via, load, moved, v, old_v, take, p_start, p_links, p_tail)
                if q1 >= 0:
                    _move(parent, via, load, moved, u1, old_u1, take, p_start, p_links, p_tail)
                if q2 >= 0:
                    _move(parent, via, load, moved, u2, old_u2, take, p_start, p_links, p_tail)
                if moved != t:
                    mult[t] += take
                    num_trees -= 1
                break
            changed[moved] = True
            moves += 1
    return num_trees, moves


@njit(cache=True)
def _crossing(via, p_start, p_links, over):
    """``(trees, ranks)`` of the tree edges whose path crosses a link marked ``over``."""
    bad = np.zeros(p_start.size - 1, np.bool_)
    for q in range(bad.size):
        for e in range(p_start[q], p_start[q + 1]):
            if over[p_links[e]]:
                bad[q] = True
    count = 0
    for t in range(via.shape[0]):
        for v in range(via.shape[1]):
            if via[t, v] >= 0 and bad[via[t, v]]:
                count += 1
    trees = np.empty(count, np.int64)
    ranks = np.empty(count, np.int64)
    i = 0
    for t in range(via.shape[0]):
        for v in range(via.shape[1]):
            if via[t, v] >= 0 and bad[via[t, v]]:
                trees[i], ranks[i] = t, v
                i += 1
    return trees, ranks


def _one_switch_paths(topo: Topology, heads: np.ndarray, table: PathTable
                      ) -> list[tuple[int, ...]]:
    """Every ``gpu -> switch -> head`` path into the head ranks (a mask over ranks)
    not in ``table``."""
    arr = topo.arrays
    g, s, h = _one_switch_candidates(arr.tail, arr.head, arr.is_switch, arr.rank_of, heads,
                                     np.sort(table.key), topo.num_nodes)
    return list(zip(g.tolist(), s.tolist(), h.tolist()))


@njit(cache=True)
def _one_switch_candidates(tail, head, is_switch, rank_of, heads, known, n):
    """``(gpus, switches, heads)`` of the paths ``g -> s -> h`` (links in index order,
    then ``g`` by the index of its link into ``s``) with ``heads[rank(h)]`` whose key
    ``(g·n + s)·n + h`` is not in the sorted ``known``."""
    count = np.zeros(n + 1, np.int64)          # GPU -> switch links, grouped by switch
    for a in range(tail.size):
        if rank_of[tail[a]] >= 0 and is_switch[head[a]]:
            count[head[a] + 1] += 1
    start = np.cumsum(count)
    fill = start[:-1].copy()
    up = np.empty(start[-1], np.int64)
    for a in range(tail.size):
        if rank_of[tail[a]] >= 0 and is_switch[head[a]]:
            up[fill[head[a]]] = tail[a]
            fill[head[a]] += 1
    out_g, out_s, out_h = [], [], []
    for a in range(tail.size):
        sw, h = tail[a], head[a]
        if not is_switch[sw] or rank_of[h] < 0 or not heads[rank_of[h]]:
            continue
        for i in range(start[sw], start[sw + 1]):
            g = up[i]
            key = (g * n + sw) * n + h
            j = np.searchsorted(known, key)
            if g != h and (j == known.size or known[j] != key):
                out_g.append(g)
                out_s.append(sw)
                out_h.append(h)
    return np.array(out_g, np.int64), np.array(out_s, np.int64), np.array(out_h, np.int64)


def _with_neighbours(topo: Topology, ranks: np.ndarray) -> np.ndarray:
    """Mask over ranks: the ranks and every rank one switch away from them (two-step
    moves need those)."""
    arr = topo.arrays
    mark = np.zeros(topo.num_nodes, bool)
    mark[arr.gpu_nodes[ranks]] = True
    switches = np.zeros(topo.num_nodes, bool)
    switches[arr.tail[mark[arr.head] & arr.is_switch[arr.tail]]] = True
    mark[arr.tail[switches[arr.head]]] = True
    return mark[arr.gpu_nodes]


@njit(cache=True)
def _unit_loads(via, mults, p_start, p_links, num_links):
    """Unit trees crossing every link."""
    per_path = np.zeros(p_start.size - 1, np.int64)
    for t in range(via.shape[0]):
        for v in range(via.shape[1]):
            if via[t, v] >= 0:
                per_path[via[t, v]] += mults[t]
    load = np.zeros(num_links, np.int64)
    for q in range(per_path.size):
        for e in range(p_start[q], p_start[q + 1]):
            load[p_links[e]] += per_path[q]
    return load


@njit(cache=True)
def _edge_order(parent, via):
    """Per tree: its maximum depth and the paths of its edges ordered by the depth of
    their heads (parents first; ranks in order within a depth)."""
    num_trees, n = parent.shape
    depth = np.empty(n, np.int64)
    max_depth = np.zeros(num_trees, np.int64)
    out = np.empty((num_trees, n - 1), np.int64)
    for t in range(num_trees):
        _rank_depths(parent[t], depth)
        top = depth.max()
        max_depth[t] = top
        i = 0
        for level in range(1, top + 1):
            for v in range(n):
                if depth[v] == level:
                    out[t, i] = via[t, v]
                    i += 1
    return max_depth, out


def requantized(forest: PhysicalForest, k: int) -> PhysicalForest:
    """The forest with ``k`` unit trees per root: every root's multiplicities scaled by
    ``k / forest.k`` and rounded by largest remainder (ties: earlier tree; trees left
    at 0 dropped)."""
    k = int(k)
    if k == forest.k:
        return forest
    mult = _largest_remainder(forest.mults, forest.roots, k, forest.k)
    keep = np.flatnonzero(mult > 0)
    edges = tuple([forest.edges[i] for i in keep.tolist()])
    return PhysicalForest(k, forest.roots[keep], mult[keep], forest.parent[keep],
                          forest.via[keep], forest.depth[keep], forest.paths, edges)


@njit(cache=True)
def _largest_remainder(mults, roots, k, k_old):
    """Multiplicities ``mults · k / k_old`` rounded down, then one more unit for the
    trees of largest remainder of every root until its ``k`` is reached."""
    scaled = mults * k / k_old
    out = np.floor(scaled + 1e-9).astype(np.int64)
    rem = scaled - out
    num_roots = roots.max() + 1
    missing = np.full(num_roots, k, np.int64)
    start = np.zeros(num_roots + 1, np.int64)       # trees grouped by root, in order
    for t in range(roots.size):
        missing[roots[t]] -= out[t]
        start[roots[t] + 1] += 1
    start = np.cumsum(start)
    fill = start[:-1].copy()
    by_root = np.empty(roots.size, np.int64)
    for t in range(roots.size):
        by_root[fill[roots[t]]] = t
        fill[roots[t]] += 1
    taken = np.zeros(roots.size, np.bool_)
    for r in range(num_roots):
        for _ in range(missing[r]):
            best = -1
            for i in range(start[r], start[r + 1]):
                t = by_root[i]
                if not taken[t] and (best < 0 or rem[t] > rem[best]):
                    best = t
            if best < 0:
                break
            taken[best] = True
            out[best] += 1
    return out


def reroute(forest: PhysicalForest, topo: Topology, cap_q: np.ndarray, k: int,
            target: Fraction) -> Rerouted | None:
    """``forest``, requantized to ``k`` unit trees per root, rerouted to carry
    ``target`` (quanta per root) on capacities ``cap_q`` (quanta per link of ``topo``,
    which must have the forest's nodes and links), or ``None`` if some link stays over
    capacity (module docstring)."""
    forest = requantized(forest, k)
    unit = target / forest.k
    if int(cap_q.max()) * unit.denominator >= 1 << 62:
        return None                     # unit counts beyond int64: let Phase 3 decide
    cap = (cap_q * unit.denominator) // unit.numerator
    table = forest.paths
    load = _unit_loads(forest.via, forest.mults, table.start, table.links, topo.num_links)
    over = load > cap
    if not over.any():                  # the (requantized) previous trees already fit
        return Rerouted(forest, load / forest.k, 0, 0)
    cand_t, cand_v = _crossing(forest.via, table.start, table.links, over)
    # candidate paths into the affected ranks and their one-switch neighbours
    heads = _with_neighbours(topo, cand_v)
    table = table.extended(_one_switch_paths(topo, heads, table), topo)
    into = np.flatnonzero(heads[table.head])
    into = into[np.argsort(table.head[into], kind="stable")]
    in_start = np.zeros(topo.num_gpus + 1, np.int64)
    np.cumsum(np.bincount(table.head[into], minlength=topo.num_gpus), out=in_start[1:])

    trees = forest.roots.size
    # splits divide multiplicities (at most k·N trees); memory caps the slots
    slots = min(forest.k * topo.num_gpus, 2 * trees + 4 * topo.num_gpus)
    parent = np.empty((slots, topo.num_gpus), np.int32)
    via = np.empty((slots, topo.num_gpus), np.int32)
    parent[:trees], via[:trees] = forest.parent, forest.via
    mult = np.zeros(slots, np.int64)
    roots = np.zeros(slots, np.int64)
    mult[:trees], roots[:trees] = forest.mults, forest.roots
    changed = np.zeros(slots, bool)
    moves = 0
    for _ in range(REROUTE_PASSES):     # a later pass finds room earlier moves made
        trees, done = _reroute_edges(parent, via, mult, roots, trees, table.start, table.links,
                                     table.tail, in_start, into, load, cap, cand_t, cand_v,
                                     changed, MAKE_ROOM_CALLS)
        moves += done
        over = load > cap
        if trees < 0 or done == 0 or not over.any():
            break
        cand_t, cand_v = _crossing(via[:trees], table.start, table.links, over)
        if not heads[cand_v].all():
            break
    if trees < 0 or over.any():
        return None
    new = _rebuilt(forest, topo, table, parent[:trees], via[:trees], mult[:trees],
                   roots[:trees], changed[:trees])
    return Rerouted(new, load / forest.k, moves, int(changed[:trees].sum()))


def _rebuilt(forest: PhysicalForest, topo: Topology, table: PathTable, parent: np.ndarray,
             via: np.ndarray, mult: np.ndarray, roots: np.ndarray,
             changed: np.ndarray) -> PhysicalForest:
    """The forest with new edges (by depth, parents first) for the changed trees."""
    redo = np.flatnonzero(changed)
    depth = np.zeros(roots.size, np.int64)
    depth[:forest.depth.size] = forest.depth
    edges = list(forest.edges) + [()] * (roots.size - len(forest.edges))
    if redo.size:
        depth[redo], edge_paths = _edge_order(parent[redo], via[redo])
        used = np.flatnonzero(np.bincount(edge_paths.ravel(), minlength=len(table.nodes)))
        name = table.named(used, [n.id for n in topo.nodes]).__getitem__
        for t, row in zip(redo.tolist(), edge_paths.tolist()):
            edges[t] = tuple(map(name, row))
    return PhysicalForest(forest.k, roots.copy(), mult.copy(), parent.copy(), via.copy(),
                          depth, table, tuple(edges))
