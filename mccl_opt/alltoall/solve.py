"""``solve_alltoall``: the public AllToAll synthesizer (paper §4.2, App. D, App. G).

Read top to bottom, a call tries the cheapest path that can be proven optimal first:

1. *reuse* (:func:`~.local.reuse_certified`): after a capacity-only change that leaves
   the old LP optimal (its Farley certificate still holds), the old schedule stands;
2. *local* (:func:`~.local.local_resolve`): re-optimise only the pairs a capacity
   change touches, with a certificate over all pairs;
3. *full*: column generation on a master seeded with the warm columns
   (:mod:`.driver`; :mod:`.latency` for ``max_steps="min"``) and the deep-dive rounding;
   cold instead under a time limit (routed first, :mod:`.direct`) and after a repair
   whose cold routing is certified optimal (docs/alltoall.md, *Warm is never the slow
   path*).

Whatever the path, the warm schedule re-rated on the new fabric is kept when it is
faster than the result (:mod:`.kept`).

Each path returns an :class:`~.assemble.Outcome`; :func:`~.assemble.make_schedule`
builds the schedule, the bottleneck cut and ``stats`` (the JSON view of the typed
:class:`~.assemble.RunReport`).
"""

from __future__ import annotations

import dataclasses

import time
from typing import Any

from ..entry_checks import (check_backend, check_max_chunks, check_time_limit, check_topology,
                            check_warm)
from ..errors import InputError, SolveError
from ..kernel_time import charge_apart, kernel_seconds
from ..report import stamp
from ..schedule import Schedule
from ..topology import Topology
from .assemble import Outcome, make_schedule
from .colgen import CGOptions, CGStatus
from .cut_bound import cut_bound_gbps
from .direct import no_room_for_master, routed_outcome
from .driver import certified_cold_routing, cold_routing, round_solved, run_cg
from .kept import Kept, keep_if_better, kept_schedule
from .local import GaveUp, local_eligible, local_resolve, raises_a_binding_link, reuse_certified
from .pricing import PricedColumns
from .problem import Problem, problem_for
from .state import AllToAllWarmState
from .warm import changes_are_nonbinding, sharply_fallen, warm_columns

__all__ = ["solve_alltoall", "WARM_UNDER_A_LIMIT_MAX_PAIRS"]

#: Under a time limit, a warm solve that reaches the full path carries its columns
#: (the full warm master, less the routes through a sharply fallen link:
#: :func:`.driver.build_master`) below this many pairs, as it does without a limit,
#: and solves cold from its routing above (docs/alltoall.md, *A sharp fall under a
#: time limit*: an NVSwitch lane at 2.5 % on HPN 2x4x8).  Below it a warm master's
#: solves take milliseconds to tenths of a second, and the cold start's heading-in
#: rounds cost more (HPN 2x4x8 loop jobs: 1.5-3x the warm master's CPU, docs/alltoall.md,
#: *Under a time limit*); above it a warm master has no check that its first solve fits
#: the limit (:mod:`.direct`).
WARM_UNDER_A_LIMIT_MAX_PAIRS = 30_000


