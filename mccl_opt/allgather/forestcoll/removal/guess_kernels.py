"""Compiled inner loops of the exact split's guesses (:mod:`.exact_split`, paper §4.3):
the slack of node sets under given units, and one switch's guessed greedy plan within
the slack of the known sets (docs/allgather_history.md "Exact split in batches")."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def set_slacks(sides, in_start, in_arc, tail, caps, gpus, k, out):
    """``out[i]``: the slack ``units(δ⁻(S)) - k |V_c \\ S|`` of the node set ``sides[i]``
    (bool row over the nodes) under the units ``caps`` of the arcs ``tail -> head``, the
    arcs into node ``v`` being ``in_arc[in_start[v]:in_start[v + 1]]`` (a set's own
    in-arcs only: an NVSwitch's 502 neighbour sets of at most 9 nodes each)."""
    for i in range(sides.shape[0]):
        units = 0
        for v in range(sides.shape[1]):
            if sides[i, v]:
                for p in range(in_start[v], in_start[v + 1]):
                    a = in_arc[p]
                    if not sides[i, tail[a]]:
                        units += caps[a]
        outside = 0
        for g in gpus:
            if not sides[i, g]:
                outside += 1
        out[i] = units - k * outside


@njit(cache=True)
def room(at, size, slack, u, w, t):
    """The least ``slack`` of the sets (columns of ``at``, the first ``size``) whose cut
    a split off ``u -> w -> t`` lowers: ``S ∋ w, u, t ∉ S`` or ``S ∌ w, u, t ∈ S``."""
    least = np.int64(1) << np.int64(62)
    for s in range(size):
        if (not (at[u, s] or at[t, s])) if at[w, s] else (at[u, s] and at[t, s]):
            if slack[s] < least:
                least = slack[s]
    return least


@njit(cache=True)
def lower(at, size, slack, u, w, t, amount):
    """Lower the slack of the sets :func:`room` reads by ``amount``."""
    for s in range(size):
        if (not (at[u, s] or at[t, s])) if at[w, s] else (at[u, s] and at[t, s]):
            slack[s] -= amount


@njit(cache=True)
def plan_switch(w, in_nodes, in_left, out_nodes, out_left, at, size, slack, near_at, near_size,
                near_slack, trial, in_idx, out_idx, pair_idx, plan):
    """ForestColl's greedy passes over the pairs of switch ``w`` (ins and outs in node
    order, repeated while a pass splits something) with every pair taking
    ``min(in left, out left, room)``, the room that of two stores of known sets
    (:func:`room`: the shared ``at``/``size``/``slack`` and ``w``'s own ``near_*``).
    ``in_left``/``out_left`` (units of ``u -> w``/``w -> t``), both slacks and ``trial``
    (the units of the network's arcs; ``in_idx``/``out_idx``/``pair_idx`` index them,
    ``-1`` for a loop ``u -> u``) are updated; the splits ``(u, t, amount)`` are written
    to ``plan``'s rows and counted.  Every split zeroes an in-unit, an out-unit or a
    set's slack (none rises again), so ``plan`` needs at most ``ins + outs + sets`` rows."""
    count = 0
    progress = True
    while progress:
        progress = False
        for i in range(in_nodes.size):
            for j in range(out_nodes.size):
                if in_left[i] == 0:
                    break
                if out_left[j] == 0:
                    continue
                u, t = in_nodes[i], out_nodes[j]
                amount = min(in_left[i], out_left[j], room(at, size, slack, u, w, t),
                             room(near_at, near_size, near_slack, u, w, t))
                if amount <= 0:
                    continue
                in_left[i] -= amount
                out_left[j] -= amount
                lower(at, size, slack, u, w, t, amount)
                lower(near_at, near_size, near_slack, u, w, t, amount)
                trial[in_idx[i]] -= amount
                trial[out_idx[j]] -= amount
                if pair_idx[i, j] >= 0:
                    trial[pair_idx[i, j]] += amount
                plan[count, 0], plan[count, 1], plan[count, 2] = u, t, amount
                count += 1
                progress = True
    return count
