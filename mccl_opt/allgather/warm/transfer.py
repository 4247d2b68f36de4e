"""A physical forest carried onto a fabric whose GPUs were replaced (ForestColl-warm, §4.3).

Fail3 replaces a GPU by a backup elsewhere (docs/modelling.md): the backup takes the
failed GPU's rank, every other node keeps its id, and only the links at the replaced
GPU change.  The previous trees are rank-space arborescences, so they remain spanning
trees of the new fabric once every switch path is written with the new node indices
and each hop at a replaced GPU that no longer exists is re-routed: the first hop
``g -> s`` of a path out of a replaced GPU becomes the fewest-hop switch route from the
backup to ``s``, the last hop ``s -> g`` into one the fewest-hop switch route from ``s``
to the backup (a loop the splice makes is cut out).  :func:`carried` returns that
forest; :mod:`.reroute` then moves the edges the new capacities cannot carry, and a
reroute that reaches the guessed optimum certifies it exactly as after Fail1/Fail2.

``None`` when the fabric's shape really changed (another GPU count, a previous node
missing, a hop between kept nodes gone, no route at a replaced GPU): the caller then
packs anew (Phases 2-3 with the previous shapes).
"""

from __future__ import annotations

from collections import deque
from typing import Sequence

import numpy as np

from mccl_opt.topology import Topology
from .forest import SwitchPathTable, PhysicalForest, hop_positions, link_lookup

__all__ = ["carried"]


def carried(forest: PhysicalForest, old_gpus: Sequence[str],
            old_links: tuple[np.ndarray, np.ndarray], topo: Topology) -> PhysicalForest | None:
    """``forest`` (over the GPUs ``old_gpus`` in rank order and the links ``old_links``,
    ``(tail, head)`` node arrays, of its topology) on ``topo``, whose GPUs at some ranks
    have new ids (module docstring); ``None`` if it cannot be carried."""
    table, n = forest.paths, topo.num_gpus
    if len(old_gpus) != n:
        return None
    replaced = [r for r, (a, b) in enumerate(zip(old_gpus, topo.gpus)) if a != b]
    index = {nd.id: i for i, nd in enumerate(topo.nodes)}
    old_ids = table.node_ids
    new_of = np.fromiter((index.get(v, -1) for v in old_ids), np.int64, count=len(old_ids))
    arr = topo.arrays
    new_of[table.gpu_nodes[replaced]] = arr.gpu_nodes[replaced]
    flat = new_of[table.flat]
    if (flat < 0).any():
        return None                                  # a previous node is gone
    tail, head = new_of[old_links[0]], new_of[old_links[1]]
    link_of = np.where((tail >= 0) & (head >= 0), link_lookup(topo, tail, head), -1)
    links = link_of[table.links]                     # the new link of every path hop
    broken = np.flatnonzero(links < 0)
    if broken.size == 0:
        return _with_paths(forest, SwitchPathTable.from_flat(flat, table.first, topo, links=links))
    at = hop_positions(table.first)[broken]
    is_new = np.zeros(topo.num_nodes, bool)
    is_new[arr.gpu_nodes[replaced]] = True
    if not (is_new[flat[at]] | is_new[flat[at + 1]]).all():
        return None                                  # a link between kept nodes is gone
    routes: dict[tuple[int, int], list[int] | None] = {}
    spliced = {}
    for j in np.unique(np.searchsorted(table.first, at, side="right") - 1).tolist():
        path = _spliced(flat[table.first[j]:table.first[j + 1]].tolist(), is_new, topo, routes)
        if path is None:
            return None
        spliced[j] = path
    return _with_paths(forest, _rewritten(flat, table.first, links, spliced, topo))


