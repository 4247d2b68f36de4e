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

from .errors import TopologyError
from .topology import Topology

__all__ = ["switch_paths_from", "switch_path", "path_nodes"]

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
