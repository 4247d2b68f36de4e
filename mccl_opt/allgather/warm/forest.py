"""The physical forest: a schedule's AllGather trees in rank space over switch paths.

ForestColl-warm (paper §4.3; docs/allgather.md, *Rerouting*) edits the previous
schedule's *physical* trees.  :class:`PhysicalForest` holds them as arrays only (the
parent rank of every rank and the switch path it hangs on, per tree, with a
multiplicity of ``k`` unit trees per root, and every tree's edges as a row of path
indices, parents first); :class:`SwitchPathTable` indexes the switch paths as flat node
arrays.  No Python object per tree edge is made: the schedule's chunks are a
:class:`~mccl_opt.TreeChunks` view of the same arrays (:meth:`PhysicalForest.tree_chunks`).
A forest is built from Phase 3's mapped trees (:meth:`PhysicalForest.from_mapped`), from
a schedule's chunks alone (:meth:`PhysicalForest.from_chunks`, for a schedule read from
a file) or carried onto a fabric whose GPUs were replaced (:mod:`.transfer`);
:func:`requantized` rescales it to another ``k``; :mod:`.reroute` moves its edges.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from itertools import chain
from typing import Sequence

import numpy as np
from numba import njit

from mccl_opt.schedule import TreeChunk, TreeChunks, TreeTable, distinct_paths
from mccl_opt.schedule_chunks import FlatPaths
from mccl_opt.topology import Topology
from ..forestcoll.depths import fill_depths, spanning_depths
from ..forestcoll.mapping import MappedTrees

__all__ = ["SwitchPathTable", "FlatPaths", "PhysicalForest", "requantized", "largest_remainder",
           "rebuilt", "unit_loads", "edge_order", "link_lookup", "hop_positions",
           "MAX_TREES_PER_ROOT"]

#: largest tree count per root a schedule read without warm state is taken apart into
MAX_TREES_PER_ROOT = 1 << 16


def link_lookup(topo: Topology, tails: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """The link index of every ``tails[i] -> heads[i]`` of ``topo`` (``-1``: no such
    link), by binary search over the sorted link keys (no ``n x n`` matrix)."""
    arr, n = topo.arrays, topo.num_nodes
    key = arr.tail.astype(np.int64) * n + arr.head
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    want = np.asarray(tails, np.int64) * n + heads
    pos = np.minimum(np.searchsorted(sorted_key, want), max(key.size - 1, 0))
    found = sorted_key[pos] == want if key.size else np.zeros(want.size, bool)
    return np.where(found, order[pos], -1)


def hop_positions(first: np.ndarray) -> np.ndarray:
    """Positions in a flat path array of every node that is followed by another node of
    its path (paths ``flat[first[j]:first[j+1]]``): hop ``i`` runs ``flat[i] -> flat[i+1]``."""
    hop = np.ones(int(first[-1]), bool)
    hop[first[1:] - 1] = False
    return np.flatnonzero(hop)


@dataclass(frozen=True)
class SwitchPathTable:
    """Switch paths by index on one topology: path ``j`` visits the nodes
    ``flat[first[j]:first[j+1]]`` (``nodes[j]``: the same as a tuple) and crosses the
    links ``links[start[j]:start[j+1]]`` (``-1`` where the topology has no such link),
    from rank ``tail[j]`` to rank ``head[j]``; ``key`` is ``(u·n + s)·n + v`` for
    one-switch paths (``-1`` for others), to find duplicates; ``node_ids`` and
    ``gpu_nodes`` (node index of every rank) are the topology's."""

    nodes: Sequence[tuple[int, ...]]
    flat: np.ndarray
    first: np.ndarray
    start: np.ndarray
    links: np.ndarray
    tail: np.ndarray
    head: np.ndarray
    key: np.ndarray
    node_ids: tuple[str, ...]
    gpu_nodes: np.ndarray

    @classmethod
    def build(cls, paths: Sequence[tuple[int, ...]], topo: Topology) -> "SwitchPathTable":
        """The table of ``paths`` (node-index tuples, shared as ``nodes``) on ``topo``."""
        stored = FlatPaths.of_tuples(paths)
        return cls.from_flat(stored.flat, stored.first, topo, paths)

    @classmethod
    def from_flat(cls, flat: np.ndarray, first: np.ndarray, topo: Topology,
                  nodes: Sequence[tuple[int, ...]] | None = None,
                  links: np.ndarray | None = None) -> "SwitchPathTable":
        """The table of the flat paths ``flat``/``first`` on ``topo`` (``links``: their
        links if the caller knows them)."""
        arr, n = topo.arrays, topo.num_nodes
        lens = np.diff(first)
        heads = flat[first[1:] - 1]
        tails = flat[first[:-1]]
        mid = flat[np.minimum(first[:-1] + 1, max(flat.size - 1, 0))]
        key = np.where(lens == 3, (tails * n + mid) * n + heads, -1)
        if links is None:
            hops = hop_positions(first)
            links = link_lookup(topo, flat[hops], flat[hops + 1])
        return cls(FlatPaths(flat, first) if nodes is None else nodes, flat, first,
                   first - np.arange(first.size), links, arr.rank_of[tails],
                   arr.rank_of[heads], key, tuple(nd.id for nd in topo.nodes), arr.gpu_nodes)

    def extended(self, paths: Sequence[tuple[int, ...]], topo: Topology) -> "SwitchPathTable":
        """This table followed by ``paths`` (on the same topology)."""
        if not paths:
            return self
        more = SwitchPathTable.build(paths, topo)
        flat = np.concatenate([self.flat, more.flat])
        first = np.concatenate([self.first, more.first[1:] + self.first[-1]])
        return SwitchPathTable(FlatPaths(flat, first), flat, first,
                         np.concatenate([self.start, more.start[1:] + self.start[-1]]),
                         np.concatenate([self.links, more.links]),
                         np.concatenate([self.tail, more.tail]),
                         np.concatenate([self.head, more.head]),
                         np.concatenate([self.key, more.key]), self.node_ids, self.gpu_nodes)


