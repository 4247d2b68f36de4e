"""Which Phase 3 packers :func:`.pack_steps.pack` runs, in which order, and where it stops
(paper §4.3; docs/allgather_history.md "The pack plan").

:func:`plan_pack` makes a :class:`PackPlan` once per packing, from what the caller needs
(:class:`Goal`) and the packing's size (``k`` trees per root on ``n`` GPUs) alone: no
graph is read, so every decision below is a pure function, tested as one.  The order,
each step running only while no packing has been found ("admits": the logical graph
packed passes the rooted cut test of Edmonds' theorem):

1. :attr:`Step.REPAIR`: the spread split's repair packing, after a rooted test that skips
   it where no packing exists (:attr:`PackPlan.test_stride`; then the graph does not admit
   ``k``); from :data:`~.packing.scaled.SCALED_MIN_K` trees per root the scaled packings
   first (:attr:`PackPlan.plain_first`).  A declining plan (:attr:`PackPlan.declines`)
   stops here.  Where the forecast stopped the packing and the plan has
   :attr:`Step.FEW_TREES`, the few-trees packing of the exact split runs at once
   (:meth:`.pack_steps._Packer.few_first`); otherwise, or where it fails, the whole
   rooted test.
2. :attr:`Step.GUARDED`: where the graph does not admit ``k``, the guarded spread split and
   its repair packing (skipped on a tight guarded graph, :attr:`PackPlan.guarded_skips_tight`,
   and where the few-trees packing follows on a graph with a narrow tight rank,
   :attr:`PackPlan.guarded_skips_narrow`).
3. :attr:`Step.FEW_TREES` from :data:`FEW_BEFORE_FAST_K` trees per root (admits).
4. :attr:`Step.PLAIN`: the plain repair packing after the scaled ones (admits).
5. :attr:`Step.RAIL_FIRST`: below :data:`~.packing.growth_order.RAIL_FIRST_MIN_RANKS` GPUs,
   the repair packing in the rail-first order (admits).
6. :attr:`Step.FEW_TREES` below ``FEW_BEFORE_FAST_K`` trees per root where the repair
   searches are capped (``max_chunks=None``): the exact few-trees packing before greedy
   (admits).
7. :attr:`Step.GREEDY`: the guided greedy portfolio.
8. :attr:`Step.FEW_TREES` below ``FEW_BEFORE_FAST_K`` trees per root with a chunk budget
   (where cheap).
9. :attr:`Step.EXACT_SPLIT`: where no split admits ``k``, the exact split, packed by the
   repair packing (searches uncapped) or the greedy portfolio.
10. :attr:`Step.EXACT`: Lovász's exact packing, one max-flow per tree edge, planned up to
    :data:`~.packing.exact_packing.EXACT_PACK_MAX_EDGES` tree edges.

When the steps run out, :func:`.pack_steps.pack` raises :class:`~mccl_opt.errors.SolveError`
(the chain's next method solves the fabric).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from fractions import Fraction
from typing import Sequence

from .packing.exact_packing import EXACT_PACK_MAX_EDGES
from .packing.few_trees import FEW_TREES_CHEAP_ENTRIES
from .packing.growth_order import RAIL_FIRST_MIN_RANKS
from .packing.scaled import PLAIN_FIRST_ENTRIES, SCALED_MIN_K

__all__ = ["Goal", "ForestCollAsk", "Step", "PackPlan", "plan_pack", "TEST_FIRST_K",
           "TEST_FIRST_ENTRIES", "TEST_FIRST_SINKS", "FEW_BEFORE_FAST_K"]

#: from this many trees per root the rooted cut test runs before the repair packer, not
#: after it: on a logical graph that does not admit ``k`` the packer only stops when no
#: augmenting chain is left, which takes seconds to minutes when ``k`` is an exact ``k0``
#: in the hundreds (leaf-spine 4x2x8 with a NIC degraded one way: 811 trees per root,
#: 101 s), while the test is ``n`` max-flows (milliseconds)
TEST_FIRST_K = 64

#: ... and below it from this many tree entries ``k·n²`` (a failing repair packing of the
#: spread split of shared aggregation 2x16x8 at ``None`` before :mod:`.removal.siblings`,
#: ``k = 41``: ~0.7 s CPU, the test ~0.02 s; of leaf-spine 8x2x8 with 4 spines, ``k = 41``,
#: 672 k entries: 0.2-0.3 s, the sampled test ~0.01 s), the test on a sample of sinks only
#: (:data:`TEST_FIRST_SINKS`): a failing sink proves no packing exists, a passing sample
#: leaves it to the packing, which certifies itself (the whole sweep of a graph that
#: passes, 0.5 s there, cost about as much as the packing); from 131 k entries since the
#: restriction seed of one-way dragonfly 4x4x1x8 (``k = 13``, 213 k entries: its spread
#: split's repair packing failed after 173 k visits, ~0.1 s, where the sampled test fails
#: at its first sink in ~2 ms; docs/allgather_history.md "Lossy restriction balancing at None").
#: Against 2^19, in one process, alternated passes, per-state best CPU s summed (two runs):
#: fuzz seed 3413's 102 states 7.06-7.36 vs 6.64-6.76, its 15 states planned otherwise
#: 1.73-1.81 vs 1.46-1.50 (each a passing sampled test, <= 0.11 s), worst state 0.53-0.55
#: vs 0.50-0.56 (not among them); 16 dragonfly states at None, three one-way 4x4x1x8 of
#: them planned otherwise (the test fails), 4.79-5.78 vs 5.08-5.60, worst 0.88-1.02 vs
#: 0.96-1.05 (seed 3497: 0.73-0.92 vs 0.96-1.01): kept for the worst state
TEST_FIRST_ENTRIES = 1 << 17

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


class Goal(str, Enum):
    """What the caller of :func:`.pack_steps.pack` (and of the ForestColl solve that
    packs, :func:`mccl_opt.allgather.solve.sub_forestcoll`) needs."""

    #: ``max_chunks=None``: the exact optimum, by this method (step-aware's default
    #: packing too).  The repair searches are capped by a forecast, as the exact few-trees
    #: packing follows a failure at any size.  A switch balancing that loses capacity
    #: declines before the packing, on a chain's sub-fabric too (the balanced restriction)
    EXACT = "exact"
    #: a chunk budget ``K``: a failed packing is followed by fewer chunks
    #: (``solve._fewer_chunks``), so the few-trees packing runs only up to
    #: :data:`~.packing.few_trees.FEW_TREES_CHEAP_ENTRIES` and the searches are uncapped
    BUDGET = "budget"
    #: ``max_chunks=None`` where a later method of the chain solves the fabric exactly
    #: (the weaker-direction fabric, :func:`..chain.solve_unbalanced`): past
    #: ``FEW_TREES_CHEAP_ENTRIES`` only the spread split's first packing, then decline
    #: (dragonfly 4x4x1x8 one way: 8-9 s CPU of exact split and packings, ~0.4 s by the
    #: general method).  A switch balancing that loses capacity is kept (the chain compares
    #: the rounded schedule with the next method's)
    DECLINABLE = "declinable"

    @classmethod
    def of(cls, max_chunks: int | None, declinable: bool = False) -> Goal:
        """The goal of a solve at ``max_chunks`` (``declinable``: a later method of the
        chain solves the fabric exactly; meaningful at ``None`` only)."""
        if max_chunks is not None:
            return cls.BUDGET
        return cls.DECLINABLE if declinable else cls.EXACT


@dataclass(frozen=True)
class ForestCollAsk:
    """What one ForestColl solve (:func:`mccl_opt.allgather.solve.sub_forestcoll`) is asked
    for, beyond the fabric, route and chunk limit; the defaults are a fabric's own solve."""

    #: keep a switch balancing that loses capacity (a chain's sub-fabric, whose rounded
    #: schedule the chain compares with the general method's; ``sub_forestcoll`` sets it)
    lossy_balance: bool = False
    #: the sub-fabric is a balanced restriction whose links may carry this many times their
    #: capacity on the real fabric (:func:`.pipeline.balanced_split`)
    headroom: Sequence[Fraction] | None = None
    #: above the tree limit at ``max_chunks=None``, the scaled packing instead of declining
    #: (the balanced restriction at scale, :func:`..restriction.stages.solve_by_restriction`)
    scaled: bool = False
    #: ``False``: the proportional spread split (the general method's seed trees,
    #: :func:`..general.restriction_seed.forestcoll_trees`)
    siblings_last: bool = True
    #: what the packing must achieve (:class:`Goal`; ``None``: :meth:`Goal.of` the limit)
    goal: Goal | None = None
    #: where balancing the budget's trees loses capacity, weigh a smaller budget balanced
    #: without loss too (the general method's seed, :func:`.pipeline.balanced_split`)
    fewer: bool = False


