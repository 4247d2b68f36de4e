"""ForestColl-warm (paper §4.3): a guessed optimum certified by the trees that reach it.

A warm start guesses ``(k, y)`` from cut bounds that lie *above* the chunk-budget
optimum, so any schedule reaching ``k·y`` proves the guess exact, and with it the rate
cold would find (docs/allgather.md, *Modelling choices* and *Rerouting*).  In order:
the previous schedule kept as is (it still reaches the target), the previous trees
rerouted to carry it (:mod:`.reroute`), or (where worth it) a completed Phase 3
packing of ``k`` trees of bandwidth ``y``; at a ``k`` cold declines (``Run.cold_declines``:
the seeded general method is cold's route) only the first (docs/allgather.md, *Warm
skips what cold declines*).  Two guesses are tried:

* :func:`warm_guess`: ``x*`` guessed from single-GPU and previous cuts, no max-flow;
* :func:`warm_budget`: exact Phase 1, the chunk budget guessed by a few probes.

If neither is certified the caller runs the exact budget and :func:`keep_or_reroute`
tries the previous schedule and trees once more at cold's ``(k, y)``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from fractions import Fraction

from mccl_opt import anytime
from mccl_opt.schedule import Schedule
from ..assemble import Optimum, RerouteOutcome, Run, kept, packed, rerouted
from ..budget import EXACT_TREES_LIMIT, exact_k, guess_budget, guess_trees
from ..fabric import quantum_for
from ..forestcoll.pack_plan import TEST_FIRST_K
from ..forestcoll.pack_steps import Packed, Packing, SplitKind, spread_logical
from ..forestcoll.pipeline import Budget, balanced_split
from ..forestcoll.removal.splitting import sink_ranks
from ..forestcoll.sized import sized_visits
from ..forestcoll.packing.repair import repair_pack
from ..forestcoll.packing.scaled import SCALED_MIN_K, scaled_pack
from .reroute import (REROUTE_FLOOR_S, Rerouted, calibrated_cold_seconds, predicted_cold_seconds,
                      reroute)
from ..forestcoll.throughput import Fabric, cut_upper_bound, optimal_rate

__all__ = ["Certificate", "GuessKind", "warm_guess", "warm_budget", "keep_or_reroute"]


class Certificate(str, Enum):
    """How a guess was certified (the value of ``stats['phase1_guess']`` or
    ``stats['budget_guess']``), or that it was not."""

    KEPT = "certified by the previous schedule"
    REROUTED = "certified by rerouting"
    PACKED = "certified by packing"
    REJECTED = "rejected"
    SKIPPED = "skipped: cold declines this many exact trees per root"


class GuessKind(str, Enum):
    """Which warm guess (its ``stats`` key)."""

    X_STAR = "phase1_guess"
    BUDGET = "budget_guess"


@dataclass(frozen=True)
class Guess:
    """A guessed ``(k, y)`` (``y`` in quanta) whose ``k·y`` = ``target_gbps`` bounds the
    chunk-budget optimum from above; ``opt``: its Phase 1 (the bound or exact) and
    ``pack``: whether a packing may certify it when the previous trees cannot."""

    kind: GuessKind
    opt: Optimum
    target_gbps: float
    k: int
    y: Fraction
    pack: bool


def warm_guess(run: Run) -> Schedule | None:
    """ForestColl-warm without Phase 1's max-flow sweep: guess ``x*`` as the smallest
    single-GPU ingress/egress or previous-cut ratio (an upper bound), take ``k`` trees of
    bandwidth ``y = guess/k`` and certify them; ``None`` if not certified (the caller
    runs the exact Phase 1; nothing is reused from here)."""
    t = time.perf_counter()
    fab, quantum = run.cuts.fab, quantum_for(run.topo.arrays.capacity)
    bound = cut_upper_bound(fab, run.hint_cuts)
    found = guess_trees(fab, bound, run.max_chunks, run.cuts)
    run.stats["phase1_s"] = time.perf_counter() - t
    run.stats["phase1_maxflows"] = 0
    if found is None or found[0] > EXACT_TREES_LIMIT:   # cold would not pack that many
        return None
    k, y = found
    opt = Optimum.guessed(fab, bound, quantum, 0)
    # beyond the budget (k0 > K) a guess of x* is rarely reachable: when the previous
    # trees cannot be rerouted to it, no packing tests it either
    pack = run.max_chunks is None or exact_k(fab, bound) <= run.max_chunks
    return _keep_or_certify(run, Guess(GuessKind.X_STAR, opt, opt.x_star_gbps, k, y, pack))


def warm_budget(run: Run) -> Schedule | None:
    """ForestColl-warm when the ``x*`` guess was rejected because ``k0 > K`` (the budget
    optimum lies below ``x*``, e.g. Fail2 at >= 32 GPUs): the exact Phase 1 (seeded with
    the previous cut), then the chunk budget *guessed* with a few probing max-flows
    instead of its sweep (:func:`~mccl_opt.allgather.budget.guess_budget`) and certified by the previous
    schedule or rerouted previous trees, or by a packing when those cannot be rerouted
    at all; ``None`` if there is nothing to guess or that fails.  (A failed reroute
    means a non-tight guess more often than not, and the exact budget sweep costs less
    than a packing from 256 GPUs on.)"""
    t = time.perf_counter()
    fab, quantum = run.cuts.fab, quantum_for(run.topo.arrays.capacity)
    p1 = run.phase_one = optimal_rate(fab, run.hint_cuts)
    run.stats["phase1_s"] = time.perf_counter() - t
    run.stats["phase1_maxflows"] = p1.maxflow_calls
    t = time.perf_counter()
    found = guess_budget(fab, p1, run.max_chunks, run.hint_cuts, cuts=run.cuts)
    run.stats["budget_s"] = time.perf_counter() - t
    if found is None:
        return None
    k, y, probes = found
    run.stats["budget_maxflows"] = probes
    run.expect_cold(predicted_cold_seconds(k, run.topo.num_gpus))   # the allowance's share
    return _keep_or_certify(run, Guess(GuessKind.BUDGET, Optimum.guessed(fab, p1, quantum, probes),
                                       float(k * y) * quantum, k, y, pack=False))


def keep_or_reroute(run: Run, budget: Budget) -> Schedule | None:
    """After the exact budget: the previous schedule if it reaches cold's ``k·y``, else
    the previous trees rerouted to it, else ``None``."""
    opt = Optimum.of(budget)
    loads = run.prev.kept_loads(budget.target_gbps, run.max_chunks)
    if loads is not None:
        return kept(run, opt, loads)
    result = _reroute_previous(run, budget.fab, budget.k, budget.y)
    return None if result is None else rerouted(run, opt, result)


def _keep_or_certify(run: Run, guess: Guess) -> Schedule | None:
    """Certify ``guess``: keep the previous schedule if it already reaches the target,
    else reroute the previous trees to carry it, else (if ``guess.pack``, or when there
    were no trees to reroute) pack ``k`` trees of bandwidth ``y``; ``None`` if all fail
    (the caller falls back to the exact path)."""
    key = guess.kind.value
    loads = run.prev.kept_loads(guess.target_gbps, run.max_chunks)
    if loads is not None:
        run.stats[key] = Certificate.KEPT.value
        return kept(run, guess.opt, loads)
    if run.cold_declines(guess.k) is not None:
        run.stats[key] = Certificate.SKIPPED.value
        return None
    anytime.check("ForestColl-warm: before rerouting")
    result = _reroute_previous(run, guess.opt.fab, guess.k, guess.y)
    if result is not None:
        run.stats[key] = Certificate.REROUTED.value
        return rerouted(run, guess.opt, result)
    if not guess.pack and run.reroute is RerouteOutcome.FAILED:
        return None
    anytime.check("ForestColl-warm: before certifying by packing")
    if not _packing_pays(guess.k, run.topo.num_gpus, run.prev.schedule):
        run.stats["guess_packing"] = "skipped: predicted as costly as cold's packing"
        return None
    run.stats["k_exact"] = int(exact_k(guess.opt.fab, guess.opt.p1))
    found = _certify_by_packing(run, guess.opt.fab, guess.k, guess.y)
    if found is None:
        return None
    run.stats[key] = Certificate.PACKED.value
    return packed(run, guess.opt, found)


def _packing_pays(k: int, n: int, previous: Schedule | None) -> bool:
    """Whether a packing that certifies a guess is predicted cheaper than the cold
    solve it may replace.  It *is* cold's Phases 2-3 at the guessed budget
    (:data:`.reroute.COLD_S_PER_ENTRY` CPU seconds per entry ``k·n²``, the cold
    prediction itself, or the previous cold solve's measured time scaled to ``k``,
    :func:`.reroute.calibrated_cold_seconds`, if higher: ``k·n²`` misses Phase 2 at
    small ``k``), and a wrong guess adds all of it to the cold solve that follows, so it
    runs only where that is within :data:`.reroute.REROUTE_FLOOR_S` (small fabrics).
    Shared-nic 2x4x8-p2 at ``None`` (fuzz seed 3514, ``k = 1``: 2 ms predicted, 0.04 s
    measured) spent its whole warm allowance in that packing's Phase 2 and went cold:
    warm 0.027-0.031 vs cold 0.017-0.021 s CPU.  Before ``k·n²`` it ran whenever the
    wall-clock allowance (a share of the *previous* state's cold time) had room: multi-spine 2x2x8 at ``max_chunks=None``
    after a one-way fault (fuzz seed 3414), a wrong ``x*`` guess packed 27 trees per
    root, the allowance passed in it and the solve went cold: warm 0.05-0.06 s vs cold
    0.025-0.035 s CPU (docs/allgather.md, *A guess certified by packing*)."""
    report = previous.report if isinstance(previous, Schedule) else None
    carried = report.cold_cpu if report is not None and len(previous.gpus) == n else None
    calibrated = calibrated_cold_seconds(k, n, previous) or carried or 0.0
    return max(predicted_cold_seconds(k, n), calibrated) <= REROUTE_FLOOR_S


def _reroute_previous(run: Run, fab: Fabric, k: int, y: Fraction) -> Rerouted | None:
    """The previous trees, as ``k`` unit trees per root, rerouted to carry ``k·y``
    (quanta) on the new capacities, or ``None``."""
    if run.failed_target == (k, y):
        return None                     # deterministic: the same target fails again
    t = time.perf_counter()
    forest = run.prev.forest
    if forest is None:
        return None
    cold_s = calibrated_cold_seconds(k, run.topo.num_gpus, run.prev.schedule)
    spent = 0.0 if run.warm_spent is None else run.warm_spent()
    out = reroute(forest, run.topo, fab.cap, k, k * y, cold_s, spent)
    run.stats["reroute_s"] = time.perf_counter() - t
    run.reroute = RerouteOutcome.FAILED if out is None else RerouteOutcome.DONE
    run.stats["reroute"] = run.reroute.value
    if out is None:
        run.failed_target = (k, y)
    return out


def _certify_by_packing(run: Run, fab: Fabric, k: int, y: Fraction) -> Packed | None:
    """Balance, spread-split and repair-pack ``k`` trees per root of bandwidth ``y``
    (reusing the previous shapes; from :data:`~..forestcoll.pack_plan.TEST_FIRST_K` trees
    per root only after the rooted test, and scaled first, as cold packs); the packing
    if it completes -- then ``k·y`` is
    reached, which certifies a guessed ``(k, y)`` that bounds the optimum -- else
    ``None``."""
    arr, stats = run.topo.arrays, run.stats
    t = time.perf_counter()
    balanced = balanced_split(fab, arr.is_switch, k, y, run.max_chunks)
    balanced.record(stats)
    stats["balance_s"] = time.perf_counter() - t
    if not balanced.exact or balanced.k != k:
        return None
    t = time.perf_counter()
    lg = spread_logical(balanced.split, arr.rank_of)
    stats["phase2_s"] = time.perf_counter() - t
    stats["split"] = SplitKind.SPREAD.value
    t = time.perf_counter()
    n = lg.num_gpus                       # a wrong guess must not cost more than a packing
    visits = sized_visits(k * n * n, k * n * n)
    if visits is None or (k >= TEST_FIRST_K and
                          not lg.admits(k, order=sink_ranks(balanced.split, arr.rank_of))):
        stats["phase3_s"] = time.perf_counter() - t     # too long, or no packing completes
        return None
    classes, info = scaled_pack(n, lg.tail, lg.head, lg.units, k) if k >= SCALED_MIN_K \
        else (None, {})
    if classes is None:
        classes, info = repair_pack(n, lg.tail, lg.head, lg.units, k, run.shapes,
                                    max_visits=visits)
    stats["phase3_s"] = time.perf_counter() - t
    if classes is None:                   # a wrong guess fails here, before any greedy
        return None
    stats.update(info)
    result = Packed(lg, classes, k, SplitKind.SPREAD, Packing.REPAIR)
    result.record(stats)
    stats["k"] = int(k)
    return result
