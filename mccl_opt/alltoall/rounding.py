"""Rounding the LP to an executable schedule of ``K`` chunks per pair (paper §4.2).

* :func:`largest_remainder`: per pair, ``K·y_j/sum y`` rounded down, the missing chunks
  going to the largest remainders (ties: larger share, then lower column index).
* :func:`deep_dive`: the diving heuristic of Sadykov et al. (2019) as used by the paper
  (Huin et al., 2023).  Each dive step fixes whole chunks as lower bounds on path
  shares (``y_j >= k/K``, a column bound in the ``t``-form master), re-solves the
  residual master *with pricing on*, and scores the largest-remainder rounding of the
  new solution.  The first step fixes every column's integral part; later steps round
  up the fractional columns closest to their next chunk, a growing batch at a time.  A
  step whose LP rate cannot beat the best rounding found is undone and its columns made
  tabu (limited backtracking).  The best schedule seen is kept.  Before it, the
  chunk repair (:mod:`.repair`) tries single-chunk moves that bring every link back to
  the LP's load; when it succeeds the schedule is at the LP rate and no dive is needed.
  Neither runs when the rounding already reaches the whole-chunk cut bound
  (:mod:`.chunk_bound`): no schedule of ``K`` chunks per pair is faster.

The rate of a rounded schedule is recomputed exactly: ``min_a cap_a / load_a``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..errors import SolveError
from ..link_rate import rate_of_loads
from .chunk_bound import chunk_bound_gbps
from .colgen import CGOptions, column_generation
from .master import ColumnPool, RestrictedMaster
from .problem import Problem
from .repair import repair_overloads

__all__ = ["Rounded", "largest_remainder", "balanced", "rounded_rate", "deep_dive",
           "dive_budget", "DIVE_BUDGET_FACTOR", "DIVE_BUDGET_MIN_S"]

_EPS = 1e-9

#: The deep dive may spend this many times the LP phase's solver seconds (LP solves
#: plus pricing), and at least :data:`DIVE_BUDGET_MIN_S`: on HPN 2x4x8 after random
#: degradations its steps cost 0.7-5 s against a 0.3 s LP for a rounding gap of 0.2 %
#: that it never closed (docs/alltoall.md, *The dive's budget*).
DIVE_BUDGET_FACTOR = 2.0
DIVE_BUDGET_MIN_S = 0.2


def dive_budget(lp_seconds: float) -> float:
    """Seconds the deep dive may take after an LP phase of ``lp_seconds``."""
    return max(DIVE_BUDGET_FACTOR * lp_seconds, DIVE_BUDGET_MIN_S)


@dataclass
class Rounded:
    """Chunk counts per pool column (``counts[j]`` chunks of ``1/K`` on column ``j``)."""

    counts: np.ndarray
    rate: float
    pool_pair: np.ndarray
    pool_start: np.ndarray
    pool_arcs: np.ndarray
    pool_origin: np.ndarray
    method: str


def rounded_rate(pool: ColumnPool, counts: np.ndarray, k: int, capacity: np.ndarray,
                 background: np.ndarray | None = None) -> float:
    """Exact rate of chunk ``counts``: ``min_a cap_a / load_a`` (``background``: fixed
    share loads of routes outside the pool, added to the links)."""
    load = pool.loads(counts / k, capacity.size)
    if background is not None:
        load = load + background
    return rate_of_loads(capacity, load)


def _starts(keys: np.ndarray, n: int) -> np.ndarray:
    """Where each key ``0..n-1`` starts in ``keys`` sorted (``n + 1`` offsets): the
    exclusive prefix sums of the key counts (as ``searchsorted`` of ``arange(n + 1)`` in
    the sorted keys, without searching ``n`` values)."""
    out = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=n), out=out[1:])
    return out


def _one_column_per_pair(pool: ColumnPool, y: np.ndarray, n_pairs: int) -> bool:
    """Every pair has exactly one column, with a positive share (a first master at
    scale): its rounding is all ``K`` chunks on that column, no sort needed."""
    return y.size == n_pairs and bool((y > _EPS).all()) and \
        bool((np.bincount(pool.pair, minlength=n_pairs) == 1).all())


def largest_remainder(pool: ColumnPool, y: np.ndarray, n_pairs: int, k: int) -> np.ndarray:
    """Chunk counts per column: largest-remainder rounding of ``K·y_j / sum_p y``."""
    if _one_column_per_pair(pool, y, n_pairs):
        return np.full(y.size, k, dtype=np.int64)     # all K chunks on it
    y = np.where(y > _EPS, y, 0.0)
    total = np.bincount(pool.pair, weights=y, minlength=n_pairs)
    units = k * y / total[pool.pair]
    counts = np.floor(units + 1e-9)
    frac = np.where(y > 0, units - counts, -1.0)
    missing = k - np.bincount(pool.pair, weights=counts, minlength=n_pairs)
    order = np.lexsort((np.arange(y.size), -y, -frac, pool.pair))
    first = _starts(pool.pair, n_pairs)[:-1]           # first position of each pair in order
    rank = np.arange(y.size) - first[pool.pair[order]]
    bump = np.zeros(y.size)
    bump[order] = (rank < missing[pool.pair[order]]).astype(float)
    return (counts + bump).astype(np.int64)


def balanced(pool: ColumnPool, y: np.ndarray, n_pairs: int, k: int, capacity: np.ndarray,
             fixed: np.ndarray | None = None, max_moves: int | None = None,
             background: np.ndarray | None = None) -> np.ndarray:
    """Chunk counts per column: integral parts of ``K·y_j/sum_p y`` (at least ``fixed``),
    the missing chunks placed greedily where they raise the link utilisation least, then
    moved off the most utilised link while that helps (numba kernel).  Pairs without
    columns get no chunks; ``background`` (share loads outside the pool) counts as load."""
    from ._kernels import balance_chunks

    y = np.where(y > _EPS, y, 0.0)
    total = np.bincount(pool.pair, weights=y, minlength=n_pairs)
    units = k * y / total[pool.pair]
    counts = np.floor(units + 1e-9).astype(np.int64)
    if fixed is not None:
        counts = np.maximum(counts, fixed)
        over = np.bincount(pool.pair, weights=counts, minlength=n_pairs) > k
        counts = np.where(over[pool.pair], fixed, counts)
    by_pair = np.argsort(pool.pair, kind="stable")
    pair_start = _starts(pool.pair, n_pairs)
    seg = np.repeat(np.arange(len(pool)), np.diff(pool.start))
    by_arc = np.lexsort((seg, pool.arcs))
    arc_start = _starts(pool.arcs, capacity.size)
    moves = 20 * n_pairs if max_moves is None else max_moves
    return balance_chunks(counts.astype(np.int64), units, pool.pair, pool.start, pool.arcs,
                          pair_start.astype(np.int64), by_pair.astype(np.int64),
                          arc_start.astype(np.int64), seg[by_arc].astype(np.int64),
                          np.asarray(capacity, dtype=float), k, moves,
                          np.zeros(capacity.size) if background is None
                          else np.asarray(background, dtype=float) * k)


def _best_rounding(pool: ColumnPool, y: np.ndarray, n_pairs: int, k: int, capacity: np.ndarray,
                   fixed: np.ndarray | None, background: np.ndarray | None = None
                   ) -> tuple[np.ndarray, float, str]:
    """The better of largest-remainder and balanced rounding of ``y`` (largest remainder
    alone when it is exact: every share already a whole number of chunks)."""
    lr = largest_remainder(pool, y, n_pairs, k)
    if fixed is None and _one_column_per_pair(pool, y, n_pairs):     # exact: K chunks each
        return lr, rounded_rate(pool, lr, k, capacity, background), "largest_remainder"
    if fixed is not None:
        done = np.bincount(pool.pair, weights=fixed, minlength=n_pairs) >= k
        lr = np.where(done[pool.pair], fixed, lr)
    y_pos = np.where(y > _EPS, y, 0.0)
    units = k * y_pos / np.bincount(pool.pair, weights=y_pos, minlength=n_pairs)[pool.pair]
    if np.abs(units - lr).max(initial=0.0) <= _EPS:
        return lr, rounded_rate(pool, lr, k, capacity, background), "largest_remainder"
    bal = balanced(pool, y, n_pairs, k, capacity, fixed, background=background)
    r_lr = rounded_rate(pool, lr, k, capacity, background)
    r_bal = rounded_rate(pool, bal, k, capacity, background)
    return (bal, r_bal, "balanced") if r_bal > r_lr else (lr, r_lr, "largest_remainder")


def _snapshot(pool: ColumnPool, counts: np.ndarray, rate: float, method: str) -> Rounded:
    """The rounding and the pool as it is now: the pool's arrays are shared, not copied
    (a pool replaces its arrays when it grows or drops columns, never writes into them;
    copying 20M path entries cost 0.35 s at 2,048 GPUs)."""
    return Rounded(counts.copy(), rate, pool.pair, pool.start, pool.arcs, pool.origin, method)


def deep_dive(master: RestrictedMaster, prob: Problem, y: np.ndarray, k: int, max_steps: int,
              lp_rate: float, *, good_enough: float = 1e-3, max_dives: int = 12,
              max_backtracks: int = 3, deadline: float | None = None,
              options: CGOptions = CGOptions(), background: np.ndarray | None = None,
              pairs: np.ndarray | None = None, floor: float = 0.0,
              budget_s: float | None = None) -> tuple[Rounded, dict]:
    """Best of the plain roundings and a deep dive from the LP solution ``y``.

    The repair and the dive run only while the best rounding (or ``floor``: the rate of
    a schedule the caller keeps if better, :mod:`.kept`) is more than ``good_enough``
    (relative) below the bar: ``lp_rate``, or the whole-chunk cut bound
    (:mod:`.chunk_bound`, ``counters["chunk_bound_gbps"]``) where that is lower; a step
    whose LP cannot beat the best rounding is undone or ends the dive.  It
    starts no step after ``deadline`` (a time limit's) nor after ``budget_s`` seconds
    (:func:`dive_budget`; ``counters["stopped_by"] == "dive budget"``).  Leaves ``master`` with fixed lower bounds; returns the best
    rounding (with a copy of the column pool it refers to) and the dive's counters (JSON).
    ``pairs`` (bool per pair) limits the rounding to those pairs, whose columns alone are
    in the pool; ``background`` is the other pairs' fixed (rounded) share loads, which the
    master's capacity rows must already carry.
    """
    pool = master.pool
    lr = largest_remainder(pool, y, prob.num_pairs, k)
    lr_rate = rounded_rate(pool, lr, k, master.capacity, background)
    counts, rate, how = _best_rounding(pool, y, prob.num_pairs, k, master.capacity, None,
                                       background)
    best = _snapshot(pool, counts, rate, how)
    repaired = False
    # the bar: the LP rate, or the whole-chunk cut bound where that is lower (no
    # K-chunk schedule can beat it: a rounding there is optimal, nothing to repair)
    chunk_bound = (chunk_bound_gbps(prob.topo, k) if max(rate, floor) < (1 - _EPS) * lp_rate
                   else float("inf"))
    bar = min(lp_rate, chunk_bound)
    if max(rate, floor) < (1 - good_enough) * bar:
        fixed_up = repair_overloads(master, prob, counts, k, max_steps, 1.0 / lp_rate, background)
        if fixed_up is not None:
            r = rounded_rate(pool, fixed_up, k, master.capacity, background)
            if r > rate * (1 + 1e-12):
                best, repaired = _snapshot(pool, fixed_up, r, f"repaired+{how}"), True
                y = np.concatenate([y, np.zeros(len(pool) - y.size)])
    dive_steps = backtracks = pricing_rounds = 0
    options = CGOptions(rel_tol=options.rel_tol, drop_after=np.iinfo(np.int64).max)  # indices stay
    tabu: set[int] = set()
    stop = deadline
    if budget_s is not None:
        stop = min(stop if stop is not None else np.inf, time.perf_counter() + budget_s)
    fixed = np.zeros(len(pool), dtype=np.int64)
    batch = 0.0                                 # first step: integral parts only
    trouble: str | None = None
    for step in range(max_dives):
        if trouble is not None or max(best.rate, floor) >= (1 - good_enough) * bar:
            break
        if stop is not None and time.perf_counter() >= stop:
            if deadline is None or stop < deadline:
                trouble = "dive budget"
            break
        total = np.bincount(pool.pair, weights=y, minlength=prob.num_pairs)
        units = k * y / total[pool.pair]
        target = np.maximum(fixed, np.floor(units + 1e-6).astype(np.int64))
        over = np.bincount(pool.pair, weights=target, minlength=prob.num_pairs) > k
        target = np.where(over[pool.pair], fixed, target)
        frac = units - np.floor(units + 1e-6)
        pair_fixed = np.bincount(pool.pair, weights=target, minlength=prob.num_pairs)
        cand = np.flatnonzero((frac > 1e-6) & (pair_fixed[pool.pair] < k))
        cand = np.array([j for j in cand if j not in tabu], dtype=np.int64)
        if batch > 0 and cand.size:
            order = cand[np.lexsort((cand, -frac[cand]))]     # closest to the next chunk first
            take = max(1, int(np.ceil(batch * order.size)))
            room = k - pair_fixed
            chosen = []
            for j in order:
                if len(chosen) >= take:
                    break
                p = pool.pair[j]
                if room[p] >= 1:
                    room[p] -= 1
                    chosen.append(j)
            chosen = np.asarray(chosen, dtype=np.int64)
            target[chosen] += 1
        else:
            chosen = np.zeros(0, dtype=np.int64)
        changed = np.flatnonzero(target != fixed)
        if changed.size == 0:
            if batch == 0:                          # nothing integral to fix: start rounding up
                batch = 0.25
                continue
            break
        master.set_lower(changed, target[changed] / k)
        done = np.bincount(pool.pair, weights=target, minlength=prob.num_pairs) >= k
        if pairs is not None:
            done |= ~pairs
        want = prob.pair_matrix((~done).astype(float), 0.0) > 0
        try:
            res = column_generation(master, prob, max_steps, options=options, deadline=stop,
                                    want=want, bound=False, label=f"deep dive step {step + 1}")
        except SolveError as e:     # under a time limit: keep the best rounding (issue 27)
            if deadline is None:
                raise
            trouble = str(e)
            break
        trouble = trouble or res.trouble
        dive_steps += 1
        pricing_rounds += res.rounds
        grown = len(pool) - fixed.size
        fixed = np.concatenate([target, np.zeros(grown, dtype=np.int64)])
        if res.rate <= max(best.rate, floor) * (1 + 1e-9) and chosen.size:
            # no completion of these fixings can beat the best rounding: undo the batch
            backtracks += 1
            fixed[chosen] -= 1
            master.set_lower(chosen, fixed[chosen] / k)
            tabu.update(int(j) for j in chosen)
            if backtracks > max_backtracks:
                break
            batch = max(batch / 2, 0.05)
            y = np.concatenate([y, np.zeros(len(pool) - y.size)])
            continue
        y = res.solution.y
        counts, rate, how = _best_rounding(pool, y, prob.num_pairs, k, master.capacity, fixed,
                                           background)
        if rate > best.rate * (1 + 1e-12):
            best = _snapshot(pool, counts, rate, f"deep_dive+{how}")
        if res.rate <= max(best.rate, floor) * (1 + 1e-9):
            break                                   # the residual LP cannot do better
        batch = 0.25 if batch == 0 else min(1.0, batch * 1.5)
    counters: dict = {"dive_steps": dive_steps, "backtracks": backtracks, "lr_rate": lr_rate,
                      "pricing_rounds": pricing_rounds, "repaired": repaired}
    if chunk_bound < lp_rate:
        counters["chunk_bound_gbps"] = chunk_bound
    if trouble is not None:
        counters["stopped_by"] = trouble
    return best, counters
