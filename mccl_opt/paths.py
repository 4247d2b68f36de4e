"""Switch-only shortest paths: the route the network takes between two nodes.

Paper §3.2-3.3 measures and schedules GPU-to-GPU traffic over *overlay links*: the
path a transfer ``u -> v`` takes through the fabric, whose interior nodes are switches
only (a GPU never forwards on its own).  This module is the one definition of that path,
shared by telemetry (pair samples), the NCCL-style baselines, the "no re-opt"
transplant and the tests.

Choice of path (deterministic): fewest hops, then the lowest total latency, then the
order of a Dijkstra search whose heap is keyed ``(hops, latency, node index)``: a node
keeps the first predecessor arc that reached its best key, and a node's out-arcs are
scanned in CSR order (by head index).  Only the source and switches are expanded.

One search per ``(topology, source)`` is cached for the lifetime of the topology object
(:class:`~mccl_opt.topology.Topology` is immutable), so repeated look-ups are dict hits.
"""

from __future__ import annotations

import heapq
import weakref
from types import MappingProxyType
from typing import Mapping, Sequence

import numpy as np

from .errors import TopologyError
from .topology import Topology

__all__ = ["switch_paths_from", "switch_path", "switch_paths_batch", "path_nodes"]

# id(topology) -> source node -> (pred arc of every reached node, arc paths to GPUs)
_Tree = tuple[dict[int, int], Mapping[int, tuple[int, ...]]]
_CACHE: dict[int, dict[int, _Tree]] = {}


def _search(topo: Topology, src: int) -> dict[int, int]:
    """Predecessor arc of every node reachable from ``src`` with switch-only interiors."""
    arr = topo.arrays
    best: dict[int, tuple[int, float]] = {src: (0, 0.0)}
    pred: dict[int, int] = {}
    heap: list[tuple[int, float, int]] = [(0, 0.0, src)]
    while heap:
        hops, lat, u = heapq.heappop(heap)
        if best[u] != (hops, lat) or (u != src and not arr.is_switch[u]):
            continue
        for k in range(arr.out_start[u], arr.out_start[u + 1]):
            a = int(arr.out_arcs[k])
            v = int(arr.head[a])
            cand = (hops + 1, lat + float(arr.latency[a]))
            if v not in best or cand < best[v]:
                best[v] = cand
                pred[v] = a
                heapq.heappush(heap, (cand[0], cand[1], v))
    pred.pop(src, None)
    return pred


def _unwind(topo: Topology, pred: dict[int, int], src: int, dst: int) -> tuple[int, ...]:
    tail = topo.arrays.tail
    path: list[int] = []
    v = dst
    while v != src:
        a = pred[v]
        path.append(a)
        v = int(tail[a])
    return tuple(reversed(path))


def _tree(topo: Topology, src: int) -> _Tree:
    if not 0 <= src < topo.num_nodes:
        raise TopologyError(f"node index {src} is out of range for {topo.name!r} "
                            f"({topo.num_nodes} nodes); pass topo.node_index(node_id)")
    per_topo = _CACHE.get(id(topo))
    if per_topo is None:
        per_topo = _CACHE[id(topo)] = {}
        weakref.finalize(topo, _CACHE.pop, id(topo), None)
    hit = per_topo.get(src)
    if hit is None:
        pred = _search(topo, src)
        gpus = (int(g) for g in topo.arrays.gpu_nodes)
        paths = {g: _unwind(topo, pred, src, g) for g in gpus if g in pred}
        hit = per_topo[src] = (pred, MappingProxyType(paths))
    return hit


def switch_paths_from(topo: Topology, src: int) -> Mapping[int, tuple[int, ...]]:
    """Arc-index paths from node ``src`` to every *other* GPU it reaches through switches
    only, keyed by GPU node index (read-only; unreachable GPUs are absent)."""
    return _tree(topo, src)[1]


def switch_path(topo: Topology, src: int, dst: int) -> tuple[int, ...]:
    """Arc indices of the switch-only path ``src -> dst`` between any two distinct nodes.

    Raises :class:`TopologyError` when ``src == dst`` or no such path exists."""
    pred = _tree(topo, src)[0]
    if not 0 <= dst < topo.num_nodes:
        raise TopologyError(f"node index {dst} is out of range for {topo.name!r} "
                            f"({topo.num_nodes} nodes); pass topo.node_index(node_id)")
    if dst == src or dst not in pred:
        ids = topo.nodes
        why = "source and destination are the same node" if dst == src else \
            "connect them by a link or a chain of switches"
        raise TopologyError(
            f"no switch-only path {ids[src].id!r} -> {ids[dst].id!r} in {topo.name!r}: {why}")
    return _unwind(topo, pred, src, dst)


