"""The cold ForestColl phases (paper §4.3), shared by :func:`~mccl_opt.allgather.solve.solve_allgather`,
the warm certificates (:mod:`~mccl_opt.allgather.warm.previous.certify`) and step-aware switch removal (:mod:`.step_aware`).

Phase 1 and the chunk budget (:func:`phase_one_budget`) and switch balancing
(:func:`balanced_split`); Phase 2 switch removal and Phase 3 packing are
:func:`.pack_steps.pack`, which runs the steps of a :class:`.pack_plan.PackPlan` (which
packers, in which order).  Each returns a typed result; ``stats`` only receives the JSON
view (timings, names).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Sequence

import numpy as np

from mccl_opt import anytime, progress
from mccl_opt.entry_checks import check_backend, check_max_chunks, check_topology, check_warm
from mccl_opt.errors import SolveError
from mccl_opt.schedule import Schedule
from mccl_opt.topology import Topology
from ..budget import CutBounds, choose_trees, exact_k
from ..fabric import fabric_of
from .removal.balancing import BALANCING, balance_switches
from .removal.splitting import SplitGraph
from .throughput import Fabric, PhaseOneResult, optimal_rate
from .removal.unit_rounding import restriction_units

__all__ = ["Budget", "Balanced", "check_inputs", "phase_one_budget", "balanced_split", "gbps"]


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
    the fabric with every cable at a switch at its weaker direction was used;
    ``fallback``: where this is the smaller budget balanced without loss, the best lossy
    option, packed instead when this one does not pack (a tight graph the fast packers
    can miss: dragonfly 4x4x1x8 with an NVLink at 65 % one way, 9 trees per root)."""

    split: SplitGraph
    k: int
    exact: bool
    symmetrized: bool = False
    fallback: Balanced | None = None

    def record(self, stats: dict[str, Any]) -> None:
        stats["balanced_exactly"] = self.exact
        if self.symmetrized:
            stats["symmetrized"] = True


def balanced_split(fab: Fabric, is_switch: np.ndarray, k: int, y: Fraction,
                   max_chunks: int | None, headroom: Sequence[Fraction] | None = None,
                   optimum: Fraction | None = None, lossless: bool = False,
                   fewer: PhaseOneResult | None = None) -> Balanced:
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
    restriction_units`).  ``lossless`` (the caller keeps only a balancing that gives up
    nothing): where none exists, the split of the floors is returned unbalanced, marked
    not exact, without weighing the lossy options (dragonfly 4x4x1x8 one way at
    ``max_chunks=None``, fuzz seed 3511: ~0.09 s of re-optimised and symmetrized budgets
    that the caller then declined; docs/allgather_history.md "Lossless balancing first").
    ``fewer`` (``fab``'s Phase 1, with ``headroom`` and a chunk budget): where the budget's
    ``k`` loses capacity, the budget of at most ``k - 1`` trees per root balanced without
    loss (:func:`_fewer_lossless`) is weighed too, first, so a tie goes to it."""
    units = (fab.cap * y.denominator) // y.numerator
    options = []                        # (bandwidth per root in quanta, split, k, symmetrized)
    if headroom is not None:
        found, rounded = restriction_units(fab, is_switch, k, y, headroom, max_chunks is None,
                                           optimum)
        if found is not None:
            return Balanced(_units_split(fab, is_switch, found[0], found[1]), found[1], True)
    anytime.check(BALANCING)
    split = SplitGraph.from_links(fab.n, fab.tail, fab.head, units, is_switch, fab.gpus, k)
    if balance_switches(split):
        return Balanced(split, k, True)
    if lossless:
        return Balanced(split, k, False)
    if fewer is not None and headroom is not None and max_chunks is not None and k > 1:
        option = _fewer_lossless(fab, is_switch, k, headroom, fewer)
        if option is not None:
            options.append(option)          # first: a tie goes to it
    lossy_from = len(options)
    if headroom is not None and rounded is not None:
        options.append((k * rounded[1], _units_split(fab, is_switch, rounded[0], k), k, False))
    original, unit = fab, Fraction(1)   # a unit of ``fab``'s capacities, in quanta
    for _ in range(3):
        anytime.check(BALANCING)
        kept = np.array([split.units.get((a, b), 0) for a, b in
                         zip(fab.tail.tolist(), fab.head.tolist())], np.int64)
        fab, unit = fab.with_caps(kept), unit * y
        balanced = _split_for(fab, is_switch, max_chunks)
        if balanced is None:
            break
        split, k, y, exact = balanced
        if exact:
            options.append((k * y * unit, split, k, False))
            break
    anytime.check(BALANCING)
    balanced = _split_for(_symmetrized(original, is_switch), is_switch, max_chunks)
    if balanced is not None and balanced[3]:
        split, k, y, _ = balanced
        options.append((k * y, split, k, True))
    if not options:
        raise SolveError("switches could not be balanced (in- vs out-capacity) without losing "
                         "every tree, even with each cable at its weaker direction; check the "
                         "one-directional links of the fabric")
    best = max(range(len(options)), key=lambda i: options[i][0])   # ties: the first
    _, split, k, symmetrized = options[best]
    fallback = None
    if best < lossy_from < len(options):
        _, other, k_other, sym_other = max(options[lossy_from:], key=lambda o: o[0])
        fallback = Balanced(other, k_other, False, sym_other)
    return Balanced(split, k, False, symmetrized, fallback)


#: :func:`_fewer_lossless` weighs a smaller budget only up to this share of the budget's
#: trees per root: at a tie (the rule) fewer trees save packing and master columns in
#: proportion, while a lossless graph may still not pack by the fast packers (the lossy
#: option then packs after it: dragonfly 4x4x1x8, NVLink at 65 % one way, 9 of 10 trees
#: per root failed in 0.4 s of a 0.39 s seed), so a near-equal count is not worth it
FEWER_TREES_SHARE = 0.75


def _fewer_lossless(fab: Fabric, is_switch: np.ndarray, k: int, headroom: Sequence[Fraction],
                    p1: PhaseOneResult) -> tuple[Fraction, SplitGraph, int, bool] | None:
    """The option of :func:`balanced_split` (bandwidth per root, split, trees per root,
    symmetrized) of the best budget of at most ``k - 1`` trees per root on the restriction
    ``fab`` when its units round without loss (:mod:`.removal.unit_rounding`), else
    ``None``.  Dragonfly 4x4x1x8 one way, the general method's seed at 16 chunks (fuzz
    seeds 3497 / 3511): ``k = 13`` balances only by giving up capacity, 99.928 % / 99.989 %
    of the optimum, where ``k = 8`` rounds without loss to 99.989 % with 8/13 of the trees
    to pack and to re-weight (docs/allgather_history.md "Lossless balancing first")."""
    k2, y2, _ = choose_trees(fab, p1, k - 1)
    if k2 == 0 or y2 <= 0 or k2 > FEWER_TREES_SHARE * k:
        return None
    found, _ = restriction_units(fab, is_switch, k2, y2, headroom, False, None)
    if found is None:
        return None
    return found[1] * y2, _units_split(fab, is_switch, found[0], found[1]), found[1], False


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
    return fab.with_caps(cap)
