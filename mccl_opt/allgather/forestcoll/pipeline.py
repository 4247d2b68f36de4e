"""The cold ForestColl phases (paper §4.3), shared by :func:`~mccl_opt.allgather.solve.solve_allgather`,
the warm certificates (:mod:`~mccl_opt.allgather.warm.previous.certify`) and step-aware switch removal (:mod:`.step_aware`).

Phase 1 and the chunk budget (:func:`phase_one_budget`), switch balancing
(:func:`balanced_split`), Phase 2 switch removal and Phase 3 packing (:func:`pack`).
Each returns a typed result; ``stats`` only receives the JSON view (timings, names).

Longer than ~400 lines on purpose: the three phases hand typed results to each other,
and the packing's order of fallbacks (repair, guarded split, few-trees, rail-first,
greedy) with their search caps reads as one sequence.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction
from typing import Any, Sequence

import numpy as np

from mccl_opt import anytime, progress
from mccl_opt.entry_checks import check_backend, check_max_chunks, check_topology, check_warm
from mccl_opt.errors import SolveError
from mccl_opt.schedule import Schedule
from mccl_opt.topology import Topology
from ..budget import CutBounds, choose_trees, exact_k
from .packing.exact_packing import EXACT_PACK_MAX_EDGES, exact_pack_stage
from .packing.few_trees import FEW_TREES_CHEAP_ENTRIES, few_trees_on_splits
from .packing.forecast import NO_FORECAST, forecast
from ..fabric import fabric_of
from .packing.growth_order import RAIL_FIRST_MIN_RANKS
from .packing.scaled import PLAIN_FIRST_ENTRIES, SCALED_MIN_K, many_trees_pack, plain_pack
from .removal.balancing import balance_switches
from .removal.exact_split import split_all
from .removal.splitting import LogicalGraph, SplitGraph
from .removal.guarded_spread import guarded_spread
from .removal.spread import spread_split
from .throughput import Fabric, PhaseOneResult, optimal_rate
from .packing.trees import TreeClass, greedy_pack
from .removal.unit_rounding import restriction_units
from .sized import limited_repair

__all__ = ["Budget", "Balanced", "Packed", "Packing", "SplitKind", "check_inputs",
           "phase_one_budget", "balanced_split", "spread_logical", "pack", "gbps"]

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


def check_inputs(topo: Topology, max_chunks: int | None, warm: Schedule | None = None,
                 backend: str = "highs") -> None:
    """The AllGather side of the synthesizers' one error contract (:mod:`..entry_checks`):
    a non-topology, a bad chunk budget, an unknown or missing backend and a warm start
    that is not a previous AllGather schedule get the errors AllToAll gives them."""
    check_topology(topo)
    check_max_chunks(max_chunks)
    check_backend(backend)
    check_warm(warm, "allgather")


def gbps(rate: PhaseOneResult, quantum: float) -> float:
    """A rate in quanta (Phase 1's exact fraction) in Gbps."""
    return float(Fraction(rate.num, rate.den) * Fraction(quantum).limit_denominator(10**12))


@dataclass(frozen=True)
class Budget:
    """Phase 1 and the chunk budget: the integer fabric and its quantum (Gbps), Phase 1's
    optimum and tight cut ``p1``, ``k`` trees per root of bandwidth ``y`` (quanta) and
    the max-flows the budget took."""

    fab: Fabric
    quantum: float
    p1: PhaseOneResult
    k: int
    y: Fraction
    maxflows: int

    @property
    def x_star_gbps(self) -> float:
        return gbps(self.p1, self.quantum)

    @property
    def target_gbps(self) -> float:
        """The chunk-budget optimum ``k·y`` in Gbps."""
        return float(self.k * self.y) * self.quantum


def phase_one_budget(topo: Topology, max_chunks: int | None, stats: dict[str, Any],
                     hint_cuts: list[np.ndarray] | None = None,
                     cuts: CutBounds | None = None, p1: PhaseOneResult | None = None) -> Budget:
    """Phase 1 (exact optimum, §4.3) and the chunk budget; ``cuts``: the cut bounds of
    the warm guesses on the same capacities; ``p1``: this fabric's exact Phase 1 when
    a warm guess already ran it (not run again)."""
    fab, quantum = fabric_of(topo)
    if p1 is None:
        progress.update("AllGather phase 1: exact optimum (max-flow)")
        t = time.perf_counter()
        p1 = optimal_rate(fab, hint_cuts)
        stats["phase1_s"] = time.perf_counter() - t
        stats["phase1_maxflows"] = p1.maxflow_calls

    progress.update("AllGather: chunk budget")
    t = time.perf_counter()
    k, y, calls = choose_trees(fab, p1, max_chunks, extra_cuts=hint_cuts, cuts=cuts)
    if k == 0 or y <= 0:
        raise SolveError("no tree bandwidth admits the chunk budget; raise max_chunks")
    stats["budget_s"] = time.perf_counter() - t
    stats["budget_maxflows"] = calls
    stats["k"], stats["k_exact"] = int(k), int(exact_k(fab, p1))
    return Budget(fab, quantum, p1, int(k), y, calls)


@dataclass(frozen=True)
class Balanced:
    """Tree units of every link with switches balanced, for ``k`` trees per root;
    ``exact``: balanced without giving up capacity the optimum needs; ``symmetrized``:
    the fabric with every cable at a switch at its weaker direction was used."""

    split: SplitGraph
    k: int
    exact: bool
    symmetrized: bool = False

    def record(self, stats: dict[str, Any]) -> None:
        stats["balanced_exactly"] = self.exact
        if self.symmetrized:
            stats["symmetrized"] = True


def balanced_split(fab: Fabric, is_switch: np.ndarray, k: int, y: Fraction,
                   max_chunks: int | None, headroom: Sequence[Fraction] | None = None,
                   optimum: Fraction | None = None) -> Balanced:
    """Tree units of every link, switches balanced.  When balancing must give up
    capacity the optimum cannot spare (one-directional degradations; the rate then sits
    below ``lp_rate_gbps``), two balanced fabrics are tried and the one with more
    bandwidth per root kept: the balanced units re-optimised (``k``, ``y`` chosen again
    on them, at most 3 times), and every cable at a switch at the smaller of its two
    directions' capacities, which balances each switch by construction.  The trees,
    synthesized for less capacity than the fabric has, are valid on it.

    ``headroom`` (``fab`` a balanced restriction of a real fabric: ``c_e / c'_e`` per
    link): the floors are first rounded up where the real fabric has room, so that every
    switch stays balanced; where that needs a lower ``y``
    (:func:`.removal.unit_rounding.rounded_restriction`) it is weighed against the greedy
    balancing's options that leave every switch balanced; with ``max_chunks=None`` the exact
    optimum (``optimum``: Phase 1's ``x*``, which the budget's ``k·y`` can stop short of) is
    first sought with fewer or more trees than ``k`` (:func:`.removal.unit_rounding.
    restriction_units`)."""
    units = (fab.cap * y.denominator) // y.numerator
    options = []                        # (bandwidth per root in quanta, split, k, symmetrized)
    if headroom is not None:
        found, rounded = restriction_units(fab, is_switch, k, y, headroom, max_chunks is None,
                                           optimum)
        if found is not None:
            return Balanced(_units_split(fab, is_switch, found[0], found[1]), found[1], True)
    split = SplitGraph.from_links(fab.n, fab.tail, fab.head, units, is_switch, fab.gpus, k)
    if balance_switches(split):
        return Balanced(split, k, True)
    if headroom is not None and rounded is not None:
        options.append((k * rounded[1], _units_split(fab, is_switch, rounded[0], k), k, False))
    original, unit = fab, Fraction(1)   # a unit of ``fab``'s capacities, in quanta
    for _ in range(3):
        kept = np.array([split.units.get((a, b), 0) for a, b in
                         zip(fab.tail.tolist(), fab.head.tolist())], np.int64)
        fab, unit = Fabric.build(fab.n, fab.tail, fab.head, kept, fab.gpus), unit * y
        balanced = _split_for(fab, is_switch, max_chunks)
        if balanced is None:
            break
        split, k, y, exact = balanced
        if exact:
            options.append((k * y * unit, split, k, False))
            break
    balanced = _split_for(_symmetrized(original, is_switch), is_switch, max_chunks)
    if balanced is not None and balanced[3]:
        split, k, y, _ = balanced
        options.append((k * y, split, k, True))
    if not options:
        raise SolveError("switches could not be balanced (in- vs out-capacity) without losing "
                         "every tree, even with each cable at its weaker direction; check the "
                         "one-directional links of the fabric")
    _, split, k, symmetrized = max(options, key=lambda o: o[0])     # ties: the first
    return Balanced(split, k, False, symmetrized)


def _units_split(fab: Fabric, is_switch: np.ndarray, units: np.ndarray, k: int) -> SplitGraph:
    """The split graph of balanced ``units`` (:mod:`.removal.unit_rounding`)."""
    split = SplitGraph.from_links(fab.n, fab.tail, fab.head, units, is_switch, fab.gpus, k)
    if not balance_switches(split):               # balanced already: nothing is removed
        raise SolveError("internal: rounded restriction units were not balanced; please report")
    return split


def _split_for(fab: Fabric, is_switch: np.ndarray, max_chunks: int | None
               ) -> tuple[SplitGraph, int, Fraction, bool] | None:
    """Phase 1 and the chunk budget on ``fab``, then its tree units with switches
    balanced: ``(split, k, y, balanced without loss)``, or ``None`` if no tree fits."""
    p1 = optimal_rate(fab)
    if p1.num == 0:
        return None
    k, y, _ = choose_trees(fab, p1, max_chunks)
    if y <= 0:
        return None
    units = (fab.cap * y.denominator) // y.numerator
    split = SplitGraph.from_links(fab.n, fab.tail, fab.head, units, is_switch, fab.gpus, k)
    return split, k, y, balance_switches(split)


def _symmetrized(fab: Fabric, is_switch: np.ndarray) -> Fabric:
    """``fab`` with every arc at a switch capped at its reverse arc's capacity (0 when
    there is none), so every switch's in-capacity equals its out-capacity."""
    reverse = {(int(a), int(b)): i for i, (a, b) in enumerate(zip(fab.tail, fab.head))}
    cap = fab.cap.copy()
    for i, (a, b) in enumerate(zip(fab.tail.tolist(), fab.head.tolist())):
        if is_switch[a] or is_switch[b]:
            j = reverse.get((b, a))
            cap[i] = min(cap[i], fab.cap[j]) if j is not None else 0
    return Fabric.build(fab.n, fab.tail, fab.head, cap, fab.gpus)


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
#: plain and scrambled, fat-tree 4x2x2x8) it took 0-954 visits; where it failed
#: (leaf-spine 6x2x8 and 8x2x8 with 4 spines) it ran out of chains at 0.36-0.39 ``k·n²``
#: (0.18 s at 128 GPUs)
RAIL_FIRST_VISITS_SHARE = 8


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
    ``k`` trees per root uses every unit (no spare unit anywhere)."""
    n = lg.num_gpus
    return bool((np.bincount(lg.head, weights=lg.units, minlength=n) == k * (n - 1)).all())


#: from this many trees per root :func:`pack` runs the rooted cut test before the repair
#: packer, not after it: on a logical graph that does not admit ``k`` the packer only
#: stops when no augmenting chain is left, which takes seconds to minutes when ``k`` is an
#: exact ``k0`` in the hundreds (leaf-spine 4x2x8 with a NIC degraded one way: 811 trees
#: per root, 101 s), while the test is ``n`` max-flows (milliseconds)
TEST_FIRST_K = 64

#: ... and below it from this many tree entries ``k·n²`` (a failing repair packing of the
#: spread split of shared aggregation 2x16x8 at ``None`` before :mod:`.removal.siblings`,
#: ``k = 41``: ~0.7 s CPU, the test ~0.02 s; of leaf-spine 8x2x8 with 4 spines, ``k = 41``,
#: 672 k entries: 0.2-0.3 s, the sampled test ~0.01 s), the test on a sample of sinks only
#: (:data:`TEST_FIRST_SINKS`): a failing sink proves no packing exists, a passing sample
#: leaves it to the packing, which certifies itself (the whole sweep of a graph that
#: passes, 0.5 s there, cost about as much as the packing)
TEST_FIRST_ENTRIES = 1 << 19

#: sinks of that first test, every ``n // TEST_FIRST_SINKS``-th rank
TEST_FIRST_SINKS = 32


#: from this many trees per root (the scaled packings' :data:`~.packing.scaled.SCALED_MIN_K`:
#: the plain repair packing has then run to its ``k·n²`` visits, or runs after) the
#: few-trees packing follows a failed repair packing at once, before the rail-first
#: repair and the greedy portfolio: one-way and two-way narrow-NIC dragonfly 4x2x1x8 at
#: ``None`` (``k = 103``) spent 0.10-0.19 s in each, both failing, before the few-trees
#: packing packed the exact split in 0.04 s (docs/allgather.md, *Few-trees before the
#: rail-first and greedy packings*)
FEW_BEFORE_FAST_K = SCALED_MIN_K


def _leave_to_next(k: int) -> None:
    """:func:`pack` with ``declinable``: the exact split and packings are left to the
    chain's next method, which solves the fabric exactly for less (dragonfly 4x4x1x8
    one way at ``None``: 8-9 s CPU here, ~0.4 s by the general method)."""
    raise SolveError(f"no fast packing of {k} trees per root completed; the exact split and "
                     "packing are left to the next method")


def pack(split: SplitGraph, rank_of: np.ndarray, k: int, guides: dict[int, np.ndarray],
         stats: dict[str, Any], shapes: Shapes | None = None, fewer_chunks: bool = False,
         siblings_last: bool = True, declinable: bool = False,
         spread: LogicalGraph | None = None) -> Packed:
    """Phases 2+3: spread split + fast packing; when the spread split broke the cut
    condition, the spread split with guarded pairings (:mod:`.removal.guarded_spread`), then
    exact splitting, and exact packing as the last fallback on at most
    :data:`EXACT_PACK_MAX_EDGES` tree edges (beyond: :class:`SolveError`, the chain's
    next method solves the fabric).  Under a limit the packings are sized to its time
    left (:func:`_pack_repair`).  From :data:`FEW_BEFORE_FAST_K` trees per root the
    few-trees packing follows a failed repair packing before the rail-first and greedy
    ones.  ``fewer_chunks`` (K): the few-trees packing only to
    ``FEW_TREES_CHEAP_ENTRIES``.  ``siblings_last=False``: the spread splits (plain and
    guarded) proportional (:func:`.removal.spread.spread_split`).  ``declinable``: a later
    method solves the fabric exactly (the weaker-direction fabric at ``max_chunks=None``,
    :func:`.chain.solve_unbalanced`): past ``FEW_TREES_CHEAP_ENTRIES`` only the spread
    split's first packing runs, then a :class:`SolveError` leaves the rest (the guarded
    split, the plain, rail-first, greedy and exact packings, the exact split) to it.
    ``spread``: ``spread_logical(split, rank_of, siblings_last)`` when the caller has it
    (timed in ``stats["phase2_s"]`` by the caller; no packer changes it): a warm solve's
    cold fallback reuses the seeded packing's Phase 2."""
    progress.update("AllGather phase 2: switch removal")
    if spread is None:
        t = time.perf_counter()
        spread = spread_logical(split, rank_of, siblings_last)
        stats["phase2_s"] = time.perf_counter() - t
    lg, kind = spread, SplitKind.SPREAD
    progress.update("AllGather phase 3: tree packing")
    t = time.perf_counter()
    # Phase 3 and the mapping take about as long as Phase 2 or longer (HPN 1024 GPUs:
    # 0.46 vs 0.51 s; 2048: 1.1 vs 0.76 s)
    anytime.check_room("Phase 3: before the repair packing", stats["phase2_s"])
    # the plain repair packing may search for seconds there: the few-trees one goes first
    late_plain = k >= SCALED_MIN_K and k * lg.num_gpus ** 2 > PLAIN_FIRST_ENTRIES
    # from SCALED_MIN_K the plain repair packing has had its k·n² visits (or comes after):
    # the few-trees packing goes before the rail-first and greedy ones (FEW_BEFORE_FAST_K)
    few_next = k >= FEW_BEFORE_FAST_K
    cheap = k * lg.num_gpus ** 2 <= FEW_TREES_CHEAP_ENTRIES
    few = not (fewer_chunks or declinable) or cheap
    # at None the exact few-trees packing follows a failed repair packing, so its searches
    # stop where they are forecast to cost more than it; uncapped, on a graph they cannot
    # pack they run until no augmenting chain is left (leaf-spine 8x2x8 with 4 spines, 41
    # trees per root: 1.3 M, 10.6 M and 4.5 M visits, 6.2 s CPU, before the few-trees
    # packing); capped at k·n², SuperPOD 2x4x8's completes at 4.1x that, 10x cheaper)
    capped = not fewer_chunks
    test_first = k > TEST_FIRST_K or k * lg.num_gpus ** 2 >= TEST_FIRST_ENTRIES
    stride = 1 if k > TEST_FIRST_K else max(1, lg.num_gpus // TEST_FIRST_SINKS)
    if test_first and not lg.admits(k, stride):   # no packing can complete: skip it
        found, admits = None, False
    else:
        found = _pack_repair(lg, k, stats, shapes, plain=not late_plain, capped=capped)
        admits = found is not None or lg.admits(k)
    if not admits and declinable and not cheap:
        # the guarded split's repair packing failed on every such state measured (one-way
        # dragonfly, 149-187 trees per root: 0.13-0.67 s of guarded split for nothing)
        _leave_to_next(k)
    if not admits:
        anytime.check("Phase 2: before the guarded spread split")
        t2 = time.perf_counter()
        guarded = guarded_spread(split, rank_of, lg, siblings_last)
        stats["phase2_s"] += time.perf_counter() - t2
        if guarded is not None:                   # it passes the rooted test
            lg, kind, admits = guarded, SplitKind.GUARDED, True
            anytime.check("Phase 3: before the repair packing of the guarded split")
            # at None, on a tight guarded graph the repair packing in the plain growth
            # order failed on every state measured (leaf-spine 4x2x8, 8x2x8 with 4 spines
            # in three listings, 4x2x8 one way: 0.04-0.26 s each); the rail-first retry
            # below (completes on 4x2x8) and the few-trees packing follow
            if not (capped and lg.num_gpus < RAIL_FIRST_MIN_RANKS and tight(lg, k)):
                found = _pack_repair(lg, k, stats, shapes, plain=not late_plain, capped=capped,
                                     guarded=True)
    if found is None and admits and few_next and few:
        lg, kind, found = _few_trees(split, rank_of, k, stats, lg, kind)
    if found is None and declinable and not cheap:
        # the plain, rail-first and greedy packings that follow cost 0.3-0.5 s each at
        # 64 GPUs and 150-190 trees per root, the general method ~0.3 s in all
        _leave_to_next(k)
    if found is None and admits and late_plain:
        plain = plain_pack(lg.num_gpus, lg.tail, lg.head, lg.units, k, shapes, stats)
        found = None if plain is None else (plain, Packing.REPAIR)
    if found is None and admits and lg.num_gpus < RAIL_FIRST_MIN_RANKS:
        # small fabrics grow wide-then-narrow one vertex per turn; where that gets stuck
        # (leaf-spine: every NIC link narrow) the rail-first batched order may not
        found = _pack_repair(lg, k, stats, shapes, rail_first=True, capped=capped,
                             guarded=kind is SplitKind.GUARDED)
    # on a tight graph the greedy portfolio must use every unit and fails (leaf-spine 8x2x8
    # with 4 spines at None: 0.9 s); the exact few-trees packing goes first, greedy after
    few_first = found is None and admits and not few_next and few and capped and tight(lg, k)
    if few_first:
        lg, kind, found = _few_trees(split, rank_of, k, stats, lg, kind)
    if found is None:
        anytime.check("Phase 3: before the greedy packing")
        found = _pack_greedy(lg, k, guides)
    if found is None and admits and not few_next and few and not few_first:
        lg, kind, found = _few_trees(split, rank_of, k, stats, lg, kind)
    if found is None and not admits:
        anytime.check("Phase 2: before the exact split")
        t2 = time.perf_counter()
        g = split.copy()
        if not split_all(g):
            raise SolveError("exact switch removal did not complete; the fabric's "
                             "switches could not be balanced without losing the optimum")
        lg = LogicalGraph.from_split(g, rank_of)
        kind = SplitKind.EXACT
        stats["phase2_s"] += time.perf_counter() - t2
        found = _pack_repair(lg, k, stats, shapes) or _pack_greedy(lg, k, guides)
    edges = k * lg.num_gpus * (lg.num_gpus - 1)
    if found is None and edges > EXACT_PACK_MAX_EDGES:   # one max-flow per edge: hopeless
        raise SolveError(f"no fast packing of {k} trees per root completed, and the exact "
                         f"tree packing of {edges} tree edges (one max-flow each) is out of "
                         f"reach (more than {EXACT_PACK_MAX_EDGES})")
    if found is None:
        found = exact_pack_stage(lg.num_gpus, lg.tail, lg.head, lg.units, k,
                                 time.perf_counter() - t), Packing.EXACT
    stats["phase3_s"] = time.perf_counter() - t
    packed = Packed(lg, found[0], k, kind, found[1])
    packed.record(stats)
    return packed
