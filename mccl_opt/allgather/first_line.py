"""The compiled first AllGather schedule of large fabrics: the GPUs on one line, a
two-way chain per root.

A time-limited solve (:mod:`mccl_opt.anytime`) needs a valid schedule before anything
else (:mod:`.first`).  Above :data:`.first.MWU_MAX_GPUS` GPUs one shortest-path tree
per root costs ``N^2`` routed paths (4M at 2,048 GPUs: 4-9 s of array work), longer
than the limits a controller sets.  Here the GPUs are put on one line, greedily: from
rank 0, each next GPU is the nearest one not yet on it, ties to the lowest rank (a
compiled Dijkstra over switch-only paths, link cost ``1/capacity``, that queues only
switches and stops once no queued switch can lead to a nearer GPU; on a
rail-optimised fabric this walks a host's NVLink domain, then crosses to the next
host on the rail it left from), and the way back along every step is routed the same
way: 1 ms at 1,024 GPUs.  Root ``p_r``'s tree is the chain ``p_r -> p_{r+1} -> ... -> p_{N-1}`` and the
chain ``p_r -> p_{r-1} -> ... -> p_0``, carrying its whole shard (the ring AllGather
of paper §2 without its closing hop, as trees).  Only ``2(N - 1)`` paths are routed;
step ``i``'s path carries ``i + 1`` shards forward and ``N - 1 - i`` back.  The rate is
far from the optimum on multi-NIC hosts: the solve improves on it when the limit
leaves room.

:func:`line_trees` returns ``None`` when the greedy walk finds no GPU left within
switch-only reach (e.g. hosts joined GPU to GPU), or a step has no way back: the caller
then builds shortest-path trees.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..schedule_chunks import FlatPaths, TreeChunks, TreeTable
from ..topology import Topology

__all__ = ["line_trees"]

#: a switch is pruned only where its bound exceeds the best candidate by this factor, so
#: that rounding in the bound (summed in another order) never prunes a path that ties
_SLACK = 1.0 + 1e-9


@njit(cache=True)
def _heap_push(keys, vals, size, key, val):
    """Push ``(key, val)`` on the binary min-heap ``keys[:size]``; the new size."""
    i = size
    keys[i], vals[i] = key, val
    while i > 0:
        up = (i - 1) >> 1
        if keys[up] <= keys[i]:
            break
        keys[up], keys[i] = keys[i], keys[up]
        vals[up], vals[i] = vals[i], vals[up]
        i = up
    return size + 1


@njit(cache=True)
def _heap_pop(keys, vals, size):
    """Remove the heap's top (read it from ``keys[0], vals[0]`` first); the new size."""
    size -= 1
    keys[0], vals[0] = keys[size], vals[size]
    i = 0
    while True:
        low, left, right = i, 2 * i + 1, 2 * i + 2
        if left < size and keys[left] < keys[low]:
            low = left
        if right < size and keys[right] < keys[low]:
            low = right
        if low == i:
            return size
        keys[low], keys[i] = keys[i], keys[low]
        vals[low], vals[i] = vals[i], vals[low]
        i = low


