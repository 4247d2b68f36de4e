"""``solve_allgather``: ForestColl(-warm) AllGather synthesis (paper §4.3, App. C).

Read top to bottom, one call is:

1. with a time limit, a first valid schedule at once (:mod:`.first`), offered to the
   limit (:mod:`mccl_opt.anytime`), which returns the best offered when it passes;
2. the warm route (:mod:`.warm.route`): a previous schedule of other GPUs is declined at
   once; otherwise every warm step below runs under one shared allowance derived from
   the cold solve time the previous schedule carries, and past it the solve carries on
   cold (*warm never slower than cold*, docs/allgather.md);
3. the method chain (:mod:`.chain`): ForestColl on balanced fabrics, else the
   weaker-direction fabric, the balanced restriction and the general method (warm only
   from its own columns);
4. ForestColl itself: a warm start's certified guesses (:mod:`.warm.certify`), else Phase 1
   and the chunk budget, the previous trees rerouted to it, switch balancing, Phase 2 and
   Phase 3 (:mod:`.forestcoll.pipeline`, :mod:`.forestcoll.pack_steps` in the order of
   :mod:`.forestcoll.pack_plan`, seeded with the previous trees when warm;
   step-aware: :mod:`.forestcoll.step_aware`), and the schedule (:mod:`.assemble`).

Every schedule carries a typed :class:`~mccl_opt.report.SolveReport`: the method, how
the solve ended, the bound, the warm use (``declined`` when a warm start was given but
the schedule is cold's) and the methods tried with their times; ``stats["warm_route"]``
names the route taken (:class:`.warm.route.RouteTaken`).

Longer than ~400 lines on purpose: the public entry point's argument checks, the
warm route and the chain are one call read top to bottom (the steps above).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any, Callable

from .. import anytime
from ..entry_checks import check_time_limit
from ..errors import SolveError
from ..kernel_time import charge_apart, kernel_seconds
from ..report import Attempt, Method, Termination, WarmUse, stamp
from ..schedule import Schedule
from ..topology import Topology
from .assemble import Optimum, Run, packed
from .budget import EXACT_TREES_LIMIT, BudgetUnpacked, ChunkCounts, CutBounds
from .canonical import canonical
from .chain import RESTRICTION_ROUNDING_GAP, cut_bound_gbps, SeedOnce, solve_by_general, \
    solve_unbalanced
from .stage import Declined, ForestColl, Trail
from .warm.certify import Certificate, GuessKind, keep_or_reroute, warm_budget, warm_guess
from .warm.reroute import predicted_cold_seconds
from .warm.route import RouteTaken, WarmRoute
from .fabric import fabric_of, switches_balanced
from .fewer_trees import fewer_trees
from .first import MWU_MAX_GPUS, first_schedule
from .first_images import averaged_first, image_seconds
from .forestcoll.above_limit import pack_scaled
from .forestcoll.pack_plan import ForestCollAsk, Goal
from .forestcoll.pack_steps import pack, spread_logical
from .forestcoll.pipeline import balanced_split, check_inputs, gbps, phase_one_budget
from .forestcoll.throughput import cut_upper_bound

if TYPE_CHECKING:                                 # the general method loads on its first use
    from .general.restriction_seed import RestrictionSeed

__all__ = ["solve_allgather", "sub_forestcoll", "PHASES_23_PER_PHASE_1"]

#: balancing and Phases 2-3 are expected to take this many times Phase 1 and the chunk
#: budget (HPN 1024-2048 GPUs: 4-10x; a low estimate, so :func:`.anytime.check_room`
#: stops a limited solve before them only when they most likely do not fit)
PHASES_23_PER_PHASE_1 = 4.0

#: a time limit ``S`` holds within ``LIMIT_TOLERANCE[0] * S + LIMIT_TOLERANCE[1]`` s past
#: it (issue 25); the first schedule's images, once started where their expected cost
#: fits, may use :data:`IMAGES_LATE_SHARE` of that to finish rather than be thrown away
#: at the limit (at load 13 on 2 cores a 0.2 s limit on leaf-spine 8x2x8 returned the
#: line, 13 % of its images' rate, when they were stopped at the limit itself)
LIMIT_TOLERANCE, IMAGES_LATE_SHARE = (0.2, 0.05), 0.5

#: above :data:`.budget.EXACT_TREES_LIMIT` trees per root at ``max_chunks=None``, fabrics
#: of at most this many GPUs go to the general method seeded with ForestColl's own trees
#: (stopped at the cut bound), larger ones to the scaled packing: the seeded master took
#: 0.35 s where the scaled packing took 1.1 s on shared aggregation / SuperPOD 2x8x8,
#: 0.40 vs 0.71 s on HPN 2x16x8, but 43 s vs 4.1 s on HPN 4x16x8 (CPU; docs/allgather.md
#: "Above the tree limit"); so do they below it from :data:`SEEDED_GENERAL_ENTRIES` ``k·n²``
SEEDED_GENERAL_MAX_GPUS, SEEDED_GENERAL_ENTRIES = 256, 1 << 22   # 2x8x8 Fail2: 1.15 -> 0.30 s


def solve_allgather(topo: Topology, warm: Schedule | None = None, backend: str = "highs",
                    max_chunks: int | None = 10, step_aware: Any = False,
                    time_limit: float | None = None) -> Schedule:
    """Throughput-optimal AllGather trees (ForestColl), warm-started from ``warm``.

    ``max_chunks=K``: every root's trees carry multiples of ``1/k`` for one ``k <= K``
    (the best such ``k``); ``None``: the exact optimum.  ``step_aware=True`` (or a
    :class:`.forestcoll.step_aware.StepAware` with a rate tolerance) uses the step-aware switch
    removal LP of App. C on ``backend`` for shallower trees.  ``time_limit`` (s): the
    best valid schedule found by then is returned, ``report.termination`` saying
    whether it is optimal, with the certified bound and gap.
    The fabric is solved in a canonical listing (:mod:`.canonical`), so the order a file
    lists switches and links in does not matter.  Fabrics with unbalanced switches, and
    any the ForestColl path cannot solve exactly, go to the general method (the
    forwarding-only optimum by column generation over trees, :mod:`.chain`,
    :mod:`.general.method`; ``step_aware`` does not apply there).  Raises
    :class:`TopologyError` for unusable fabrics, :class:`SolveError` only on numerical
    trouble (never an internal ``KeyError``/``IndexError``/``AssertionError``).  Numba
    kernels compiled or loaded inside the call are timed apart (``stats["kernel_load_s"]``,
    :mod:`mccl_opt.kernel_time`), not in ``seconds``.
    """
    called = time.perf_counter()                 # the limit counts from here
    cpu = time.thread_time()                     # the cold CPU time (docs/allgather.md)
    check_inputs(topo, max_chunks, warm, backend)
    check_time_limit(time_limit)
    with kernel_seconds() as kernels:
        sched, route = _solve_limited(canonical(topo), warm, backend, max_chunks, step_aware,
                                      time_limit, called)
    cpu = time.thread_time() - cpu - kernels.cpu_seconds
    return stamp(_with_cold_seconds(charge_apart(sched, kernels), warm, route, cpu))


def _solve_limited(topo: Topology, warm: Schedule | None, backend: str, max_chunks: int | None,
                   step_aware: Any, time_limit: float | None, called: float
                   ) -> tuple[Schedule, WarmRoute]:
    """Steps 1-2 of the module doc: the first schedule, the limit (from ``called``, a
    ``time.perf_counter()`` reading at the call), the warm route."""
    trail = Trail()
    start = time.perf_counter()
    route = WarmRoute.plan(topo, warm)

    def solve() -> Schedule:
        if time_limit is not None:
            first = trail.run(Method.FIRST, lambda: _offered(first_schedule(topo, route.warm,
                                                                            max_chunks)),
                              "kept as fallback")
            anytime.check("after the first schedule")
            share, floor = LIMIT_TOLERANCE
            _offer_images(topo, first, max_chunks, trail,
                          IMAGES_LATE_SHARE * (share * time_limit + floor))
            anytime.check("after the first schedule's images")   # their grace has ended
        return _chain(topo, route, backend, max_chunks, step_aware, trail)

    sched, stopped = anytime.limited(time_limit, solve, called)
    if stopped is not None:
        why = (f"the time limit was reached in {stopped.stopped_in}" if stopped.failure is None
               else f"the solve failed ({stopped.failure})")
        trail.add(Attempt(sched.report.method, 0.0, f"returned: {why}"))
        sched = _at_time_limit(topo, sched, max_chunks)
    return _with_route(_with_trail(sched, trail, time.perf_counter() - start), route), route


def _offered(sched: Schedule) -> Schedule:
    anytime.offer(sched)
    return sched


def _offer_images(topo: Topology, first: Schedule, max_chunks: int | None, trail: Trail,
                  late_s: float) -> None:
    """Step 1's second offer: a cold first schedule averaged over automorphisms of the
    fabric (:mod:`.first_images`), where the limit leaves room for it
    (:func:`.first_images.image_seconds` CPU seconds, over the CPU share); once started,
    it may finish up to ``late_s`` past the limit (:func:`.anytime.late`)."""
    if first.report.warm is not WarmUse.COLD or topo.num_gpus <= MWU_MAX_GPUS:
        return
    anytime.check_room("the first schedule's images",
                       image_seconds(topo) / anytime.cpu_share())
    t = time.perf_counter()
    with anytime.late(late_s):
        images = averaged_first(topo, first, max_chunks)
    if images is None:
        trail.add(Attempt(Method.FIRST, time.perf_counter() - t,
                          "declined: no automorphism found raises the first schedule's rate"))
        return
    anytime.offer(images)
    trail.add(Attempt(Method.FIRST, time.perf_counter() - t,
                      f"offered: {images.solver['algorithm']}"))


def _chain(topo: Topology, route: WarmRoute, backend: str, max_chunks: int | None,
           step_aware: Any, trail: Trail) -> Schedule:
    """Step 3: which method solves ``topo`` (:mod:`.chain`), each warm step on ``route``."""
    if not switches_balanced(topo):                   # ForestColl is exact on balanced only
        return solve_unbalanced(topo, route, backend, max_chunks, sub_forestcoll(backend, trail),
                                trail)
    t = time.perf_counter()
    coarse: Schedule | None = None                    # ForestColl's trees rounded too far
    try:
        sched = _typed_forestcoll(topo, route, backend, max_chunks, step_aware, trail)
    except BudgetUnpacked as e:
        if max_chunks is None:                        # a rounded schedule is no answer
            sched = Declined(f"ForestColl: {e}")
        else:
            trail.add(Attempt(Method.FORESTCOLL, time.perf_counter() - t, f"failed: {e}"))
            t = time.perf_counter()
            sched, coarse = _fewer_chunks(topo, route, backend, max_chunks, step_aware, trail, e)
    except SolveError as e:
        sched = Declined(f"ForestColl: {e}")
    if isinstance(sched, Declined):
        trail.add(Attempt(Method.FORESTCOLL, time.perf_counter() - t, f"declined: {sched.reason}"))
        bound = cut_bound_gbps(topo)
        return solve_by_general(topo, route, backend, max_chunks, sched.reason, bound, trail,
                                _balanced_seed(topo, bound, coarse, max_chunks, backend, trail))
    return fewer_trees(topo, sched, max_chunks, backend, route)


def _balanced_seed(topo: Topology, bound: float | None, coarse: Schedule | None,
                   max_chunks: int | None, backend: str, trail: Trail
                   ) -> Callable[[], RestrictionSeed | None] | None:
    """The general method's seed on a balanced fabric ForestColl declined
    (:func:`.general.restriction_seed.balanced_seed`: a few chunks per root of ForestColl's
    own trees, stopped at the cut bound ``x*``): at ``max_chunks=None``, made by
    ForestColl at :data:`.general.restriction_seed.SEED_CHUNKS`; at ``K``, where those
    chunk counts have just failed, only the trees ``coarse`` that rounded too far."""
    from .general.restriction_seed import balanced_seed, own_trees_seed

    if bound is None:
        return None
    if max_chunks is None:
        return SeedOnce(lambda: balanced_seed(topo, bound, sub_forestcoll(backend, trail)))
    if coarse is None:
        return None
    return SeedOnce(lambda: own_trees_seed(bound, coarse))


def _fewer_chunks(topo: Topology, route: WarmRoute, backend: str, max_chunks: int,
                  step_aware: Any, trail: Trail, failed: BudgetUnpacked
                  ) -> tuple[Schedule | Declined, Schedule | None]:
    """ForestColl with fewer chunks than the budget ``max_chunks=K`` whose packing failed
    (:class:`.budget.ChunkCounts` skips the limits that repeat it), kept when its rate
    is within :data:`.chain.RESTRICTION_ROUNDING_GAP` of the optimum; else declined (the
    general method runs), with the schedule that rounded too far, if any (its trees seed
    the general method).  The fast packers can miss a packing that exists (leaf-spine
    8x2x8 with 4 spines: 9 and 7 trees per root fail, 2 pack at 0.08 % below the optimum,
    where the general method took > 40 s; docs/allgather_history.md "Leaf-spine at K=10")."""
    reason = Declined(f"ForestColl: {failed}")
    counts = ChunkCounts(max_chunks)
    counts.failed(failed)
    for k in counts:
        try:
            sched = _typed_forestcoll(topo, route, backend, k, step_aware, trail)
        except SolveError as e:
            counts.failed(e)
            continue
        if isinstance(sched, Declined):
            return reason, None
        if sched.rate_gbps >= sched.lp_rate_gbps * (1 - RESTRICTION_ROUNDING_GAP):
            return sched, None
        return reason, sched
    return reason, None


def sub_forestcoll(backend: str, trail: Trail) -> ForestColl:
    """ForestColl as the method chain runs it on a balanced sub-fabric (the
    weaker-direction fabric, a balanced restriction, the general method's seed): cold on
    a ``None`` route, keeping what balancing loses (:attr:`.forestcoll.pack_plan.
    ForestCollAsk.lossy_balance`), as ``ask`` says otherwise."""

    def forestcoll(sub: Topology, r: WarmRoute | None, k: int | None,
                   ask: ForestCollAsk = ForestCollAsk()) -> Schedule | Declined:
        return _typed_forestcoll(sub, r or WarmRoute.plan(sub, None), backend, k, False, trail,
                                 dataclasses.replace(ask, lossy_balance=True))

    return forestcoll


def _typed_forestcoll(topo: Topology, route: WarmRoute, backend: str,
                      max_chunks: int | None, step_aware: Any, trail: Trail,
                      ask: ForestCollAsk = ForestCollAsk()) -> Schedule | Declined:
    """:func:`_forestcoll`, an internal error turned into a :class:`SolveError` naming the
    fabric (the chain of methods catches it)."""
    try:
        return _forestcoll(topo, route, backend, max_chunks, step_aware, trail, ask)
    except (KeyError, IndexError, AssertionError, ZeroDivisionError) as e:
        raise SolveError(f"ForestColl failed on {topo.name!r} ({type(e).__name__}: {e}); "
                         "a bug: please report the topology file") from e


def _forestcoll(topo: Topology, route: WarmRoute, backend: str, max_chunks: int | None,
                step_aware: Any, trail: Trail,
                ask: ForestCollAsk = ForestCollAsk()) -> Schedule | Declined:
    """Step 4 on a canonically listed ``topo``, as ``ask`` says
    (:class:`.forestcoll.pack_plan.ForestCollAsk`); :class:`.stage.Declined` when the exact
    optimum (``max_chunks=None``) needs more than :data:`.budget.EXACT_TREES_LIMIT`
    trees per root on a chain's sub-fabric (``lossy_balance``, unless ``scaled``),
    step-aware, or a fabric's own solve of at most :data:`SEEDED_GENERAL_MAX_GPUS` GPUs
    (larger ones pack them by the scaled packing alone, :func:`.forestcoll.above_limit.
    pack_scaled`) or from :data:`SEEDED_GENERAL_ENTRIES` entries ``k·n²``, or switch
    balancing loses capacity the optimum needs (unless ``lossy_balance``; a ``goal`` of
    ``EXACT`` declines there too, where only the optimum is kept).  The warm steps (the
    certified guesses, rerouting at cold's budget, the packing seeded with the previous
    shapes) run on ``route``; past its allowance the solve carries on cold from where
    it is."""
    run = Run.start(topo, route.warm, max_chunks)
    goal = Goal.of(max_chunks) if ask.goal is None else ask.goal
    lossy_balance, siblings_last = ask.lossy_balance, ask.siblings_last
    rewarm = run.prev is not None and not step_aware  # step-aware only reads the guides
    # the guesses skip a ``k`` cold declines: the seeded general method is cold's route
    run.cold_declines = lambda k: _declines(k, topo.num_gpus, max_chunks, goal, ask,
                                            bool(step_aware))
    since = route.used                                # this run's warm steps: from here
    run.warm_spent = lambda: route.spent(since)
    run.expect_cold = lambda cold_s: route.expect_cold(cold_s, topo)

    def carry_on_cold() -> None:                      # the phases so far are cold's
        if not route.active:
            run.prev, run.cuts = None, None

    if rewarm:                                        # guesses, certified
        quick = route.attempt("ForestColl-warm's guesses", Method.FORESTCOLL,
                              lambda _: _certified_guess(run), lambda: None, trail.attempts)
        if quick is not None:
            return quick
        carry_on_cold()

    anytime.check("ForestColl: before Phase 1")
    budget = phase_one_budget(topo, max_chunks, run.stats, run.hint_cuts, run.cuts, run.phase_one)
    declined = run.cold_declines(budget.k)
    if declined is not None:
        return Declined(declined)
    many = max_chunks is None and budget.k > EXACT_TREES_LIMIT
    if many:                                          # the scaled packing alone, cold
        run.prev, run.cuts = None, None
    # once this run's warm steps pass half of its predicted cold cost, go cold
    cold_s = predicted_cold_seconds(budget.k, topo.num_gpus)
    route.expect_cold(cold_s, topo)
    if rewarm and run.prev is not None:
        quick = route.attempt("ForestColl-warm's rerouting", Method.FORESTCOLL,
                              lambda _: keep_or_reroute(run, budget), lambda: None,
                              trail.attempts, route.cold_cap(cold_s, since))
        if quick is not None:
            return quick
        carry_on_cold()

    # balancing and Phases 2-3 cost several times Phase 1 and the budget (HPN 2048 GPUs:
    # 2.0 s vs 0.2-0.5 s): where less is left, their schedule would come past the limit
    anytime.check_room("ForestColl: before switch balancing",
                       PHASES_23_PER_PHASE_1 * (run.stats.get("phase1_s", 0.0)
                                                + run.stats.get("budget_s", 0.0)))
    arr = topo.arrays
    t = time.perf_counter()
    try:
        balanced = balanced_split(budget.fab, arr.is_switch, budget.k, budget.y, max_chunks,
                                  ask.headroom, budget.p1.rate,
                                  lossless=goal is Goal.EXACT and lossy_balance,
                                  fewer=budget.p1 if ask.fewer else None)
        balanced.record(run.stats)
        run.stats["balance_s"] = time.perf_counter() - t
        if not balanced.exact and (goal is Goal.EXACT or not lossy_balance):   # below the optimum
            return Declined("switch balancing lost capacity")
        anytime.check("ForestColl: before Phases 2-3")
        if step_aware:
            from .forestcoll.step_aware import StepAware, step_aware_pack   # only when asked for

            opts = step_aware if isinstance(step_aware, StepAware) else None
            result = step_aware_pack(balanced.split, arr.rank_of, balanced.k, run.guides,
                                     run.stats, backend, opts)
        elif many and balanced.k > EXACT_TREES_LIMIT:
            result = pack_scaled(balanced.split, arr.rank_of, balanced.k, run.stats)
        else:
            try:
                result = _pack(run, route, balanced, trail, route.cold_cap(cold_s, since),
                               goal, siblings_last)
            except SolveError:
                if balanced.fallback is None:
                    raise
                balanced = balanced.fallback   # fewer trees without loss did not pack
                result = _pack(run, route, balanced, trail, route.cold_cap(cold_s, since),
                               goal, siblings_last)
    except BudgetUnpacked:
        raise
    except SolveError as e:                           # this budget's split or packing failed
        raise BudgetUnpacked(budget.k, str(e)) from e
    return packed(run, Optimum.of(budget), result)


def _declines(k: int, n: int, max_chunks: int | None, goal: Goal, ask: ForestCollAsk,
              step_aware: bool) -> str | None:
    """Why ForestColl on ``n`` GPUs declines an exact packing of ``k`` trees per root at
    ``max_chunks=None`` (:func:`_forestcoll`'s rule), else ``None``: more than
    :data:`.budget.EXACT_TREES_LIMIT` (unless ``ask.scaled``), or ``k·n²`` past
    :data:`SEEDED_GENERAL_ENTRIES` where the seeded master is cheaper (a fabric's own
    solve, or the weaker-direction fabric, whose trees then seed the general method,
    :mod:`.chain`)."""
    if max_chunks is not None:
        return None
    many = k > EXACT_TREES_LIMIT
    own_seeded = not ask.scaled and n <= SEEDED_GENERAL_MAX_GPUS
    weaker_seeded = goal is Goal.DECLINABLE and n <= SEEDED_GENERAL_MAX_GPUS
    costly = (weaker_seeded or not (ask.lossy_balance or step_aware)) and \
        k * n * n > SEEDED_GENERAL_ENTRIES
    if not (many or costly) or not ((ask.lossy_balance and not ask.scaled) or step_aware
                                    or own_seeded):
        return None
    return f"more than {EXACT_TREES_LIMIT} exact trees per root" if many else \
        f"{k} exact trees per root: the seeded master is cheaper"


def _certified_guess(run: Run) -> Schedule | None:
    """ForestColl-warm's two guesses, each certified (:mod:`.warm.certify`), or ``None``."""
    run.cuts = CutBounds(fabric_of(run.topo)[0])      # cut bounds shared by the guesses
    quick = warm_guess(run)
    if quick is not None:
        return quick
    run.stats.setdefault(GuessKind.X_STAR.value, Certificate.REJECTED.value)
    anytime.check("ForestColl-warm: after the x* guess")
    quick = warm_budget(run)
    if quick is not None:
        return quick
    run.stats.setdefault(GuessKind.BUDGET.value, Certificate.REJECTED.value)
    return None


def _pack(run: Run, route: WarmRoute, balanced: Any, trail: Trail, most: float,
          goal: Goal, siblings_last: bool = True) -> Any:
    """Phases 2-3: seeded with the previous tree shapes on a warm route (a warm step,
    its repair searches sized to the allowance left, at most ``most`` seconds:
    :meth:`.warm.route.WarmRoute.cold_cap`), else cold.  Phase 2's spread split does not
    depend on the previous trees, so on a warm route it is cold's own work, done once
    before the warm step and reused by the cold fallback (it was redone there: a warm
    solve declined in the seeded packing cost cold + its spread split + the allowance)."""
    arr = run.topo.arrays
    spread = None

    def cold() -> Any:
        run.prev = None
        return pack(balanced.split, arr.rank_of, balanced.k, {}, run.stats, None, goal,
                    siblings_last, spread)

    if run.prev is None:
        return cold()
    t = time.perf_counter()
    spread = spread_logical(balanced.split, arr.rank_of, siblings_last)
    run.stats["phase2_s"] = time.perf_counter() - t
    return route.attempt("the packing seeded with the previous trees", Method.FORESTCOLL,
                         lambda _: pack(balanced.split, arr.rank_of, balanced.k, run.guides,
                                        run.stats, run.shapes, goal, siblings_last, spread),
                         cold, trail.attempts, most)


def _at_time_limit(topo: Topology, best: Schedule, max_chunks: int | None) -> Schedule:
    """The best schedule offered when the limit passed, reported as stopped there, with
    the tightest single-GPU cut bound (:func:`.forestcoll.throughput.cut_upper_bound`, no max-flow)
    or the method's own bound, if lower, as its certified bound."""
    fab, quantum = fabric_of(topo)
    bound = gbps(cut_upper_bound(fab), quantum)
    base = best.report                                # every schedule maker sets one
    if base.bound_gbps is not None:
        bound = min(bound, base.bound_gbps)
    report = dataclasses.replace(base, termination=Termination.TIME_LIMIT, max_chunks=max_chunks,
                                 bound_gbps=max(bound, best.rate_gbps))
    stats = {**best.stats, "status": Termination.TIME_LIMIT.value}
    return dataclasses.replace(best, stats=stats, report=report)


def _with_trail(sched: Schedule, trail: Trail, seconds: float) -> Schedule:
    """The report with the methods tried and the whole call's seconds."""
    report = sched.report
    if report is None:                                # every maker sets one; be safe
        raise SolveError("internal: a schedule was built without a report; please report it")
    sched.report = dataclasses.replace(report, attempts=tuple(trail.attempts), seconds=seconds)
    return sched


def _with_route(sched: Schedule, route: WarmRoute) -> Schedule:
    """The route taken in ``stats["warm_route"]`` (and why a warm start was declined in
    ``stats["warm_declined"]``); ``report.warm`` is ``declined`` when a warm start was
    given but the schedule is cold's."""
    taken = route.taken(sched.report.warm)
    sched.stats["warm_route"] = taken.value
    if route.reason is not None:
        sched.stats["warm_declined"] = route.reason
    if taken is RouteTaken.DECLINED:
        sched.report = dataclasses.replace(sched.report, warm=WarmUse.DECLINED)
    return sched


def _with_cold_seconds(sched: Schedule, warm: Schedule | None, route: WarmRoute,
                       cpu: float) -> Schedule:
    """The cold solve time the next warm start measures its allowance by (wall and this
    thread's CPU seconds), and whether that cold solve was costly (it went past
    ForestColl on the fabric itself): this call's when its schedule is cold's (its
    seconds without kernel loading, less the warm steps'; ``cpu``: its CPU seconds
    without kernel loading), else the ones ``warm`` carries."""
    report = sched.report
    costly: bool | None = report.method is not Method.FORESTCOLL
    cold_cpu: float | None
    if report.termination is Termination.TIME_LIMIT:
        cold = cold_cpu = costly = None               # a cold solve would take longer
    elif report.warm in (WarmUse.COLD, WarmUse.DECLINED):
        cold = max(0.0, report.seconds - route.used_wall)
        cold_cpu = max(0.0, cpu - route.used)
    else:
        previous = warm.report if isinstance(warm, Schedule) else None
        cold = previous.cold_seconds if previous is not None else None
        cold_cpu = previous.cold_cpu_seconds if previous is not None else None
        costly = previous.cold_costly if previous is not None else None
    sched.report = dataclasses.replace(report, cold_seconds=cold, cold_costly=costly,
                                       cold_cpu_seconds=cold_cpu)
    return sched
