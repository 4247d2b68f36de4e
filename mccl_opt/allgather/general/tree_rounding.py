"""Rounding the general method's tree weights to at most ``K`` chunks per root.

The master's optimum gives every root ``r`` trees with weights ``w_T``; the fractional
schedule sends share ``w_T / sum_{T of r} w_T`` of ``r``'s shard over ``T``.  An
executable schedule with ``max_chunks = K`` gives every tree a whole number ``n_T`` of
chunks of ``1/k`` for one ``k <= K`` (``sum_{T of r} n_T = k``, so at most ``K`` trees per
root), and its rate is recomputed from the link loads, ``min_a cap_a / L_a`` with
``L_a = sum_T n_T load_T(a) / k`` (README "Units and definitions").

For every ``k <= K`` (shares in multiples of ``1/k``, as the validator accepts), and the
best ``k`` kept:

1. **Largest remainder** per root: ``n_T = floor(k s_T)``, the missing chunks to the
   largest fractional parts (ties: the earlier column).
2. **Local search** (deterministic): move one chunk between two trees of one root, among
   the LP's support and the other trees of the final pool (as many as a bounded load
   matrix holds), when the move lowers the highest link utilisation ``L_a / cap_a`` (or
   keeps it and saturates fewer links); best move first, until none improves.  Each
   accepted move strictly lowers ``(max utilisation, links at the max)``
   lexicographically, so the search ends.
"""

from __future__ import annotations

import numpy as np

from .live_master import TreePool

__all__ = ["round_trees", "fractional_shares"]

_REL = 1e-12                       # utilisations this close to the max count as at the max


def fractional_shares(pool: TreePool, weights: np.ndarray, n_roots: int) -> np.ndarray:
    """Per pool column, its share of its root's shard (weights normalised per root)."""
    total = np.bincount(pool.root, weights=weights, minlength=n_roots)
    safe = np.where(total > 0, total, 1.0)
    return np.where(weights > 0, weights / safe[pool.root], 0.0)


def _largest_remainder(shares: np.ndarray, roots: np.ndarray, n_roots: int, k: int) -> np.ndarray:
    scaled = shares * k
    n = np.floor(scaled + 1e-9).astype(np.int64)
    frac = scaled - n
    missing = k - np.bincount(roots, weights=n, minlength=n_roots).astype(np.int64)
    order = np.lexsort((np.arange(shares.size), -frac, roots))   # per root, largest first
    for r in np.flatnonzero(missing > 0):
        cols = order[roots[order] == r]
        n[cols[:missing[r]]] += 1
    return n


def _objective(util: np.ndarray) -> tuple[float, int]:
    m = float(util.max())
    return m, int(np.count_nonzero(util >= m * (1 - _REL)))


def _local_search(n: np.ndarray, roots: np.ndarray, load: np.ndarray, capacity: np.ndarray,
                  k: int, max_moves: int) -> np.ndarray:
    """Improve chunk counts ``n`` (``load[j]``: link crossings of candidate ``j``)."""
    util = (n @ load) / (k * capacity)
    step = load / (k * capacity)                 # utilisation of one chunk on each tree
    best = _objective(util)
    for _ in range(max_moves):
        top = util >= best[0] * (1 - _REL)
        move = None
        for j in np.flatnonzero((n > 0) & (load[:, top].sum(axis=1) > 0)):
            mates = np.flatnonzero((roots == roots[j]) & (np.arange(n.size) != j))
            if not mates.size:
                continue
            cand = util - step[j] + step[mates]          # one row per receiving tree
            peak = cand.max(axis=1)
            for i in np.argsort(peak, kind="stable")[:3]:
                obj = _objective(cand[i])
                if obj < best and (move is None or obj < move[0]):
                    move = (obj, j, mates[i])
        if move is None:
            break
        best, j, i = move
        n[j] -= 1
        n[i] += 1
        util = util - step[j] + step[i]
    return n


#: per root, at most this many trees outside the LP's support join the local search
_EXTRA_PER_ROOT = 3


def _candidates(pool: TreePool, shares: np.ndarray, n_roots: int) -> np.ndarray:
    """The LP's support, then per root up to :data:`_EXTRA_PER_ROOT` other pool trees
    (the latest priced: alternative trees the local search may move chunks to)."""
    support = np.flatnonzero(shares > 0)
    rest = np.flatnonzero(shares <= 0)[::-1]
    _, first = np.unique(pool.root[rest], return_index=True)
    picks = [rest[np.flatnonzero(pool.root[rest] == pool.root[rest][i])[:_EXTRA_PER_ROOT]]
             for i in first]
    return np.concatenate([support, *picks]).astype(np.int64) if picks else support

def round_trees(pool: TreePool, weights: np.ndarray, n_roots: int, capacity: np.ndarray,
                max_chunks: int, max_moves: int | None = None) -> tuple[np.ndarray, int]:
    """``(chunk counts per pool column, k)``: every root's counts sum to ``k``, the
    ``k <= max_chunks`` whose rounding (module docstring) has the highest rate (ties: the
    smallest ``k``), so a larger ``max_chunks`` never rounds worse from the same LP."""
    shares = fractional_shares(pool, weights, n_roots)
    cand = _candidates(pool, shares, n_roots)
    roots = pool.root[cand]
    load = pool.incidence(cand, capacity.size)
    best: tuple[float, np.ndarray, int] | None = None
    for k in range(1, max_chunks + 1):
        n = _largest_remainder(shares[cand], roots, n_roots, k)
        moves = max_moves if max_moves is not None else 4 * k * n_roots
        n = _local_search(n, roots, load, capacity, k, moves)
        peak = float(((n @ load) / (k * capacity)).max())
        if best is None or peak < best[0] * (1 - 1e-12):
            best = (peak, n, k)
    _, n, k = best
    out = np.zeros(len(pool), dtype=np.int64)
    out[cand] = n
    return out, k