@njit(cache=True)
def _cheapest(src, target, on_line, out_start, out_arcs, tail, head, cost, is_switch, near,
              dist, pred, seen, done, keys, vals, tag):
    """Dijkstra from ``src`` over switch-only paths to ``target`` (or, with ``target <
    0``, to the nearest GPU not ``on_line``, ties to the lowest node index): the node
    reached, -1 if none.  Only switches enter the heap: a GPU is an end, never a hop, so
    a GPU that can end the search is a candidate kept aside, and the search stops once
    the heap's nearest switch is no nearer than the best candidate (costs are > 0).  A
    switch ``w`` reached at ``d`` with ``d + near[w]`` above the best candidate (``near``:
    its cost to the nearest GPU, :func:`_nearest_gpu`) cannot lead to a better one and
    is neither queued nor expanded (shared aggregation 2x64x8: the 15 other rails' ToRs
    behind the aggregation switch, 64 GPUs each, at every crossing between hosts).
    ``seen``/``done`` hold the ``tag`` of the search that last touched a node, so the
    arrays are shared by every search without being reset."""
    seen[src], dist[src], pred[src] = tag, 0.0, -1
    size = _heap_push(keys, vals, 0, 0.0, src)
    best, best_d = -1, np.inf
    while size > 0:
        d, v = keys[0], vals[0]
        if d >= best_d:
            break
        size = _heap_pop(keys, vals, size)
        if done[v] == tag or d + near[v] > best_d * _SLACK:
            continue
        done[v] = tag
        for k in range(out_start[v], out_start[v + 1]):
            a = out_arcs[k]
            w = head[a]
            nd = d + cost[a]
            if is_switch[w]:
                if done[w] != tag and nd + near[w] <= best_d * _SLACK and near[w] < np.inf and \
                        (seen[w] != tag or nd < dist[w]):
                    seen[w], dist[w], pred[w] = tag, nd, a
                    size = _heap_push(keys, vals, size, nd, w)
            elif w != src and (w == target or (target < 0 and not on_line[w])) and \
                    (nd < best_d or (nd == best_d and w < best)):
                best, best_d, pred[w] = w, nd, a
    return best


@njit(cache=True)
def _nearest_gpu(in_start, in_arcs, tail, cost, is_switch, keys, vals):
    """Per node, the cost of its cheapest switch-only path to any GPU (0 at a GPU,
    ``inf`` at a switch that reaches none): one Dijkstra from every GPU at once over the
    links reversed, a GPU never relayed."""
    n = is_switch.size
    near = np.full(n, np.inf)
    size = 0
    for v in range(n):
        if not is_switch[v]:
            near[v] = 0.0
            size = _heap_push(keys, vals, size, 0.0, v)
    while size > 0:
        d, v = keys[0], vals[0]
        size = _heap_pop(keys, vals, size)
        if d > near[v]:
            continue
        for k in range(in_start[v], in_start[v + 1]):
            a = in_arcs[k]
            u = tail[a]
            if is_switch[u] and d + cost[a] < near[u]:
                near[u] = d + cost[a]
                size = _heap_push(keys, vals, size, near[u], u)
    return near


@njit(cache=True)
def _append_path(src, dst, pred, tail, nodes, arcs, used):
    """Append the path ``src -> dst`` that ``pred`` holds to ``nodes``/``arcs`` (the arc
    into each node, -1 at the first), growing them: ``(nodes, arcs, its length)``."""
    hops, v = 0, dst
    while v != src:
        hops += 1
        v = tail[pred[v]]
    if used + hops + 1 > nodes.size:
        grow = max(2 * nodes.size, used + hops + 1)
        nodes = np.concatenate((nodes, np.empty(grow - nodes.size, np.int64)))
        arcs = np.concatenate((arcs, np.empty(grow - arcs.size, np.int64)))
    v = dst
    for j in range(hops, 0, -1):
        nodes[used + j], arcs[used + j] = v, pred[v]
        v = tail[pred[v]]
    nodes[used], arcs[used] = src, -1
    return nodes, arcs, hops + 1


