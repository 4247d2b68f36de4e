"""From logical tree classes to physical trees (a schedule's :class:`~mccl_opt.TreeChunks`).

Each logical link's units ride on one or more physical switch paths (its bundle from
Phase 2).  A class of multiplicity ``m`` peels ``m`` units off every link it uses; if a
link's units come from several paths the class splits so that every tree edge is one
path.  Tree edges are listed parents first (breadth-first).  The schedule's trees are
the mapped arrays themselves (:func:`tree_chunks`: a path table and a row of path indices
per tree), not a Python tuple per tree edge.

:func:`map_classes` does this with array operations (consumption offsets per link by
cumulative sums, depths by pointer jumping); a class that straddles two paths of a
bundle is first cut into parts at the boundaries (:func:`_straddle_cuts`).  The per-vertex
Python mapping it replaced is the tests' reference (``tests/mapping_reference.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
from numba import njit

from mccl_opt.schedule import TreeChunks, TreeTable
from mccl_opt.schedule_chunks import FlatPaths, path_nodes
from .depths import fill_depths
from .removal.splitting import LogicalGraph
from .packing.trees import TreeClass

__all__ = ["MappedTrees", "map_classes", "class_ranks",
           "tree_chunks", "tree_loads"]

@dataclass(frozen=True)
class MappedTrees:
    """Physical trees by path index: tree ``i`` is rooted at rank ``roots[i]``, has
    multiplicity ``mults[i]`` and its edges ride ``paths[j]`` for ``j in edges[i]``
    (parents first); ``used[j]`` counts the trees (with multiplicity) riding path ``j``;
    ``edge_matrix`` is ``edges`` as one array when :func:`map_classes` built it."""

    roots: list[int]
    mults: list[int]
    edges: Sequence[Sequence[int]]
    paths: Sequence[tuple[int, ...]]
    used: np.ndarray
    edge_matrix: np.ndarray | None = None


def tree_chunks(mapped: MappedTrees, k: int, node_ids: Sequence[str],
                gpu_nodes: np.ndarray) -> TreeChunks:
    """The schedule's chunks (share ``mult/k``), one per mapped tree, in order, as arrays
    (``gpu_nodes[r]``: the node index of rank ``r``)."""
    edges = mapped.edge_matrix
    if edges is None:
        edges = np.array(mapped.edges, np.int64).reshape(len(mapped.roots), -1)
    src = np.asarray(gpu_nodes, np.int64)[np.asarray(mapped.roots, np.int64)]
    return TreeChunks(TreeTable(node_ids, mapped.paths, src,
                                np.asarray(mapped.mults, np.int64) / k, edges))


def tree_loads(mapped: MappedTrees, k: int, link_of: np.ndarray, num_links: int) -> np.ndarray:
    """Share load of every physical link (``mult/k`` per tree edge crossing it);
    ``link_of[a, b]`` is the link index of ``a -> b``."""
    hot = np.flatnonzero(mapped.used)
    lens, nodes = path_nodes(mapped.paths, hot)
    lens -= 1
    starts = np.cumsum(lens + 1)[:-1]           # index of every path's first node but one
    pair = np.ones(max(nodes.size - 1, 0), bool)  # (nodes[i], nodes[i+1]) is a path link
    pair[starts - 1] = False
    links = link_of[nodes[:-1][pair], nodes[1:][pair]]
    weight = np.repeat(mapped.used[hot], lens) / k
    return np.bincount(links, weights=weight, minlength=num_links)


def map_classes(classes: Sequence[TreeClass], lg: LogicalGraph,
                arcs_ranks: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
                ) -> tuple[MappedTrees, np.ndarray] | None:
    """Physical trees of ``classes`` and the depth of every tree: classes keep their
    multiplicity unless they straddle two paths of a bundle, then they are split
    (:func:`_straddle_cuts`); ``None`` only if the bundles do not match the units.
    ``arcs_ranks``: :func:`class_ranks` of the classes if the caller has it."""
    parents, _, depth = class_ranks(classes, lg) if arcs_ranks is None else arcs_ranks
    mult = np.array([c.mult for c in classes], np.int64)
    seg_paths = FlatPaths(lg.bundles.nodes, lg.bundles.path_start)   # no tuple per path
    seg_hi = np.cumsum(lg.bundles.units)
    first_seg = lg.bundles.start[:-1].copy()          # every link's first segment
    base = np.zeros(lg.units.size + 1, np.int64)
    np.cumsum(lg.units, out=base[1:])
    roots = np.array([c.root for c in classes], np.int64)
    edges, used = _segments(parents, mult, base, seg_hi, first_seg, depth)
    if edges is None:                  # classes straddle paths: split them where they do
        count, mult = _straddle_cuts(parents, np.array([c.mult for c in classes], np.int64),
                                     base, seg_hi, first_seg)
        rows = np.repeat(np.arange(len(classes)), count)
        parents, depth, roots = parents[rows], depth[rows], roots[rows]
        edges, used = _segments(parents, mult, base, seg_hi, first_seg, depth)
        if edges is None:
            return None
    mapped = MappedTrees(roots.tolist(), mult.tolist(), edges, seg_paths, used, edges)
    return mapped, depth.max(axis=1)


@njit(cache=True)
def _straddle_cuts(parents, mult, base, seg_hi, first_seg):
    """Every class split into consecutive parts of its ``mult`` units, cut wherever one of
    its links' units pass from one bundle segment to the next (links consumed in class
    order, as :func:`_segments` does): parts per class, and the parts' multiplicities.
    Each part rides one segment per link, so :func:`_segments` maps it; the parts are
    the reference mapping's sub-trees (classes of a few large multiplicities, as a scaled
    packing makes, went through that per-vertex Python: 0.3-0.8 s at 64-128 GPUs)."""
    num_classes, n = parents.shape
    consumed = np.zeros(base.size, np.int64)
    cur = first_seg.copy()
    count = np.zeros(num_classes, np.int64)
    parts = np.empty(num_classes + seg_hi.size, np.int64)   # a boundary is passed once
    cuts = np.empty(seg_hi.size + 1, np.int64)
    top = 0
    for c in range(num_classes):
        m = mult[c]
        k = 0
        for v in range(n):
            a = parents[c, v]
            if a < 0:
                continue
            lo, s = _take_units(a, m, base, consumed, cur, seg_hi)
            while seg_hi[s] < lo + m:           # a boundary inside this class's units
                cuts[k] = seg_hi[s] - lo
                k += 1
                s += 1
        ordered = np.sort(cuts[:k])
        start, prev = top, 0
        for i in range(k):
            if ordered[i] > prev:
                parts[top] = ordered[i] - prev
                top += 1
                prev = ordered[i]
        parts[top] = m - prev
        top += 1
        count[c] = top - start
    return count, parts[:top].copy()


def class_ranks(classes: Sequence[TreeClass], lg: LogicalGraph
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The logical link into, the parent rank and the depth of every rank of every class
    (int32 rows, 4 bytes an entry at 4096 GPUs; ``-1`` link and parent at the root)."""
    arcs = np.array([c.parent_arc for c in classes], np.int32)
    ranks, depth = _ranks_depths(arcs, lg.tail.astype(np.int32))
    return arcs, ranks, depth