@dataclass(frozen=True)
class PhysicalForest:
    """A schedule's trees in rank space: tree ``t`` has root rank ``roots[t]``,
    multiplicity ``mults[t]`` (of ``k`` unit trees per root), the parent rank of every
    rank ``parent[t, v]`` over switch path ``via[t, v]`` of ``paths`` (``-1`` at the
    root), maximum depth ``depth[t]`` and its edges as the row ``rows[t]`` of path
    indices (parents first)."""

    k: int
    roots: np.ndarray
    mults: np.ndarray
    parent: np.ndarray
    via: np.ndarray
    depth: np.ndarray
    paths: SwitchPathTable
    rows: np.ndarray

    @classmethod
    def from_mapped(cls, mapped: MappedTrees, k: int, depths: np.ndarray,
                    topo: Topology) -> "PhysicalForest":
        """From Phase 3's mapped trees on ``topo`` (edges in the order of ``mapped.edges``)."""
        num_trees, num_gpus = len(mapped.roots), topo.num_gpus
        rows = mapped.edge_matrix
        if rows is None:
            rows = np.array(mapped.edges, np.int64)
        rows = rows.reshape(num_trees, num_gpus - 1)
        paths = mapped.paths
        table = (SwitchPathTable.from_flat(paths.flat, paths.first, topo, paths)
                 if isinstance(paths, FlatPaths) else SwitchPathTable.build(paths, topo))
        parent, via = _index_trees(rows, table.tail, table.head, num_gpus)
        return cls(int(k), np.asarray(mapped.roots, np.int64), np.asarray(mapped.mults, np.int64),
                   parent, via, np.asarray(depths, np.int64), table, rows)

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
        table = SwitchPathTable.build([tuple(index[v] for v in p) for p in paths], topo)
        inner = np.array([v for p in table.nodes for v in p[1:-1]], np.int64)
        if (table.links < 0).any() or (table.tail < 0).any() or (table.head < 0).any() \
                or not topo.arrays.is_switch[inner].all():
            return None
        rows = ids.reshape(len(chunks), n - 1)
        parent, via = _index_trees(rows, table.tail, table.head, n)
        depth = spanning_depths(parent, roots)
        if (depth < 0).any():
            return None
        return cls(int(k), roots, mults, parent, via, depth, table, rows)

    def tree_chunks(self) -> TreeChunks:
        """The schedule chunks (share ``mults[t] / k`` of root ``roots[t]``'s shard), a
        view of the forest's arrays."""
        table = self.paths
        return TreeChunks(TreeTable(table.node_ids, table.nodes, table.gpu_nodes[self.roots],
                                    self.mults / self.k, self.rows))

    def shapes(self) -> tuple[np.ndarray, np.ndarray]:
        """Rank-space shapes ``(roots, parent ranks)`` of the trees, by root and largest
        first (a warm start's guides and seeds)."""
        order = np.lexsort((-self.mults, self.roots))
        if (order[1:] > order[:-1]).all():          # already in order: no copy
            return self.roots, self.parent
        return self.roots[order], self.parent[order]