@njit(cache=True)
def _line_paths(out_start, out_arcs, in_start, in_arcs, tail, head, cost, is_switch, first):
    """The greedy line from node ``first`` (module doc): ``(line, nodes, arcs, lengths)``
    with the GPUs' node indices in line order, then the ``N - 1`` forward step paths
    and the ``N - 1`` paths back, flat (``lengths`` nodes each, the arc into each node
    at the same position, -1 at a path's first); ``line`` is shorter than ``N`` when
    the walk got stuck, ``lengths`` holds a 0 where a way back is missing."""
    n = is_switch.size
    g = n - int(is_switch.sum())
    dist = np.empty(n)
    pred = np.full(n, -1, np.int64)
    seen = np.full(n, -1, np.int64)
    done = np.full(n, -1, np.int64)
    keys = np.empty(out_arcs.size + n)
    vals = np.empty(out_arcs.size + n, np.int64)
    near = _nearest_gpu(in_start, in_arcs, tail, cost, is_switch, keys, vals)
    on_line = np.zeros(n, np.bool_)
    line = np.empty(g, np.int64)
    nodes = np.empty(8 * g, np.int64)
    arcs = np.empty(8 * g, np.int64)
    lengths = np.zeros(2 * (g - 1), np.int64)
    line[0], on_line[first] = first, True
    used, tag = 0, 0
    for i in range(g - 1):
        nxt = _cheapest(line[i], -1, on_line, out_start, out_arcs, tail, head, cost,
                        is_switch, near, dist, pred, seen, done, keys, vals, tag)
        tag += 1
        if nxt < 0:
            return line[:i + 1], nodes[:used], arcs[:used], lengths
        nodes, arcs, length = _append_path(line[i], nxt, pred, tail, nodes, arcs, used)
        used += length
        lengths[i] = length
        line[i + 1], on_line[nxt] = nxt, True
    for i in range(g - 1):
        back = _cheapest(line[i + 1], line[i], on_line, out_start, out_arcs, tail, head,
                         cost, is_switch, near, dist, pred, seen, done, keys, vals, tag)
        tag += 1
        if back < 0:
            return line, nodes[:used], arcs[:used], lengths
        nodes, arcs, length = _append_path(line[i + 1], line[i], pred, tail, nodes, arcs, used)
        used += length
        lengths[g - 1 + i] = length
    return line, nodes[:used], arcs[:used], lengths


@njit(cache=True)
def _line_edges(g):
    """The ``g x (g - 1)`` edge table of the line's trees: root ``p_r`` rides forward
    steps ``r..g-2`` (path ``i``), then back steps ``r-1..0`` (path ``g - 1 + i``),
    written row by row (numpy's broadcast ``where`` made three ``g x g`` temporaries:
    3-5 ms at 1024 GPUs)."""
    edges = np.empty((g, g - 1), np.int64)
    for r in range(g):
        for j in range(g - 1 - r):
            edges[r, j] = r + j
        for j in range(g - 1 - r, g - 1):
            edges[r, j] = 2 * g - 3 - j
    return edges


def line_trees(topo: Topology) -> tuple[TreeChunks, np.ndarray] | None:
    """One tree per root, whole shard: the two chains of the greedy GPU line from that
    root (module doc), with the share load of every link; ``None`` when the line cannot
    be built over switch-only paths."""
    arr = topo.arrays
    g = int(arr.gpu_nodes.size)
    if g < 2:
        return None
    cost = float(arr.capacity.max()) / np.asarray(arr.capacity, float)
    line, nodes, arcs, lengths = _line_paths(
        np.asarray(arr.out_start, np.int64), np.asarray(arr.out_arcs, np.int64),
        np.asarray(arr.in_start, np.int64), np.asarray(arr.in_arcs, np.int64),
        np.asarray(arr.tail, np.int64), np.asarray(arr.head, np.int64), cost,
        np.asarray(arr.is_switch, np.bool_), int(arr.gpu_nodes[0]))
    if line.size < g or not lengths.all():
        return None
    table = TreeTable([v.id for v in topo.nodes], FlatPaths.of_lengths(nodes, lengths),
                      line, np.ones(g), _line_edges(g))
    # step i forward serves roots 0..i, back serves roots i+1..N-1
    step = np.arange(g - 1, dtype=float)
    per_path = np.concatenate((step + 1, g - 1 - step))
    loads = np.bincount(arcs[arcs >= 0], weights=np.repeat(per_path, lengths)[arcs >= 0],
                        minlength=topo.num_links)
    return TreeChunks(table), loads
