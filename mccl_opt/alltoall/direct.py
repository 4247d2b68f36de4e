"""A schedule straight from the initial routing, without the LP (paper §4.2; issue 25
"a time limit that holds").

The first restricted master is built on the initial routing (:mod:`.initial`): one
shortest path per pair.  That routing is already a feasible AllToAll schedule -- every
pair's whole shard on its path, all ``K`` chunks on it -- at the rate
``min_a cap_a / load_a``.  At 2,048 GPUs (4M pairs) the first master costs about four
times the routing itself (the master's arrays, its closed-form solution, the rounding),
so when a time limit leaves less than :data:`~.initial.MASTER_COST_FACTOR` routings'
time after the routing, the solve returns this schedule instead (status ``time_limit``;
its certified bound is the node-set cut bound, :mod:`.cut_bound`).  Costs O(path
entries): one pass for the loads.
"""

from __future__ import annotations

import time

import numpy as np

from .assemble import SATURATION_REL_TOL, Outcome, RunReport, WarmMode
from .colgen import CGStatus
from .initial import MASTER_COST_FACTOR
from .pricing import PricedColumns
from .problem import Problem
from .rows import Rows
from .state import AllToAllWarmState, ChunkRoutes, LPColumns, OldFabric

__all__ = ["no_room_for_master", "routed_outcome"]


def no_room_for_master(deadline: float | None, routed_s: float) -> bool:
    """Whether a time limit's ``deadline`` (``time.perf_counter()``) leaves less than
    the first master's expected cost, :data:`~.initial.MASTER_COST_FACTOR` times the
    seconds the initial routing took."""
    return deadline is not None and deadline - time.perf_counter() < MASTER_COST_FACTOR * routed_s


def routed_outcome(prob: Problem, routing: PricedColumns, max_chunks: int | None, backend: str,
                   max_steps: int) -> Outcome:
    """The :class:`~.assemble.Outcome` of ``routing`` (one path per pair, every pair
    routed) as the schedule itself: each path carries its pair's whole shard (``K``
    chunks).  The warm state's LP columns are the routing with ``y = 1`` (a feasible,
    uncertified master point: no basis, no pricing certificate)."""
    pair = prob.pair_index(routing.src, routing.dst)
    routes = Rows(routing.start, routing.arcs)
    ones = np.ones(pair.size)
    loads = routes.loads(ones, prob.num_links)
    t = float((loads / prob.capacity).max(initial=0.0))
    rate = 1.0 / t if t > 0 else float("inf")
    saturated = loads >= prob.capacity * t * (1 - SATURATION_REL_TOL)
    chunks = ChunkRoutes(pair, routes, ones, np.arange(pair.size, dtype=np.int64), max_chunks)
    state = AllToAllWarmState(OldFabric.of(prob), LPColumns(pair, routes, ones, t), chunks)
    report = RunReport(
        status=CGStatus.TIME_LIMIT, warm_mode=WarmMode.COLD, backend=backend, iterations=0,
        rounds=0, columns=int(pair.size), columns_dropped=0, warm_columns=0,
        lp_bound_gbps=float("inf"), bound_history=[], max_steps=max_steps, rounding="routed",
        extra={"first_schedule": "routed"})
    return Outcome(loads, rate, saturated, state, report, None)