@njit(cache=True)
def _ranks_depths(arcs, tail):
    """:func:`.depths.parent_ranks` and :func:`.depths.rank_depths` in one pass over the
    rows (no full-size temporaries: 151M entries at 4096 GPUs with k = 9)."""
    num_classes, n = arcs.shape
    ranks = np.empty((num_classes, n), np.int32)
    depth = np.empty((num_classes, n), np.int32)
    for c in range(num_classes):
        for v in range(n):
            a = arcs[c, v]
            ranks[c, v] = tail[a] if a >= 0 else -1
        fill_depths(ranks[c], depth[c])
    return ranks, depth


@njit(cache=True)
def _take_units(a, m, base, consumed, cur, seg_hi):
    """A class takes ``m`` units of link ``a`` from its running offset: the offset of its
    first unit and the bundle segment that unit lies in (the link's cursor moves there)."""
    lo = base[a] + consumed[a]
    consumed[a] += m
    s = cur[a]
    while seg_hi[s] <= lo:
        s += 1
    cur[a] = s
    return lo, s


@njit(cache=True)
def _segments(parents, mult, base, seg_hi, first_seg, depth):
    """Per class, the bundle segment (physical path) of every tree edge, ordered by the
    depth of its head, then rank; and the multiplicity riding every segment.  A link's
    units are consumed in class order (a class takes ``mult`` units from the link's
    running offset, its segments in turn from ``first_seg``); ``(None, used)`` if some
    class's units straddle two segments."""
    num_classes, n = parents.shape
    consumed = np.zeros(base.size, np.int64)
    cur = first_seg.copy()                    # the segment every link's offset is in
    used = np.zeros(seg_hi.size, np.int64)
    edges = np.empty((num_classes, max(n - 1, 0)), np.int32)
    seg = np.empty(n, np.int64)
    count = np.zeros(n + 1, np.int64)
    for c in range(num_classes):
        m = mult[c]
        top = 0
        for v in range(n):
            a = parents[c, v]
            if a < 0:
                continue
            lo, s = _take_units(a, m, base, consumed, cur, seg_hi)
            if lo + m > seg_hi[s]:
                return None, used
            seg[v] = s
            used[s] += m
            if depth[c, v] > top:
                top = depth[c, v]
        count[: top + 2] = 0                  # counting sort by depth (ranks in order)
        for v in range(n):
            if parents[c, v] >= 0:
                count[depth[c, v] + 1] += 1
        for d in range(1, top + 2):
            count[d] += count[d - 1]
        for v in range(n):
            if parents[c, v] >= 0:
                d = depth[c, v]
                edges[c, count[d]] = seg[v]
                count[d] += 1
    return edges, used
