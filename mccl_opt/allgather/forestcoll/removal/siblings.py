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
import scipy.sparse as sp

from ..maxflow import INF

__all__ = ["SwitchNeighbours", "spread_stages"]


class SwitchNeighbours:
    """Which switches each node is cabled to (either direction) in the physical graph."""

    def __init__(self, n: int, tail: np.ndarray, head: np.ndarray, is_switch: np.ndarray
                 ) -> None:
        rows = np.concatenate([tail[is_switch[head]], head[is_switch[tail]]])
        cols = np.concatenate([head[is_switch[head]], tail[is_switch[tail]]])
        adj = sp.csr_matrix((np.ones(rows.size, np.int32), (rows, cols)), shape=(n, n))
        adj.data[:] = 1                                   # duplicates summed: back to 0/1
        self.adj = adj

    def siblings(self, w: int, us: np.ndarray, ts: np.ndarray, tail: np.ndarray,
                 col: np.ndarray) -> np.ndarray:
        """Per pair ``p`` (in-link tail ``us[tail[p]]``, out-link head ``ts[col[p]]``):
        are both ends cabled to a common switch other than ``w``?"""
        a, b = self.adj[us], self.adj[ts]
        common = (a @ b.T).toarray()
        common -= np.outer(a[:, [w]].toarray().ravel(), b[:, [w]].toarray().ravel())
        return common[tail, col] > 0


def spread_stages(proportional: np.ndarray, siblings: np.ndarray) -> list:
    """The transport's stages (:func:`.transport.transport`): the proportional shares,
    then any amount, sibling pairs (:class:`SwitchNeighbours`) held at 0 in both; then
    the two again with siblings open (a switch whose pairs are all siblings, as a spine
    of several, is paired as without this); without siblings the two plain stages."""
    if not siblings.any():
        return [proportional, None]
    return [np.where(siblings, 0, proportional), np.where(siblings, 0, INF), proportional,
            None]
