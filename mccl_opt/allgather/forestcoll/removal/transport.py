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

from ..maxflow import INF, FlowNetwork

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
    from ``u`` that the cut condition may need."""
    net = FlowNetwork(n_in + n_out, tail, n_in + col)
    amounts = np.zeros(tail.size, np.int64)
    for pair_caps in stages:
        if not (supply.any() and demand.any()):      # nothing left to place: no stage moves
            break
        caps = net.caps()
        caps[:tail.size] = INF if pair_caps is None else pair_caps
        caps[net.s_arc0: net.s_arc0 + n_in] = supply
        caps[net.t_arc0 + n_in: net.t_arc0 + n_in + n_out] = demand
        net.max_flow(caps)
        flow = net.flows(tail.size)
        amounts += flow
        supply -= np.bincount(tail, flow, supply.size).astype(np.int64)
        demand -= np.bincount(col, flow, demand.size).astype(np.int64)
    if loop_of is not None and supply.any():
        # contiguous arrays whether callers pass slices or not: one kernel signature
        _unloop(n_in, n_out, np.ascontiguousarray(tail, np.int64), np.ascontiguousarray(col, np.int64),
                amounts, supply, demand, np.ascontiguousarray(loop_of, np.int64))
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
