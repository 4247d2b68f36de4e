"""Column generation for the AllToAll master (paper §4.2) with a certified bound.

Each round solves the restricted master, prices every pair with the step-bounded
shortest path under the arc prices ``w`` (:mod:`.pricing`), adds every path whose cost
is below its pair's dual ``sigma_p`` (a negative reduced cost), and drops columns unused
for ``drop_after`` rounds once the pool is large.

**Bound (Farley / Lagrangian).**  The full master's dual is
``max sum_p sigma_p  s.t.  sigma_p <= w(P)`` for every path ``P`` of ``p``,
``sum_a cap_a w_a <= 1``, ``w, sigma >= 0``.  For the master's prices ``w``,
``sigma'_p = SP_p(w)`` (the pricing's shortest path costs) is dual feasible once ``w``
is scaled to ``sum_a cap_a w_a <= 1``, so ``t* >= sum_p SP_p(w) / max(1, cap·w)`` and
``z* <= 1 / that``.

**Cut prices.**  Any ``w >= 0`` gives such a bound.  On degenerate fabrics (healthy
HPN: many equal-cost paths) the master's vertex dual prices one or two saturated links
that other paths avoid, so its bound is 0 for dozens of rounds while the master value is
already optimal.  When the vertex bound does not close, the loop also prices
``w_a = 1 / cap(S)`` on the set ``S`` of links the master saturates: the bound is then
the cut bound ``sum_p crossings_p(S) / cap(S)`` of that set, which certifies a master
whose bottleneck is a whole tier of links in round 1 (docs/alltoall.md, *Scale*).  When
that does not close either, the cut bounds of the saturated set's largest capacity
classes are tried as well (:func:`class_cut_prices`, with the proof that each is a valid
bound).  The best bound's prices are kept as the run's certificate.  The loop stops when
the master's ``t`` is within ``rel_tol`` of the best bound, or when no column prices
out; :class:`CGStatus` says which limit, if any, ended it instead.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import numpy as np

from .. import progress
from ..errors import SolveError
from .cut_bound import tightest_cut
from .master import MasterSolution, MasterTimeUp, RestrictedMaster
from .pricing import PricedColumns, price_paths
from .rows import csr_take
from .problem import Problem

__all__ = ["CGOptions", "CGResult", "CGStatus", "column_generation", "farley_bound",
           "cut_prices", "strongest_columns"]

#: A link is saturated when its load is within this relative tolerance of ``cap·t``.
CUT_REL_TOL = 1e-6


class CGStatus(enum.Enum):
    """How :func:`column_generation` ended: ``OPTIMAL`` (within ``rel_tol`` of the bound,
    or no column prices out), ``TIME_LIMIT`` (the deadline passed) or ``ROUND_LIMIT``
    (``max_rounds`` rounds without either).  ``value`` is the JSON word."""

    OPTIMAL = "optimal"
    TIME_LIMIT = "time_limit"
    ROUND_LIMIT = "round_limit"


@dataclass(frozen=True)
class CGOptions:
    """Tolerances and column management of :func:`column_generation`."""

    rel_tol: float = 1e-7          # stop when (t - bound) <= rel_tol * t
    drop_after: int = 8            # drop columns at zero for this many rounds ...
    drop_min_pool: int = 0         # ... once the pool exceeds this many columns (0: 3 x pairs)
    max_rounds: int = 10_000
    strongest: float = 0.0         # add only columns whose reduced cost is at least this
                                   # share of the round's largest (:func:`strongest_columns`)


@dataclass
class CGResult:
    """Outcome of :func:`column_generation` (``bound_t``: certified lower bound on t)."""

    solution: MasterSolution
    bound_t: float
    status: CGStatus
    rounds: int
    history: list[tuple[float, float]] = field(default_factory=list)   # (z_master, z_bound)
    lp_seconds: float = 0.0
    pricing_seconds: float = 0.0
    iterations: int = 0
    dropped: int = 0
    shortest: np.ndarray | None = None     # the last pricing's shortest path costs (N x N)
    shortest_w: np.ndarray | None = None   # ... and the arc prices it priced
    cert_sp: float | None = None           # sum_p SP_p(w) of the best bound's prices ...
    cert_w: np.ndarray | None = None       # ... and those prices (the run's certificate)
    trouble: str | None = None             # a master's failure that ended a limited run early

    @property
    def rate(self) -> float:
        return self.solution.rate

    @property
    def rate_bound(self) -> float:
        return 1.0 / self.bound_t if self.bound_t > 0 else float("inf")


def farley_bound(shortest: np.ndarray, w: np.ndarray, capacity: np.ndarray, prob: Problem) -> float:
    """Lower bound on the optimal ``t`` from arc prices ``w`` (module docstring)."""
    return _bound(float(prob.pair_values(shortest).sum()), w, capacity)


def _bound(sp_sum: float, w: np.ndarray, capacity: np.ndarray) -> float:
    """:func:`farley_bound` from ``sum_p SP_p(w)`` (0 when a pair is unreachable)."""
    return sp_sum / max(1.0, float(capacity @ w)) if np.isfinite(sp_sum) else 0.0


#: When the whole saturated set's cut bound does not close, the cut bound is also
#: tried on its largest capacity classes (at most this many; :func:`class_cut_prices`).
CUT_CLASSES = 3


def cut_prices(master: RestrictedMaster, sol: MasterSolution) -> np.ndarray | None:
    """Prices ``1 / cap(S)`` on the links ``S`` the master solution saturates (its own
    load plus the master's background), 0 elsewhere; ``None`` if none is saturated."""
    sat = _saturated(master, sol)
    return sat / float(master.capacity @ sat) if sat.any() else None


def _saturated(master: RestrictedMaster, sol: MasterSolution) -> np.ndarray:
    """The links the master solution saturates (bool per link)."""
    load = master.pool.loads(sol.y, master.capacity.size)
    if master.background is not None:
        load = load + master.background
    return load >= master.capacity * sol.t * (1 - CUT_REL_TOL)


def class_cut_prices(master: RestrictedMaster, sol: MasterSolution) -> list[np.ndarray]:
    """Cut prices ``1 / cap(S_c)`` on each of the :data:`CUT_CLASSES` largest capacity
    classes ``S_c = {a in S : cap_a = c}`` of the saturated set ``S`` (when ``S`` has
    more than one class; ``[]`` otherwise).

    A degenerate master optimum saturates links of several tiers at once; the cut of
    ``S`` counts every pair's crossings of all of them against their summed capacity,
    which a tier the pair need not cross dilutes, while the cut of one tier alone can be
    tight (docs/alltoall.md, *Imported fabrics*).

    **Validity** (any link set ``S' != {}``, so each ``S_c``).  Let ``(y, t)`` be feasible
    for the full master: every pair ``p`` splits its unit demand over step-bounded paths
    (``sum_P y_P = 1``) and every link carries ``load_a + background_a <= cap_a t``.
    Summing over ``S'``: ``t cap(S') >= sum_{a in S'} load_a = sum_p sum_P y_P |P ∩ S'|
    >= sum_p min_P |P ∩ S'|``.  Under the prices ``w = 1_{S'} / cap(S')`` a path costs
    ``|P ∩ S'| / cap(S')`` and ``cap·w = 1``, so ``sum_p SP_p(w)`` -- what
    :func:`_bound` returns for ``w`` -- is at most ``t``; for the optimal ``t*`` too: the
    bound never exceeds ``t* = 1/z*`` (it is a Farley bound, module docstring).  Checked
    against the compact LP by ``bench/fuzz_alltoall.py`` and
    ``tests/test_alltoall_class_cut.py``."""
    sat = _saturated(master, sol)
    caps, counts = np.unique(master.capacity[sat], return_counts=True)
    if caps.size < 2:
        return []
    out = []
    for c in caps[np.argsort(-counts, kind="stable")[:CUT_CLASSES]]:
        s = sat & (master.capacity == c)
        out.append(s / float(master.capacity @ s))
    return out


#: The cut pricing pass also returns the paths cheaper under the cut prices than a pair's
#: used ones (docs/alltoall.md, *Scale*); a switch for measuring what they bring.
CUT_COLUMNS = True


def _used_path_cost(master: RestrictedMaster, sol: MasterSolution, w: np.ndarray,
                    prob: Problem) -> np.ndarray:
    """Per pair (``N x N``), the cheapest cost under ``w`` of a path the master uses,
    less a relative tolerance: cut pricing returns the paths strictly cheaper."""
    pool = master.pool
    cost = pool.costs(w)
    best = np.full(prob.num_pairs, np.inf)
    used = sol.y > 0
    np.minimum.at(best, pool.pair[used], cost[used])
    best = np.where(np.isfinite(best), best * (1 - 1e-9) - 1e-12 * float(w.max(initial=0.0)), -np.inf)
    return prob.pair_matrix(best, -np.inf)


def strongest_columns(priced: PricedColumns, threshold: np.ndarray, share: float) -> PricedColumns:
    """Partial pricing: the priced columns whose reduced cost ``threshold[s, d] - cost``
    is at least ``share`` of the largest (all when ``share`` is 0).  Exact: a round adds
    at least the most negative column, so the run still ends only at a certificate or
    when no column prices out.  On the full master the degenerate duals of a round below
    the optimum price a new column for most single-column pairs (HPN 2x8x8: 13,440 of
    16,256), each then a pair row; the strongest half reached the same optimum in the
    same round with half the rows (docs/alltoall.md, *The last rounds and the local try*)."""
    if share <= 0 or priced.count == 0:
        return priced
    reduced = threshold[priced.src, priced.dst] - priced.cost
    keep = np.flatnonzero(reduced >= share * float(reduced.max()))
    if keep.size == priced.count:
        return priced
    start, arcs = csr_take(priced.start, priced.arcs, keep)
    return PricedColumns(priced.shortest, priced.src[keep], priced.dst[keep], priced.cost[keep],
                         start, arcs)


def column_generation(master: RestrictedMaster, prob: Problem, max_steps: int, *,
                      options: CGOptions = CGOptions(), deadline: float | None = None,
                      want: np.ndarray | None = None, bound: bool = True,
                      label: str = "column generation", pricing_s: float = 0.0,
                      set_cut: bool = False) -> CGResult:
    """Run column generation on ``master`` until LP-optimal (or the deadline).

    ``want`` masks the pairs that may receive columns (all by default); ``bound=False``
    skips the Farley bound (it is not valid once rounding has fixed column bounds) and
    stops only when no column prices out.  With a ``deadline``, a round stops before its
    pricing when less time is left than a pricing pass is expected to take (the last
    round's, or ``pricing_s`` before the first: what routing the initial columns took):
    its columns would come past the deadline.  ``set_cut`` (the full master: every pair
    wanted, the fabric's capacities): the first round whose master rate did not rise
    also prices the tightest node-set cut (:func:`.cut_bound.tightest_cut`), once; a
    master already at the cut bound then certifies there instead of pricing degenerate
    duals round after round (docs/alltoall.md, *Stalled duals*).
    """
    best_bound = 0.0
    history: list[tuple[float, float]] = []
    lp_s = pr_s = 0.0
    iters = dropped = 0
    age = np.zeros(master.num_columns, dtype=np.int64)
    min_pool = options.drop_min_pool or 3 * prob.num_pairs
    status = CGStatus.ROUND_LIMIT       # unless a break below says otherwise
    last: MasterSolution | None = None
    shortest = shortest_w = cert_w = None
    cert_sp: float | None = None
    all_pairs = np.full((prob.num_gpus, prob.num_gpus), -np.inf)
    rnd = 0
    trouble: str | None = None
    for rnd in range(1, options.max_rounds + 1):
        # the first solve is never cut short: without it there is no schedule at all
        remaining = (None if deadline is None or last is None
                     else max(deadline - time.perf_counter(), 1e-3))
        t0 = time.perf_counter()
        try:
            sol = master.solve(f"{label}, round {rnd}", time_limit=remaining)
        except MasterTimeUp:                      # cut short before any solution: keep the last
            lp_s += time.perf_counter() - t0
            status = CGStatus.TIME_LIMIT
            break
        except SolveError as e:
            # under a time limit, numerical trouble in a later round keeps the last
            # round's solution (a valid schedule) instead of losing it (issue 27)
            if deadline is None or last is None:
                raise
            lp_s += time.perf_counter() - t0
            status, trouble = CGStatus.TIME_LIMIT, str(e)
            break
        lp_s += time.perf_counter() - t0
        iters += sol.iterations
        if sol.status.is_limit and last is not None:
            status = CGStatus.TIME_LIMIT
            break
        last = sol
        if deadline is not None and deadline - time.perf_counter() < pricing_s:
            status = CGStatus.TIME_LIMIT     # pricing would end past the deadline
            break                            # (a limited result's bound: .cut_bound)
        tol_rc = 1e-9 * max(float(sol.sigma.max(initial=0.0)), 1e-300)
        threshold = prob.pair_matrix(sol.sigma - tol_rc, -np.inf)
        t1 = time.perf_counter()
        priced = price_paths(prob.graph, sol.w, threshold, max_steps, want)
        pricing_s = time.perf_counter() - t1
        pr_s += pricing_s
        shortest, shortest_w = priced.shortest, sol.w
        cut = None
        if bound:
            candidates = [(sol.w, float(prob.pair_values(priced.shortest).sum()))]
            closed = sol.t - _bound(candidates[0][1], sol.w, master.capacity)
            if closed > options.rel_tol * sol.t:
                w_cut = cut_prices(master, sol)
                if w_cut is not None:
                    t1 = time.perf_counter()
                    cut_thr = (_used_path_cost(master, sol, w_cut, prob) if CUT_COLUMNS
                               else all_pairs)
                    cut = price_paths(prob.graph, w_cut, cut_thr, max_steps, want)
                    pr_s += time.perf_counter() - t1
                    candidates.append((w_cut, float(prob.pair_values(cut.shortest).sum())))
                    if _bound(candidates[-1][1], w_cut, master.capacity) < sol.t * (1 - options.rel_tol):
                        for w_c in class_cut_prices(master, sol):
                            t1 = time.perf_counter()
                            sp = price_paths(prob.graph, w_c, all_pairs, max_steps, want).shortest
                            pr_s += time.perf_counter() - t1
                            candidates.append((w_c, float(prob.pair_values(sp).sum())))
            stalled = bool(history) and sol.rate <= history[-1][0] * (1 + 1e-12)
            if set_cut and stalled and closed > options.rel_tol * sol.t:
                set_cut = False                      # once per run
                t1 = time.perf_counter()
                _, links = tightest_cut(prob.topo)
                if links.any():
                    w_c = links / float(master.capacity @ links)
                    sp = price_paths(prob.graph, w_c, all_pairs, max_steps, want).shortest
                    candidates.append((w_c, float(prob.pair_values(sp).sum())))
                pr_s += time.perf_counter() - t1
            for w_c, sp_sum in candidates:
                b = _bound(sp_sum, w_c, master.capacity)
                if b > best_bound or cert_w is None:
                    best_bound = max(best_bound, b)
                    cert_w = w_c
                    cert_sp = sp_sum
            history.append((sol.rate, 1.0 / best_bound if best_bound > 0 else float("inf")))
            progress.update(label, rnd, *history[-1], "Gbps")
            if sol.t - best_bound <= options.rel_tol * sol.t:
                status = CGStatus.OPTIMAL
                break
        if deadline is not None and time.perf_counter() >= deadline:
            status = CGStatus.TIME_LIMIT
            break
        new = strongest_columns(priced, threshold, options.strongest)
        added = master.add(prob.pair_index(new.src, new.dst), new.start, new.arcs)
        if cut is not None and cut.count:
            cut = strongest_columns(cut, cut_thr, options.strongest)
            added += master.add(prob.pair_index(cut.src, cut.dst), cut.start, cut.arcs)
        if added == 0:
            status = CGStatus.OPTIMAL
            break
        age = np.concatenate([np.where(sol.y > 0, 0, age + 1), np.zeros(added, dtype=np.int64)])
        last.y = np.concatenate([last.y, np.zeros(added)])
        if master.num_columns > min_pool:
            stale = (age >= options.drop_after) & (master.lower == 0)
            dropped += master.drop(stale)
            age = age[~stale]
            last.y = last.y[~stale]
    if last is None:                    # max_rounds < 1: nothing was solved
        raise SolveError(f"{label}: max_rounds must be at least 1, got {options.max_rounds}")
    bound_t = min(best_bound, last.t) if bound else last.t
    return CGResult(last, bound_t, status, rnd, history, lp_s, pr_s, iters, dropped, shortest,
                    shortest_w, cert_sp, cert_w, trouble)
