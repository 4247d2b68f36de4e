"""The few-trees packing's compiled growth of one tree class (Lovász's growth, paper §4.3;
:mod:`.few_trees` module doc): links taken unchecked and verified by sweeps in batches,
links taken by checks where none is left, a class split where a link admits only some
of its copies; lazily (no sweep once complete) inside a batch of classes that
:mod:`.few_trees` verifies at once."""

from __future__ import annotations

from numba import njit

from ..maxflow import _bfs_levels
from .growth_checks import _check, _short_paths_flow, _verify
from .remembered_sets import _all_slacks, _enter, _move, _remember, _ruled_out

__all__ = ["MAX_FAILED_VERIFICATIONS", "SINKS_PER_CHECK"]

#: verifications of a class's unchecked links that may fail before the class grows by
#: checked links only (each failure remembers a new set, so the class cannot cycle)
MAX_FAILED_VERIFICATIONS = 8

#: sinks of a verification sweep counted as one max-flow against the packing's budget (a
#: sweep repairs one flow from sink to sink: ~2.8 ms for 127 sinks of leaf-spine 8x2x8's
#: tight exact split in rank order, where a check from scratch takes ~0.1-0.5 ms)
SINKS_PER_CHECK = 4


@njit(cache=True)
def _unchecked_link(count, mult, order, out_start, out_arc, l_head, cap, member, mem, sets,
                    slack, dead, spent):
    """The first link the class would take were every check to pass: members newest
    first, each one's links widest first, with room for every copy and not ruled out by
    a remembered set; -1 if none.  A link passed over stays so while the class only
    grows (its head a member, its units or a set's slack only fall): ``dead`` marks it,
    ``spent`` a member whose every link is (both cleared where the class gives back)."""
    for i in range(count - 1, -1, -1):
        u = order[i]
        if spent[u]:
            continue
        for p in range(out_start[u], out_start[u + 1]):
            a = out_arc[p]
            if dead[a]:
                continue
            v = l_head[a]
            if member[v] or cap[a] < mult or _ruled_out(u, v, mult, mem, sets, slack):
                dead[a] = True
                continue
            return a
        spent[u] = True
    return -1


@njit(cache=True)
def _checked_link(count, mult, p_left, n, m, order, out_start, out_arc, l_head, cap, pair,
                  unstarted, left, short, net, member, mem, sets, members, sizes, slack,
                  in_start, in_arc, l_tail, side, checks):
    """One link by checks (module doc): links with room for every copy first (members
    newest first), then the others (members oldest first); ``(link, copies)``, ``(-1, 0)``
    when stuck, ``(-2, 0)`` past the budget.  A failed check's sink side is remembered."""
    start, arcs, rhead, res, level, queue, it, path = net
    for wide in (True, False):
        for j in range(count):
            u = order[count - 1 - j] if wide else order[j]
            for p in range(out_start[u], out_start[u + 1]):
                a = out_arc[p]
                v = l_head[a]
                if member[v] or cap[a] == 0 or (wide and cap[a] < mult):
                    continue
                need = mult if wide else 1
                if _ruled_out(u, v, need, mem, sets, slack):
                    continue
                want = min(mult, cap[a])
                if _short_paths_flow(u, v, n, pair, unstarted, p_left + want, left,
                                     short) >= p_left + want:
                    amount = want                # every check cut passes (module doc)
                else:
                    checks[0] += 1
                    if checks[0] > checks[1]:
                        return -2, 0
                    amount = _check(u, v, want, p_left, n, m, cap, unstarted, start,
                                    arcs, rhead, res, level, queue, it, path)
                if amount >= need and (amount == mult or not wide):
                    return a, amount
                _bfs_levels(n + 2, start, arcs, rhead, res, n, -1, level, queue)
                for x in range(n):
                    side[x] = level[x] < 0
                _remember(side, n, mem, sets, members, sizes, slack, in_start, in_arc,
                          l_tail, cap, unstarted, p_left)
    return -1, 0


