"""The same certified rate on fewer trees: an exact schedule re-weighted at a vertex of
the tree master over its own trees (docs/allgather.md "Fewer trees at equal rate").

ForestColl is exact with ``k`` trees per root where ``k`` is the denominator of the
optimum, on a balanced fabric (:func:`.solve._chain`) and on a balanced restriction
``c'`` (:func:`.chain.solve_by_restriction`): on shared aggregation 2x2x8 with a one-way
NIC fault at ``max_chunks=None``, ``k = 2619`` and 2165 distinct trees, where the general
method's schedule of the same rate had 123; HPN 1x2x8 Fail2, 148 trees.
The tree master (paper §4.3 tree packing as an LP, :mod:`.general.live_master`) over
those trees has ForestColl's weights as a feasible point at the certified optimum, so
its optimum is that rate, and a basic optimum has at most one positive weight per row
(``roots + links``): the same rate on at most ``roots + links - 1`` trees.  The master is
solved once, stopped at the certified rate (:func:`.general.method.solve_general`
seeded with the schedule's own trees, ``first_only``: one master); the re-weighted trees are kept only
when they are fewer and reach the rate within :data:`RATE_TOL`.  The warm state stays
ForestColl's (its kept trees in units of ``1/k``): a warm solve of the same state reuses
them as before (shared aggregation 2x2x8 one way, same state warm: 0.038 s; with the
master's columns as warm state the route was declined, 0.16 s, cold's time).
"""

from __future__ import annotations

import dataclasses

from .. import anytime
from ..errors import SolveError, TopologyError
from ..schedule import Schedule, bottleneck_links, schedule_rate, share_loads
from ..topology import Topology

__all__ = ["fewer_trees", "VERTEX_LP_MAX_SIZE", "RATE_TOL"]

#: the master is solved only when its columns times rows stay below this (shared
#: aggregation 2x2x8: 2165 x 192, 0.09 s CPU; HPN 2x8x8 Fail2: 477 x 672, 0.06 s; the
#: 2x8x8 general method's 1536 x 672 took 0.93 s, a healthy 2x8x8's 8028 x 672 1.5 s)
VERTEX_LP_MAX_SIZE = 500_000

#: relative rate the re-weighted trees may lose to the master's float tolerance
RATE_TOL = 1e-9


def fewer_trees(topo: Topology, sched: Schedule | None, max_chunks: int | None,
                backend: str, previous: Schedule | None = None) -> Schedule | None:
    """``sched`` (an exact schedule, ``max_chunks=None``, of ``topo``) on fewer trees at
    the same rate: the warm start ``previous``'s trees where they still reach that rate
    (:func:`_previous_trees`, no LP), else those of a basic optimum of the tree master
    over ``sched``'s own trees; ``sched`` itself otherwise, with a chunk limit, when the
    master is larger than :data:`VERTEX_LP_MAX_SIZE`, or when a time limit passes during
    the master (``sched`` is already exact and was not offered as the limit's incumbent)."""
    if sched is None or max_chunks is not None:
        return sched
    reused = _previous_trees(topo, sched, previous)
    if reused is not None:
        return reused
    if len(sched.chunks) * (topo.num_gpus + topo.num_links) > VERTEX_LP_MAX_SIZE:
        return sched
    from .general.method import solve_general          # the general method loads on use
    from .general.restriction_seed import RestrictionSeed

    seed = RestrictionSeed(sched.lp_rate_gbps, (sched,), 0.0, "the schedule's own trees")
    try:
        vertex = solve_general(topo, backend=backend, max_chunks=None, seed=seed,
                               first_only=True)
    except (SolveError, TopologyError):
        return sched
    except anytime.TimeLimitReached:    # a finishing touch: the exact schedule stands
        return sched
    if len(vertex.chunks) >= len(sched.chunks) or \
            vertex.rate_gbps < sched.rate_gbps * (1 - RATE_TOL):
        return sched
    return _on(sched, vertex.chunks, vertex.rate_gbps, vertex.bottleneck,
               fewer_trees_s=vertex.report.seconds)


def _previous_trees(topo: Topology, sched: Schedule, previous: Schedule | None
                    ) -> Schedule | None:
    """``sched`` on the trees of the warm start ``previous`` when they are fewer, every
    hop is a link of ``topo`` and their rate on ``topo`` reaches ``sched``'s within
    :data:`RATE_TOL` (then it is the same certified optimum); else ``None``.  After a
    warm solve that reuses ForestColl's kept trees the previous re-weighted trees
    usually still fit: one load sum instead of the master (docs/allgather.md "Fewer
    trees at equal rate")."""
    if previous is None or previous.collective != "allgather" or \
            tuple(previous.gpus) != tuple(sched.gpus) or \
            not 0 < len(previous.chunks) < len(sched.chunks):
        return None
    try:
        loads = share_loads(topo, previous.chunks)
    except (TopologyError, TypeError, ValueError):      # a hop that is no link any more
        return None
    rate = schedule_rate(topo, loads)
    if not rate >= sched.rate_gbps * (1 - RATE_TOL):
        return None
    rate = min(rate, sched.lp_rate_gbps)
    return _on(sched, previous.chunks, rate, bottleneck_links(topo, loads, rate, None),
               fewer_trees_reused=True)


def _on(sched: Schedule, chunks: tuple, rate: float, bottleneck: tuple, **stats: object
        ) -> Schedule:
    """``sched`` on ``chunks`` (its report's method and certificate, ForestColl's warm
    state: its kept trees in units of ``1/k``); ``k`` becomes ``None``."""
    return dataclasses.replace(sched, chunks=chunks, rate_gbps=rate, bottleneck=bottleneck,
                               stats={**sched.stats, "fewer_trees_from": len(sched.chunks),
                                      **stats},
                               warm_state=sched.warm_state,
                               report=dataclasses.replace(sched.report, k=None))
