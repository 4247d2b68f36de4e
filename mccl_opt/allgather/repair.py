"""Phase 3 at scale: unit trees grown concurrently with local augmenting repair.

On tight fabrics (healthy HPN: every GPU's ingress is a tight cut, so *every* logical
unit must be used) greedy growth gets stuck: a tree ``t`` whose vertex set ``R_t`` has
no free link to a missing vertex.  Instead of the global exact fallback (Lovász, one
max-flow per extension), :func:`repair_pack` repairs locally, as in an augmenting-path
step of the matroid-intersection view of Edmonds' branching theorem (paper §4.3):

for a missing vertex ``v``, search breadth-first over the trees containing ``v`` for a
chain ``t = x0, x1, ..., xj`` where ``x_i`` takes over the link into ``v`` used by
``x_{i+1}`` and ``xj`` re-parents ``v`` onto a link with a free unit.  A tree may take
link ``w -> v`` iff ``w`` is in it and (when it already holds ``v``) ``w`` is not below
``v`` — re-parenting moves ``v``'s subtree along, so every tree stays an
arborescence and every link stays within its units (capacities only ever decrease).

Growth: ``k`` unit trees per root, round robin (one vertex per tree per round), each
tree scanning first the *wide* links of its vertices (units above their tail's
average; NVLink-derived links on HPN), then the others, link scans rotated by root as
in :func:`~.trees.greedy_pack`.  Wide-first makes a tree enter a host once and fan out
inside it, which is what leaves the scarce rail units for the other trees (0 repairs on
HPN up to 512 GPUs).  Warm: previous tree shapes are seeded verbatim first.  Identical
trees of a root are merged into :class:`~.trees.TreeClass` es.  Completion certifies
the packing by construction; ``None`` means no local chain exists and the caller
falls back to the global packers.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .trees import TreeClass

__all__ = ["repair_pack", "MAX_ENTRIES"]

#: largest ``k * n * n`` (unit trees x ranks) the packer allocates state for (~33 bytes
#: each); beyond it (exact mode with a large k at scale) the caller's fallbacks run
MAX_ENTRIES = 1 << 23


@njit(cache=True)
def _below(par, tail, w, v, root):
    """Is ``w`` in the subtree of ``v`` (walking ``w``'s parents up to the root)?"""
    while True:
        if w == v:
            return True
        if w == root:
            return False
        w = tail[par[w]]


@njit(cache=True)
def _usable(x, b, v, k, tail, par, member):
    """May tree ``x`` take link ``b`` (into ``v``) as ``v``'s parent?"""
    w = tail[b]
    if not member[x, w] or b == par[x, v]:
        return False
    return not (member[x, v] and _below(par[x], tail, w, v, x // k))


@njit(cache=True)
def _repair(t, n, k, tail, in_start, in_arc, cap, off, used, user, slot_of, par, member,
            count, order, stamp, seen, q_tree, q_pred, q_arc, free, shift, info):
    """Find and apply an augmenting chain that gives tree ``t`` one more vertex.
    Trees are checked against the (few) free links into ``v`` when discovered and
    expanded over the saturated ones only when popped.  Returns the vertex gained
    (or -1) and the updated visit stamp; ``info[1]`` counts the trees visited."""
    for i in range(n):
        v = (i + shift * (t // k)) % n
        if member[t, v]:
            continue
        n_free = 0
        for p in range(in_start[v], in_start[v + 1]):
            if cap[in_arc[p]] > 0:
                free[n_free] = in_arc[p]
                n_free += 1
        if n_free == 0:
            continue
        stamp += 1
        seen[t] = stamp
        q_tree[0] = t
        q_pred[0] = -1
        qh = 0
        qt = 1
        end = -1
        end_arc = -1
        for f in range(n_free):
            if _usable(t, free[f], v, k, tail, par, member):
                end = 0
                end_arc = free[f]
                break
        while qh < qt and end < 0:
            x = q_tree[qh]
            for p in range(in_start[v], in_start[v + 1]):
                b = in_arc[p]
                if cap[b] > 0 or not _usable(x, b, v, k, tail, par, member):
                    continue
                for s in range(off[b], off[b] + used[b]):
                    y = user[s]
                    if seen[y] == stamp:
                        continue
                    seen[y] = stamp
                    q_tree[qt] = y
                    q_pred[qt] = qh
                    q_arc[qt] = b
                    for f in range(n_free):
                        if _usable(y, free[f], v, k, tail, par, member):
                            end = qt
                            end_arc = free[f]
                            break
                    qt += 1
                    if end >= 0:
                        break
                if end >= 0:
                    break
            qh += 1
        info[1] += qt
        if end < 0:
            continue
        # apply: the tree at position j takes its new arc; walk back along predecessors
        j = end
        b = end_arc
        x = q_tree[j]
        s = slot_of[x, v]          # x's old slot (on the arc its predecessor takes), if any
        cap[b] -= 1
        ns = off[b] + used[b]
        used[b] += 1
        user[ns] = x
        slot_of[x, v] = ns
        par[x, v] = b
        while q_pred[j] >= 0:
            b = q_arc[j]           # the arc x held and its predecessor takes over
            j = q_pred[j]
            y = q_tree[j]
            s_next = slot_of[y, v]
            user[s] = y
            slot_of[y, v] = s
            par[y, v] = b
            s = s_next
        member[t, v] = True
        order[t, count[t]] = v
        count[t] += 1
        return v, stamp
    return -1, stamp


@njit(cache=True)
def _grow(n, k, start, tail, head, in_start, in_arc, cap, wide, off, shift, info, seed):
    """Round-robin BFS growth of ``n*k`` unit trees with repair, trees with a complete
    ``seed`` row (warm reuse) taken as they are; returns ``(status, par)`` with status
    0 on success, -1 if some tree stayed stuck."""
    T = n * k
    par = np.full((T, n), -1, np.int64)
    member = np.zeros((T, n), np.bool_)
    order = np.zeros((T, n), np.int64)
    count = np.ones(T, np.int64)
    pos = np.zeros((2, T), np.int64)
    scanned = np.zeros((2, T), np.int64)
    slot_of = np.full((T, n), -1, np.int64)
    used = np.zeros(cap.shape[0], np.int64)
    user = np.full(off[-1] + 1, -1, np.int64)
    seen = np.zeros(T, np.int64)
    q_tree = np.empty(T, np.int64)
    q_pred = np.empty(T, np.int64)
    q_arc = np.empty(T, np.int64)
    free = np.empty(n, np.int64)
    stamp = 0
    for t in range(T):
        r = t // k
        member[t, r] = True
        order[t, 0] = r
        if seed[t, (r + 1) % n] < 0:
            continue
        for v in range(n):
            a = seed[t, v]
            if a >= 0:
                cap[a] -= 1
                s = off[a] + used[a]
                used[a] += 1
                user[s] = t
                slot_of[t, v] = s
                par[t, v] = a
                member[t, v] = True
                order[t, count[t]] = v
                count[t] += 1
    done = 0
    while done < T:
        done = 0
        for t in range(T):
            if count[t] == n:
                done += 1
                continue
            r = t // k
            arc = -1
            for tier in range(2):       # wide links (tail's above-average) first
                while arc < 0 and pos[tier, t] < count[t]:
                    u = order[t, pos[tier, t]]
                    deg = start[u + 1] - start[u]
                    while scanned[tier, t] < deg:
                        a = start[u] + (shift * r + u + scanned[tier, t]) % deg
                        scanned[tier, t] += 1
                        if wide[a] == (tier == 0) and cap[a] > 0 and not member[t, head[a]]:
                            arc = a
                            break
                    if arc < 0:
                        pos[tier, t] += 1
                        scanned[tier, t] = 0
                if arc >= 0:
                    break
            if arc >= 0:
                v = head[arc]
                cap[arc] -= 1
                s = off[arc] + used[arc]
                used[arc] += 1
                user[s] = t
                slot_of[t, v] = s
                par[t, v] = arc
                member[t, v] = True
                order[t, count[t]] = v
                count[t] += 1
            else:
                # every scanned link of t stays saturated (capacities never grow), so
                # pos/scanned need no reset; repair may free nothing but gives t a vertex
                v, stamp = _repair(t, n, k, tail, in_start, in_arc, cap, off, used, user,
                                   slot_of, par, member, count, order, stamp, seen,
                                   q_tree, q_pred, q_arc, free, shift, info)
                info[0] += 1
                if v < 0:
                    return -1, par
    return 0, par


def repair_pack(n: int, tail: np.ndarray, head: np.ndarray, units: np.ndarray,
                k: int, shapes: tuple[np.ndarray, np.ndarray] | None = None,
                shift: int = 1) -> tuple[list[TreeClass] | None, dict[str, int]]:
    """``k`` unit trees per root on the logical graph, merged into classes (``None``
    if a tree gets stuck with no local augmenting chain), and counters.

    ``shapes = (roots, parent_ranks)``: previous trees (ForestColl-warm, paper §4.3),
    reused verbatim, in order, as many unit trees each as their links' units allow;
    only the rest is grown.  Returns ``(None, {})`` without trying when
    ``k * n * n > MAX_ENTRIES``.
    """
    if k * n * n > MAX_ENTRIES:
        return None, {}
    order = np.lexsort((head, tail))
    s_tail, s_head = tail[order].astype(np.int64), head[order].astype(np.int64)
    cap = units[order].astype(np.int64).copy()
    start = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(s_tail, minlength=n), out=start[1:])
    in_arc = np.lexsort((s_tail, s_head)).astype(np.int64)
    in_start = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(s_head, minlength=n), out=in_start[1:])
    off = np.zeros(cap.size + 1, np.int64)
    np.cumsum(cap, out=off[1:])
    info = np.zeros(2, np.int64)
    mean = np.bincount(s_tail, weights=cap, minlength=n) / np.maximum(np.diff(start), 1)
    wide = cap > mean[s_tail]
    seed, reused = _seed(n, k, s_tail, s_head, cap, shapes)
    status, par = _grow(n, k, start, s_tail, s_head, in_start, in_arc, cap, wide, off, shift,
                        info, seed)
    counters = {"repairs": int(info[0]), "repair_visits": int(info[1]), "reused_trees": reused}
    if status < 0:
        return None, counters
    mask = par >= 0
    par[mask] = order[par[mask]]
    out: list[TreeClass] = []
    for r in range(n):
        groups: dict[bytes, list] = {}
        for row in par[r * k:(r + 1) * k]:
            key = row.tobytes()
            if key in groups:
                groups[key][1] += 1
            else:
                groups[key] = [row, 1]
        out.extend(TreeClass(r, m, row.copy()) for row, m in groups.values())
    out.sort(key=lambda c: (c.root, -c.mult))
    return out, counters


def _seed(n: int, k: int, tail: np.ndarray, head: np.ndarray, cap: np.ndarray,
          shapes: tuple[np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, int]:
    """Unit-tree seed rows (sorted-arc parents, -1 elsewhere) from previous shapes whose
    every link exists and still has units; returns the rows and how many were seeded."""
    seed = np.full((n * k, n), -1, np.int64)
    if shapes is None or len(shapes[0]) == 0:
        return seed, 0
    roots = np.asarray(shapes[0], np.int64)
    parents = np.asarray(shapes[1], np.int64)
    arc_of = np.full((n, n), -1, np.int64)
    arc_of[tail, head] = np.arange(tail.size)
    has = parents >= 0
    arcs = np.where(has, arc_of[np.maximum(parents, 0), np.arange(n)[None, :]], -1)
    usable = (has.sum(axis=1) == n - 1) & ~(has & (arcs < 0)).any(axis=1)
    taken = _seed_rows(k, roots, arcs, usable, cap.copy(), seed)
    return seed, int(taken.sum())


@njit(cache=True)
def _seed_rows(k, roots, arcs, usable, left, seed):
    """In order, give each usable shape as many of its root's ``k`` unit trees as its
    links' remaining units allow (``left`` is consumed); fills ``seed``, returns the
    number of seeded unit trees per root."""
    n = arcs.shape[1]
    taken = np.zeros(n, np.int64)
    for i in range(roots.size):
        r = roots[i]
        if not usable[i] or taken[r] == k:
            continue
        m = k - taken[r]
        for v in range(n):
            if arcs[i, v] >= 0 and left[arcs[i, v]] < m:
                m = left[arcs[i, v]]
        if m <= 0:
            continue
        for v in range(n):
            if arcs[i, v] >= 0:
                left[arcs[i, v]] -= m
        for j in range(r * k + taken[r], r * k + taken[r] + m):
            seed[j, :] = arcs[i, :]
        taken[r] += m
    return taken
