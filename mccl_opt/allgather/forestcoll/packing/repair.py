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

Growth: ``k`` unit trees per root, round robin, in the order of :mod:`.growth_order`
(wide links first, then the root's rail, then the rest; batched turns from
``RAIL_FIRST_MIN_RANKS`` ranks on); link scans rotated by root as in
:func:`~.trees.greedy_pack`.  Wide-first makes a tree enter a host once and fan out
inside it, and the root's rail first makes the trees of one rail share that rail's
units, which is what the exactly tight host ingress of multi-segment HPN needs (0
repairs up to 2048 GPUs, where a plain wide-then-narrow order needed ~7400 chains).
The repair search is :mod:`.augment` (short searches first).

Cost: a tree's scan of one class of links touches that class's compact list only, and
saturated links leave a skip list (union-find "next live link"), so a scan never
revisits them.  The repair index (every link's users, every tree's slot on its links)
is built only when a tree first gets stuck, in the order the units were taken, so
packings without repairs (most large ones) never pay for it (4096 GPUs, k = 9: 1.3 GB)
and packings with repairs equal those of an index kept all along.  The kernels the
growth loop calls are compiled without reference counting (``_nrt=False``: they
allocate nothing; atomic reference counts around the calls took ~30 % of the growth
time in a profile).  Warm: previous tree
shapes are seeded verbatim first.  Identical trees of a root are merged into
:class:`~.trees.TreeClass` es.  Completion certifies the packing by construction;
``None`` means no local chain exists and the caller falls back to the global packers.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .forecast import NO_FORECAST, Forecast, hopeless
from .augment import Links, Search, Trees, Users, attach, enlist, has, index_users, join, repair, spend
from .growth_order import growth_order
from .seeding import seed_rows
from .trees import TreeClass

__all__ = ["repair_pack", "MAX_ENTRIES"]

#: largest ``k * n * n`` (unit trees x ranks) the packer allocates state for (9 bytes
#: each while growing, 13 once a repair needs the index, plus 4 per logical unit:
#: 3.5 GB at the limit; 4096 GPUs with k = 9 grow in 1.4 GB); beyond it the caller's
#: fallbacks run
MAX_ENTRIES = 1 << 28

#: trees a first repair search visits per missing vertex before trying the next one
SHORT_SEARCH = 16

#: growth tiers (:mod:`.growth_order`): wide links; narrow links out of vertices in the
#: root's narrow component, then out of the other vertices, each the above-average
#: ones first.  ``TIER_ARCS``: the class list each tier scans (0 wide, 1 narrow above
#: the tail's narrow average, 2 other narrow); ``TIER_OWN``: 1 own component, 0
#: others, -1 any
TIER_ARCS = (0, 1, 2, 1, 2)
TIER_OWN = (-1, 1, 1, 0, 0)


@njit(cache=True, _nrt=False)
def _find(nxt, p):
    """First live position ``>= p`` of a skip list (``nxt[q] == q``: ``q`` is live;
    ``nxt[-1]`` is a live sentinel), halving the paths it walks."""
    while nxt[p] != p:
        nxt[p] = nxt[nxt[p]]
        p = nxt[p]
    return p


@njit(cache=True, _nrt=False)
def _next_arc(t, tier, u, r, shift, outdeg, cstart, fpos, skip, head, member, scanned, rot):
    """The next link of tier ``tier`` out of ``u`` that tree ``t`` (root ``r``) can
    take, -1 when ``u`` has none left.  ``u``'s links are scanned from the rotated
    offset ``shift * r + u`` of its whole out-list, restricted to the tier's class
    (``TIER_ARCS``), skipping saturated links through the skip list;
    ``scanned[tier, t]`` counts the class positions passed (the scan resumes there),
    ``rot[tier, t]`` is the rotated start within the class."""
    c = TIER_ARCS[tier]
    cs = cstart[c, u]
    ce = cstart[c, u + 1]
    dc = ce - cs
    if dc == 0:
        return -1
    sc = scanned[tier, t]
    if sc == 0:                 # first class link at or after the rotated full position
        o = (shift * r + u) % outdeg[u]
        lo, hi = cs, ce
        while lo < hi:
            mid = (lo + hi) >> 1
            if fpos[mid] < o:
                lo = mid + 1
            else:
                hi = mid
        rot[tier, t] = lo - cs
    oc = rot[tier, t]
    while sc < dc:
        if oc + sc < dc:            # first segment [oc, dc), then [0, oc)
            p = cs + oc + sc
            lim = ce
        else:
            p = cs + oc + sc - dc
            lim = cs + oc
        f = _find(skip, p)
        if f >= lim:
            sc += lim - p
            continue
        sc += f - p + 1
        if not has(member, t, head[f]):
            scanned[tier, t] = sc
            return f
    scanned[tier, t] = sc
    return -1


