"""``solve_allgather``: ForestColl(-warm) AllGather synthesis (paper §4.3, App. C).

Read top to bottom, one call is:

1. a warm start first tries to *guess* the optimum and certify the guess by the
   previous schedule, its rerouted trees or a packing (:mod:`.certify`);
2. otherwise Phase 1 (exact optimum) and the chunk budget (:mod:`.pipeline`,
   :mod:`.throughput`, :mod:`.budget`), after which a warm start tries the previous
   schedule and trees once more at cold's budget;
3. switch balancing, Phase 2 switch removal and Phase 3 tree packing
   (:mod:`.pipeline`; step-aware: :mod:`.step_aware`);
4. the physical trees and the schedule (:mod:`.assemble`).

docs/allgather.md describes every phase and the measured figures.
"""

from __future__ import annotations

import time
from typing import Any

from ..errors import SolveError
from ..kernel_time import charge_apart, kernel_seconds
from ..schedule import Schedule
from ..topology import Topology
from .assemble import Optimum, Run, packed
from .budget import CutBounds
from .canonical import canonical
from .chain import (EXACT_TREES_LIMIT, cut_bound_gbps, solve_by_general, solve_unbalanced,
                    switches_balanced)
from .certify import Certificate, GuessKind, keep_or_reroute, warm_budget, warm_guess
from .fabric import fabric_of
from .pipeline import balanced_split, check_inputs, pack, phase_one_budget
from .warm import WarmState, restore_warm_state

__all__ = ["solve_allgather", "restore_warm_state", "WarmState"]


def solve_allgather(topo: Topology, warm: Schedule | None = None, backend: str = "highs",
                    max_chunks: int | None = 10, step_aware: Any = False) -> Schedule:
    """Throughput-optimal AllGather trees (ForestColl), warm-started from ``warm``.

    ``max_chunks=K``: every root's trees carry multiples of ``1/k`` for one ``k <= K``
    (the best such ``k``); ``None``: the exact optimum.  ``step_aware=True`` (or a
    :class:`.step_aware.StepAware` with a rate tolerance) uses the step-aware switch
    removal LP of App. C on ``backend`` for shallower trees.
    The fabric is solved in a canonical listing (:mod:`.canonical`), so the order a file
    lists switches and links in does not matter.  Fabrics with unbalanced switches, and
    any the ForestColl path cannot solve exactly, go to the general method (the
    forwarding-only optimum by column generation over trees, :mod:`.chain`,
    :mod:`.general`; ``step_aware`` does not apply there).  Raises
    :class:`TopologyError` for unusable fabrics, :class:`SolveError` only on numerical
    trouble (never an internal ``KeyError``/``IndexError``/``AssertionError``).  Numba
    kernels compiled or loaded inside the call are timed apart (``stats["kernel_load_s"]``,
    :mod:`mccl_opt.kernel_time`), not in ``seconds``.
    """
    with kernel_seconds() as kernels:
        sched = _solve(topo, warm, backend, max_chunks, step_aware)
    return charge_apart(sched, kernels)


def _solve(topo: Topology, warm: Schedule | None, backend: str, max_chunks: int | None,
           step_aware: Any) -> Schedule:
    check_inputs(topo, max_chunks, warm, backend)
    topo = canonical(topo)
    if not switches_balanced(topo):                   # ForestColl is exact on balanced only
        return solve_unbalanced(topo, warm, backend, max_chunks,
                                lambda sub, w, k=max_chunks: _typed_forestcoll(sub, w, backend, k,
                                                                               False))
    try:
        sched = _typed_forestcoll(topo, warm, backend, max_chunks, step_aware)
    except SolveError as e:
        return solve_by_general(topo, warm, backend, max_chunks, f"ForestColl: {e}",
                                cut_bound_gbps(topo))
    if sched is None:
        return solve_by_general(topo, warm, backend, max_chunks,
                                f"more than {EXACT_TREES_LIMIT} exact trees per root",
                                cut_bound_gbps(topo))
    if sched.stats.get("balanced_exactly") is False:
        return solve_by_general(topo, warm, backend, max_chunks, "switch balancing lost capacity",
                                cut_bound_gbps(topo))
    return sched


def _typed_forestcoll(topo: Topology, warm: Schedule | None, backend: str,
                      max_chunks: int | None, step_aware: Any) -> Schedule | None:
    """:func:`_forestcoll`, an internal error turned into a :class:`SolveError` naming the
    fabric (the chain of methods catches it)."""
    try:
        return _forestcoll(topo, warm, backend, max_chunks, step_aware)
    except (KeyError, IndexError, AssertionError, ZeroDivisionError) as e:
        raise SolveError(f"ForestColl failed on {topo.name!r} ({type(e).__name__}: {e}); "
                         "a bug: please report the topology file") from e


def _forestcoll(topo: Topology, warm: Schedule | None, backend: str, max_chunks: int | None,
                step_aware: Any) -> Schedule | None:
    """The ForestColl(-warm) steps 1-4 on a canonically listed ``topo``; ``None`` when
    the exact optimum (``max_chunks=None``) needs more than :data:`.chain.EXACT_TREES_LIMIT`
    trees per root."""
    run = Run.start(topo, warm, max_chunks)
    rewarm = run.prev is not None and not step_aware

    if rewarm:                                        # 1. guesses, certified
        run.cuts = CutBounds(fabric_of(topo)[0])      # cut bounds shared by the guesses
        quick = warm_guess(run)
        if quick is not None:
            return quick
        run.stats[GuessKind.X_STAR.value] = Certificate.REJECTED.value
        quick = warm_budget(run)
        if quick is not None:
            return quick
        run.stats[GuessKind.BUDGET.value] = Certificate.REJECTED.value

    budget = phase_one_budget(topo, max_chunks, run.stats, run.hint_cuts, run.cuts)   # 2.
    if max_chunks is None and budget.k > EXACT_TREES_LIMIT:
        return None
    if rewarm:
        quick = keep_or_reroute(run, budget)
        if quick is not None:
            return quick

    arr = topo.arrays                                 # 3.
    t = time.perf_counter()
    balanced = balanced_split(budget.fab, arr.is_switch, budget.k, budget.y, max_chunks)
    balanced.record(run.stats)
    run.stats["balance_s"] = time.perf_counter() - t
    if step_aware:
        from .step_aware import StepAware, step_aware_pack      # only when asked for

        opts = step_aware if isinstance(step_aware, StepAware) else None
        result = step_aware_pack(balanced.split, arr.rank_of, balanced.k, run.guides, run.stats,
                                 backend, opts)
    else:
        result = pack(balanced.split, arr.rank_of, balanced.k, run.guides, run.stats, run.shapes)
    return packed(run, Optimum.of(budget), result)                  # 4.