def path_nodes(topo: Topology, arcs: Sequence[int]) -> tuple[str, ...]:
    """Node ids visited by a non-empty arc path (source first)."""
    arr, nodes = topo.arrays, topo.nodes
    return (nodes[int(arr.tail[arcs[0]])].id, *(nodes[int(arr.head[a])].id for a in arcs))


def switch_paths_batch(topo: Topology, src: Sequence[int], dst: Sequence[int],
                       chunk: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """:func:`switch_path` of many node pairs at once, in arrays: ``(arcs, hops)``, row ``i``
    the path ``src[i] -> dst[i]`` in ``arcs[i, :hops[i]]`` (-1 after it; ``hops[i] == 0``
    where there is no switch-only path, or ``src[i] == dst[i]``).

    The same choice as the search above, layer by layer over ``chunk`` sources at a time:
    a node reached first at hop ``h`` keeps, among the arcs reaching it at that hop, the one
    of the lowest total latency, then of the predecessor popped first by the heap (lowest
    latency, then node index), then the first in CSR order; a chunk's search stops once
    its destinations are reached.  A load generator's group pairs of a 10,240-GPU fabric
    take seconds instead of the per-source searches' minutes."""
    src = np.asarray(src, dtype=np.int64)
    dst = np.asarray(dst, dtype=np.int64)
    arcs = np.full((len(src), 1), -1, dtype=np.int64)
    hops = np.zeros(len(src), dtype=np.int64)
    sources = np.unique(src)
    for lo in range(0, len(sources), chunk):
        mine = sources[lo:lo + chunk]
        rows = np.flatnonzero(np.isin(src, mine))
        j = np.searchsorted(mine, src[rows])
        pred = _layers(topo, mine, j, dst[rows])
        found, width = _unwind_batch(topo, pred, j, src[rows], dst[rows])
        if found.shape[1] > arcs.shape[1]:
            arcs = np.pad(arcs, ((0, 0), (0, found.shape[1] - arcs.shape[1])), constant_values=-1)
        arcs[rows, :found.shape[1]] = found
        hops[rows] = width
    return arcs, hops


def _layers(topo: Topology, sources: np.ndarray, j: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """``pred[s, v]``: the arc into node ``v`` on the search from ``sources[s]`` (-1: not
    reached), layer by layer until every ``(j, dst)`` is reached or nothing is left."""
    arr = topo.arrays
    pred = np.full((len(sources), topo.num_nodes), -1, dtype=np.int64)
    seen = np.zeros(pred.shape, dtype=bool)
    seen[np.arange(len(sources)), sources] = True
    f_j, f_u, f_lat = np.arange(len(sources)), sources.copy(), np.zeros(len(sources))
    while len(f_u) and not seen[j, dst].all():
        grow = (f_u == sources[f_j]) | arr.is_switch[f_u]
        f_j, f_u, f_lat = f_j[grow], f_u[grow], f_lat[grow]
        start, count = arr.out_start[f_u], arr.out_start[f_u + 1] - arr.out_start[f_u]
        owner = np.repeat(np.arange(len(f_u)), count)
        k = np.repeat(start - np.cumsum(count) + count, count) + np.arange(int(count.sum()))
        a = arr.out_arcs[k].astype(np.int64)
        v = arr.head[a].astype(np.int64)
        new = ~seen[f_j[owner], v]
        owner, a, v, k = owner[new], a[new], v[new], k[new]
        lat_u = f_lat[owner]
        lat = lat_u + arr.latency[a]
        s = f_j[owner]
        order = np.lexsort((k, f_u[owner], lat_u, lat, v, s))       # per node: best key, then heap order
        if len(order):
            order = order[np.r_[True, (s[order][1:] != s[order][:-1]) | (v[order][1:] != v[order][:-1])]]
        pred[s[order], v[order]] = a[order]
        seen[s[order], v[order]] = True
        f_j, f_u, f_lat = s[order], v[order], lat[order]
    return pred


def _unwind_batch(topo: Topology, pred: np.ndarray, j: np.ndarray,
                  src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each pair's arcs (source first) from the predecessor table; hops 0 if unreached."""
    tail = topo.arrays.tail
    reached = (pred[j, dst] >= 0) & (src != dst)
    back: list[np.ndarray] = []
    cur = np.where(reached, dst, src)
    while (live := cur != src).any():
        a = np.where(live, pred[j, cur], -1)
        back.append(a)
        cur = np.where(live, tail[np.maximum(a, 0)], cur)
    if not back:
        return np.full((len(src), 1), -1, dtype=np.int64), np.zeros(len(src), dtype=np.int64)
    steps = np.stack(back, axis=1)                       # destination first
    width = (steps >= 0).sum(axis=1)
    out = np.full(steps.shape, -1, dtype=np.int64)
    for h in range(steps.shape[1]):                      # reverse each row's valid prefix
        ok = width > h
        out[ok, h] = steps[ok, width[ok] - 1 - h]
    return out, width
