"""The warm start's own schedule as a floor: never return a worse one (docs/alltoall.md,
*The warm schedule is a floor*).

After a capacity-only change the previous schedule's chunks are still a valid AllToAll
schedule on the new fabric, at the rate ``min_a cap_a / load_a`` under the new
capacities.  A solve keeps it when its own rounding (or, under a time limit, its
first routed schedule) is slower, and the deep dive (:func:`~.rounding.deep_dive`) takes
its rate as the bar to beat: when it is within ``good_enough`` of the LP rate there is
nothing to dive for.  The LP rate and its certified bound stay those of the solve, so
the reported gap is the kept schedule's honest gap.  Costs one pass over its routes.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from ..link_rate import LOAD_NOISE, rate_of_loads
from .assemble import Outcome
from .problem import Problem
from .state import AllToAllWarmState, ChunkRoutes

__all__ = ["Kept", "kept_schedule", "keep_if_better"]


class Kept(NamedTuple):
    """The old chunk routes (same links as the new fabric), their share loads and rate."""

    routes: ChunkRoutes
    loads: np.ndarray
    rate: float


def kept_schedule(prob: Problem, state: AllToAllWarmState | None, max_chunks: int | None,
                  max_steps: int) -> Kept | None:
    """``state``'s schedule re-rated on ``prob``, when it is valid there: the same nodes
    and links (capacities may differ), the same ``max_chunks``, every pair's shares
    summing to 1 and no route longer than ``max_steps`` GPU arrivals; else ``None``."""
    if state is None or state.chunks is None or state.chunks.max_chunks != max_chunks:
        return None
    if not state.fabric.same_links(prob):
        return None
    chunks = state.chunks
    cover = np.bincount(chunks.pair, weights=chunks.share, minlength=prob.num_pairs)
    if cover.size != prob.num_pairs or np.abs(cover - 1.0).max(initial=0.0) > 1e-9:
        return None
    if max_steps < prob.topo.num_nodes - 1 and (
            chunks.routes.sums(prob.is_step_arc) > max_steps).any():
        return None
    loads = chunks.routes.loads(chunks.share, prob.num_links)
    if not (loads > LOAD_NOISE).any():
        return None
    return Kept(chunks, loads, rate_of_loads(prob.capacity, loads, noise=LOAD_NOISE))


def keep_if_better(outcome: Outcome, kept: Kept | None) -> Outcome:
    """``outcome`` with the kept schedule's chunks instead of its own when they are
    faster (rounding ``"kept"``; its LP columns, bound and status unchanged, its LP rate
    raised to the kept rate when below: the kept shares are a feasible master point)."""
    if kept is None:
        return outcome
    own = rate_of_loads(outcome.warm_state.fabric.capacity, outcome.loads, noise=LOAD_NOISE,
                        idle=0.0)
    if kept.rate <= own * (1 + 1e-12):
        return outcome
    no_column = np.full(outcome.warm_state.lp.count, -1, dtype=np.int64)
    routes = dataclasses.replace(kept.routes, of_column=no_column)
    report = dataclasses.replace(outcome.report, rounding="kept",
                                 extra={**outcome.report.extra, "own_rounded_rate": own})
    return dataclasses.replace(outcome, loads=kept.loads, lp_rate=max(outcome.lp_rate, kept.rate),
                               warm_state=dataclasses.replace(outcome.warm_state, chunks=routes),
                               report=report)