@njit(cache=True)
def _index_trees(rows, p_tail, p_head, num_gpus):
    """``(parent, via)`` of trees given as rows of path indices."""
    num_trees, per_tree = rows.shape
    parent = np.full((num_trees, num_gpus), -1, np.int32)
    via = np.full((num_trees, num_gpus), -1, np.int32)
    for t in range(num_trees):
        for i in range(per_tree):
            q = rows[t, i]
            parent[t, p_head[q]] = p_tail[q]
            via[t, p_head[q]] = q
    return parent, via


@njit(cache=True)
def unit_loads(via, mults, p_start, p_links, num_links):
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
def edge_order(parent, via, trees, rows, max_depth):
    """For the trees ``trees``: their maximum depth (into ``max_depth``) and the paths
    of their edges ordered by the depth of their heads (into ``rows``; parents first,
    ranks in order within a depth)."""
    n = parent.shape[1]
    depth = np.empty(n, np.int64)
    for t in trees:
        fill_depths(parent[t], depth)
        top = depth.max()
        max_depth[t] = top
        i = 0
        for level in range(1, top + 1):
            for v in range(n):
                if depth[v] == level:
                    rows[t, i] = via[t, v]
                    i += 1


def requantized(forest: PhysicalForest, k: int) -> PhysicalForest:
    """The forest with ``k`` unit trees per root: every root's multiplicities scaled by
    ``k / forest.k`` and rounded by largest remainder (ties: earlier tree; trees left
    at 0 dropped)."""
    k = int(k)
    if k == forest.k:
        return forest
    mult = largest_remainder(forest.mults, forest.roots, k, forest.k)
    keep = np.flatnonzero(mult > 0)
    if keep.size == mult.size:
        return PhysicalForest(k, forest.roots, mult, forest.parent, forest.via, forest.depth,
                              forest.paths, forest.rows)
    return PhysicalForest(k, forest.roots[keep], mult[keep], forest.parent[keep],
                          forest.via[keep], forest.depth[keep], forest.paths, forest.rows[keep])


@njit(cache=True)
def largest_remainder(mults, roots, k, k_old):
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


def rebuilt(forest: PhysicalForest, table: SwitchPathTable, parent: np.ndarray, via: np.ndarray,
            mult: np.ndarray, roots: np.ndarray, changed: np.ndarray) -> PhysicalForest:
    """The forest with trees ``parent``/``via`` over ``table`` (its first trees are
    ``forest``'s; the arrays are taken, not copied) and new edge rows (by depth,
    parents first) for the changed trees."""
    redo = np.flatnonzero(changed)
    old = forest.depth.size
    depth = np.zeros(roots.size, np.int64)
    depth[:old] = forest.depth
    rows = np.empty((roots.size, forest.rows.shape[1]), forest.rows.dtype)
    rows[:old] = forest.rows
    edge_order(parent, via, redo, rows, depth)
    return PhysicalForest(forest.k, roots, mult, parent, via, depth, table, rows)
