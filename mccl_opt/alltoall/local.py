"""Warm local re-optimisation with a global certificate ("pair fixing").

When only link capacities changed and the old basis is not reusable (a binding link
changed: Fail2), most pairs' old routes stay optimal.  We re-optimise only the *free*
pairs and prove that the result is optimal for the full master:

1. Free pairs ``F``: the pairs with an old column in use (``y > 0``) that crosses a link
   whose capacity changed.  Every other pair keeps its old shares ``y``; together they
   load link ``a`` with ``b_a``.
2. Restricted master over ``F`` (the other pair rows get demand 0 and no columns):
   ``sum_{j in P(p)} y_j >= 1`` (p in F), ``sum_j beta_aj y_j - cap_a t <= -b_a``, with
   column generation priced for ``F`` only (:func:`~.colgen.column_generation`, ``want``).
3. Certificate: every round of that column generation prices *all* pairs under the
   restricted master's link prices ``w`` and computes the Farley bound over all pairs,
   ``t_lb = sum_p SP_p(w) / max(1, cap·w)``, a valid lower bound on the full optimum.
   The combined solution (fixed ``y`` + restricted ``y``) is feasible for the full master
   with value ``t_R``, so ``t_R - t_lb <= rel_tol·t_R`` proves it optimal.  With
   ``cap·w = 1``, ``t_R = sum_F sigma_p + w·b`` and ``w·b = sum_{fixed p} sum_j y_j w(P_j)``,
   so the gap is ``sum_F (sigma_p - SP_p) + sum_fixed (sum_j y_j w(P_j) - SP_p·sum_j y_j)``:
   once no free column prices out, it is exactly the fixed pairs' excess over their
   shortest paths.  The fixed pairs with an excess join ``F`` and the loop repeats (at
   most a few times); if that does not certify, the caller falls back to the full
   warm master.
4. Rounding: the fixed pairs keep their old chunks (the same routes); the free pairs
   are rounded against the fixed chunks' loads (the restricted master's rows are reset
   to them before the deep dive).

The new schedule's :class:`~.state.AllToAllWarmState` holds the combined columns and shares (no
basis), so a chained warm start works the same way.

:func:`reuse_certified` is the degenerate case ``F = {}``: when the old shares still fit
at the old ``t`` and the old run's own Farley certificate (its last prices) still holds
under the new capacities, the old schedule is returned as it stands, with no LP at all.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import numpy as np

from ..backends import get_backend
from ..link_rate import rate_of_loads
from .assemble import SATURATION_REL_TOL, Outcome, RunReport, WarmMode, fractional, rounded_columns
from .colgen import CGOptions, CGStatus, column_generation
from .driver import PRESOLVE_EVERY_TIME_MIN_PAIRS, certificate_of
from .master import ColumnPool, RestrictedMaster
from .problem import Problem
from .rounding import deep_dive, dive_budget
from .rows import csr_take
from .state import ChunkRoutes, LPColumns, AllToAllWarmState
from .warm import changes_are_nonbinding

__all__ = ["GaveUp", "local_resolve", "local_eligible", "reuse_certified", "raises_a_binding_link"]

#: The local master re-solves cold and presolved only after a batch of at least this many
#: new columns per free pair (round 2's one per pair); warm from its basis otherwise
#: (:meth:`~.master.RestrictedMaster.presolve_every_time`).  Below
#: :data:`~.driver.PRESOLVE_EVERY_TIME_MIN_PAIRS` pairs it always re-solves warm: on HPN
#: 2x4x8 loop jobs the cold re-solve after such a batch took 900-1,200 pivots where the
#: warm one took 30-200 (docs/alltoall.md, *The last rounds and the local try*).
PRESOLVE_BATCH_ROWS = 1.0

#: After the free set grows, the next run must bring the certificate gap below this
#: fraction of what it was before, else the local try gives up (docs/alltoall.md,
#: *The local try's budget*).
GAP_SHRINK = 0.5


@dataclass(frozen=True)
class GaveUp:
    """Why :func:`local_resolve` returned no outcome (``stats["local_gave_up"]``)."""

    reason: str


def local_eligible(prob: Problem, state: AllToAllWarmState | None, max_chunks: int | None) -> bool:
    """Same nodes and links, only capacities changed, and the state carries what the
    local path needs (column pairs, chunk routes at the same ``max_chunks``)."""
    if state is None or state.chunks is None:
        return False
    if state.chunks.max_chunks != max_chunks:
        return False
    return state.fabric.same_links(prob) and bool((state.fabric.capacity != prob.capacity).any())


def raises_a_binding_link(prob: Problem, state: AllToAllWarmState, rel_tol: float = 1e-6) -> bool:
    """A link the old LP saturated gains capacity (a repair or upgrade of the
    bottleneck): then most pairs may re-balance onto it, and the local path would only
    grow its free set until it gives up (measured: 1x16x8 repaired from Fail2)."""
    old = state.fabric.capacity
    up = prob.capacity > old
    return bool((state.lp_load[up] >= old[up] * state.lp.t * (1 - rel_tol)).any())


def local_resolve(prob: Problem, state: AllToAllWarmState, backend: str, max_steps: int,
                  max_chunks: int | None, options: CGOptions, deadline: float | None,
                  max_steps_local: int = 3, max_free: float = 0.3,
                  step_rounds: int = 10) -> Outcome | GaveUp:
    """The outcome of the certified local re-optimisation (module docstring), or why
    it does not apply or did not certify (the caller then solves the full warm master).
    Gives up when the free pairs would exceed ``max_free`` of all pairs (the restricted
    master is then hardly smaller than the full one), when a run after the free set grew
    did not shrink the certificate gap to :data:`GAP_SHRINK` of what it was, or after
    ``max_steps_local`` column generation runs of ``step_rounds`` rounds each, between
    which the fixed pairs that cause the gap join the free ones."""
    n_pairs, n_links = prob.num_pairs, prob.num_links
    old, old_chunks = state.lp, state.chunks
    routes = old.routes
    n = old.count
    pair, y_old = old.pair, old.y
    used = y_old > 0
    if max_steps < prob.topo.num_nodes - 1 and (
            routes.sums(prob.is_step_arc)[used]
            > max_steps).any():
        return GaveUp("an old route is longer than the step bound")
    changed = state.fabric.capacity != prob.capacity
    crosses = routes.sums(changed) > 0
    free = np.zeros(n_pairs, dtype=bool)
    free[pair[used & crosses]] = True
    if not free.any():
        return GaveUp("no used route crosses a changed link")

    def background(free: np.ndarray) -> np.ndarray:
        fixed = used & ~free[pair]
        return routes.loads(np.where(fixed, y_old, 0.0), n_links)

    def add_pairs(master: RestrictedMaster, new: np.ndarray) -> None:
        cols = np.flatnonzero(new[pair])
        st, arcs = routes.take(cols)
        master.add(pair[cols], st, arcs, cols)

    pool = ColumnPool()
    sel = free[pair]
    cols = np.flatnonzero(sel)
    pool.append(pair[cols], *routes.take(cols), cols)
    b_lp = background(free)
    # cold, presolved, primal after a large batch of columns from 30,000 pairs up: at 1024
    # GPUs the warm primal re-solve after the free pairs' new columns took 2x as long
    # (docs/alltoall.md, *third pass*); warm after small ones (*The local try's budget*)
    # and, below, after any batch (PRESOLVE_BATCH_ROWS)
    master = RestrictedMaster(get_backend(backend), n_pairs, prob.capacity, pool, free, b_lp)
    large = n_pairs >= PRESOLVE_EVERY_TIME_MIN_PAIRS
    master.presolve_every_time("primal", batch_rows=PRESOLVE_BATCH_ROWS if large else np.inf)
    step_options = CGOptions(options.rel_tol, options.drop_after, options.drop_min_pool, step_rounds)
    rounds = grow = iterations = steps = 0
    lp_s = pr_s = 0.0
    history: list = []
    bound_t = 0.0
    gap_grown_from: float | None = None     # the gap when the free set last grew
    while True:
        want = prob.pair_matrix(free.astype(float), 0.0) > 0
        res = column_generation(master, prob, max_steps, options=step_options, deadline=deadline,
                                want=want, label=f"local re-optimisation {grow + 1}")
        steps += 1
        rounds += res.rounds
        iterations += res.iterations
        lp_s += res.lp_seconds
        pr_s += res.pricing_seconds
        history += res.history
        t = res.solution.t
        bound_t = max(bound_t, min(res.bound_t, t))
        if t - bound_t <= options.rel_tol * t or res.status is CGStatus.TIME_LIMIT:
            break
        gap = (t - bound_t) / t
        if gap_grown_from is not None and gap > GAP_SHRINK * gap_grown_from:
            return GaveUp(f"the free set grew and the certificate gap went only from "
                          f"{gap_grown_from:.1%} to {gap:.1%}")
        gap_grown_from = None
        if steps >= max_steps_local or res.shortest is None:
            return GaveUp(f"no certificate after {steps} column generation runs")
        w = res.solution.w
        sp = prob.pair_values(res.shortest)
        col_price = routes.sums(w)
        fixed = used & ~free[pair]
        excess = np.bincount(pair, weights=np.where(fixed, y_old * (col_price - sp[pair]), 0.0),
                             minlength=n_pairs)
        # the fixed pairs priced above their shortest paths, and those on links the
        # restricted optimum saturates (degenerate duals price only one of them)
        load = pool.loads(res.solution.y, n_links) + background(free)
        tight = load >= prob.capacity * t * (1 - 1e-9)
        on_tight = routes.sums(tight) > 0
        new = ~free & (excess > 1e-9 * t / n_pairs)
        if res.rounds == step_rounds and excess.sum() < 0.5 * (t - res.bound_t):
            continue                    # the free pairs' own gap dominates: keep pricing
        if res.rounds < step_rounds:    # restricted optimum reached
            tight_new = new.copy()
            tight_new[pair[fixed & on_tight]] = True
            if (free | tight_new).sum() <= max_free * n_pairs:
                new = tight_new
        if not new.any():
            return GaveUp("no fixed pair to free")
        if (free | new).sum() > max_free * n_pairs:
            return GaveUp(f"the free pairs would pass {max_free:.0%} of all pairs")
        gap_grown_from = gap
        grow += 1
        free |= new
        b_lp = background(free)
        master.set_rows(free, b_lp)
        add_pairs(master, new)

    lp_done = time.perf_counter()
    sol = res.solution
    lp_rate = sol.rate
    y = sol.y.copy()
    cols_final = len(pool)
    lp_loads = pool.loads(y, n_links) + b_lp
    saturated = lp_loads >= prob.capacity * sol.t * (1 - SATURATION_REL_TOL)
    k = 1 if max_chunks is None else max_chunks
    keep = ~free[old_chunks.pair]                       # the fixed pairs' old chunks
    b_round = old_chunks.routes.loads(np.where(keep, old_chunks.share, 0.0), n_links)
    t_round = time.perf_counter()
    dive: dict = {}
    if max_chunks is None:
        rounded = fractional(pool, y, prob)
    else:
        master.set_rows(free, b_round)
        rounded, dive = deep_dive(master, prob, y, max_chunks, max_steps, lp_rate,
                                  deadline=deadline, background=b_round, pairs=free,
                                  budget_s=dive_budget(lp_s + pr_s))
    rounding_s = time.perf_counter() - t_round
    new_used, new_loads = rounded_columns(prob, rounded, k)
    loads = new_loads + b_round

    # the new state: the fixed pairs' old chunks, then the new ones (the schedule
    # orders them by pair; a pair is either fixed or free) ...
    c_pair = np.concatenate([old_chunks.pair[keep], rounded.pool_pair[new_used]])
    c_routes = old_chunks.routes.keep_then(
        keep, *csr_take(rounded.pool_start, rounded.pool_arcs, new_used))
    n_kept = int(keep.sum())
    c_share = np.concatenate([old_chunks.share[keep], rounded.counts[new_used] / k])
    # ... and its columns: the fixed pairs' used old columns, then the restricted pool
    fixed = used & ~free[pair]
    new_index_of_old = np.full(keep.size, -1, dtype=np.int64)
    new_index_of_old[keep] = np.arange(n_kept)
    old_of = old_chunks.of_column[fixed]
    chunk_of_fixed = np.where(old_of >= 0, new_index_of_old[np.maximum(old_of, 0)], -1)
    chunk_of_free = np.full(cols_final, -1, dtype=np.int64)
    in_cg = new_used < cols_final
    chunk_of_free[new_used[in_cg]] = n_kept + np.flatnonzero(in_cg)
    lp = LPColumns(np.concatenate([pair[fixed], pool.pair[:cols_final]]),
                   routes.keep_then(fixed, pool.start[:cols_final + 1], pool.arcs),
                   np.concatenate([y_old[fixed], y]), float(sol.t))
    chunk_routes = ChunkRoutes(c_pair, c_routes, c_share,
                               np.concatenate([chunk_of_fixed, chunk_of_free]), max_chunks)
    warm_state = AllToAllWarmState(replace(state.fabric, capacity=prob.capacity.copy()), lp, chunk_routes,
                           None, certificate_of(res, prob, max_steps))
    report = RunReport(
        status=CGStatus.TIME_LIMIT if res.status is CGStatus.TIME_LIMIT else CGStatus.OPTIMAL,
        warm_mode=WarmMode.LOCAL, backend=backend, iterations=iterations, rounds=rounds,
        columns=lp.count, columns_dropped=0, warm_columns=n,
        lp_bound_gbps=1.0 / bound_t if bound_t > 0 else float("inf"),
        bound_history=[list(h) for h in history], max_steps=max_steps, rounding=rounded.method,
        lp_seconds=lp_s, pricing_seconds=pr_s, rounding_seconds=rounding_s,
        extra={"free_pairs": int(free.sum()), "certificate_rounds": grow + 1, **dive})
    return Outcome(loads, lp_rate, saturated, warm_state, report, lp_done)


def reuse_certified(prob: Problem, state: AllToAllWarmState | None, backend: str, max_steps: int,
                    max_chunks: int | None, rel_tol: float) -> Outcome | None:
    """The old schedule itself, when a capacity-only change leaves the old LP solution
    provably optimal; else ``None``.

    The old shares still fit at the old ``t`` under the new capacities, and the old
    run's last pricing (prices ``w``, ``sum_p SP_p(w)``, same step bound) still gives a
    Farley bound ``sum_p SP_p(w) / max(1, cap·w)`` within ``rel_tol`` of ``t``: then ``t``
    is the new optimum with the same certificate, no LP needs solving, and the old
    chunks stay (when their rounded rate did not drop).  This is the case of a changed
    link the old LP did not price (``w_a = 0``), e.g. Fail1."""
    if not local_eligible(prob, state, max_chunks):
        return None
    cert = state.certificate
    if cert is None or cert.max_steps != max_steps or cert.w.size != prob.num_links:
        return None
    t = state.lp.t
    bound = cert.bound_t(prob.capacity)
    if not (t > 0 and t - bound <= rel_tol * t):
        return None
    lp_loads = state.lp_load
    if (lp_loads > prob.capacity * t * (1 + 1e-9)).any():
        return None
    chunks = state.chunks
    loads = chunks.routes.loads(chunks.share, prob.num_links)
    if (rate_of_loads(prob.capacity, loads)
            < rate_of_loads(state.fabric.capacity, loads) * (1 - 1e-12)):
        return None                         # the rounding's bottleneck moved: re-round
    saturated = lp_loads >= prob.capacity * t * (1 - SATURATION_REL_TOL)
    basis = state.basis if changes_are_nonbinding(prob, state) else None
    new_state = replace(state, fabric=replace(state.fabric, capacity=prob.capacity.copy()),
                        basis=basis)
    bound_gbps = 1.0 / bound if bound > 0 else float("inf")
    report = RunReport(
        status=CGStatus.OPTIMAL, warm_mode=WarmMode.REUSE, backend=backend, iterations=0,
        rounds=0, columns=state.lp.count, columns_dropped=0, warm_columns=state.lp.count,
        lp_bound_gbps=bound_gbps, bound_history=[[1.0 / t, bound_gbps]], max_steps=max_steps,
        rounding="reused")
    return Outcome(loads, 1.0 / t, saturated, new_state, report)