def _check_args(topo: Topology, warm: Any, backend: Any, max_chunks: Any, max_steps: Any,
                time_limit: Any) -> None:
    """The AllToAll side of the synthesizers' one error contract (:mod:`..entry_checks`),
    plus the step bound only AllToAll takes."""
    check_topology(topo)
    check_max_chunks(max_chunks)
    if max_steps is not None and max_steps != "min" and (
            isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
        raise InputError(f"max_steps must be None, a positive integer or 'min', got {max_steps!r}")
    check_time_limit(time_limit)
    check_backend(backend)
    check_warm(warm, "alltoall", (AllToAllWarmState,))


def solve_alltoall(topo: Topology, warm: Schedule | AllToAllWarmState | None = None, backend: str = "highs",
                   max_chunks: int | None = 10, max_steps: int | str | None = None,
                   time_limit: float | None = None, *, rel_tol: float = 1e-7,
                   min_steps_tol: float = 1e-6) -> Schedule:
    """Synthesize an AllToAll schedule for ``topo`` (README "Python API").

    ``warm``: a previous schedule (or its ``warm_state``) whose still-valid columns seed
    the master.  ``max_chunks``: chunks of ``1/K`` per pair (``None``: the fractional LP
    optimum).  ``max_steps``: ``None`` (no bound), an int (GPU-arrivals per path) or
    ``"min"`` (the smallest bound that keeps the LP optimum within ``min_steps_tol``,
    paper App. D).  ``time_limit`` (s): return the best schedule found so far with
    ``stats["status"] == "time_limit"``.  ``rel_tol``: column generation stops when the
    master is within this relative gap of its certified bound.  Numba kernels compiled or
    loaded inside the call are timed apart (``stats["kernel_load_s"]``,
    :mod:`mccl_opt.kernel_time`), not in ``seconds``.
    """
    _check_args(topo, warm, backend, max_chunks, max_steps, time_limit)
    with kernel_seconds() as kernels:
        sched = _synthesize(topo, warm, backend, max_chunks, max_steps, time_limit, rel_tol,
                            min_steps_tol)
    return stamp(charge_apart(sched, kernels))


def _synthesize(topo: Topology, warm: Schedule | AllToAllWarmState | None, backend: str,
                max_chunks: int | None, max_steps: int | str | None, time_limit: float | None,
                rel_tol: float, min_steps_tol: float) -> Schedule:
    t0 = time.perf_counter()
    deadline = None if time_limit is None else t0 + float(time_limit)
    prob = problem_for(topo)
    options = CGOptions(rel_tol=rel_tol)
    state = warm.warm_state if isinstance(warm, Schedule) else warm
    state = state if isinstance(state, AllToAllWarmState) else None
    steps = topo.num_nodes - 1 if max_steps in (None, "min") else int(max_steps)

    outcome: Outcome | None = None
    if max_steps != "min":
        outcome = reuse_certified(prob, state, backend, steps, max_chunks, rel_tol)
    kept = (None if max_steps == "min" or outcome is not None
            else kept_schedule(prob, state, max_chunks, steps))
    tried_local = (outcome is None and max_steps != "min"
                   and local_eligible(prob, state, max_chunks)
                   and not (state.basis is not None and changes_are_nonbinding(prob, state))
                   and not raises_a_binding_link(prob, state)
                   and not sharply_fallen(prob, state).any())
    gave_up: dict = {}
    if tried_local:
        local = local_resolve(prob, state, backend, steps, max_chunks, options, deadline)
        if isinstance(local, GaveUp):
            gave_up["local_gave_up"] = local.reason
        else:
            outcome = local
    if outcome is None:
        # under a time limit the full path routes first and, when the first master
        # cannot fit in the time left, the routing itself is the schedule
        # (:mod:`.direct`); with room, it carries the warm columns only below
        # :data:`WARM_UNDER_A_LIMIT_MAX_PAIRS` (a large warm master has no such check:
        # 2,048 GPUs, 5-10 s past a 0.5 s limit; docs/alltoall.md)
        carry = warm is not None and (
            deadline is None or max_steps == "min"
            or prob.num_pairs < WARM_UNDER_A_LIMIT_MAX_PAIRS)
        columns = warm_columns(prob, warm) if carry else None
        search: dict = {}
        if max_steps == "min":
            from .latency import min_steps_solve    # the step search: only when asked for

            solved, search = min_steps_solve(prob, backend, columns, deadline, options,
                                             min_steps_tol)
            outcome = round_solved(prob, solved, backend, max_chunks, deadline, state)
        else:
            routing = cold_routing(prob, steps, deadline) if deadline is not None else None
            if routing is not None and no_room_for_master(deadline, routing[1]):
                outcome = routed_outcome(prob, routing[0], max_chunks, backend, steps)
            else:
                # after a repair, a cold start whose first routing is already optimal
                # costs less than any warm master (docs/alltoall.md, *Warm is never
                # the slow path*)
                if columns is not None and _repaired(prob, state):
                    certified = certified_cold_routing(prob, steps)
                    if certified is not None:
                        routing, columns = certified, None
                outcome = _limited_cg(prob, backend, steps, columns, deadline, options, state,
                                      routing, max_chunks, kept)
        outcome.report.extra.update(search, **gave_up, local_fallback=bool(tried_local))
    outcome = keep_if_better(outcome, kept)

    sched = make_schedule(prob, outcome, max_chunks)
    if outcome.report.status is CGStatus.TIME_LIMIT:
        _with_cut_bound(sched, topo)
    seconds = time.perf_counter() - t0
    sched.stats["seconds"] = sched.solver["seconds"] = seconds
    sched.stats["lp_phase_seconds"] = seconds if outcome.lp_done is None else outcome.lp_done - t0
    sched.report = dataclasses.replace(sched.report, seconds=seconds)
    return sched


def _limited_cg(prob: Problem, backend: str, steps: int, columns, deadline: float | None,
                options: CGOptions, state: AllToAllWarmState | None,
                routing: tuple[PricedColumns, float] | None, max_chunks: int | None,
                kept: Kept | None) -> Outcome:
    """Column generation and rounding (the deep dive's bar raised to the ``kept`` warm
    schedule's rate); under a time limit, a first master that fails
    (numerical trouble) leaves the initial routing as the schedule (issue 27: a
    200k-link solve lost everything to the first master's failure)."""
    try:
        solved = run_cg(prob, backend, steps, columns, deadline, options, state, routing)
    except SolveError as e:
        if routing is None or deadline is None:
            raise
        outcome = routed_outcome(prob, routing[0], max_chunks, backend, steps)
        outcome.report.extra["stopped_by"] = str(e)
        return outcome
    return round_solved(prob, solved, backend, max_chunks, deadline, state,
                        0.0 if kept is None else kept.rate)


def _repaired(prob: Problem, state: AllToAllWarmState | None) -> bool:
    """Only capacities changed, and a link the old LP saturated gained capacity."""
    return (state is not None and state.fabric.same_links(prob)
            and raises_a_binding_link(prob, state))


def _with_cut_bound(sched: Schedule, topo: Topology) -> None:
    """A schedule stopped by its time limit: its certified bound is the tighter of
    column generation's (none when it stopped before pricing) and the node-set cut bound
    (:mod:`.cut_bound`), never below the schedule's own rate."""
    report = sched.report
    bound = cut_bound_gbps(topo)
    if report.bound_gbps is not None:
        bound = min(bound, report.bound_gbps)
    bound = max(bound, sched.rate_gbps)
    sched.report = dataclasses.replace(report, bound_gbps=bound)
    sched.stats["cut_bound_gbps"] = bound
