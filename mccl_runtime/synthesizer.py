"""Synthesizers for the Schedule Manager (paper §3.2, the optimizer wrapper): the product
optimizer (:func:`solver_synthesizer`, warm ``mccl_opt.solve_alltoall`` /
``solve_allgather`` with their kernels loaded ahead), the round-aware picks for executors
that run a hop per round, and :func:`cold_on_small`.  A synthesizer is
``synthesize(kind, topology, warm, time_limit_s) -> Schedule``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from mccl_opt.errors import MCCLError
from mccl_opt.schedule import Schedule
from mccl_opt.topology import Topology

if TYPE_CHECKING:
    from mccl_opt.lowering.rounds import RoundPieces

__all__ = ["Synthesizer", "solver_synthesizer", "cold_on_small", "tree_rounds"]

#: ``synthesize(kind, topology, warm, time_limit_s) -> Schedule``
Synthesizer = Callable[[str, Topology, "Schedule | None", "float | None"], Schedule]


def solver_synthesizer(backend: str = "highs", max_chunks: int = 10, shallow: bool = False,
                       unit_tolerance: float | None = 0.005, kernels: str = "eager",
                       pieces: RoundPieces | None = None) -> Synthesizer:
    """The product optimizer: ``mccl_opt.solve_alltoall`` / ``solve_allgather``, warm;
    their compiled kernels are loaded here (:func:`.warmup.load_kernels`), not at the
    first failure.

    ``shallow``: for executors that run a tree hop per round (store and forward, as the
    torch.distributed executor does, docs/executor.md): when a warm AllGather start
    returns deeper trees than the schedule it started from, solve cold too and keep the
    cold schedule if its rate is as high and its trees shallower.  For AllToAll the warm
    start is also solved cold and with minimal step bounds, and the candidate of the
    warm rate with the lowest store-and-forward round time is kept
    (:func:`_round_aware_alltoall`).  Two schedules of one rate are equal for the fluid model (paper §4) but not for such an executor, where
    each round lasts as long as its busiest link: on three degraded links of HPN 1x2x4
    the warm trees took 6 rounds and ran at 0.53 of the cold schedule's 3.

    ``unit_tolerance``: an AllGather whose fabric has a capacity within this fraction below
    a multiple of the tree bandwidth (a measured 49.9 for a true 50 Gbps NIC) is solved
    with that capacity raised to the multiple
    (:func:`mccl_opt.allgather.unit_tolerance.tolerant_allgather`), so it gets the forest
    of the true capacity: forests of one rate from 49.9 and 50 differed by 9 % in
    simulated time on irregular fabric 7 (docs/runtime.md).  ``None``: the solver's
    schedule as it is.

    ``kernels`` (:data:`.warmup.KERNEL_MODES`): ``"eager"`` loads every kernel here,
    ``"background"`` in a thread, ``"lazy"`` none ahead (a solve path then loads or
    compiles its own on first use; ``controller serve --kernels``)."""
    from .warmup import check_kernels_mode, load_kernels, load_kernels_in_background

    mode = check_kernels_mode(kernels)
    if shallow:     # the round-aware pick's model, imported here rather than inside the first re-synthesis
        import mccl_opt.lowering.rounds  # noqa: F401
    if mode == "eager":
        load_kernels(backend)
    elif mode == "background":
        load_kernels_in_background(backend)

    def _tolerant(topo: Topology, solve: Callable[[Topology], Schedule]) -> Schedule:
        if unit_tolerance is None:
            return solve(topo)
        from mccl_opt.allgather.unit_tolerance import tolerant_allgather

        return tolerant_allgather(topo, solve, max_chunks, unit_tolerance)

    def synthesize(kind: str, topo: Topology, warm: Schedule | None,
                   time_limit_s: float | None) -> Schedule:
        import mccl_opt

        if kind == "alltoall":
            if shallow and warm is not None:
                return _round_aware_alltoall(topo, warm, backend, max_chunks, time_limit_s, pieces)
            return mccl_opt.solve_alltoall(topo, warm=warm, backend=backend, max_chunks=max_chunks,
                                           time_limit=time_limit_s)
        t0 = time.perf_counter()
        sched = _tolerant(topo, lambda fabric: mccl_opt.solve_allgather(
            fabric, warm=warm, backend=backend, max_chunks=max_chunks, time_limit=time_limit_s))
        if shallow and warm is not None and tree_rounds(sched) > tree_rounds(warm):
            left = _left_for_another(time_limit_s, t0, time.perf_counter() - t0)
            if left is None or left > 0:
                cold = _tolerant(topo, lambda fabric: mccl_opt.solve_allgather(
                    fabric, warm=None, backend=backend, max_chunks=max_chunks, time_limit=left))
                if cold.rate_gbps >= sched.rate_gbps * (1 - 1e-9) and tree_rounds(cold) < tree_rounds(sched):
                    sched = cold
        return sched

    return synthesize


def cold_on_small(synthesize: Synthesizer, max_gpus: int) -> Synthesizer:
    """``synthesize`` that ignores the warm start on fabrics of at most ``max_gpus`` GPUs
    (the job's fabric: a communicator's sub-fabric counts its members).  The fluid LP
    (paper §4) has many optima of one rate; on small fabrics warm AllGather trees of the
    cold rate simulated at 0.90-0.95 of the cold schedule (irregular 10-GPU fabric,
    docs/runtime.md "Ramps and equal-rate optima"), and a cold solve there costs
    tens of milliseconds at most, so the warm start buys little.  ``max_gpus=0`` keeps every warm start."""
    if max_gpus < 0:
        raise MCCLError(f"the cold re-synthesis bound (--cold-gpus) must be >= 0 GPUs, got {max_gpus!r}")

    def synthesize_small_cold(kind: str, topo: Topology, warm: Schedule | None,
                              time_limit_s: float | None) -> Schedule:
        return synthesize(kind, topo, None if topo.num_gpus <= max_gpus else warm, time_limit_s)

    return synthesize_small_cold


def _round_aware_alltoall(topo: Topology, warm: Schedule, backend: str, max_chunks: int,
                          time_limit_s: float | None, pieces: RoundPieces | None = None) -> Schedule:
    """The warm AllToAll re-synthesis for an executor that runs a GPU hop per round: the
    warm solve, the warm and (unless the warm solve ran cold) the cold solve with the
    smallest step bound that keeps its rate (``max_steps="min"``, paper App. D), and then
    the plain cold solve; of those
    at least as fast as the warm one (LP
    rate), the one with the lowest store-and-forward round time on the measured fabric
    (:func:`mccl_opt.lowering.rounds.round_time`, chunks cut as ``pieces`` says; ties keep
    the earlier candidate).  The
    fluid LP has many optima of one rate; on HPN 1x2x4 with a NIC at 50 of 400 Gbps,
    warm optima sent over the slow NIC in two rounds and ran at 0.53-0.62 of offline on
    gloo ranks in 7 of 16 runs (docs/executor.md, "AllToAll on gloo ranks")."""
    import mccl_opt
    from mccl_opt.alltoall.warm import fell_sharply
    from mccl_opt.lowering.rounds import round_time
    from mccl_opt.report import WarmUse

    t0 = time.perf_counter()
    best = mccl_opt.solve_alltoall(topo, warm=warm, backend=backend, max_chunks=max_chunks, time_limit=time_limit_s)
    took = time.perf_counter() - t0
    best_t = round_time(best, topo, pieces=pieces)
    # a warm solve that ran cold (a repair whose cold routing is certified, or 30,000
    # pairs and more under a limit) already is the cold solve; after a link fell sharply
    # (e.g. a dead NIC) the cold one with the smallest step bound improved the pick by
    # 0.3 % on average (at most 6 %) on 30 dead-link fabrics for a third more CPU, and
    # the plain cold one, now that such a warm solve carries its columns, 3 % in mean
    # round time for 70 % more CPU (docs/executor.md, "The round-aware pick under load";
    # docs/alltoall.md, *A sharp fall under a time limit*): both are skipped.  The plain
    # cold solve tied or lost on 48 fabrics warm from the healthy schedule, but a warm
    # start from a version built on a stalled reading (another GPU's ToR cable read at
    # 0.4-0.75) keeps its round structure: the other three then reach 0.77-0.92 of the
    # cold solve's round time (docs/executor.md, "All seven classes on real ranks")
    skip_cold = best.report.warm is WarmUse.COLD or fell_sharply(topo, warm)
    cold = () if skip_cold else ((None, "min"), (None, None))
    for start, steps in ((warm, "min"), *cold):
        left = _left_for_another(time_limit_s, t0, took)
        if left is not None and left <= 0:
            break
        t1 = time.perf_counter()
        cand = mccl_opt.solve_alltoall(topo, warm=start, backend=backend, max_chunks=max_chunks,
                                       max_steps=steps, time_limit=left)
        took = time.perf_counter() - t1
        t = round_time(cand, topo, pieces=pieces)
        if cand.rate_gbps >= best.rate_gbps * (1 - 1e-9) and t < best_t * (1 - 1e-6):
            best, best_t = cand, t
    return best


def _left_for_another(time_limit_s: float | None, t0: float, last_s: float) -> float | None:
    """Seconds of a job's ``time_limit_s`` (started at ``t0``) left for one more solve
    attempt, ``None`` without a limit; 0.0 when less is left than the last attempt took:
    another one would most likely end past the limit (a synthesizer returns its first
    schedule late when even that does not fit), so none is started."""
    if time_limit_s is None:
        return None
    left = time_limit_s - (time.perf_counter() - t0)
    return left if left >= last_s else 0.0


def tree_rounds(schedule: Schedule) -> int:
    """Rounds of an AllGather schedule run a tree hop per round: its deepest tree
    (GPU hops from the root); 0 for other collectives."""
    if schedule.collective != "allgather":
        return 0
    return max((max(c.depths().values()) for c in schedule.chunks), default=0)
