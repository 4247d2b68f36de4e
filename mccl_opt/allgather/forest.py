"""The physical forest: a schedule's AllGather trees in rank space over switch paths.

ForestColl-warm (paper §4.3; docs/allgather.md, *Rerouting*) edits the previous
schedule's *physical* trees.  :class:`PhysicalForest` holds them as arrays (the parent
rank of every rank and the switch path it hangs on, per tree, with a multiplicity of
``k`` unit trees per root); :class:`PathTable` indexes the switch paths.  A forest is
built from Phase 3's mapped trees (:meth:`PhysicalForest.from_mapped`) or from a
schedule's chunks alone (:meth:`PhysicalForest.from_chunks`, for a schedule read from a
file); :func:`requantized` rescales it to another ``k``; :mod:`.reroute` moves its edges.
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
from .depths import fill_depths, spanning_depths
from .mapping import MappedTrees

__all__ = ["PathTable", "PhysicalForest", "requantized", "largest_remainder", "rebuilt",
           "unit_loads", "edge_order", "MAX_TREES_PER_ROOT"]

#: largest tree count per root a schedule read without warm state is taken apart into
MAX_TREES_PER_ROOT = 1 << 16


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
        depth = spanning_depths(parent, roots)
        if (depth < 0).any():
            return None
        return cls(int(k), roots, mults, parent, via, depth, table,
                   tuple(c.edges for c in chunks))

    def tree_chunks(self, gpu_ids: Sequence[str]) -> tuple[TreeChunk, ...]:
        """The schedule chunks: share ``mults[t] / k`` of root ``roots[t]``'s shard."""
        k = self.k
        return tuple(TreeChunk(gpu_ids[r], m / k, e) for r, m, e in
                     zip(self.roots.tolist(), self.mults.tolist(), self.edges))

    def shapes(self) -> tuple[np.ndarray, np.ndarray]:
        """Rank-space shapes ``(roots, parent ranks)`` of the trees, by root and largest
        first (a warm start's guides and seeds)."""
        order = np.lexsort((-self.mults, self.roots))
        return self.roots[order], self.parent[order].astype(np.int64)


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
def edge_order(parent, via):
    """Per tree: its maximum depth and the paths of its edges ordered by the depth of
    their heads (parents first; ranks in order within a depth)."""
    num_trees, n = parent.shape
    depth = np.empty(n, np.int64)
    max_depth = np.zeros(num_trees, np.int64)
    out = np.empty((num_trees, n - 1), np.int64)
    for t in range(num_trees):
        fill_depths(parent[t], depth)
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
    mult = largest_remainder(forest.mults, forest.roots, k, forest.k)
    keep = np.flatnonzero(mult > 0)
    edges = tuple([forest.edges[i] for i in keep.tolist()])
    return PhysicalForest(k, forest.roots[keep], mult[keep], forest.parent[keep],
                          forest.via[keep], forest.depth[keep], forest.paths, edges)


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


def rebuilt(forest: PhysicalForest, topo: Topology, table: PathTable, parent: np.ndarray,
            via: np.ndarray, mult: np.ndarray, roots: np.ndarray,
            changed: np.ndarray) -> PhysicalForest:
    """The forest with new edges (by depth, parents first) for the changed trees."""
    redo = np.flatnonzero(changed)
    depth = np.zeros(roots.size, np.int64)
    depth[:forest.depth.size] = forest.depth
    edges = list(forest.edges) + [()] * (roots.size - len(forest.edges))
    if redo.size:
        depth[redo], edge_paths = edge_order(parent[redo], via[redo])
        used = np.flatnonzero(np.bincount(edge_paths.ravel(), minlength=len(table.nodes)))
        name = table.named(used, [n.id for n in topo.nodes]).__getitem__
        for t, row in zip(redo.tolist(), edge_paths.tolist()):
            edges[t] = tuple(map(name, row))
    return PhysicalForest(forest.k, roots.copy(), mult.copy(), parent.copy(), via.copy(),
                          depth, table, tuple(edges))