class Step(str, Enum):
    """One step of a :class:`PackPlan` (module doc: the order)."""

    REPAIR = "repair"
    GUARDED = "guarded"
    FEW_TREES = "few-trees"
    PLAIN = "plain"
    RAIL_FIRST = "rail-first"
    GREEDY = "greedy"
    EXACT_SPLIT = "exact-split"
    EXACT = "exact"


@dataclass(frozen=True)
class PackPlan:
    """The steps :func:`.pack_steps.pack` runs, in order, and how.

    ``test_stride``: the rooted test before the first repair packing sweeps every
    ``test_stride``-th sink (``None``: no test first); ``plain_first``: the first repair
    packings include the plain one (else it is :attr:`Step.PLAIN`); ``capped``: the repair
    searches stop where the few-trees packing is forecast cheaper
    (:func:`.pack_steps._pack_repair`); ``guarded_skips_tight``: the guarded split's
    plain-order repair packing is skipped on a tight graph; ``guarded_skips_narrow``: the
    guarded split's repair packing is skipped where a rank is its own tight set with an
    in-link of fewer than ``k`` units (:func:`.pack_steps.narrow_tight`), the few-trees
    packing coming next; ``declines``: the steps stop
    after the first packing, leaving the fabric to the chain's next method."""

    steps: tuple[Step, ...]
    test_stride: int | None
    plain_first: bool
    capped: bool
    guarded_skips_tight: bool
    guarded_skips_narrow: bool
    declines: bool


