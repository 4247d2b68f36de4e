"""Phase 3's local augmenting repair (paper §4.3; the packer is :mod:`.repair`).

A unit tree ``t`` stuck in :func:`.repair._grow` gains a missing vertex ``v`` by a chain
``t = x0, x1, ..., xj``: ``x_i`` takes over the link into ``v`` used by ``x_{i+1}`` and
``xj`` re-parents ``v`` onto a link with a free unit.  A tree may take link ``w -> v``
iff ``w`` is in it and (when it already holds ``v``) ``w`` is not below ``v``, so every
tree stays an arborescence and every link within its units.  The search is breadth-first
over the trees holding ``v``; the state arrays are :func:`.repair._grow`'s.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

__all__ = ["repair", "spend", "attach", "has", "add", "join", "index_users", "enlist", "Links",
           "Trees", "Users", "Search"]


class Links(NamedTuple):
    """The logical graph as the packer holds it: link ends, the links into each rank
    (``in_arc[in_start[v] : in_start[v + 1]]``), free units per link (``cap``) and into
    each rank (``in_free``), and the skip list of live links."""

    tail: np.ndarray
    head: np.ndarray
    in_start: np.ndarray
    in_arc: np.ndarray
    cap: np.ndarray
    skip: np.ndarray
    in_free: np.ndarray


class Trees(NamedTuple):
    """The unit trees being grown: ``par[t, v]`` the link into ``v`` (by rank once the
    repair index exists), ``member`` bits, ``missing`` ranks per part (``part_col``, see
    :mod:`.growth_order`), and the ranks in the order taken (``order``, ``count``)."""

    par: np.ndarray
    member: np.ndarray
    missing: np.ndarray
    part_col: np.ndarray
    order: np.ndarray
    count: np.ndarray


class Users(NamedTuple):
    """The repair index: link ``a``'s users in slots ``off[a] .. off[a] + used[a]``
    (``user``), and the slot of tree ``t``'s link into ``v`` (``slot_of[t, v]``)."""

    off: np.ndarray
    used: np.ndarray
    user: np.ndarray
    slot_of: np.ndarray


class Search(NamedTuple):
    """Scratch of the repair search: visit stamps per tree, the saturated and free links
    into ``v``, the breadth-first queue (tree, predecessor, link), the memo of
    :func:`_below` with its walk, and ``info`` (repairs, trees visited, memo token)."""

    seen: np.ndarray
    sat: np.ndarray
    free: np.ndarray
    q_tree: np.ndarray
    q_pred: np.ndarray
    q_arc: np.ndarray
    memo: np.ndarray
    memo_below: np.ndarray
    path: np.ndarray
    info: np.ndarray


@njit(cache=True, _nrt=False)
def has(bits, t, v):
    """Is rank ``v`` in tree ``t``?  (``bits[t]``: its ranks, 64 to a word.)"""
    return (bits[t, v >> 6] >> (v & 63)) & 1 == 1


@njit(cache=True, _nrt=False)
def add(bits, t, v):
    """Rank ``v`` joins tree ``t``."""
    bits[t, v >> 6] |= np.int64(1) << (v & 63)


@njit(cache=True, _nrt=False)
def join(t, v, member, missing, part_col):
    """Rank ``v`` joins tree ``t``: its member bit, and one rank less missing from each
    of its parts (``missing[t, part_col[v, j]]``; see :mod:`.growth_order`)."""
    add(member, t, v)
    for c in range(part_col.shape[1]):
        missing[t, part_col[v, c]] -= 1


@njit(cache=True, _nrt=False)
def spend(a, cap, skip, in_free, head):
    """Take one unit of arc ``a``; a saturated arc leaves the skip list."""
    cap[a] -= 1
    in_free[head[a]] -= 1
    skip[a] = a + (cap[a] == 0)     # a live arc lists itself


@njit(cache=True, _nrt=False)
def attach(t, v, a, link, by_rank, member, missing, part_col, order, count):
    """Tree ``t`` reaches rank ``v`` over link ``a`` (its unit already spent; the
    repair index, once built, is updated by the caller).  ``link[t]`` holds each
    rank's parent link at the rank (``by_rank``: once the repair index exists) or at
    its position in ``order[t]`` (while growing: the row is written in sequence)."""
    link[t, v if by_rank else count[t]] = a
    join(t, v, member, missing, part_col)
    order[t, count[t]] = v
    count[t] += 1


@njit(cache=True, _nrt=False)
def index_users(batch, seeded, par, order, count, off, used, user, slot_of):
    """The repair index (every link's users, in slots ``off[a] .. off[a] + used[a]``;
    ``slot_of[t, v]``: the slot of ``t``'s link into ``v``), built when the first tree
    gets stuck, in the order the trees took their units: seeded trees first, then turn
    by turn of the round robin (``batch`` ranks per tree per turn), tree by tree."""
    T, n = par.shape
    for t in range(T):
        if seeded[t]:
            for i in range(1, count[t]):
                enlist(t, order[t, i], par[t, order[t, i]], off, used, user, slot_of)
    for lo in range(1, n, batch):
        for t in range(T):
            if not seeded[t]:
                for i in range(lo, min(count[t], lo + batch)):
                    enlist(t, order[t, i], par[t, order[t, i]], off, used, user, slot_of)


