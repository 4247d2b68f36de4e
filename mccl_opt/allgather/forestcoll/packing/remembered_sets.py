"""The few-trees packing's remembered tight sets (docs/allgather_history.md "Few-trees packing:
checks in batches"; :mod:`.few_trees` module doc): GPU sets a failed check or sweep
found, each with its exact slack (the units entering it less the unstarted trees rooted
outside it), kept up to date as a class takes or gives back links, so a link into a set
whose slack is below the copies is ruled out without a max-flow."""

from __future__ import annotations

from numba import njit


@njit(cache=True)
def _set_slack(c, sets, members, sizes, in_start, in_arc, l_tail, cap, unstarted, p_left):
    """Slack of remembered set ``c``: the units entering it less the unstarted trees
    rooted outside it (module doc)."""
    units = 0
    inside = 0
    for i in range(sizes[c]):
        x = members[c, i]
        inside += unstarted[x]
        for p in range(in_start[x], in_start[x + 1]):
            a = in_arc[p]
            if not sets[c, l_tail[a]]:
                units += cap[a]
    return units - (p_left - inside)


@njit(cache=True)
def _all_slacks(mem, sets, members, sizes, slack, in_start, in_arc, l_tail, cap, unstarted,
                p_left):
    for c in range(mem[0]):
        slack[c] = _set_slack(c, sets, members, sizes, in_start, in_arc, l_tail, cap,
                              unstarted, p_left)


@njit(cache=True)
def _remember(side, n, mem, sets, members, sizes, slack, in_start, in_arc, l_tail, cap,
              unstarted, p_left):
    """Remember the node set ``side`` (a cut's sink side) with its slack, unless it is
    remembered already; past :data:`MEMORY_SETS` the oldest is replaced."""
    size = 0
    for x in range(n):
        size += side[x]
    for c in range(mem[0]):
        if sizes[c] == size:
            same = True
            for x in range(n):
                if sets[c, x] != side[x]:
                    same = False
                    break
            if same:
                return
    if mem[0] < sets.shape[0]:
        c = mem[0]
        mem[0] += 1
    else:
        c = mem[1]
        mem[1] = (c + 1) % sets.shape[0]
    j = 0
    for x in range(n):
        sets[c, x] = side[x]
        if side[x]:
            members[c, j] = x
            j += 1
    sizes[c] = size
    slack[c] = _set_slack(c, sets, members, sizes, in_start, in_arc, l_tail, cap, unstarted,
                          p_left)


@njit(cache=True)
def _ruled_out(u, v, need, mem, sets, slack):
    """Whether a remembered set holding ``v`` but not ``u`` has slack below ``need``:
    then ``need`` copies over ``u -> v`` would break the cut condition (exact)."""
    for c in range(mem[0]):
        if sets[c, v] and not sets[c, u] and slack[c] < need:
            return True
    return False


@njit(cache=True)
def _move(a, copies, l_tail, l_head, cap, pair, mem, sets, slack):
    """``copies`` more (or, negative, fewer) copies of the class over link ``a``."""
    u, v = l_tail[a], l_head[a]
    cap[a] -= copies
    pair[u, v] -= copies
    for c in range(mem[0]):
        if sets[c, v] and not sets[c, u]:
            slack[c] -= copies


@njit(cache=True)
def _enter(a, copies, count, l_tail, l_head, cap, pair, mem, sets, slack, row, member, order):
    """The class enters ``l_head[a]`` over link ``a`` with ``copies`` copies; returns its
    new member count."""
    _move(a, copies, l_tail, l_head, cap, pair, mem, sets, slack)
    v = l_head[a]
    row[v] = a
    member[v] = True
    order[count] = v
    return count + 1