@njit(cache=True, _nrt=False)
def _mark_tails(t, n, member, in_start, in_arc, tail, skip, cstart, tails, stamp):
    """For a tree ``t`` missing few ranks: mark (``tails[u, 0] = stamp``) every rank
    ``u`` of ``t`` with a live link to a missing rank, and in ``tails[u, 1]`` the
    classes of those links (bit ``c``).  A scan need only visit marked ranks: an
    unmarked rank's links lead to ranks ``t`` has or are saturated, so the top-down
    scan would pass it (the same links are found, far fewer looked at)."""
    for w in range(member.shape[1]):
        gaps = ~member[t, w]
        while gaps != 0:
            low = gaps & -gaps
            gaps ^= low
            v = w * 64 + _bit(low)
            if v >= n:
                break
            for p in range(in_start[v], in_start[v + 1]):
                a = in_arc[p]
                u = tail[a]
                if skip[a] != a or not has(member, t, u):
                    continue                # saturated, or from a rank t lacks
                if tails[u, 0] != stamp:
                    tails[u, 0] = stamp
                    tails[u, 1] = 0
                tails[u, 1] |= 1 << ((a >= cstart[1, 0]) + (a >= cstart[2, 0]))


@njit(cache=True, _nrt=False)
def _bit(low):
    """The index of the single set bit of ``low``."""
    i = 0
    while low != 1 and i < 63:
        low = (low >> 1) & 0x7FFFFFFFFFFFFFFF
        i += 1
    return i


@njit(cache=True, _nrt=False)
def _by_rank(link, order, count, row):
    """Rewrite each tree's ``link`` row from order positions to ranks (``row``: scratch
    of one row)."""
    n = link.shape[1]
    for t in range(link.shape[0]):
        for v in range(n):
            row[v] = -1
        for i in range(1, count[t]):
            row[order[t, i]] = link[t, i]
        for v in range(n):
            link[t, v] = row[v]