def plan_pack(goal: Goal, k: int, n: int) -> PackPlan:
    """The plan of a packing of ``k`` trees per root on ``n`` GPUs for ``goal``."""
    entries = k * n * n
    cheap = entries <= FEW_TREES_CHEAP_ENTRIES
    # the few-trees packing: at any size where this method delivers the exact optimum
    few = goal is Goal.EXACT or cheap
    # at None the exact few-trees packing follows a failed repair packing, so its searches
    # stop where they are forecast to cost more than it; uncapped, on a graph they cannot
    # pack they run until no augmenting chain is left (leaf-spine 8x2x8 with 4 spines, 41
    # trees per root: 1.3 M, 10.6 M and 4.5 M visits, 6.2 s CPU, before the few-trees
    # packing); capped at k·n², SuperPOD 2x4x8's completes at 4.1x that, 10x cheaper)
    capped = goal is not Goal.BUDGET
    # declinable and not cheap: only the capped repair packing runs before the next
    # method, so a sampled test decides whether to try it (the whole sweep that passes
    # cost 0.63 s on a one-way dragonfly 4x4x1x8 at 145 trees per root, for a 0.05 s try);
    # the guarded split's repair packing failed on every such state measured (one-way
    # dragonfly, 149-187 trees per root: 0.13-0.67 s of guarded split for nothing); the
    # plain, rail-first and greedy packings after it cost 0.3-0.5 s each at 64 GPUs and
    # 150-190 trees per root, the general method ~0.3 s in all
    declines = goal is Goal.DECLINABLE and not cheap
    test_first = k > TEST_FIRST_K or entries >= TEST_FIRST_ENTRIES
    stride = 1 if k > TEST_FIRST_K and not declines else max(1, n // TEST_FIRST_SINKS)
    # the plain repair packing may search for seconds there: the few-trees one goes first
    late_plain = k >= SCALED_MIN_K and entries > PLAIN_FIRST_ENTRIES
    small = n < RAIL_FIRST_MIN_RANKS
    # from SCALED_MIN_K the plain repair packing has had its k·n² visits (or comes after)
    few_next = k >= FEW_BEFORE_FAST_K
    steps = [Step.REPAIR]
    if not declines:
        steps.append(Step.GUARDED)
        if few and few_next:
            steps.append(Step.FEW_TREES)
        if late_plain:
            steps.append(Step.PLAIN)
        if small:
            # small fabrics grow wide-then-narrow one vertex per turn; where that gets
            # stuck (leaf-spine: every NIC link narrow) the rail-first order may not
            steps.append(Step.RAIL_FIRST)
        if few and not few_next and capped:
            # at None the exact few-trees packing goes before greedy: on a tight graph
            # greedy must use every unit and fails (leaf-spine 8x2x8 with 4 spines: 0.9 s),
            # and after failed repair packings it rescued no state at None of fuzz seeds
            # 3413 / 3511 / 3512, tight or not (one-way scrambled dragonfly 4x4x1x8 at
            # k = 31: 1.0 s, failing; docs/allgather.md, *Few-trees before greedy at None*)
            steps.append(Step.FEW_TREES)
        steps.append(Step.GREEDY)
        if few and not few_next and not capped:
            steps.append(Step.FEW_TREES)
        steps.append(Step.EXACT_SPLIT)
        if k * n * (n - 1) <= EXACT_PACK_MAX_EDGES:   # one max-flow per edge: beyond, hopeless
            steps.append(Step.EXACT)
    # at None, on a tight guarded graph the repair packing in the plain growth order failed
    # on every state measured (leaf-spine 4x2x8, 8x2x8 with 4 spines in three listings,
    # 4x2x8 one way: 0.04-0.26 s each); the rail-first retry (completes on 4x2x8) and the
    # few-trees packing follow
    # where the few-trees packing comes right after the guarded split, a rank that is its
    # own tight set and has an in-link of fewer than k units must take some trees through
    # that link; the repair packing cannot choose which (docs/allgather.md, *Narrow NIC
    # links*): on narrow-NIC dragonfly 4x2x1x8 at None (k = 103-293) it failed in
    # 0.14-0.44 s before a 0.07 s few-trees packing; on 4x1x1x8 it completed, slower than
    # the few-trees packing (0.07-0.23 s solves against 0.05 s)
    skips_narrow = few and few_next and not declines
    return PackPlan(tuple(steps), stride if test_first else None, not late_plain, capped,
                    capped and small, skips_narrow, declines)
