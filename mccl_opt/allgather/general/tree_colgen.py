"""Column generation over spanning arborescences: the exact AllGather optimum with
forwarding-only switches on any fabric (paper §4.3 tree packing, generalised; see
docs/allgather_history.md "General method").

Each round solves the restricted master (:mod:`.live_master`) and prices every root:
under the link prices ``pi`` every GPU pair's cheapest switch-only path
(:mod:`.switch_paths`) is an edge cost, and the root's cheapest tree is a minimum
spanning arborescence of that GPU digraph (:mod:`.arborescence`); the tree whose cost
``c_r(pi)`` is below the root row's dual ``sigma_r`` is added.

**Certified bound (Lagrangian).**  The full master's dual is
``min pi.cap  s.t.  sum_r sigma_r >= 1,  sigma_r <= cost_pi(T)`` for every tree ``T`` of
root ``r``, ``pi, sigma >= 0``.  For any ``pi >= 0`` with ``sum_r c_r(pi) > 0``,
``(pi, sigma = c(pi)) / sum_r c_r(pi)`` is dual feasible, so
``x* <= pi.cap / sum_r c_r(pi)``.  The loop keeps the best such bound and stops when
the master's ``x`` is within ``rel_tol`` of it (or no column prices out: then the
bound meets ``x`` up to rounding).  A basic optimum has at most ``roots + links``
positive weights, so the number of trees stays small whatever the capacities.

**No cycling.**  Columns at zero weight for ``drop_after`` rounds are dropped only in a
round whose ``x`` is above the ``x`` of the previous drop.  Between two such rounds the
pool only grows, so a degenerate master (``x`` flat while the duals move) cannot drop a
tree and price it again forever; before this rule leaf-spine 4x2x8 with one NIC at 0.9
one way ran the 10 000-round cap at the seed's rate, 1.2 % below the optimum.

**Lazy link rows.**  From ``lazy_rows_from`` links the first master holds only the
capacity rows of the half of the links the starting trees load most (crossings per
unit of capacity); the others, the least likely to bind, join when a solution exceeds
them (:meth:`.live_master.TreeMaster.violated`), and the master is re-solved (dual
simplex) before anything reads its point.  So every point the loop uses meets every
link's capacity, and its ``x`` is the full restricted master's optimum: the stopping
test and the certificate are those of the full master.  While rows are missing each
tree's weight is capped at twice the smallest GPU egress (no optimum needs more: a root's
trees can be scaled down to total ``x``, and ``x`` is at most every GPU's egress), which
keeps the relaxed master bounded.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from mccl_opt import anytime, progress
from mccl_opt.backends import Backend
from mccl_opt.errors import InputError, SolveError
from mccl_opt.topology import Topology
from .arborescence import min_arborescences
from .switch_paths import SwitchPaths
from .live_master import MasterPoint, TreeMaster, TreePool
from .master_solve import solve_reached

#: re-solves of the final master without the trees the LP solver returned below zero
#: (:class:`.live_master.MasterPoint`): clipping a weight of -8e-8 on a tree crossing a
#: 400 Gbps link 20 times cost 1.2e-5 of the rate on a 64-GPU SuperPOD-like fabric
_BELOW_ZERO_RESOLVES = 3

#: makes tree-master columns: ``(root ranks, link indices of every tree)``
Columns = Callable[[], tuple[list[int], list[np.ndarray]]]

__all__ = ["TreeCGOptions", "TreeCGResult", "tree_column_generation", "price_trees", "mwu_trees",
           "pricing_points", "price_bound", "TIE_BREAK"]

#: weight of the ``1/capacity`` term of the tie-broken pricing point
#: (:func:`pricing_points`), of this method (``TreeCGOptions.tie_break``) and of the
#: symmetry quotient (:data:`.quotient.QUOTIENT_TIE_BREAK`)
TIE_BREAK = 1e-3


@dataclass(frozen=True)
class TreeCGOptions:
    """Tolerances and column management of :func:`tree_column_generation`."""

    rel_tol: float = 1e-9          # stop when bound - x <= rel_tol * x
    drop_after: int = 2            # drop columns at zero weight for this many rounds ...
    drop_min_pool: int = 0         # ... once the pool exceeds this many (0: the row count),
                                   # and only after the master's x rose since the last drop
    max_rounds: int = 10_000
    time_limit: float | None = None
    method: str = "primal"         # LP method of the master's solves
    seed_rounds: int = 50          # multiplicative-weights rounds of starting trees (cold)
    warm_seed_rounds: int = 5      # ... when the previous schedule's trees are given
    short_seed_rounds: int = 20    # ... added when a seeded master falls short of its bound
    short_seed_after: int = 10     # ... from this round on
    smoothing: float = 0.8         # dual smoothing weight of the stability centre (0: off)
    tie_break: float = TIE_BREAK   # weight of the 1/capacity term that breaks ties among
                                   # trees of equal cost at the duals (0: off)
    lazy_rows_from: int = 2048     # from this many links the master starts with half the
                                   # link rows and adds the violated ones (module docstring)


@dataclass
class TreeCGResult:
    """Outcome of :func:`tree_column_generation` (rates in the master's scaled units)."""

    pool: TreePool
    weights: np.ndarray            # per pool column
    rate: float                    # the master's x: reached by the fractional schedule
    bound: float                   # certified upper bound on the optimum
    status: str                    # "optimal" | "time_limit" | "round_limit" | "stalled"
    rounds: int
    lp_seconds: float = 0.0
    first_lp_seconds: float = 0.0  # the first master solve's share of ``lp_seconds``
    pricing_seconds: float = 0.0
    iterations: int = 0
    dropped: int = 0
    history: list[tuple[float, float]] = field(default_factory=list)   # (x, bound)
    link_rows: int = 0             # capacity rows the master held at the end (lazy rows:
                                   # fewer than the links, every link's capacity still met)

    @property
    def gap(self) -> float:
        """Certified relative gap ``(bound - x) / bound`` (0 when proven optimal)."""
        if not np.isfinite(self.bound) or self.bound <= 0:
            return 0.0 if self.bound == self.rate else float("inf")
        return max(0.0, (self.bound - self.rate) / self.bound)


def price_trees(topo: Topology, price: np.ndarray,
                roots: np.ndarray) -> tuple[SwitchPaths, np.ndarray, np.ndarray]:
    """Every root's cheapest spanning tree under link prices ``price``:
    ``(paths, parents, costs)`` with ``parents[i]`` in rank space (-1 at the root)."""
    paths = SwitchPaths(topo, price)
    parents, costs = min_arborescences(paths.cost, roots)
    return paths, parents, costs


def mwu_trees(topo: Topology, capacity: np.ndarray, rounds: int,
              eta: float = 10.0) -> tuple[list[int], list[np.ndarray]]:
    """Starting columns by multiplicative weights (Garg-Koenemann style): each round
    prices every root's cheapest tree under ``pi_a = exp(eta u_a / max u) / cap_a``,
    ``u_a`` the utilisation of link ``a`` by all trees so far, so later rounds avoid the
    links earlier trees crowd.  The trees of all rounds together nearly solve the
    master, which column generation then finishes in a few rounds (a cold start from
    single trees tails off over hundreds of degenerate rounds).  Stops early (after at
    least one round) when the enclosing solve's time limit passes
    (:func:`mccl_opt.anytime.limit_left`): each round prices every root."""
    left = anytime.limit_left()
    deadline = None if left is None else time.perf_counter() + left
    roots = np.arange(topo.num_gpus)
    out_r: list[int] = []
    out_t: list[np.ndarray] = []
    used = np.zeros_like(capacity)
    price = 1.0 / capacity
    for _ in range(max(rounds, 1)):
        paths, parents, costs = price_trees(topo, price, roots)
        priced = roots[np.isfinite(costs)]
        for r, arcs in zip(priced.tolist(), paths.forest_arcs(priced, parents)):
            out_r.append(r)
            out_t.append(arcs)
            used += np.bincount(arcs, minlength=capacity.size)
        util = used / capacity
        price = np.exp(eta * util / max(float(util.max()), 1e-300)) / capacity
        if deadline is not None and time.perf_counter() >= deadline:
            break
    return out_r, out_t


def _candidates(topo: Topology, price: np.ndarray, pt: MasterPoint, roots: np.ndarray
                ) -> tuple[float, list[int], list[np.ndarray]]:
    """Price every root at ``price``: the sum of the cheapest tree costs (for the bound)
    and the trees whose reduced cost under the master's own duals is negative."""
    paths, parents, costs = price_trees(topo, price, roots)
    total = float(costs.sum())
    tol_rc = 1e-12 * max(float(pt.sigma.max(initial=0.0)), 1e-300)
    out_r: list[int] = []
    out_t: list[np.ndarray] = []
    priced = roots[np.isfinite(costs)]
    for r, arcs in zip(priced.tolist(), paths.forest_arcs(priced, parents)):
        if float(pt.pi[arcs].sum()) < pt.sigma[r] - tol_rc:
            out_r.append(r)
            out_t.append(arcs)
    return total, out_r, out_t


def price_bound(price: np.ndarray, capacity: np.ndarray, total: float) -> float:
    """The Lagrangian bound ``price·capacity / total`` of one pricing point, ``total`` the
    root-weighted cost of its cheapest trees (paper §5's dual bound; ``inf`` where the
    trees cost nothing or could not be priced): a round's bound, of this method and of the
    symmetry quotient's (:mod:`.quotient`)."""
    return float(price @ capacity) / total if total > 0 and np.isfinite(total) else np.inf


def pricing_points(center: np.ndarray | None, pi: np.ndarray, capacity: np.ndarray,
                    alpha: float, tie: float):
    """Where a round prices, in order; it adds the trees of every point whose reduced
    cost at the master's duals ``pi`` is negative:

    1. Wentges smoothing: ``alpha`` of the way from ``pi`` to the stability centre (the
       prices of the best Lagrangian bound so far, kept apart from a certified bound the
       caller passes, so that a seeded run smooths too);
    2. ``pi`` plus ``tie * mean(pi_a cap_a) / cap_a``: the master's duals are degenerate
       (zero on most links), so many trees cost nothing and the cheapest one found is
       an arbitrary, crowded one; the small ``1/capacity`` term prefers the roomy
       paths among trees of (nearly) equal cost (HPN 4x16x8 with a one-way NIC fault:
       the restriction seed closed in 5 rounds without it, 1 with it);
    3. ``pi`` itself, which finds a column unless the master is optimal, so the loop
       ends exactly where it would without 1-2.

    Every point's trees (up to three per root a round, each one the master wants) keep
    both the smoothed point's stability and the plain duals' direction: the superpod
    2x4x8 of fuzz seed 3419 (one-way fault, restriction seed) took 50 rounds with the
    first point's trees alone, 13 with every point's (docs/allgather.md)."""
    if center is not None and alpha > 0:
        yield alpha * center + (1.0 - alpha) * pi
    if tie > 0:
        scale = float(pi @ capacity) / max(capacity.size, 1)
        if scale > 0:
            yield pi + tie * scale / capacity
    yield pi


def _check_within_round(deadline: float | None) -> None:
    """:func:`mccl_opt.anytime.check` inside a round (after the master solve, before
    each pricing point), so a warm attempt's allowance passing abandons the run within
    the round, not at its end (one round of a large master took seconds); skipped past
    the solve's own ``deadline``, where the round ends and returns the master's trees."""
    if deadline is None or time.perf_counter() < deadline:
        anytime.check("the general method's column generation, within a round")


def _lazy_rows(topo: Topology, capacity: np.ndarray, pool: TreePool,
               options: TreeCGOptions) -> tuple[np.ndarray | None, float]:
    """The link rows the first master holds and the weight cap while some are missing
    (module docstring, "Lazy link rows"): all and no cap below ``lazy_rows_from`` links."""
    n = capacity.size
    if n < options.lazy_rows_from or not len(pool):
        return None, np.inf
    crossed = np.bincount(pool.arcs, minlength=n) / capacity
    rows = np.argsort(-crossed, kind="stable")[:(n + 1) // 2]
    arr = topo.arrays
    egress = np.bincount(arr.tail, weights=capacity, minlength=topo.num_nodes)
    return rows, 2.0 * float(egress[arr.gpu_nodes].min())


def _out_of_time(pt: MasterPoint | None, where: str) -> None:
    """A master solve stopped at the time left (:func:`.master_solve.solve_reached`): a
    warm stage's allowance is abandoned, and so is the solve's own limit before any
    master point (its best offered schedule is returned); otherwise the caller returns
    the last master point's trees (``status='time_limit'``)."""
    limit = anytime.current()
    if pt is None or (limit is not None and limit.is_stage):
        anytime.run_out(f"{where}: the master LP at the time limit")
        raise SolveError(f"{where}: the time limit passed before the first master LP "
                         "was solved; raise the time limit")


def tree_column_generation(topo: Topology, backend: Backend, capacity: np.ndarray,
                      roots: list[int], trees: list[np.ndarray],
                      options: TreeCGOptions = TreeCGOptions(),
                      upper_bound: float | None = None,
                      later: Sequence[tuple[int, Columns]] = ()) -> TreeCGResult:
    """Solve the tree master to optimality from the given starting columns
    (``capacity`` per link, in the units the rates come back in).  Every round's prices
    give a valid bound (module docstring); at ``options.time_limit`` the master's rate,
    which its trees reach, is returned with the best bound and ``status='time_limit'``;
    so is it at the time limit of the enclosing solve (:func:`mccl_opt.anytime.limit_left`),
    while a sub-budget of it passing (a warm attempt's) abandons the run
    (:func:`mccl_opt.anytime.check`).  ``upper_bound`` (the master's units): an upper
    bound on the optimum certified by the caller (:mod:`.restriction_seed`); the loop
    starts from it as its best bound, so it stops as soon as the master reaches it.
    ``later``: stages ``(round, make)`` of more starting columns (a warm start's previous
    trees, the weaker-direction fabric's, multiplicative-weights trees), each made and
    added at the first master solve from ``round`` on that does not reach
    ``upper_bound`` (a seed that certifies at once pays neither for them nor for a
    larger LP, one that closes in a few rounds not for the later stages)."""
    t_start = time.perf_counter()
    stages = list(later)
    limits = [t for t in (options.time_limit, anytime.limit_left()) if t is not None]
    deadline = t_start + min(limits) if limits else None
    g = topo.num_gpus
    all_roots = np.arange(g)
    pool = TreePool()
    pool.append(roots, trees)
    rows, weight_cap = _lazy_rows(topo, capacity, pool, options)
    master = TreeMaster(backend, g, capacity, pool, rows, weight_cap)
    min_pool = options.drop_min_pool or g + capacity.size
    age = np.zeros(len(pool), dtype=np.int64)
    best_bound = np.inf if upper_bound is None else float(upper_bound)
    lagrangian = np.inf                     # the best bound the pricing itself certified
    center: np.ndarray | None = None        # ... and its prices, the stability centre
    history: list[tuple[float, float]] = []
    lp_s = pr_s = first_lp_s = 0.0
    iters = dropped = 0
    x_dropped = -np.inf                     # the master's x at the last drop
    status = "stalled"
    pt: MasterPoint | None = None
    rnd = 0
    for rnd in range(1, options.max_rounds + 1):
        t0 = time.perf_counter()
        where = f"AllGather column generation, round {rnd}"
        # the first master runs to its end unless a limit of the solve stops it: before
        # it there are no trees to return at ``deadline``
        point = solve_reached(master, where, options.method,
                              None if pt is None else deadline, options.rel_tol)
        lp_s += time.perf_counter() - t0
        if point is None:
            _out_of_time(pt, where)
            status = "time_limit"
            break
        pt = point
        first_lp_s = first_lp_s or lp_s
        iters += pt.iterations
        if best_bound - pt.x <= options.rel_tol * max(pt.x, 1e-300):
            history.append((pt.x, best_bound))
            status = "optimal"
            break
        _check_within_round(deadline)
        if stages and rnd >= stages[0][0]:
            more = stages.pop(0)[1]()
            added = master.add(*more) if more[0] else 0
            if added:
                age = np.concatenate([np.where(pt.w > 0, 0, age + 1), np.zeros(added, np.int64)])
                continue
        t1 = time.perf_counter()
        added = 0
        for price in pricing_points(center, pt.pi, capacity, options.smoothing,
                                       options.tie_break):
            _check_within_round(deadline)
            total, new_r, new_t = _candidates(topo, price, pt, all_roots)
            bound = price_bound(price, capacity, total)
            if bound < lagrangian:
                lagrangian, center = bound, price
                best_bound = min(best_bound, lagrangian)
            if best_bound - pt.x <= options.rel_tol * max(pt.x, 1e-300) or \
                    (deadline is not None and time.perf_counter() >= deadline):
                break
            added += master.add(new_r, new_t)       # duplicates of pool columns are refused
        pr_s += time.perf_counter() - t1
        if added:
            age = np.concatenate([np.where(pt.w > 0, 0, age + 1), np.zeros(added, np.int64)])
            pt.w = np.concatenate([pt.w, np.zeros(added)])
            pt.below = np.concatenate([pt.below, np.zeros(added, dtype=bool)])
        history.append((pt.x, best_bound))
        progress.update("AllGather general method: column generation", rnd, pt.x, best_bound)
        if best_bound - pt.x <= options.rel_tol * max(pt.x, 1e-300):
            status = "optimal"
            break
        if deadline is not None and time.perf_counter() >= deadline:
            status = "time_limit"
            break
        anytime.check("the general method's column generation")
        if added == 0:
            break
        if master.num_columns > min_pool and pt.x > x_dropped:
            stale = age >= options.drop_after   # no drop on a degenerate stall: it cycles
            dropped += master.drop(stale)
            age, pt.w, pt.below = age[~stale], pt.w[~stale], pt.below[~stale]
            x_dropped = pt.x
    else:
        status = "round_limit"
    if pt is None:
        raise InputError("TreeCGOptions.max_rounds must be at least 1")
    for _ in range(_BELOW_ZERO_RESOLVES):   # the returned trees must reach the returned x
        if not pt.below.any() or status == "time_limit":
            break               # at the limit: the trees at their clipped weights (the
        below = pt.below        # schedule's rate is recomputed from its loads)
        dropped += master.drop(below)
        point = solve_reached(master, "AllGather column generation, without trees below zero",
                              options.method, deadline, options.rel_tol)
        if point is None:
            pt.w, pt.below = pt.w[~below], below[~below]
            break
        pt = point
        iters += pt.iterations
    return TreeCGResult(pool, pt.w, pt.x, max(best_bound, pt.x), status, rnd, lp_s, first_lp_s,
                        pr_s, iters, dropped, history, int(master.rows.size))
