"""The few-trees packing's flow checks (Lovász's growth, :mod:`.few_trees` module doc): a
link's check by one max-flow, its short-path lower bound that decides most checks in
``O(n²)``, and the rooted sweep that verifies a batch of unchecked links at once."""

from __future__ import annotations

import numpy as np
from numba import njit

from ..maxflow import INF, _dinic, _rooted_check


@njit(cache=True)
def _verify(lo, hi, mult, n, m, cap, unstarted, order, p_left, vcaps, vnet, sinks,
            sweep_pos):
    """The sweep over the sinks ``order[lo:hi]`` (the ranks entered since the last
    verified state): -1 if the partial packing with the class at ``order[:hi]`` keeps the
    cut condition, else the first failing sink (its residual network left in ``vnet``).
    ``vnet``: the logical graph plus a node ``ρ`` (``n``) fed ``mult`` by the source with
    an INF link to every rank of the class, so a set meeting the class is owed its copies
    and one missing it is not."""
    start, arcs, head, res, level, queue, it, path = vnet
    for b in range(m):
        vcaps[b] = cap[b]
    for x in range(n):
        vcaps[m + x] = 0
    for i in range(hi):
        vcaps[m + order[i]] = INF
    s0 = m + n
    for x in range(n):
        vcaps[s0 + x] = unstarted[x]
    vcaps[s0 + n] = mult
    t0 = s0 + n + 1
    for x in range(n + 1):
        vcaps[t0 + x] = 0
    for i in range(lo, hi):
        sinks[i - lo] = order[i]
    part = sinks[: hi - lo].copy()
    sinks[: hi - lo] = part[np.argsort(sweep_pos[part])]
    pos = _rooted_check(n + 3, start, arcs, head, res, vcaps, t0, sinks, 0, hi - lo,
                        p_left + mult, level, queue, it, path)
    return -1 if pos < 0 else sinks[pos]


@njit(cache=True)
def _check(u, v, want, p_left, n, m, cap, unstarted, start, arcs, rhead, res, level, queue,
           it, path):
    """How many copies of the growing class may take ``u -> v`` (at most ``want``): the
    max-flow from ``{s, u}`` (``s -> r``: the unstarted trees at ``r``) to ``v``, less
    the ``p_left`` unstarted trees; ``<= 0`` when a set ``S ∋ v``, ``u ∉ S`` is tight."""
    for b in range(m):
        res[2 * b] = cap[b]
        res[2 * b + 1] = 0
    for x in range(n):
        res[2 * (m + x)] = unstarted[x]
        res[2 * (m + x) + 1] = 0
        res[2 * (m + n + x)] = 0
        res[2 * (m + n + x) + 1] = 0
    res[2 * (m + u)] = INF
    res[2 * (m + n + v)] = INF
    return _dinic(n + 2, start, arcs, rhead, res, n, n + 1, p_left + want, level, queue, it,
                  path) - p_left


@njit(cache=True)
def _short_paths_flow(u, v, n, pair, unstarted, want, left, short):
    """A flow from ``{s, u}`` to ``v`` on paths of at most three links (a lower bound on
    the check's max-flow, module doc), stopped once it reaches ``want``.  Two links:
    ``s -> v``, ``u -> v``, and through every other GPU ``w`` the units of ``w -> v`` fed
    by ``s -> w`` and ``u -> w``; then each ``w -> v`` still short is fed by ``x -> w``
    from the feed ``x`` has left.  ``left``, ``short``: scratch of ``n``."""
    total = unstarted[v] + pair[u, v]
    for w in range(n):
        left[w] = 0
        short[w] = 0
        if w != u and w != v:
            feed = unstarted[w] + pair[u, w]
            used = min(pair[w, v], feed)
            total += used
            left[w] = feed - used
            short[w] = pair[w, v] - used
    for w in range(n):
        if total >= want:
            break
        if short[w] > 0:
            for x in range(n):
                if left[x] > 0 and x != w and pair[x, w] > 0:
                    push = min(short[w], left[x], pair[x, w])
                    short[w] -= push
                    left[x] -= push
                    total += push
                    if short[w] == 0:
                        break
    return total