def _spliced(path: list[int], is_new: np.ndarray, topo: Topology,
             routes: dict[tuple[int, int], list[int] | None]) -> list[int] | None:
    """``path`` with its first hop out of / last hop into a replaced GPU re-routed over
    switches, loops cut; ``None`` if a route is missing or another hop is broken."""
    def route(src: int, dst: int) -> list[int] | None:
        if (src, dst) not in routes:
            routes[(src, dst)] = _switch_route(topo, src, dst)
        return routes[(src, dst)]

    out = list(path)
    if is_new[out[0]] and topo.arrays.is_switch[out[1]] and not _linked(topo, out[0], out[1]):
        head = route(out[0], out[1])
        if head is None:
            return None
        out = head[:-1] + out[1:]
    if is_new[out[-1]] and not _linked(topo, out[-2], out[-1]):
        tail = route(out[-2], out[-1])
        if tail is None:
            return None
        out = out[:-2] + tail
    out = _loop_free(out)
    if any(not _linked(topo, a, b) for a, b in zip(out, out[1:])):
        return None
    return out


def _linked(topo: Topology, a: int, b: int) -> bool:
    arr = topo.arrays
    outs = arr.out_arcs[arr.out_start[a]:arr.out_start[a + 1]]
    return bool((arr.head[outs] == b).any())


def _switch_route(topo: Topology, src: int, dst: int) -> list[int] | None:
    """The fewest-hop route ``src -> ... -> dst`` whose interior nodes are switches
    (breadth first, links in index order), or ``None``."""
    arr = topo.arrays
    prev = {src: -1}
    queue = deque([src])
    while queue:
        u = queue.popleft()
        for a in arr.out_arcs[arr.out_start[u]:arr.out_start[u + 1]].tolist():
            v = int(arr.head[a])
            if v in prev or (v != dst and not arr.is_switch[v]):
                continue
            prev[v] = u
            if v == dst:
                route = [v]
                while prev[route[-1]] >= 0:
                    route.append(prev[route[-1]])
                return route[::-1]
            queue.append(v)
    return None


def _loop_free(path: list[int]) -> list[int]:
    """``path`` with every cycle cut out (from a node's first visit to its last)."""
    last = {v: i for i, v in enumerate(path)}
    out, i = [], 0
    while i < len(path):
        out.append(path[i])
        i = last[path[i]] + 1
    return out


def _rewritten(flat: np.ndarray, first: np.ndarray, links: np.ndarray,
               spliced: dict[int, list[int]], topo: Topology) -> SwitchPathTable:
    """The table of the flat paths (hops over ``links``) with the paths ``spliced``
    replaced, indices kept: the untouched runs between them are copied as blocks."""
    start = first - np.arange(first.size)
    order = sorted(spliced)
    new = [np.array(spliced[j], np.int64) for j in order]
    hops = np.concatenate([p[:-1] for p in new]), np.concatenate([p[1:] for p in new])
    new_links = np.split(link_lookup(topo, *hops), np.cumsum([p.size - 1 for p in new])[:-1])
    node_parts, link_parts, lens = [], [], np.diff(first)
    done = 0
    for j, path, path_links in zip(order, new, new_links):
        node_parts += [flat[first[done]:first[j]], path]
        link_parts += [links[start[done]:start[j]], path_links]
        lens[j] = path.size
        done = j + 1
    node_parts.append(flat[first[done]:])
    link_parts.append(links[start[done]:])
    new_first = np.zeros_like(first)
    np.cumsum(lens, out=new_first[1:])
    return SwitchPathTable.from_flat(np.concatenate(node_parts), new_first, topo,
                               links=np.concatenate(link_parts))


def _with_paths(forest: PhysicalForest, table: SwitchPathTable) -> PhysicalForest | None:
    """``forest`` over ``table`` (same path indices, hence the same parent ranks)."""
    if (table.links < 0).any() or not (table.tail == forest.paths.tail).all() \
            or not (table.head == forest.paths.head).all():
        return None
    return PhysicalForest(forest.k, forest.roots, forest.mults, forest.parent, forest.via,
                          forest.depth, table, forest.rows)