@njit(cache=True)
def _grow_class(r, mult, n, m, l_tail, l_head, pair, left, short, out_start, out_arc,
                in_start, in_arc, cap, unstarted, net, vnet, vcaps, sinks, row, member, order,
                side, mem, sets, members, sizes, slack, dead, spent, sweep_pos, checks, lazy):
    """Grow a class of ``mult`` trees of root ``r`` (module doc) into ``row`` (the link
    into each rank); returns its final multiplicity: where a link admits only
    ``a < mult`` copies, the other copies give their links back and return to the
    unstarted trees of ``r``.  0 when stuck or past ``checks[1]`` max-flows (a sweep
    counts one per :data:`SINKS_PER_CHECK` sinks).

    Links are first taken unchecked (:func:`_unchecked_link`) and the links taken since
    the last verified state are verified by one sweep (:func:`_verify`) when the class
    is complete or no such link is left; a failed sweep's cut is remembered and the
    class goes back to before its first link into that cut (still verified by the next
    sweep).  Where no unchecked link is left, one link is taken by checks.  ``lazy``: no
    sweep once the class is complete (the batch's sweep in :func:`.few_trees._grow`
    verifies the packing once its classes are complete; the sweeps before a checked link
    stay, so a class splits as it would from a verified state: leaf-spine 8x2x8's packing
    keeps main's trees, where skipping them too gave 328 trees instead of 322 on
    ``scrambled(.., 56718613)`` and a 0.15 s re-weighting); 0 also where such a sweep
    fails (its cut remembered: the batch's earlier classes may have broken it, and
    retrying inside the class ran it into checked links only) or a check gets stuck."""
    p_left = 0
    for x in range(n):
        p_left += unstarted[x]
        member[x] = False
        spent[x] = False
        row[x] = -1
    dead[:] = False
    _all_slacks(mem, sets, members, sizes, slack, in_start, in_arc, l_tail, cap, unstarted,
                p_left)
    member[r] = True
    order[0] = r
    count = 1
    verified = 1                             # order[:verified] keeps the cut condition
    failed = 0
    while verified < n:
        a = -1
        if failed < MAX_FAILED_VERIFICATIONS and count < n:
            a = _unchecked_link(count, mult, order, out_start, out_arc, l_head, cap, member,
                                mem, sets, slack, dead, spent)
        if a >= 0:
            count = _enter(a, mult, count, l_tail, l_head, cap, pair, mem, sets, slack, row,
                           member, order)
            continue
        if lazy and count == n:
            return mult
        if verified < count:
            checks[0] += 1 + (count - verified) // SINKS_PER_CHECK
            if checks[0] > checks[1]:
                return 0
            bad = _verify(verified, count, mult, n, m, cap, unstarted, order, p_left, vcaps,
                          vnet, sinks, sweep_pos)
            if bad < 0:
                verified = count
                continue
            failed += 1
            start, arcs, head, res, level, queue, it, path = vnet
            _bfs_levels(n + 3, start, arcs, head, res, n + 1, -1, level, queue)
            for x in range(n):
                side[x] = level[x] < 0
            _remember(side, n, mem, sets, members, sizes, slack, in_start, in_arc, l_tail,
                      cap, unstarted, p_left)
            if lazy:                         # the batch's earlier classes may have broken it
                return 0
            back = count - 1
            for i in range(verified, count):
                v = order[i]
                if side[v] and not side[l_tail[row[v]]]:
                    back = i
                    break
            for i in range(count - 1, back - 1, -1):
                v = order[i]
                _move(row[v], -mult, l_tail, l_head, cap, pair, mem, sets, slack)
                member[v] = False
                row[v] = -1
            count = back
            dead[:] = False
            spent[:] = False
            continue
        a, amount = _checked_link(count, mult, p_left, n, m, order, out_start, out_arc,
                                  l_head, cap, pair, unstarted, left, short, net, member,
                                  mem, sets, members, sizes, slack, in_start, in_arc, l_tail,
                                  side, checks)
        if a < 0:
            return 0
        if amount < mult:                    # the rest start again later
            back = mult - amount
            for i in range(1, count):
                cap[row[order[i]]] += back
                pair[l_tail[row[order[i]]], order[i]] += back
            unstarted[r] += back
            p_left += back
            mult = amount
            dead[:] = False
            spent[:] = False
            _all_slacks(mem, sets, members, sizes, slack, in_start, in_arc, l_tail, cap,
                        unstarted, p_left)
        count = _enter(a, mult, count, l_tail, l_head, cap, pair, mem, sets, slack, row,
                       member, order)
        verified = count
    return mult
