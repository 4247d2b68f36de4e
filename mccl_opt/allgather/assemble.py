"""One solve's context and the one place an AllGather :class:`~mccl_opt.Schedule` is built.

:class:`Run` carries what every phase of one ``solve_allgather`` call needs (the
topology, the chunk budget, the previous schedule, the ``stats`` JSON view, the start
time, what a failed reroute already proved).  A schedule comes from one of three tree
sources, each certified optimal for the chunk budget (docs/allgather.md): the previous
schedule kept (:func:`kept`), the previous trees rerouted (:func:`rerouted`), or Phase 3's
packing mapped to physical trees (:func:`packed`); :func:`assemble` builds the schedule
(rate, bottleneck of Phase 1's tight cut, solver record, warm state) for all three.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction
from typing import Any, Callable, Sequence

import numpy as np

from .. import anytime
from ..errors import SolveError
from ..report import Method, SolveReport, Termination, WarmUse
from ..schedule import Schedule, TreeChunk, bottleneck_links, schedule_rate
from ..topology import Topology
from .budget import CutBounds
from .forestcoll.mapping import class_ranks, map_classes, tree_chunks, tree_loads
from .forestcoll.pack_steps import Packed, Shapes
from .forestcoll.pipeline import Budget, gbps
from .warm.reroute import Rerouted
from .forestcoll.throughput import Fabric, PhaseOneResult
from .warm.kept import AllGatherWarmState, KeptTrees
from .warm.previous import Previous

__all__ = ["Run", "Optimum", "RerouteOutcome", "assemble", "kept", "rerouted", "packed",
           "MAPPING"]

#: where a time limit stops the mapping of Phase 3's classes onto physical trees: it
#: checks the clock before the mapping, the chunks and the loads
MAPPING = "Phase 3: the trees' mapping"


class RerouteOutcome(str, Enum):
    """Whether the previous trees were rerouted to a target (``stats['reroute']``)."""

    DONE = "done"
    FAILED = "failed"


@dataclass
class Run:
    """One ``solve_allgather`` call.  ``prev``: the previous schedule (``None`` cold);
    ``cuts``: cut bounds shared by the warm guesses; ``failed_target``: the ``(k, y)``
    a reroute already failed to reach (it would fail again); ``reroute``: the last
    reroute's outcome; ``phase_one``: the exact Phase 1 a warm guess ran (cold's own:
    reused when the solve goes on cold); ``warm_spent``: CPU seconds this run's warm
    steps have taken so far (:meth:`.warm.route.WarmRoute.spent`; rerouting counts them
    against its cap); ``expect_cold``: tells the warm route this state's predicted cold
    CPU seconds once its budget is known (:meth:`.warm.route.WarmRoute.expect_cold`: the
    allowance shrinks to a share of it); ``cold_declines``: why cold declines an exact packing of ``k``
    trees per root, or ``None`` (a guess at such a ``k`` is not certified: cold's route
    is then another method); ``stats``: the schedule's JSON view, filled as phases run."""

    topo: Topology
    max_chunks: int | None
    stats: dict[str, Any]
    t_start: float
    prev: Previous | None = None
    cuts: CutBounds | None = None
    failed_target: tuple[int, Fraction] | None = None
    reroute: RerouteOutcome | None = None
    phase_one: PhaseOneResult | None = None
    warm_spent: Callable[[], float] | None = None
    expect_cold: Callable[[float], None] = lambda cold_s: None
    cold_declines: Callable[[int], str | None] = lambda k: None

    @classmethod
    def start(cls, topo: Topology, warm: Schedule | None, max_chunks: int | None) -> "Run":
        run = cls(topo, max_chunks, {"warm": warm is not None}, time.perf_counter())
        run.prev = None if warm is None else Previous(warm, topo)
        return run

    @property
    def hint_cuts(self) -> list[np.ndarray]:
        return [] if self.prev is None else self.prev.hint_cuts

    @property
    def guides(self) -> dict[int, np.ndarray]:
        return {} if self.prev is None else self.prev.guides

    @property
    def shapes(self) -> Shapes | None:
        return None if self.prev is None else self.prev.shapes


@dataclass(frozen=True)
class Optimum:
    """What certifies a schedule's rate: the integer fabric, the Phase 1 result whose
    cut is the bottleneck (exact, or the guessed bound a certificate proved exact),
    ``x*`` in Gbps and the max-flows spent beyond Phase 1."""

    fab: Fabric
    p1: PhaseOneResult
    x_star_gbps: float
    maxflows: int

    @classmethod
    def of(cls, budget: Budget) -> "Optimum":
        return cls(budget.fab, budget.p1, budget.x_star_gbps, budget.maxflows)

    @classmethod
    def guessed(cls, fab: Fabric, p1: PhaseOneResult, quantum: float,
                maxflows: int) -> "Optimum":
        return cls(fab, p1, gbps(p1, quantum), maxflows)


def cut_ids(topo: Topology, p1: PhaseOneResult) -> set[str]:
    """Node ids of Phase 1's tight set."""
    node_ids = [n.id for n in topo.nodes]
    return {node_ids[i] for i in np.flatnonzero(p1.cut)}


