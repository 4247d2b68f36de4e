"""Phase 3: k spanning out-trees per root on the logical GPU graph (paper §4.3).

Trees are grown as *classes*: a class is a partial arborescence with an integer
multiplicity (how many of the root's k unit trees share it).  Extending a class of
multiplicity ``m`` over a logical link with ``c`` free units takes ``min(m, c)``; when
``c < m`` the class splits and the remainder grows on its own.

* :func:`greedy_pack` (compiled) tries two greedy orders.  First breadth-first, all
  classes growing one vertex per round (round robin, so no root hogs a link; a
  vertex's links are scanned from a root-dependent offset): shallow trees.  If that
  gets stuck, widest-link-first (a heap on remaining units, one class at a time),
  which crosses scarce cuts once per class.  With a *guide* (ForestColl-warm, paper
  §4.3) a class first tries the links its root's previous tree used, A*-like, then
  falls back to the order above.  Completing every class proves optimality by
  construction (every link stays within its units); if both orders get stuck, the
  exact packing of :mod:`.exact_packing` (Lovász, as in ForestColl) runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from mccl_opt import anytime


#: root-dependent rotations of the BFS link scan tried in turn (deterministic)
SHIFTS = (1, 3, 7, 0)

__all__ = ["TreeClass", "greedy_pack", "guide_arrays", "init_root_classes",
           "split_off_remainder", "add_vertex", "keep_unfinished"]


@dataclass
class TreeClass:
    """``mult`` of the root's ``k`` unit trees share this arborescence;
    ``parent_arc[v]`` is the logical link into rank ``v`` (-1 at the root)."""

    root: int
    mult: int
    parent_arc: np.ndarray


@njit(cache=True)
def init_root_classes(n, k, root, mult, parent, depth, order, count):
    """Class ``r`` (one per root) starts as root ``r`` alone with multiplicity ``k``."""
    for r in range(n):
        root[r] = r
        mult[r] = k
        for v in range(n):
            parent[r, v] = -1
            depth[r, v] = -1
        depth[r, r] = 0
        order[r, 0] = r
        count[r] = 1


@njit(cache=True)
def split_off_remainder(c, c2, r, take, root, mult, parent, depth, order, count):
    """Tree class ``c`` (root ``r``) can only take ``take`` of its multiplicity over the
    next arc: the rest becomes class ``c2`` with a copy of ``c``'s partial tree."""
    root[c2] = r
    mult[c2] = mult[c] - take
    parent[c2, :] = parent[c, :]
    depth[c2, :] = depth[c, :]
    order[c2, :] = order[c, :]
    count[c2] = count[c]
    mult[c] = take


@njit(cache=True)
def add_vertex(c, arc, u, v, parent, depth, order, count):
    """Class ``c`` reaches rank ``v`` over logical link ``arc`` from its rank ``u``."""
    parent[c, v] = arc
    depth[c, v] = depth[c, u] + 1
    order[c, count[c]] = v
    count[c] += 1


@njit(cache=True)
def keep_unfinished(active, size, count, n):
    """Compact ``active[:size]`` to the classes not yet spanning all ``n`` ranks (in
    order); returns their number."""
    m = 0
    for ai in range(size):
        c = active[ai]
        if count[c] < n:
            active[m] = c
            m += 1
    return m


