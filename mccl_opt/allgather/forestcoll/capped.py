"""Depth-capped tree packing for step-aware switch removal (paper App. C, step 4).

:func:`capped_pack` grows ``k`` trees per root layer by layer (round robin, widest free
link first) with every tree's depth capped, optionally within the hop LP's per-root plan
(:func:`allowances`); :func:`candidates` returns the packings :mod:`.step_aware` compares
by :func:`depth_key`.  A completed packing respects every logical unit.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .depths import max_depths, parent_ranks
from .removal.splitting import LogicalGraph
from .packing.trees import (TreeClass, add_vertex, greedy_pack, init_root_classes, keep_unfinished,
                    split_off_remainder)

__all__ = ["capped_pack", "class_depths", "depth_key", "allowances", "eccentricity", "candidates"]


def class_depths(classes: list[TreeClass], lg: LogicalGraph) -> np.ndarray:
    """Depth (GPU hops) of every tree class on ``lg``."""
    return max_depths(parent_ranks(np.array([c.parent_arc for c in classes]), lg.tail))


@njit(cache=True)
def _capped_bfs(n, start, head, cap, allow, k, max_depth, max_classes, root, mult, parent,
                depth, order, count, pos):
    """Layer-synchronous breadth-first packing with every tree's depth capped at
    ``max_depth``: in layer ``d`` all classes, round robin, add vertices at depth <= d
    until none can, so a link is taken for shallow tree edges before deep ones.  A
    class extends from its shallowest vertex over the widest free link (ties: head
    rank rotated by the root); root ``r``'s classes together take at most
    ``allow[r, a]`` units of link ``a``.  Returns (0, classes), (-1, stuck class) or
    (-2, 0) when out of class slots."""
    init_root_classes(n, k, root, mult, parent, depth, order, count)
    for r in range(n):
        pos[r] = 0
    active = np.empty(max_classes, np.int64)
    for r in range(n):
        active[r] = r
    n_cls = n
    n_active = n
    for layer in range(1, max_depth + 1):
        progress = True
        while progress and n_active > 0:
            progress = False
            nxt = 0
            for ai in range(n_active):
                c = active[ai]
                r = root[c]
                arc = -1
                while arc < 0 and pos[c] < count[c]:
                    u = order[c, pos[c]]
                    if depth[c, u] >= layer:
                        break
                    best_key = -1
                    for a in range(start[u], start[u + 1]):
                        v = head[a]
                        if cap[a] > 0 and allow[r, a] > 0 and depth[c, v] < 0:
                            key = min(cap[a], allow[r, a]) * (n + 1) + (n - (v - r) % n)
                            if key > best_key:
                                best_key = key
                                arc = a
                    if arc < 0:
                        pos[c] += 1
                if arc < 0:
                    continue
                progress = True
                take = min(mult[c], cap[arc], allow[r, arc])
                if take < mult[c]:
                    if n_cls >= max_classes:
                        return -2, 0
                    c2 = n_cls
                    n_cls += 1
                    split_off_remainder(c, c2, r, take, root, mult, parent, depth, order, count)
                    pos[c2] = pos[c]
                    active[n_active + nxt] = c2
                    nxt += 1
                cap[arc] -= take
                allow[r, arc] -= take
                add_vertex(c, arc, order[c, pos[c]], head[arc], parent, depth, order, count)
            n_active = keep_unfinished(active, n_active + nxt, count, n)
    if n_active > 0:
        return -1, active[0]
    return 0, n_cls


def capped_pack(lg: LogicalGraph, k: int, max_depth: int,
                allow: np.ndarray | None = None) -> list[TreeClass] | None:
    """``k`` trees per root of depth <= ``max_depth`` on ``lg`` by :func:`_capped_bfs`
    (``None`` if it gets stuck); ``allow[r, i]``: units of link ``i`` root ``r`` may use
    (default: all).  A completed packing respects every link's units."""
    n = lg.num_gpus
    order = np.lexsort((lg.head, lg.tail))
    if allow is None:
        allow = np.broadcast_to(lg.units, (n, lg.units.size))
    start = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(lg.tail, minlength=n), out=start[1:])
    max_classes = 2 * n + 16
    while True:
        arrays = [np.zeros(max_classes, np.int64) for _ in range(2)]
        mats = [np.zeros((max_classes, n), np.int64) for _ in range(3)]
        cnt, pos = np.zeros(max_classes, np.int64), np.zeros(max_classes, np.int64)
        status, n_cls = _capped_bfs(n, start, lg.head[order].astype(np.int64),
                                    lg.units[order].astype(np.int64).copy(),
                                    np.ascontiguousarray(allow[:, order], np.int64), k, max_depth,
                                    max_classes, *arrays, *mats, cnt, pos)
        if status != -2:
            break
        max_classes *= 2
    if status < 0:
        return None
    root, mult = arrays
    out = []
    for c in range(n_cls):
        par = mats[0][c].copy()
        par[par >= 0] = order[par[par >= 0]]
        out.append(TreeClass(int(root[c]), int(mult[c]), par))
    return sorted(out, key=lambda t: (t.root, -t.mult))


def depth_key(lg: LogicalGraph, classes: list[TreeClass]) -> tuple[int, float]:
    """(max depth, unit-weighted mean depth) of a packing."""
    d = class_depths(classes, lg)
    w = np.array([c.mult for c in classes], float)
    return int(d.max()), float((d * w).sum() / w.sum())


def allowances(lg: LogicalGraph, hops: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Per root and logical link, the units the hop LP plans (rounded up)."""
    n = lg.num_gpus
    index = np.full(n * n, -1, np.int64)
    index[lg.tail * n + lg.head] = np.arange(lg.tail.size)
    usage = np.zeros((n, lg.tail.size))
    arc = index[hops[:, 1] * n + hops[:, 2]]
    keep = arc >= 0
    np.add.at(usage, (hops[keep, 0], arc[keep]), x[keep])
    return np.ceil(usage - 1e-6).astype(np.int64)


def eccentricity(lg: LogicalGraph) -> int:
    """Largest BFS distance from any root in the logical graph: no tree is shallower."""
    n = lg.num_gpus
    adj = [[] for _ in range(n)]
    for a, b in zip(lg.tail.tolist(), lg.head.tolist()):
        adj[a].append(b)
    worst = 0
    for r in range(n):
        dist = {r: 0}
        queue = [r]
        for u in queue:
            for v in adj[u]:
                if v not in dist:
                    dist[v] = dist[u] + 1
                    queue.append(v)
        worst = max(worst, max(dist.values()))
    return worst


def candidates(lg: LogicalGraph, k: int, guides: dict[int, np.ndarray], low: int | None,
                allow: np.ndarray | None = None
                ) -> list[tuple[tuple[int, float], list[TreeClass], str]]:
    """The greedy packing and the shallowest depth-capped packing below it (from depth
    ``low``, default the graph's eccentricity), first within the LP's per-root
    allowances ``allow`` when given."""
    out = []
    if allow is not None and low is not None:
        planned = capped_pack(lg, k, low, allow)
        if planned is not None:
            return [(depth_key(lg, planned), planned, "planned")]
    classes = greedy_pack(lg.num_gpus, lg.tail, lg.head, lg.units, k, guides)
    limit = lg.num_gpus
    if classes is not None:
        out.append((depth_key(lg, classes), classes, "greedy"))
        limit = out[0][0][0]
    for depth in range(max(eccentricity(lg), low or 1, 1), limit):
        capped = capped_pack(lg, k, depth)
        if capped is not None:
            out.append((depth_key(lg, capped), capped, "capped"))
            break
    return out
