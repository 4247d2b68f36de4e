"""Pairs a switch leaves to another switch (Phase 2's spread proposal, paper §4.3).

Splitting switch ``w`` pairs an in-link ``u -> w`` with an out-link ``w -> t``.  Where
``u`` and ``t`` are also cabled to another switch ``x`` (two GPUs of one host under
their NVSwitch, two GPUs of one rail under their ToR), the pair through ``w`` carries
what ``x`` carries without ``w``: on two segments under one shared aggregation switch
the proportional spread sent ~7/15 of every ToR's uplink units back into its own
segment, down to other GPUs of the same host, which took host ingress the rooted cut
condition needs (the plain split failed, and the guarded one left hosts exactly tight:
1420 repair chains at 2x16x8).  The spread proposal therefore pairs such *siblings*
last: only units no other pair can take go to them (:func:`spread_stages`).  The test
is structural (cables to a common switch in the physical graph), not by names.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..maxflow import INF

__all__ = ["SwitchNeighbours", "spread_stages"]


class SwitchNeighbours:
    """Which switches each node is cabled to (either direction) in the physical graph,
    as sorted lists in CSR (``start``, ``switch``)."""

    def __init__(self, n: int, tail: np.ndarray, head: np.ndarray, is_switch: np.ndarray
                 ) -> None:
        rows = np.concatenate([tail[is_switch[head]], head[is_switch[tail]]])
        cols = np.concatenate([head[is_switch[head]], tail[is_switch[tail]]])
        keys = np.unique(rows.astype(np.int64) * n + cols)
        self.switch = keys % n
        self.start = np.zeros(n + 1, np.int64)
        np.cumsum(np.bincount(keys // n, minlength=n), out=self.start[1:])

    def siblings(self, w: int, us: np.ndarray, ts: np.ndarray, tail: np.ndarray,
                 col: np.ndarray) -> np.ndarray:
        """Per pair ``p`` (in-link tail ``us[tail[p]]``, out-link head ``ts[col[p]]``):
        are both ends cabled to a common switch other than ``w``?  (One compiled call,
        :func:`_common_switch`.)"""
        return _common_switch(int(w), np.ascontiguousarray(us, np.int64),
                              np.ascontiguousarray(ts, np.int64),
                              np.ascontiguousarray(tail, np.int64),
                              np.ascontiguousarray(col, np.int64), self.start, self.switch)


@njit(cache=True)
def _common_switch(w, us, ts, tail, col, start, switch):
    """:meth:`SwitchNeighbours.siblings`: the in-end's switches marked with its position
    (again whenever the pairs move to another in-end), then the out-end's switches
    looked up."""
    mark = np.full(start.size - 1, -1, np.int64)
    common = np.zeros(tail.size, np.bool_)
    last = -1
    for p in range(tail.size):
        i = tail[p]
        if i != last:
            u = us[i]
            for q in range(start[u], start[u + 1]):
                mark[switch[q]] = i
            last = i
        t = ts[col[p]]
        for q in range(start[t], start[t + 1]):
            x = switch[q]
            if x != w and mark[x] == i:
                common[p] = True
                break
    return common


def spread_stages(proportional: np.ndarray, siblings: np.ndarray) -> list:
    """The transport's stages (:func:`.transport.transport`): the proportional shares,
    then any amount, sibling pairs (:class:`SwitchNeighbours`) held at 0 in both; then
    the two again with siblings open (a switch whose pairs are all siblings, as a spine
    of several, is paired as without this); without siblings the two plain stages."""
    if not siblings.any():
        return [proportional, None]
    return [np.where(siblings, 0, proportional), np.where(siblings, 0, INF), proportional,
            None]