@njit(cache=True)
def _grow(n, k, links, go, outdeg, off, shift, info, seed, max_visits, fc):
    """Round-robin BFS growth of ``n*k`` unit trees with repair over ``links``
    (:class:`~.augment.Links`: ``cap`` the units; ``skip`` and ``in_free`` filled here)
    in the growth order ``go`` (:class:`~.growth_order.GrowthOrder`), trees with a
    complete ``seed`` row (warm reuse) taken as they are; returns ``(status, par)`` with
    status 0 on success, -1 if some tree stayed stuck, the repairs visited more than
    ``max_visits`` trees or the forecast ``fc`` (:class:`.forecast.Forecast`) found the
    rest costlier than the few-trees packing (``info[3] = 1``; ``par[t, v]``: the link
    into ``v``, -1 at the root)."""
    tail, head, in_start, in_arc, cap, skip, in_free = links
    cstart, fpos, comp, batch = go.start, go.fpos, go.comp, go.batch
    part_col, part_size, class_part = go.part_col, go.part_size, go.class_part
    T = n * k
    m = cap.shape[0]
    par = np.full((T, n), -1, np.int32)     # by order position until the index exists
    member = np.zeros((T, (n + 63) >> 6), np.int64)
    missing = np.empty((T, part_size.size), np.int16)  # ranks of each part not in the tree
    order = np.zeros((T, n), np.int32)
    count = np.ones(T, np.int64)
    seeded = np.zeros(T, np.bool_)
    pos = np.zeros((5, T), np.int64)
    scanned = np.zeros((5, T), np.int64)
    rot = np.zeros((5, T), np.int64)
    used = np.zeros(m, np.int64)
    user = np.empty(0, np.int32)            # the repair index: built on the first repair
    slot_of = np.empty((0, 0), np.int32)
    indexed = False
    seen = np.zeros(T, np.int64)             # repair search scratch
    sat = np.empty(max(np.diff(in_start).max(), 1), np.int64)   # saturated links into v
    q_tree = np.empty(T, np.int64)
    q_pred = np.empty(T, np.int64)
    q_arc = np.empty(T, np.int64)
    free = np.empty(n, np.int64)
    memo = np.zeros(n, np.int64)
    memo_below = np.zeros(n, np.bool_)
    path = np.empty(n + 1, np.int64)
    stamp = 0
    tails = np.zeros((n, 2), np.int64)      # ranks to scan once few are missing
    few = max(1, n // (4 * max(np.diff(in_start).max(), 1)))
    marked = 0
    for t in range(T):
        r = t // k
        missing[t, :] = part_size
        join(t, r, member, missing, part_col)
        order[t, 0] = r
        if seed.shape[0] == 0 or seed[t, (r + 1) % n] < 0:
            continue
        seeded[t] = True
        for v in range(n):
            if seed[t, v] >= 0:
                cap[seed[t, v]] -= 1        # the skip list is built after seeding
                attach(t, v, seed[t, v], par, False, member, missing, part_col, order, count)
    in_free[:] = 0                           # free units into every rank
    skip[:] = np.arange(m + 1)               # live links (a saturated one points past)
    for a in range(m):
        in_free[head[a]] += cap[a]
        skip[a] += cap[a] == 0
    trees = Trees(par, member, missing, part_col, order, count)
    search = Search(seen, sat, free, q_tree, q_pred, q_arc, memo, memo_below, path, info)
    placed = 0                               # tree entries placed (roots included)
    for t in range(T):
        placed += count[t]
    mark = np.full(3, -1, np.int64)          # the forecast's window and decision
    done = 0
    while done < T:
        done = 0
        for t in range(T):
            if count[t] == n:
                done += 1
                continue
            r = t // k
            for _ in range(batch):
                if count[t] == n:
                    break
                arc = -1
                upto = 0                    # order positions below it: marked ranks only
                if n - count[t] <= few:     # marking costs <= ~n/4 steps
                    marked += 1
                    _mark_tails(t, n, member, in_start, in_arc, tail, skip, cstart, tails,
                                marked)
                    upto = count[t]
                for tier in range(5):       # wide links, then narrow ones in r's component
                    while arc < 0 and pos[tier, t] < count[t]:
                        u = order[t, pos[tier, t]]
                        if TIER_OWN[tier] >= 0 and (comp[u] == comp[r]) != (TIER_OWN[tier] == 1) \
                                or missing[t, part_col[u, class_part[TIER_ARCS[tier]]]] == 0 \
                                or pos[tier, t] < upto and (tails[u, 0] != marked or (
                                    tails[u, 1] >> TIER_ARCS[tier]) & 1 == 0):
                            pos[tier, t] += 1       # the other narrow tier's vertex, or
                            scanned[tier, t] = 0    # all u's links lead to ranks t has
                            continue
                        arc = _next_arc(t, tier, u, r, shift, outdeg, cstart, fpos, skip, head,
                                        member, scanned, rot)
                        if arc < 0:
                            pos[tier, t] += 1
                            scanned[tier, t] = 0
                    if arc >= 0:
                        break
                if arc >= 0:
                    spend(arc, cap, skip, in_free, head)
                    if indexed:
                        enlist(t, head[arc], arc, off, used, user, slot_of)
                    attach(t, head[arc], arc, par, indexed, member, missing, part_col, order,
                           count)
                    placed += 1
                    continue
                if not indexed:
                    _by_rank(par, order, count, np.empty(n, np.int32))
                    user = np.full(off[-1] + 1, -1, np.int32)
                    slot_of = np.full((T, n), -1, np.int32)
                    index_users(batch, seeded, par, order, count, off, used, user, slot_of)
                    indexed = True
                # every scanned link of t stays saturated (capacities never grow), so
                # pos/scanned need no reset; repair may free nothing but gives t a vertex
                if hopeless(fc, info[1], T * n - placed, mark):
                    info[3] = 1
                    return -1, par
                v = -1
                users = Users(off, used, user, slot_of)
                for limit in (SHORT_SEARCH, T + 1):     # short chains first, then any
                    if v < 0:
                        v, stamp = repair(t, n, k, links, trees, users, search, stamp, shift,
                                          limit, max_visits)
                info[0] += 1
                if v < 0:
                    return -1, par
                placed += 1
    if not indexed:
        _by_rank(par, order, count, np.empty(n, np.int32))
    return 0, par


def repair_pack(n: int, tail: np.ndarray, head: np.ndarray, units: np.ndarray,
                k: int, shapes: tuple[np.ndarray, np.ndarray] | None = None,
                shift: int = 1, max_visits: int = 1 << 62, rail_first: bool | None = None,
                fc: Forecast = NO_FORECAST) -> tuple[list[TreeClass] | None, dict[str, int]]:
    """``k`` unit trees per root on the logical graph, merged into classes (``None``
    if a tree gets stuck with no local augmenting chain), and counters.

    ``shapes = (roots, parent_ranks)``: previous trees (ForestColl-warm, paper §4.3),
    reused verbatim, in order, as many unit trees each as their links' units allow;
    only the rest is grown.  ``max_visits``: give up (``None``) once the repair searches
    have visited that many trees (a guessed target that may not fit).  ``rail_first``:
    the growth order's rail-first mode (:func:`.growth_order.growth_order`).  ``fc``: stop
    where the rest is forecast costlier than the few-trees packing (:mod:`.forecast`;
    ``counters["repair_forecast_stop"]``).  Returns
    ``(None, {})`` without trying when ``k * n * n > MAX_ENTRIES``.
    """
    if k * n * n > MAX_ENTRIES:
        return None, {}
    go = growth_order(n, tail, head, units, rail_first)
    order = go.perm
    s_tail, s_head = tail[order].astype(np.int32), head[order].astype(np.int32)
    cap = units[order].astype(np.int64).copy()
    in_arc = np.argsort(s_head.astype(np.int64) * n + s_tail)
    in_start = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(s_head, minlength=n), out=in_start[1:])
    off = np.zeros(cap.size + 1, np.int64)
    np.cumsum(cap, out=off[1:])
    info = np.zeros(4, np.int64)
    seed, reused = seed_rows(n, k, s_tail, s_head, cap, shapes)
    links = Links(s_tail, s_head, in_start, in_arc, cap, np.empty(cap.size + 1, np.int64),
                  np.empty(n, np.int64))
    status, par = _grow(n, k, links, go, np.bincount(s_tail, minlength=n), off, shift, info,
                        seed, max_visits, fc)
    counters = {"repairs": int(info[0]), "repair_visits": int(info[1]), "reused_trees": reused}
    if info[3]:
        counters["repair_forecast_stop"] = 1
    if status < 0:
        return None, counters
    mult = np.zeros(len(par), np.int64)
    _merge(par, order, k, mult, np.empty(k, np.int64))
    kept = np.flatnonzero(mult)
    kept = kept[np.lexsort((-mult[kept], kept // k))]     # by root, widest first (stable)
    out = [TreeClass(t // k, m, par[t]) for t, m in zip(kept.tolist(), mult[kept].tolist())]
    return out, counters


@njit(cache=True, _nrt=False)
def _merge(par, perm, k, mult, reps):
    """Identical unit trees of a root as one class, in place, links renumbered (``perm``);
    ``mult[t]``: its root's trees equal to ``t`` and no earlier one (``reps``: classes)."""
    T, n = par.shape
    classes = 0
    for t in range(T):
        classes *= t % k != 0                   # a new root: no class yet
        for v in range(n):
            if par[t, v] >= 0:
                par[t, v] = perm[par[t, v]]
        i = 0
        while i < classes and not _same(par, reps[i], t):
            i += 1
        if i == classes:
            reps[classes], classes = t, classes + 1
        mult[reps[i]] += 1


@njit(cache=True, _nrt=False)
def _same(rows, s, t):
    """Are rows ``s`` and ``t`` equal?"""
    for v in range(rows.shape[1]):
        if rows[s, v] != rows[t, v]:
            return False
    return True