def assemble(run: Run, opt: Optimum, k: int, chunks: Sequence[TreeChunk], loads: np.ndarray,
             state: KeptTrees, warm: WarmUse) -> Schedule:
    """The schedule of ``chunks`` (``k`` unit trees per root) with share ``loads`` per link;
    its report: ForestColl, optimal at the chunk budget, bounded by ``x*``."""
    topo, stats = run.topo, run.stats
    rate = schedule_rate(topo, loads)
    seconds = time.perf_counter() - run.t_start
    stats["total_s"] = seconds
    # the quantized optimum may sit up to 5e-7 below a schedule's true rate (.fabric)
    optimum = max(opt.x_star_gbps, rate)
    report = SolveReport(collective="allgather", method=Method.FORESTCOLL,
                         termination=Termination.OPTIMAL, bound_gbps=optimum, warm=warm,
                         max_chunks=run.max_chunks, seconds=seconds, k=int(k))
    return Schedule(
        collective="allgather", topology=topo.name, gpus=topo.gpus, rate_gbps=rate,
        lp_rate_gbps=optimum, max_chunks=run.max_chunks, chunks=chunks,
        bottleneck=bottleneck_links(topo, loads, rate, k, saturated=opt.fab.cut_arcs(opt.p1.cut)),
        solver={"backend": "maxflow", "seconds": seconds,
                "maxflow_calls": opt.p1.maxflow_calls + opt.maxflows,
                "algorithm": "forestcoll" if warm is WarmUse.COLD else "forestcoll-warm"},
        stats=stats, warm_state=AllGatherWarmState(trees=state), report=report)


def kept(run: Run, opt: Optimum, loads: np.ndarray) -> Schedule:
    """The previous trees, re-rated and re-certified on the new capacities."""
    prev = run.prev.schedule
    state = run.prev.same_fabric
    run.stats.update({key: prev.stats[key] for key in ("num_trees", "max_depth", "mean_depth")
                      if key in prev.stats})
    run.stats["k"], run.stats["reused_schedule"] = state.k, True
    return assemble(run, opt, state.k, prev.chunks, loads,
                    state.with_cut(cut_ids(run.topo, opt.p1)), WarmUse.KEPT)


def rerouted(run: Run, opt: Optimum, result: Rerouted) -> Schedule:
    """The schedule of rerouted previous trees."""
    forest = result.forest
    run.stats.update(k=forest.k, rerouted_edges=result.moved_edges,
                     rerouted_trees=result.rebuilt_trees, num_trees=int(forest.roots.size),
                     max_depth=int(forest.depth.max()), mean_depth=float(forest.depth.mean()))
    state = KeptTrees.of_trees(run.topo, cut_ids(run.topo, opt.p1), forest.k, forest.shapes(),
                               result.loads, forest=forest)
    return assemble(run, opt, forest.k, forest.tree_chunks(), result.loads, state,
                    WarmUse.REROUTED)


def packed(run: Run, opt: Optimum, result: Packed) -> Schedule:
    """Physical trees of Phase 3's classes (:mod:`.forestcoll.mapping`), their loads and rate."""
    topo, stats, k = run.topo, run.stats, result.k
    arr = topo.arrays
    t = time.perf_counter()
    anytime.check(MAPPING)       # 17 ms CPU at 512 GPUs, K=2 (docs/allgather.md)
    arcs, ranks, depth = class_ranks(result.classes, result.lg)
    mapped = map_classes(result.classes, result.lg, (arcs, ranks, depth))
    del arcs, depth                                  # 0.6 GB each at 4096 GPUs, k = 9
    if mapped is None:
        raise SolveError("internal: Phase 2's path bundles do not carry the logical links' "
                         "units; please report the topology")
    trees, depths = mapped
    anytime.check(MAPPING)
    chunks = tree_chunks(trees, k, [n.id for n in topo.nodes], arr.gpu_nodes)
    link = np.full((topo.num_nodes, topo.num_nodes), -1, np.int64)
    link[arr.tail, arr.head] = np.arange(arr.tail.size)
    anytime.check(MAPPING)
    loads = tree_loads(trees, k, link, topo.num_links)
    stats["mapping_s"] = time.perf_counter() - t
    stats["num_trees"] = len(chunks)
    stats["max_depth"] = int(np.max(depths))
    stats["mean_depth"] = float(np.mean(depths))
    if run.guides:
        stats["guided_roots"] = len(run.guides)
    state = KeptTrees.of_trees(topo, cut_ids(topo, opt.p1), k, _shapes_of(result, ranks), loads,
                               mapped=trees, tree_depths=depths)
    return assemble(run, opt, k, chunks, loads, state,
                    WarmUse.COLD if run.prev is None else WarmUse.SHAPES)


def _shapes_of(result: Packed, ranks: np.ndarray) -> Shapes:
    """Rank-space shapes of the classes (``ranks``: their parent ranks), by root and
    largest first."""
    roots = np.array([c.root for c in result.classes], np.int64)
    mults = np.array([c.mult for c in result.classes], np.int64)
    order = np.lexsort((-mults, roots))            # stable: as sorted() by (root, -mult)
    if (order[1:] > order[:-1]).all():             # already in order: no copy
        return roots, ranks
    return roots[order], ranks[order]
