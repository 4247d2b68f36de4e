"""A switch's units split into pairs: the integral transport of Phase 2 (paper §4.3).

Splitting a switch ``w`` joins units of its in-links ``u -> w`` to units of its
out-links ``w -> t`` (``u != t``: a loop only adds load).  :func:`transport` finds the
pair amounts by staged max-flows (first within a proposal's pair capacities, then any
completion) and places the units a stage would leave on a loop ``u -> w -> u`` through
another pair: a dropped loop takes ingress from ``u`` that the cut condition may need.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..maxflow import INF, _dinic

#: the stages' flow limit (:meth:`..maxflow.FlowNetwork.max_flow`'s default)
MAX_FLOW = 1 << 62

__all__ = ["transport"]


def transport(n_in: int, n_out: int, tail: np.ndarray, col: np.ndarray, supply: np.ndarray,
              demand: np.ndarray, stages: list, loop_of: np.ndarray | None = None) -> np.ndarray:
    """Integral transport of a switch's units over pairs ``p`` (in-arc ``tail[p]`` to
    out-arc ``col[p]``), in stages: each a max-flow from the ``supply`` left to the
    ``demand`` left with pair capacities ``stages[i]`` (``None``: unbounded).  Returns the
    amount of every pair; ``supply`` and ``demand`` are reduced in place.  ``loop_of[i]``:
    the out-arc back to in-arc ``i``'s tail (no pair, ``-1`` if none); units the stages
    leave on such a loop are exchanged into other pairs where possible
    (:func:`_unloop`), since a loop ``u -> w -> u`` would be dropped and take ingress
    from ``u`` that the cut condition may need.  One compiled call (:func:`_staged`): the
    network built per switch in Python took ~0.3 ms, 64-184 switches per spread split
    at 128 GPUs (docs/allgather_history.md "Sweeps in structural order")."""
    tail, col = np.ascontiguousarray(tail, np.int64), np.ascontiguousarray(col, np.int64)
    caps = np.empty((len(stages), tail.size), np.int64)
    for row, pair_caps in zip(caps, stages):
        row[:] = INF if pair_caps is None else pair_caps
    loops = np.full(n_in, -1, np.int64) if loop_of is None else \
        np.ascontiguousarray(loop_of, np.int64)
    return _staged(n_in, n_out, tail, col, supply, demand, caps, loops)


@njit(cache=True)
def _staged(n_in, n_out, tail, col, supply, demand, stage_caps, loop_of):
    """:func:`transport` compiled: the network of :class:`..maxflow.FlowNetwork` over the
    ``n_in + n_out`` arc ends (pair arcs, then ``s -> v``, then ``v -> T``; residual
    arcs in the same stable order by tail), one Dinic max-flow per stage, then
    :func:`_unloop`."""
    pairs = tail.size
    n = n_in + n_out
    m = pairs + 2 * n
    r_tail = np.empty(2 * m, np.int64)
    r_head = np.empty(2 * m, np.int64)
    for a in range(m):
        if a < pairs:
            u, v = tail[a], n_in + col[a]
        elif a < pairs + n:
            u, v = n, a - pairs
        else:
            u, v = a - pairs - n, n + 1
        r_tail[2 * a], r_head[2 * a] = u, v
        r_tail[2 * a + 1], r_head[2 * a + 1] = v, u
    start = np.zeros(n + 3, np.int64)
    for a in range(2 * m):
        start[r_tail[a] + 1] += 1
    for v in range(n + 2):
        start[v + 1] += start[v]
    arcs = np.empty(2 * m, np.int64)
    fill = start[:-1].copy()
    for a in range(2 * m):                       # stable by tail
        arcs[fill[r_tail[a]]] = a
        fill[r_tail[a]] += 1
    res = np.zeros(2 * m, np.int64)
    level = np.empty(n + 2, np.int64)
    queue = np.empty(n + 2, np.int64)
    it = np.empty(n + 2, np.int64)
    path = np.empty(n + 3, np.int64)
    amounts = np.zeros(pairs, np.int64)
    for stage in range(stage_caps.shape[0]):
        if not (supply.any() and demand.any()):  # nothing left to place: no stage moves
            break
        res[:] = 0
        for p in range(pairs):
            res[2 * p] = stage_caps[stage, p]
        for i in range(n_in):
            res[2 * (pairs + i)] = supply[i]
        for j in range(n_out):
            res[2 * (pairs + n + n_in + j)] = demand[j]
        _dinic(n + 2, start, arcs, r_head, res, n, n + 1, MAX_FLOW, level, queue, it, path)
        for p in range(pairs):
            f = res[2 * p + 1]
            amounts[p] += f
            supply[tail[p]] -= f
            demand[col[p]] -= f
    if supply.any():
        _unloop(n_in, n_out, tail, col, amounts, supply, demand, loop_of)
    return amounts


@njit(cache=True)
def _unloop(n_in, n_out, tail, col, amounts, supply, demand, loop_of):
    """Place units left on loops: when in-arc ``i`` (tail ``u``) and out-arc ``j`` (head
    ``u``) still hold ``m`` units that only the loop ``u -> w -> u`` could join, move
    them through pairs ``(i', j')`` avoiding ``u``, in pair order: ``(i', j') -= m``,
    ``(i', j) += m``, ``(i, j') += m``.  Every in- and out-arc keeps its total, the loop
    is gone.  (Both pairs added exist: ``u`` is neither ``i'``'s tail nor ``j'``'s head.)"""
    index = np.full((n_in, n_out), -1, np.int64)
    for p in range(tail.size):
        index[tail[p], col[p]] = p
    for i in range(n_in):
        j = loop_of[i]
        if supply[i] == 0 or j < 0:
            continue
        left = min(supply[i], demand[j])
        for p in range(tail.size):
            if left == 0:
                break
            if amounts[p] == 0 or tail[p] == i or col[p] == j:
                continue
            m = min(left, amounts[p])
            amounts[p] -= m
            amounts[index[tail[p], j]] += m
            amounts[index[i, col[p]]] += m
            supply[i] -= m
            demand[j] -= m
            left -= m