@njit(cache=True)
def _greedy_bfs(n, start, tail, head, cap, k, guide_start, guide_child, has_guide, max_classes,
            root, mult, parent, depth, order, count, pos, scanned, gpos, gscan, arc_of, shift):
    n_cls = n
    init_root_classes(n, k, root, mult, parent, depth, order, count)
    for r in range(n):
        pos[r] = 0
        scanned[r] = 0
        gpos[r] = 0
        gscan[r] = 0
    active = np.empty(max_classes, np.int64)
    n_active = n
    for r in range(n):
        active[r] = r
    while n_active > 0:
        nxt = 0
        n_round = n_active
        for ai in range(n_round):
            c = active[ai]
            r = root[c]
            arc = -1
            # guided candidates: links of the previous tree of this root
            if has_guide[r]:
                while gpos[c] < count[c] and arc < 0:
                    u = order[c, gpos[c]]
                    g0 = guide_start[r, u]
                    g1 = guide_start[r, u + 1]
                    while g0 + gscan[c] < g1:
                        v = guide_child[r, g0 + gscan[c]]
                        gscan[c] += 1
                        if depth[c, v] < 0:
                            a = arc_of[u, v]
                            if a >= 0 and cap[a] > 0:
                                arc = a
                                break
                    if arc < 0:
                        gpos[c] += 1
                        gscan[c] = 0
            # plain BFS scan, rotated by root
            while arc < 0 and pos[c] < count[c]:
                u = order[c, pos[c]]
                deg = start[u + 1] - start[u]
                while scanned[c] < deg:
                    a = start[u] + (shift * r + u + scanned[c]) % deg
                    scanned[c] += 1
                    if cap[a] > 0 and depth[c, head[a]] < 0:
                        arc = a
                        break
                if arc < 0:
                    pos[c] += 1
                    scanned[c] = 0
            if arc < 0:
                return -1, c
            take = mult[c] if mult[c] < cap[arc] else cap[arc]
            if take < mult[c]:
                if n_cls >= max_classes:
                    return -2, 0
                c2 = n_cls
                n_cls += 1
                split_off_remainder(c, c2, r, take, root, mult, parent, depth, order, count)
                pos[c2] = pos[c]
                scanned[c2] = scanned[c]
                gpos[c2] = gpos[c]
                gscan[c2] = gscan[c]
                active[n_active + nxt] = c2   # temporarily past the current round
                nxt += 1
            cap[arc] -= take
            add_vertex(c, arc, tail[arc], head[arc], parent, depth, order, count)
        # keep unfinished classes (current + newly split) in order
        n_active = keep_unfinished(active, n_active + nxt, count, n)
    return 0, n_cls


@njit(cache=True)
def _better(cap_a, aux_a, cap_b, aux_b):
    return cap_a > cap_b or (cap_a == cap_b and aux_a < aux_b)


@njit(cache=True)
def _push(hk, ha, size, key, aux):
    i = size
    hk[i] = key
    ha[i] = aux
    while i > 0:
        p = (i - 1) >> 1
        if _better(hk[i], ha[i], hk[p], ha[p]):
            hk[i], hk[p] = hk[p], hk[i]
            ha[i], ha[p] = ha[p], ha[i]
            i = p
        else:
            break
    return size + 1


@njit(cache=True)
def _pop(hk, ha, size):
    size -= 1
    hk[0] = hk[size]
    ha[0] = ha[size]
    i = 0
    while True:
        l = 2 * i + 1
        r = l + 1
        b = i
        if l < size and _better(hk[l], ha[l], hk[b], ha[b]):
            b = l
        if r < size and _better(hk[r], ha[r], hk[b], ha[b]):
            b = r
        if b == i:
            break
        hk[i], hk[b] = hk[b], hk[i]
        ha[i], ha[b] = ha[b], ha[i]
        i = b
    return size


@njit(cache=True)
def _greedy_wide(n, start, tail, head, cap, k, guide_start, guide_child, has_guide, max_classes,
            root, mult, parent, depth, order, count):
    """Widest-link-first growth of one class at a time (guided links first).
    Returns (0, classes) on success, (-1, c) if class c is stuck, (-2, 0) if out of
    class slots."""
    m_arcs = head.shape[0]
    hk = np.empty(m_arcs + n, np.int64)
    ha = np.empty(m_arcs + n, np.int64)
    init_root_classes(n, k, root, mult, parent, depth, order, count)
    n_cls = n
    c = 0
    while c < n_cls:
        r = root[c]
        size = 0
        for t in range(count[c]):
            u = order[c, t]
            for a in range(start[u], start[u + 1]):
                if cap[a] > 0 and depth[c, head[a]] < 0:
                    size = _push(hk, ha, size, cap[a], depth[c, u] * m_arcs + a)
        gpos = 0
        gscan = 0
        while count[c] < n:
            arc = -1
            if has_guide[r]:
                while gpos < count[c] and arc < 0:
                    u = order[c, gpos]
                    g0 = guide_start[r, u]
                    g1 = guide_start[r, u + 1]
                    while g0 + gscan < g1:
                        v = guide_child[r, g0 + gscan]
                        gscan += 1
                        if depth[c, v] < 0:
                            for a in range(start[u], start[u + 1]):
                                if head[a] == v:
                                    if cap[a] > 0:
                                        arc = a
                                    break
                            if arc >= 0:
                                break
                    if arc < 0:
                        gpos += 1
                        gscan = 0
            while arc < 0 and size > 0:
                key = hk[0]
                aux = ha[0]
                size = _pop(hk, ha, size)
                a = aux % m_arcs
                if cap[a] == 0 or depth[c, head[a]] >= 0:
                    continue
                if cap[a] != key:
                    size = _push(hk, ha, size, cap[a], aux)
                    continue
                arc = a
            if arc < 0:
                return -1, c
            take = mult[c] if mult[c] < cap[arc] else cap[arc]
            if take < mult[c]:
                if n_cls >= max_classes:
                    return -2, 0
                c2 = n_cls
                n_cls += 1
                split_off_remainder(c, c2, r, take, root, mult, parent, depth, order, count)
            cap[arc] -= take
            v = head[arc]
            add_vertex(c, arc, tail[arc], v, parent, depth, order, count)
            for a in range(start[v], start[v + 1]):
                if cap[a] > 0 and depth[c, head[a]] < 0:
                    size = _push(hk, ha, size, cap[a], depth[c, v] * m_arcs + a)
        c += 1
    return 0, n_cls


