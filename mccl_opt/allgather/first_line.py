"""The compiled first AllGather schedule of large fabrics: the GPUs on one line, a
two-way chain per root.

A time-limited solve (:mod:`mccl_opt.anytime`) needs a valid schedule before anything
else (:mod:`.first`).  Above :data:`.first.MWU_MAX_GPUS` GPUs one shortest-path tree
per root costs ``N^2`` routed paths (4M at 2,048 GPUs: 4-9 s of array work), longer
than the limits a controller sets.  Here the GPUs are put on one line, greedily: from
rank 0, each next GPU is the nearest one not yet on it (a compiled Dijkstra over
switch-only paths, link cost ``1/capacity``, stopped at the first such GPU; on a
rail-optimised fabric this walks a host's NVLink domain, then crosses to the next
host on the rail it left from), and the way back along every step is routed the same
way.  Root ``p_r``'s tree is the chain ``p_r -> p_{r+1} -> ... -> p_{N-1}`` and the
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
def _cheapest(src, target, on_line, out_start, out_arcs, tail, head, cost, is_switch,
              dist, pred, seen, done, keys, vals, tag):
    """Dijkstra from ``src`` over switch-only paths, stopped at ``target`` (or, with
    ``target < 0``, at the first GPU not ``on_line``): the node reached, -1 if none.
    ``seen``/``done`` hold the ``tag`` of the search that last touched a node, so the
    arrays are shared by every search without being reset."""
    seen[src], dist[src], pred[src] = tag, 0.0, -1
    size = _heap_push(keys, vals, 0, 0.0, src)
    while size > 0:
        d, v = keys[0], vals[0]
        size = _heap_pop(keys, vals, size)
        if done[v] == tag:
            continue
        done[v] = tag
        if v != src and (v == target or (target < 0 and not is_switch[v] and not on_line[v])):
            return v
        if v != src and not is_switch[v]:
            continue                       # paths ride switches only
        for k in range(out_start[v], out_start[v + 1]):
            a = out_arcs[k]
            w = head[a]
            nd = d + cost[a]
            if done[w] != tag and (seen[w] != tag or nd < dist[w]):
                seen[w], dist[w], pred[w] = tag, nd, a
                size = _heap_push(keys, vals, size, nd, w)
    return -1


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
def _line_paths(out_start, out_arcs, tail, head, cost, is_switch, first):
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
    keys = np.empty(out_arcs.size + 1)
    vals = np.empty(out_arcs.size + 1, np.int64)
    on_line = np.zeros(n, np.bool_)
    line = np.empty(g, np.int64)
    nodes = np.empty(8 * g, np.int64)
    arcs = np.empty(8 * g, np.int64)
    lengths = np.zeros(2 * (g - 1), np.int64)
    line[0], on_line[first] = first, True
    used, tag = 0, 0
    for i in range(g - 1):
        nxt = _cheapest(line[i], -1, on_line, out_start, out_arcs, tail, head, cost,
                        is_switch, dist, pred, seen, done, keys, vals, tag)
        tag += 1
        if nxt < 0:
            return line[:i + 1], nodes[:used], arcs[:used], lengths
        nodes, arcs, length = _append_path(line[i], nxt, pred, tail, nodes, arcs, used)
        used += length
        lengths[i] = length
        line[i + 1], on_line[nxt] = nxt, True
    for i in range(g - 1):
        back = _cheapest(line[i + 1], line[i], on_line, out_start, out_arcs, tail, head,
                         cost, is_switch, dist, pred, seen, done, keys, vals, tag)
        tag += 1
        if back < 0:
            return line, nodes[:used], arcs[:used], lengths
        nodes, arcs, length = _append_path(line[i + 1], line[i], pred, tail, nodes, arcs, used)
        used += length
        lengths[g - 1 + i] = length
    return line, nodes[:used], arcs[:used], lengths


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
        np.asarray(arr.tail, np.int64), np.asarray(arr.head, np.int64), cost,
        np.asarray(arr.is_switch, np.bool_), int(arr.gpu_nodes[0]))
    if line.size < g or not lengths.all():
        return None
    # root p_r: forward steps r..N-2 (path i), then back steps r-1..0 (path N-1+i)
    j = np.arange(g - 1)[None, :]
    r = np.arange(g)[:, None]
    edges = np.where(j < g - 1 - r, r + j, 2 * g - 3 - j)
    table = TreeTable([v.id for v in topo.nodes], FlatPaths.of_lengths(nodes, lengths),
                      line, np.ones(g), edges)
    # step i forward serves roots 0..i, back serves roots i+1..N-1
    step = np.arange(g - 1, dtype=float)
    per_path = np.concatenate((step + 1, g - 1 - step))
    loads = np.bincount(arcs[arcs >= 0], weights=np.repeat(per_path, lengths)[arcs >= 0],
                        minlength=topo.num_links)
    return TreeChunks(table), loads
