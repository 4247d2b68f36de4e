"""Warm seeds of the repair packer (ForestColl-warm, paper §4.3): previous tree shapes
taken verbatim as unit trees, as many per shape as its links' remaining units allow, before
:func:`.repair.repair_pack` grows the rest."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["seed_rows"]


def seed_rows(n: int, k: int, tail: np.ndarray, head: np.ndarray, cap: np.ndarray,
              shapes: tuple[np.ndarray, np.ndarray] | None) -> tuple[np.ndarray, int]:
    """Unit-tree seed rows (sorted-arc parents, -1 elsewhere) from previous shapes whose
    every link exists and still has units; returns the rows and how many were seeded."""
    if shapes is None or len(shapes[0]) == 0:
        return np.full((0, n), -1, np.int32), 0        # cold: no rows (memory at scale)
    seed = np.full((n * k, n), -1, np.int32)
    roots = np.asarray(shapes[0], np.int64)
    parents = np.asarray(shapes[1], np.int64)
    arc_of = np.full((n, n), -1, np.int64)
    arc_of[tail, head] = np.arange(tail.size)
    has = parents >= 0
    arcs = np.where(has, arc_of[np.maximum(parents, 0), np.arange(n)[None, :]], -1)
    usable = (has.sum(axis=1) == n - 1) & ~(has & (arcs < 0)).any(axis=1)
    taken = _fill_rows(k, roots, arcs, usable, cap.copy(), seed)
    return seed, int(taken.sum())


@njit(cache=True)
def _fill_rows(k, roots, arcs, usable, left, seed):
    """In order, give each usable shape as many of its root's ``k`` unit trees as its
    links' remaining units allow (``left`` is consumed); fills ``seed``, returns the
    number of seeded unit trees per root."""
    n = arcs.shape[1]
    taken = np.zeros(n, np.int64)
    for i in range(roots.size):
        r = roots[i]
        if not usable[i] or taken[r] == k:
            continue
        m = k - taken[r]
        for v in range(n):
            if arcs[i, v] >= 0 and left[arcs[i, v]] < m:
                m = left[arcs[i, v]]
        if m <= 0:
            continue
        for v in range(n):
            if arcs[i, v] >= 0:
                left[arcs[i, v]] -= m
        for j in range(r * k + taken[r], r * k + taken[r] + m):
            seed[j, :] = arcs[i, :]
        taken[r] += m
    return taken