def guide_arrays(n: int, guides: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR children lists of each root's guide tree (``guides[r][v]`` = parent rank)."""
    g_start = np.zeros((n, n + 1), np.int64)
    g_child = np.zeros((n, max(n, 1)), np.int64)
    has = np.zeros(n, np.bool_)
    for r, par in guides.items():
        has[r] = True
        kids = sorted((int(p), v) for v, p in enumerate(par) if p >= 0)
        counts = np.bincount([p for p, _ in kids], minlength=n)
        g_start[r, 1:] = np.cumsum(counts)
        g_child[r, : len(kids)] = [v for _, v in kids]
    return g_start, g_child, has


def _csr(n: int, tail: np.ndarray, head: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.lexsort((head, tail))
    start = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(tail, minlength=n), out=start[1:])
    return order, start


def greedy_pack(n: int, tail: np.ndarray, head: np.ndarray, units: np.ndarray, k: int,
                guides: dict[int, np.ndarray] | None = None,
                widest_first: bool = False) -> list[TreeClass] | None:
    """Greedy round-robin BFS packing of ``k`` trees per root, widest-link-first where
    that gets stuck (``None`` if both do); ``widest_first`` skips the BFS order (the
    warm-up compiles both kernels with it: a small fabric never gets the BFS stuck).
    The limit is checked before each try (:func:`mccl_opt.anytime.check`: up to
    ``len(SHIFTS) + 1`` compiled passes, each of them as long as a whole packing)."""
    order, start = _csr(n, tail, head)
    s_head = head[order]
    cap = units[order].astype(np.int64).copy()
    g_start, g_child, has = guide_arrays(n, guides or {})
    arc_of = np.full((n, n), -1, np.int64)
    arc_of[tail[order], s_head] = np.arange(order.size)
    max_classes = 2 * n + 16
    strategy = 1 if widest_first else 0
    shift_i = 0
    while True:
        anytime.check("Phase 3: the greedy packing")
        root = np.zeros(max_classes, np.int64)
        mult = np.zeros(max_classes, np.int64)
        parent = np.zeros((max_classes, n), np.int64)
        depth = np.zeros((max_classes, n), np.int64)
        ordr = np.zeros((max_classes, n), np.int64)
        cnt = np.zeros(max_classes, np.int64)
        work = cap.copy()
        if strategy == 0:
            z = [np.zeros(max_classes, np.int64) for _ in range(4)]
            status, n_cls = _greedy_bfs(n, start, tail[order], s_head, work, k, g_start, g_child,
                                        has, max_classes, root, mult, parent, depth, ordr, cnt,
                                        *z, arc_of, SHIFTS[shift_i])
        else:
            status, n_cls = _greedy_wide(n, start, tail[order], s_head, work, k, g_start,
                                         g_child, has, max_classes, root, mult, parent, depth,
                                         ordr, cnt)
        if status == -2:
            max_classes *= 2
            continue
        if status < 0:
            if strategy == 0 and shift_i + 1 < len(SHIFTS):
                shift_i += 1
                continue
            if strategy == 0:
                strategy = 1
                continue
            return None
        out = []
        for c in range(n_cls):
            par = parent[c].copy()
            mask = par >= 0
            par[mask] = order[par[mask]]
            out.append(TreeClass(int(root[c]), int(mult[c]), par))
        out.sort(key=lambda t: (t.root, -t.mult))
        return out
