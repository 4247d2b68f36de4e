"""Phases 2+3 of ForestColl (paper §4.3): the spread split, then the packers in the order
of a :class:`.pack_plan.PackPlan` (:func:`pack`), shared by the solve
(:func:`~mccl_opt.allgather.solve.solve_allgather`) and step-aware switch removal
(:mod:`.step_aware`).

:func:`pack` makes the plan once from the caller's :class:`~.pack_plan.Goal`, then
:class:`_Packer` runs its steps, one method per :class:`~.pack_plan.Step`, until one
packs; each packer certifies itself (a packing that completes respects every link's
units).  The typed result :class:`Packed` names the split and the packer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from typing import Any

import numpy as np

from mccl_opt import anytime, progress
from mccl_opt.errors import SolveError
from .pack_plan import Goal, PackPlan, Step, plan_pack
from .packing.contraction import tight_alone
from .packing.exact_packing import EXACT_PACK_MAX_EDGES, exact_pack_stage
from .packing.few_trees import FEW_TREES_CHEAP_ENTRIES, few_trees_on_splits
from .packing.forecast import NO_FORECAST, forecast
from .packing.scaled import SCALED_MIN_K, many_trees_pack, plain_pack
from .packing.trees import TreeClass, greedy_pack
from .removal.exact_split import split_all
from .removal.guarded_spread import guarded_spread
from .removal.splitting import LogicalGraph, SplitGraph, sink_ranks
from .removal.spread import spread_split
from .sized import limited_repair

__all__ = ["Packed", "Packing", "SplitKind", "Shapes", "spread_logical", "pack", "tight",
           "narrow_tight"]

Shapes = tuple[np.ndarray, np.ndarray]


class Packing(str, Enum):
    """Which Phase 3 packer completed (``stats['packing']``)."""

    REPAIR = "repair"
    GREEDY = "greedy"
    EXACT = "exact"
    PLANNED = "planned"           # step-aware: depth-capped within the hop LP's plan
    CAPPED = "capped"             # step-aware: depth-capped
    DEFAULT = "default"           # step-aware kept the default packing


class SplitKind(str, Enum):
    """Which Phase 2 switch removal built the logical graph (``stats['split']``)."""

    SPREAD = "spread"
    GUARDED = "guarded"           # the spread split with pairings guarded by the cut condition
    EXACT = "exact"
    STEP_AWARE = "step-aware"     # the hop LP's integral split (App. C)
    DEFAULT = "default"           # step-aware kept the default split


@dataclass(frozen=True)
class Packed:
    """Phases 2+3: the logical graph, its tree classes (``k`` unit trees per root) and
    which switch removal and packer produced them."""

    lg: LogicalGraph
    classes: list[TreeClass]
    k: int
    split: SplitKind
    packing: Packing

    def record(self, stats: dict[str, Any]) -> None:
        stats["split"], stats["packing"] = self.split.value, self.packing.value


def spread_logical(split: SplitGraph, rank_of: np.ndarray,
                   siblings_last: bool = True) -> LogicalGraph:
    """Phase 2 by the spread proposal (:mod:`.removal.spread`, sibling pairs last unless
    ``siblings_last=False``); ``split`` is left as it was."""
    return spread_split(split, rank_of, siblings_last=siblings_last)


#: below :data:`~.packing.scaled.SCALED_MIN_K` trees per root, the repair packings after
#: the guard (of the guarded split, and the rail-first retry) stop after this many tree
#: visits per tree entry ``k·n²`` (they were unbounded): the guarded split of leaf-spine
#: 8x2x8 at ``None`` (``k = 41``) failed only after 5-18 M visits (27x its entries since
#: sibling pairs go last, 10 -> 21 s CPU), then the few-trees packing packs it.  Not the
#: first packing of the plain split: SuperPOD 4x4x8's completes past 4x (capped there, it
#: lost the chunk budget's optimum at ``K=10``).  With a chunk budget only: at ``None`` a
#: forecast decides (:mod:`.packing.forecast`)
REPAIR_VISITS_PER_ENTRY = 4


#: at ``None`` the rail-first retry's repair searches stop after ``k·n²`` over this many
#: tree visits (the few-trees packing follows): where it completed (leaf-spine 4x2x8
#: plain and scrambled, fat-tree 4x2x2x8; fuzz seeds 3413 and 3511-3522: 32-64 GPUs at
#: ``k = 41``) it took 0-3 810 visits (``k·n²/44``); where it failed (leaf-spine 6x2x8 and
#: 8x2x8 with 4 spines, fat-tree 4x2x2x8 two way) it ran out of chains at 0.36-0.39
#: ``k·n²``, or ran to the cap (``k·n²/8``: 0.08-0.1 s CPU at 128 GPUs, ``k = 41``).
#: Not after a forecast stop (:meth:`_Packer.few_first`)
RAIL_FIRST_VISITS_SHARE = 16


def _pack_repair(lg: LogicalGraph, k: int, stats: dict[str, Any], shapes: Shapes | None,
                 rail_first: bool | None = None, plain: bool = True, capped: bool = False,
                 guarded: bool = False) -> tuple[list[TreeClass], Packing] | None:
    """Repair packing, reusing previous shapes (certifies itself); from
    :data:`~.packing.scaled.SCALED_MIN_K` trees per root the scaled packings and the plain
    one in :func:`~.packing.scaled.many_trees_pack`'s order, the plain one's repair
    searches limited to ``k·n²`` tree visits (the packing's own size; below it, with
    ``guarded``, :data:`REPAIR_VISITS_PER_ENTRY` times that): leaf-spine 4x2x8
    with a NIC degraded one way packs 811 trees per root in 315 M visits (56 s) where the
    general method solves the fabric in ~1.2 s.  Under a limit (a warm stage's allowance,
    the solve's ``time_limit``) the searches are sized to its time left and the limit
    stopped when that is too little or they run out (:func:`.sized.limited_repair`).
    ``plain=False``: from ``SCALED_MIN_K`` trees per root the scaled packings only.
    ``capped``: where the exact few-trees packing follows a failure (:func:`pack` at
    ``max_chunks=None``), below ``SCALED_MIN_K`` the searches stop where the rest is
    forecast costlier than that packing (:mod:`.packing.forecast`; at most ``k·n²`` plus
    its estimate)."""
    n = lg.num_gpus
    fc = NO_FORECAST
    if k >= SCALED_MIN_K:
        visits = k * n * n
    elif capped and rail_first:
        visits = k * n * n // RAIL_FIRST_VISITS_SHARE
    elif capped:
        fc, visits = forecast(n, k)
    else:
        visits = k * n * n * REPAIR_VISITS_PER_ENTRY if guarded else 1 << 62
    if k >= SCALED_MIN_K and not rail_first:
        classes = many_trees_pack(n, lg.tail, lg.head, lg.units, k, shapes, stats, plain)
    else:
        classes, info = limited_repair("Phase 3: the repair packing", n, lg.tail, lg.head,
                                       lg.units, k, shapes, max_visits=visits,
                                       rail_first=rail_first, fc=fc)
        stats.update(info)
    if rail_first:
        stats["repair_rail_first"] = classes is not None
    return None if classes is None else (classes, Packing.REPAIR)


def _pack_greedy(lg: LogicalGraph, k: int, guides: dict[int, np.ndarray]
                 ) -> tuple[list[TreeClass], Packing] | None:
    """The guided greedy portfolio (certifies itself)."""
    classes = greedy_pack(lg.num_gpus, lg.tail, lg.head, lg.units, k, guides)
    return None if classes is None else (classes, Packing.GREEDY)


def _few_trees(split: SplitGraph, rank_of: np.ndarray, k: int, stats: dict[str, Any],
               lg: LogicalGraph, kind: SplitKind
               ) -> tuple[LogicalGraph, SplitKind, tuple[list[TreeClass], Packing] | None]:
    """The few-trees packing on ``lg`` or the exact split (:func:`.packing.few_trees.
    few_trees_on_splits`) where the fast packers got stuck on a graph that admits ``k``:
    the logical graph packed, its kind and packing, or ``lg``, ``kind``, ``None``."""
    anytime.check("Phase 3: before the few-trees packing")
    found = few_trees_on_splits(split, rank_of, k, stats, lg)
    if found is None:
        return lg, kind, None
    return found[0], kind if found[0] is lg else SplitKind.EXACT, (found[1], Packing.EXACT)


def tight(lg: LogicalGraph, k: int) -> bool:
    """Every rank's in-units are exactly the ``k (n - 1)`` trees owed to it: a packing of
    ``k`` trees per root uses every unit (no spare unit anywhere).  Each rank is then its
    own tight set, by the one definition of :func:`.packing.contraction.tight_alone` with
    ``k`` roots per rank."""
    n = lg.num_gpus
    return bool(tight_alone(n, lg.head, lg.units, np.full(n, k, np.int64)).all())


def narrow_tight(lg: LogicalGraph, k: int) -> bool:
    """Some rank is its own tight set (:func:`.packing.contraction.tight_alone`, ``k``
    roots per rank) and has an in-link of fewer than ``k`` units: every unit into it
    carries a tree, and which trees take the narrow link is the choice the repair
    packing's augmenting chains cannot make (docs/allgather.md, *Narrow NIC links*)."""
    n = lg.num_gpus
    alone = tight_alone(n, lg.head, lg.units, np.full(n, k, np.int64))
    return bool((alone[lg.head] & (lg.units < k)).any())


def _leave_to_next(k: int) -> None:
    """A declining plan's steps ran out (:attr:`.pack_plan.PackPlan.declines`): the exact
    split and packings are left to the chain's next method, which solves the fabric
    exactly for less (dragonfly 4x4x1x8 one way at ``None``: 8-9 s CPU here, ~0.4 s by
    the general method)."""
    raise SolveError(f"no fast packing of {k} trees per root completed; the exact split and "
                     "packing are left to the next method")


class _Packer:
    """One :func:`pack` running its :class:`~.pack_plan.PackPlan`, one method per
    :class:`~.pack_plan.Step`: the logical graph packed (``lg``, of kind ``kind``), the
    packing ``found`` (``None`` so far), whether ``lg`` admits ``k`` trees per root (the
    rooted cut test)."""

    def __init__(self, split: SplitGraph, rank_of: np.ndarray, k: int,
                 guides: dict[int, np.ndarray], stats: dict[str, Any], shapes: Shapes | None,
                 plan: PackPlan, siblings_last: bool, spread: LogicalGraph) -> None:
        self.split, self.rank_of, self.k, self.guides = split, rank_of, k, guides
        self.stats, self.shapes, self.plan, self.siblings_last = stats, shapes, plan, siblings_last
        self.lg, self.kind = spread, SplitKind.SPREAD
        self.found: tuple[list[TreeClass], Packing] | None = None
        self.admits = False
        self.few_tried = False
        self.start = time.perf_counter()

    def run(self) -> tuple[list[TreeClass], Packing] | None:
        """The plan's steps in order until one packs."""
        run = {Step.REPAIR: self.repair, Step.GUARDED: self.guarded, Step.FEW_TREES: self.few,
               Step.PLAIN: self.plain, Step.RAIL_FIRST: self.rail_first,
               Step.GREEDY: self.greedy,
               Step.EXACT_SPLIT: self.exact_split, Step.EXACT: self.exact}
        for step in self.plan.steps:
            if self.found is not None:
                break
            run[step]()
        return self.found

    def repair(self) -> None:
        """The spread split's repair packing, unless the test first proves none exists;
        where the forecast stops it, the few-trees packing it chose (:meth:`few_first`)."""
        plan, lg, k = self.plan, self.lg, self.k
        near = sink_ranks(self.split, self.rank_of)     # the sweeps' order, hosts together
        if plan.test_stride is not None and not lg.admits(k, plan.test_stride, order=near):
            return                                  # no packing can complete: skip it
        got: dict[str, Any] = {}                   # this packing's counters alone
        self.found = _pack_repair(lg, k, got, self.shapes, plain=plan.plain_first,
                                  capped=plan.capped)
        self.stats.update(got)
        if self.found is None and got.get("repair_forecast_stop") and \
                Step.FEW_TREES in plan.steps and k * lg.num_gpus ** 2 > FEW_TREES_CHEAP_ENTRIES:
            self.few_first()
            if self.found is not None:
                return
        # the sinks of the sampled test passed: the whole test sweeps the others only
        self.admits = self.found is not None or (
            not plan.declines and lg.admits(k, passed=plan.test_stride, order=near))

    def guarded(self) -> None:
        """Where the spread split breaks the rooted test: the guarded spread split and its
        repair packing (:meth:`_guarded_repair`), tried on each guarded split before that
        split's rooted sweep: a completed packing proves the test, so the sweep (8-48 ms
        at 128 GPUs) runs only where the packing does not complete."""
        if self.admits:
            return
        anytime.check("Phase 2: before the guarded spread split")
        tried: list[LogicalGraph] = []
        clock = [time.perf_counter()]              # Phase 2 time runs from here

        def packs(lg: LogicalGraph) -> bool:
            self.stats["phase2_s"] += time.perf_counter() - clock[0]
            tried.append(lg)
            self.found = self._guarded_repair(lg)
            clock[0] = time.perf_counter()
            return self.found is not None

        guarded = guarded_spread(self.split, self.rank_of, self.lg, self.siblings_last, packs)
        self.stats["phase2_s"] += time.perf_counter() - clock[0]
        if guarded is None:
            return
        self.lg, self.kind, self.admits = guarded, SplitKind.GUARDED, True   # it passes
        if not tried or guarded is not tried[-1]:
            self.found = self._guarded_repair(guarded)

    def _guarded_repair(self, lg: LogicalGraph) -> tuple[list[TreeClass], Packing] | None:
        """The repair packing of a guarded split (skipped on a tight graph,
        ``guarded_skips_tight``, and on one with a narrow tight rank,
        ``guarded_skips_narrow``)."""
        anytime.check("Phase 3: before the repair packing of the guarded split")
        plan = self.plan
        if plan.guarded_skips_tight and tight(lg, self.k) or \
                plan.guarded_skips_narrow and narrow_tight(lg, self.k):
            return None
        return _pack_repair(lg, self.k, self.stats, self.shapes, plain=plan.plain_first,
                            capped=plan.capped, guarded=True)

    def few_first(self) -> None:
        """Where the forecast stopped the spread split's repair packing (past
        :data:`~.packing.few_trees.FEW_TREES_CHEAP_ENTRIES`): the few-trees packing the
        forecast chose, before the rest of the rooted test, the guarded split and the
        rail-first retry, which follow only if it fails.  There it packs the exact split
        alone, which keeps every cut: it needs no test of the split packed so far, and
        a later :meth:`few` would repeat it (docs/allgather.md, *The forecast's choice
        taken at once*)."""
        self.few_tried = True
        self.lg, self.kind, self.found = _few_trees(self.split, self.rank_of, self.k,
                                                    self.stats, self.lg, self.kind)

    def few(self) -> None:
        """The few-trees packing on a graph that admits ``k`` (once)."""
        if self.admits and not self.few_tried:
            self.few_tried = True
            self.lg, self.kind, self.found = _few_trees(self.split, self.rank_of, self.k,
                                                        self.stats, self.lg, self.kind)

    def plain(self) -> None:
        """The plain repair packing after the scaled ones."""
        if self.admits:
            lg = self.lg
            plain = plain_pack(lg.num_gpus, lg.tail, lg.head, lg.units, self.k, self.shapes,
                               self.stats)
            self.found = None if plain is None else (plain, Packing.REPAIR)

    def rail_first(self) -> None:
        """The repair packing in the rail-first batched order."""
        if self.admits:
            self.found = _pack_repair(self.lg, self.k, self.stats, self.shapes, rail_first=True,
                                      capped=self.plan.capped,
                                      guarded=self.kind is SplitKind.GUARDED)

    def greedy(self) -> None:
        anytime.check("Phase 3: before the greedy packing")
        self.found = _pack_greedy(self.lg, self.k, self.guides)

    def exact_split(self) -> None:
        """Where no split admits ``k``: the exact split, repair (uncapped) or greedy packed."""
        if self.admits:
            return
        anytime.check("Phase 2: before the exact split")
        t = time.perf_counter()
        g = self.split.copy()
        if not split_all(g):
            raise SolveError("exact switch removal did not complete; the fabric's "
                             "switches could not be balanced without losing the optimum")
        self.lg, self.kind = LogicalGraph.from_split(g, self.rank_of), SplitKind.EXACT
        self.stats["phase2_s"] += time.perf_counter() - t
        self.found = _pack_repair(self.lg, self.k, self.stats, self.shapes) or \
            _pack_greedy(self.lg, self.k, self.guides)

    def exact(self) -> None:
        lg = self.lg
        self.found = exact_pack_stage(lg.num_gpus, lg.tail, lg.head, lg.units, self.k,
                                      time.perf_counter() - self.start), Packing.EXACT


def pack(split: SplitGraph, rank_of: np.ndarray, k: int, guides: dict[int, np.ndarray],
         stats: dict[str, Any], shapes: Shapes | None = None, goal: Goal = Goal.EXACT,
         siblings_last: bool = True, spread: LogicalGraph | None = None) -> Packed:
    """Phases 2+3: the spread split (sibling pairs last unless ``siblings_last=False``:
    proportional, :func:`.removal.spread.spread_split`; the guarded split's too), then the
    packers of :func:`.pack_plan.plan_pack`'s plan for ``goal``, in its order (the
    guarded spread split, the few-trees packing on it or the exact split, the exact split,
    Lovász's exact packing); a :class:`SolveError` when its steps run out (the chain's next
    method solves the fabric).  Under a limit the repair packings are sized to its time
    left (:func:`_pack_repair`).  ``spread``: ``spread_logical(split, rank_of,
    siblings_last)`` when the caller has it (timed in ``stats["phase2_s"]`` by the caller;
    no packer changes it): a warm solve's cold fallback reuses the seeded packing's
    Phase 2."""
    progress.update("AllGather phase 2: switch removal")
    if spread is None:
        t = time.perf_counter()
        spread = spread_logical(split, rank_of, siblings_last)
        stats["phase2_s"] = time.perf_counter() - t
    progress.update("AllGather phase 3: tree packing")
    plan = plan_pack(goal, k, spread.num_gpus)
    packer = _Packer(split, rank_of, k, guides, stats, shapes, plan, siblings_last, spread)
    # Phase 3 and the mapping take about as long as Phase 2 or longer (HPN 1024 GPUs:
    # 0.46 vs 0.51 s; 2048: 1.1 vs 0.76 s)
    anytime.check_room("Phase 3: before the repair packing", stats["phase2_s"])
    found = packer.run()
    if found is None and plan.declines:
        _leave_to_next(k)
    if found is None:                               # one max-flow per edge: hopeless
        edges = k * spread.num_gpus * (spread.num_gpus - 1)
        raise SolveError(f"no fast packing of {k} trees per root completed, and the exact "
                         f"tree packing of {edges} tree edges (one max-flow each) is out of "
                         f"reach (more than {EXACT_PACK_MAX_EDGES})")
    stats["phase3_s"] = time.perf_counter() - packer.start
    packed = Packed(packer.lg, found[0], k, packer.kind, found[1])
    packed.record(stats)
    return packed
