"""Tree-master columns as a tree table, in arrays (docs/allgather_history.md "Tree columns as a
tree table").

A column (:class:`.live_master.TreePool`) lists the links of its tree's edge paths one
after another; an edge ends at the first GPU it reaches (its interior nodes are
switches), so the edge boundaries are implied.  :func:`column_edges` cuts every column
into its edges at once, finds every distinct edge path once (one integer key per
path), orders each tree's edges parents first (by the depth of their heads, as every
:class:`~mccl_opt.schedule_chunks.TreeTable` maker does) and reads each tree's depth;
:func:`tree_chunks` makes the schedule's chunks from that table, whose node-id tuples
are built only when read.  The Python loop over every arc of every tree it replaces
took 0.03-0.05 s of CPU on the 128-GPU one-way states (229-309 trees).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mccl_opt.errors import SolveError
from mccl_opt.schedule_chunks import FlatPaths, TreeChunks, TreeTable
from mccl_opt.topology import Topology

__all__ = ["ColumnEdges", "column_edges", "tree_chunks", "distinct_rows"]


@dataclass(frozen=True)
class ColumnEdges:
    """The columns' edges: per column its edges' path indices in parents-first order
    (``base``) and its depth; the distinct paths' node rows (``nodes``, -1 padded)."""

    base: np.ndarray            # (columns, g - 1) path per edge, parents first
    depth: np.ndarray           # (columns,)
    nodes: np.ndarray           # (paths, max nodes)

    def paths(self) -> FlatPaths:
        """The distinct paths as node-index tuples (a tree table's paths)."""
        real = self.nodes >= 0
        return FlatPaths.of_lengths(self.nodes[real], real.sum(axis=1))


def column_edges(topo: Topology, roots: np.ndarray, lengths: np.ndarray,
                 arcs: np.ndarray) -> ColumnEdges:
    """The edges of the columns of root ranks ``roots`` whose links, ``lengths[j]`` for
    column ``j``, are ``arcs`` (module docstring).  Raises :class:`SolveError` when a
    column is no spanning arborescence of switch-only paths over the GPUs."""
    arr = topo.arrays
    g, k = topo.num_gpus, int(np.size(roots))
    arcs = np.asarray(arcs, np.int64)
    ends = ~arr.is_switch[arr.head[arcs]]
    col_of_arc = np.repeat(np.arange(k), lengths)
    edge = np.cumsum(ends) - ends                      # edge of every arc, columns in order
    first = np.flatnonzero(np.concatenate([[True], ends[:-1]])[:arcs.size])
    if first.size != k * (g - 1) or not ends[-1:].all() or not np.array_equal(
            np.bincount(col_of_arc[first], minlength=k), np.full(k, g - 1)):
        raise SolveError("a tree column is not a spanning arborescence of switch-only paths")
    pos = np.arange(arcs.size) - first[edge]
    hops = int(pos.max(initial=0)) + 1
    nodes = np.full((first.size, hops + 1), -1, np.int64)
    nodes[:, 0] = arr.tail[arcs[first]]
    nodes[edge, pos + 1] = arr.head[arcs]
    parent = np.tile(np.arange(g), (k, 1))
    child = arr.rank_of[arr.head[arcs[ends]]].reshape(k, g - 1)
    parent[np.arange(k)[:, None], child] = arr.rank_of[nodes[:, 0]].reshape(k, g - 1)
    reached = np.bincount((np.arange(k)[:, None] * g + child).ravel(),
                          minlength=k * g).reshape(k, g)
    reached[np.arange(k), roots] += 1
    if (reached != 1).any():
        raise SolveError("a tree column does not reach every GPU once")
    depth = _depths(parent)
    order = np.argsort(np.take_along_axis(depth, child, axis=1), axis=1, kind="stable")
    rows, base = distinct_rows(nodes, topo.num_nodes)
    base = np.take_along_axis(base.reshape(k, g - 1), order, axis=1)
    return ColumnEdges(base, depth.max(axis=1).astype(np.int64), nodes[rows])


def _depths(parent: np.ndarray) -> np.ndarray:
    """Depth of every rank in every tree (rows of ``parent``, roots their own parent),
    level by level: max depth + 1 passes."""
    g = parent.shape[1]
    below = (parent != np.arange(g)).astype(np.int64)
    depth = np.zeros_like(below)
    for _ in range(g):
        deeper = np.take_along_axis(depth, parent, axis=1) + below
        if np.array_equal(deeper, depth):
            return depth
        depth = deeper
    raise SolveError("a tree column has a cycle")


def distinct_rows(path: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first row of every distinct row of ``path`` (node indices below ``n``, -1
    padded), in increasing row order, and each row's position among them.  The rows
    are read as integer keys, a key per run of columns that fits in 62 bits (in that
    order they sort as the rows do); one sort of one key, or a lexsort of a few
    (``np.unique(axis=0)`` took 5-10x on dragonfly 4x4x1x8's edge paths)."""
    per_key = max(int(62 // np.log2(n + 1)), 1)
    keys = []
    for lo in range(0, max(path.shape[1], 1), per_key):
        key = np.zeros(path.shape[0], np.int64)
        for col in path.T[lo:lo + per_key]:
            key = key * (n + 1) + col + 1
        keys.append(key)
    if len(keys) == 1:
        _, first, which = np.unique(keys[0], return_index=True, return_inverse=True)
        return first, which.reshape(-1)
    order = np.lexsort(keys[::-1])                     # rows sorted, first key first
    rows = np.stack(keys, axis=1)[order]
    new = np.ones(order.size, bool)
    new[1:] = (rows[1:] != rows[:-1]).any(axis=1)
    which = np.empty(order.size, np.int64)
    which[order] = np.cumsum(new) - 1
    return order[new], which


def tree_chunks(topo: Topology, roots: np.ndarray, lengths: np.ndarray, arcs: np.ndarray,
                shares: np.ndarray) -> tuple[TreeChunks, np.ndarray]:
    """The columns (:func:`column_edges`'s arguments) as chunks carrying ``shares`` of
    their roots' shards, and every tree's depth."""
    cols = column_edges(topo, roots, lengths, arcs)
    table = TreeTable([v.id for v in topo.nodes], cols.paths(),
                      topo.arrays.gpu_nodes[np.asarray(roots, np.int64)],
                      np.asarray(shares, float), cols.base)
    return TreeChunks(table), cols.depth