@njit(cache=True, _nrt=False)
def enlist(t, v, a, off, used, user, slot_of):
    """Tree ``t``'s link ``a`` into ``v`` takes the next slot of ``a``."""
    s = off[a] + used[a]
    used[a] += 1
    user[s] = t
    slot_of[t, v] = s


@njit(cache=True, _nrt=False)
def _below(par, tail, w, v, root, memo, memo_below, token, path):
    """Is ``w`` in the subtree of ``v``?  Walks ``w``'s parents up to ``v``, the root or
    a rank answered under ``token`` (one tree and ``v``) and records the answer for every
    rank walked (``memo``/``memo_below``)."""
    depth = 0
    while True:
        if memo[w] == token:
            found = memo_below[w]
            break
        if w == v:
            found = True
            break
        if w == root:
            found = False
            break
        path[depth] = w
        depth += 1
        w = tail[par[w]]
    for i in range(depth):
        memo[path[i]] = token
        memo_below[path[i]] = found
    return found


@njit(cache=True, _nrt=False)
def _usable(x, b, v, k, tail, par, member, memo, memo_below, token, path):
    """May tree ``x`` take link ``b`` (into ``v``) as ``v``'s parent? (``token``: see
    :func:`_below`.)"""
    w = tail[b]
    if not has(member, x, w) or b == par[x, v]:
        return False
    return not (has(member, x, v) and _below(par[x], tail, w, v, x // k, memo, memo_below, token,
                                        path))


@njit(cache=True, _nrt=False)
def repair(t, n, k, links, trees, users, search, stamp, shift, limit, max_visits):
    """Find and apply an augmenting chain that gives tree ``t`` one more vertex
    (:class:`Links`, :class:`Trees`, :class:`Users`, :class:`Search`).  ``v`` runs over
    the missing ranks with a free unit into them (``in_free``), each search stopping
    after ``limit`` trees (all searches once ``info[1] > max_visits``).  Trees are
    checked against the (few) free links into ``v`` when discovered and expanded over
    the saturated ones only when popped; an expanded link leaves the search's list
    ``sat`` (its users are all enqueued).  Returns the vertex gained (or -1) and the
    updated visit stamp; ``info[1]`` counts the trees visited, ``info[2]`` is the memo
    token of :func:`_below`."""
    tail, head, in_start, in_arc, cap, skip, in_free = links
    par, member, missing, part_col, order, count = trees
    off, used, user, slot_of = users
    seen, sat, free, q_tree, q_pred, q_arc, memo, memo_below, path, info = search
    for i in range(n):
        v = (i + shift * (t // k)) % n
        if info[1] > max_visits:
            return -1, stamp
        if has(member, t, v) or in_free[v] == 0:
            continue
        n_free = 0
        n_sat = 0
        for p in range(in_start[v], in_start[v + 1]):
            if cap[in_arc[p]] > 0:
                free[n_free] = in_arc[p]
                n_free += 1
            else:
                sat[n_sat] = in_arc[p]
                n_sat += 1
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
        info[2] += 1
        for f in range(n_free):
            if _usable(t, free[f], v, k, tail, par, member, memo, memo_below, info[2], path):
                end = 0
                end_arc = free[f]
                break
        while qh < qt and qt < limit and end < 0:
            x = q_tree[qh]
            info[2] += 1
            token = info[2]
            kept = 0
            for p in range(n_sat):
                b = sat[p]
                if not _usable(x, b, v, k, tail, par, member, memo, memo_below, token, path):
                    sat[kept] = b
                    kept += 1
                    continue
                for s in range(off[b], off[b] + used[b]):
                    y = user[s]
                    if seen[y] == stamp:
                        continue
                    seen[y] = stamp
                    q_tree[qt] = y
                    q_pred[qt] = qh
                    q_arc[qt] = b
                    info[2] += 1
                    for f in range(n_free):
                        if _usable(y, free[f], v, k, tail, par, member, memo, memo_below,
                                   info[2], path):
                            end = qt
                            end_arc = free[f]
                            break
                    qt += 1
                    if end >= 0:
                        break
                if end >= 0:
                    break
            n_sat = kept                # expanded links left the list: all users seen
            qh += 1
        info[1] += qt
        if end < 0:
            continue
        # apply: the tree at position j takes its new arc; walk back along predecessors
        j = end
        b = end_arc
        x = q_tree[j]
        s = slot_of[x, v]          # x's old slot (on the arc its predecessor takes), if any
        spend(b, cap, skip, in_free, head)
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
        join(t, v, member, missing, part_col)
        order[t, count[t]] = v
        count[t] += 1
        return v, stamp
    return -1, stamp
