"""The same certified rate on fewer trees: an exact schedule re-weighted at a vertex of
the tree master over its own trees (docs/allgather_history.md "Fewer trees at equal rate").

ForestColl is exact with ``k`` trees per root where ``k`` is the denominator of the
optimum, on a balanced fabric (:func:`.solve._chain`) and on a balanced restriction
``c'`` (:func:`.restriction.stages.solve_by_restriction`): on shared aggregation 2x2x8 with a one-way
NIC fault at ``max_chunks=None``, ``k = 2619`` and 2165 distinct trees, where the general
method's schedule of the same rate had 123; HPN 1x2x8 Fail2, 148 trees.
The tree master (paper §4.3 tree packing as an LP, :mod:`.general.live_master`) over
those trees has ForestColl's weights as a feasible point at the certified optimum, so
its optimum is that rate, and a basic optimum has at most one positive weight per row
(``roots + links``): the same rate on at most ``roots + links - 1`` trees.  The master is
solved once over the schedule's distinct trees, stopped at the certified rate
(:func:`.general.tree_colgen.tree_column_generation`, one round); the trees of its basic
optimum are the schedule's own chunks at new shares (not rebuilt from the LP's
columns), kept only when they are fewer and reach the rate within :data:`RATE_TOL`.
It is solved only when it pays (:func:`master_pays`: more trees than rows, cheap, or
nearly so with a quarter of the trees linearly dependent on the tight rows), and on a warm solve that reuses the previous trees first the
previous schedule's own trees are tried (one load sum), then the master as a warm step
within the allowance (not started where its estimate, CPU seconds, exceeds what is
left in CPU seconds: :meth:`.warm.route.WarmRoute.cpu_left`).
The warm state stays ForestColl's (its kept trees in units of ``1/k``): a warm solve of
the same state reuses them as before (with the master's columns as warm state the route
was declined, cold's time).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import numpy as np

from .. import anytime
from ..errors import SolveError, TopologyError
from ..schedule import Schedule, bottleneck_links, schedule_rate, share_loads
from ..schedule_chunks import TreeChunk, TreeChunks, TreeTable, path_nodes
from ..report import Method, WarmUse
from ..topology import Topology
from .warm.kept import AllGatherWarmState
from .independence import column_rank
from .warm.route import WarmRoute

__all__ = ["fewer_trees", "master_pays", "master_seconds", "dependent_trees", "VERTEX_LP_MAX_SIZE",
           "MASTER_S_PER_NONZERO", "MASTER_FLOOR_S", "MASTER_CAP_S", "DEPENDENT_SHARE", "RATE_TOL"]

#: the master is solved only when its columns times rows stay below this (shared
#: aggregation 2x2x8: 2165 x 192, 0.09 s CPU; HPN 2x8x8 Fail2: 477 x 672, 0.06 s; the
#: 2x8x8 general method's 1536 x 672 took 0.93 s, a healthy 2x8x8's 8028 x 672 1.5 s)
VERTEX_LP_MAX_SIZE = 500_000

#: the master's measured CPU seconds per nonzero (a column's link crossings, summed over
#: the trees), for :func:`master_pays`' estimate: 0.5-1.8e-6 over 16 masters (fuzz seed
#: 3413's 32-64-GPU states at ``None``, dragonfly 4x4x1x8; 2-core machine, load 6-8).
#: Columns x rows (3e-7 each, before) missed how long the columns are: a dragonfly's 640
#: trees crossing ~280 links each, 181 106 nonzeros, took 0.24 s against 0.13 s estimated
#: (docs/allgather_history.md "One-way faults: the weaker direction after the restriction; the
#: re-weighting's estimate")
MASTER_S_PER_NONZERO = 1e-6
#: below as many trees as rows, the master is solved when it is estimated at most this
#: (s: it stays under the warm target's 20 ms floor) ...
MASTER_FLOOR_S = 0.01
#: ... or at most this (s: the warm target's floor) where :data:`DEPENDENT_SHARE` of the
#: trees are dependent: HPN 2x4x8 Fail2 (230 trees, 165 dependent, estimated 31 ms) and
#: 2x8x8 Fail1 (258, 128, 70 ms) stay unsolved as before (their
#: masters took 0.013 and 0.04 s CPU for 0.02 s solves)
MASTER_CAP_S = 0.02
#: the share of the trees that must be linearly dependent on the rows tight at the rate
#: (:func:`dependent_trees`; a vertex over them has about their rank): fuzz
#: states at ``None`` where the master was measured ran from 160 trees of rank 91 to 91
#: (fat-tree 2x2x1x8), 80 of rank 50 to 39 (irregular(7)), but 363 of rank 357 to 362 for
#: 0.2-0.3 s (fat-tree 4x2x2x8 two way; docs/allgather_history.md "A master only for a quarter's
#: gain").  A rule on the trees alone: the schedule no longer depends on the CPU seconds
#: the solve happened to take (it had been half of them, and fat-tree 2x2x1x8 got 91 or
#: 160 trees run to run)
DEPENDENT_SHARE = 0.25

#: relative rate the re-weighted trees may lose to the master's float tolerance
RATE_TOL = 1e-9


def fewer_trees(topo: Topology, sched: Schedule | None, max_chunks: int | None,
                backend: str, route: WarmRoute | None = None) -> Schedule | None:
    """``sched`` (an exact schedule, ``max_chunks=None``, of ``topo``) on fewer trees at
    the same rate: the warm start's trees (``route.given``) where they still reach that
    rate (:func:`_previous_trees`, no LP), else those of a basic optimum of the tree
    master over ``sched``'s own trees (:func:`_reweighted_once`); on a warm ``route``
    whose trees ``sched`` reuses, the master is a warm step within the allowance left,
    not started when its estimate (:func:`master_seconds`, CPU s) exceeds what is left
    (:meth:`.warm.route.WarmRoute.cpu_left`, CPU s).
    ``sched`` itself otherwise: with a chunk limit, past the allowance, or when the master
    does not pay (:func:`master_pays`)."""
    if sched is None or max_chunks is not None:
        return sched
    reused = _previous_trees(topo, sched, None if route is None else route.given)
    if reused is not None or not master_pays(topo, sched):
        return reused or sched
    if route is None or not route.active or sched.report.warm in (WarmUse.COLD, WarmUse.DECLINED):
        return _reweighted_once(topo, sched, backend)
    if master_seconds(sched) > route.cpu_left():
        return sched                         # it would not fit: the allowance is not spent
    return route.attempt("the re-weighting to fewer trees", Method.FORESTCOLL,
                         lambda _: _reweighted_once(topo, sched, backend), lambda: sched)


def master_pays(topo: Topology, sched: Schedule) -> bool:
    """Whether the master over ``sched``'s trees is solved (columns x rows at most
    :data:`VERTEX_LP_MAX_SIZE`): never with one tree per root or fewer (every root's
    shard needs a tree: no vertex has fewer; healthy dragonfly 4x4x1x8, 128 trees,
    0.07 s for none); with more trees than rows (roots + links), a basic optimum surely
    has fewer (shared aggregation 2x2x8 one way: 2165 trees, 192 rows -> 123); with
    fewer, when its estimate (:func:`master_seconds`) is at most :data:`MASTER_FLOOR_S`,
    or at most :data:`MASTER_CAP_S` where at least :data:`DEPENDENT_SHARE` of the trees
    are dependent (:func:`dependent_trees`): a rule on the trees alone (docs/allgather_history.md
    "When the re-weighting pays", "A master only for a quarter's gain")."""
    trees, rows = len(sched.chunks), topo.num_gpus + topo.num_links
    if trees <= topo.num_gpus or trees * rows > VERTEX_LP_MAX_SIZE:
        return False
    if trees > rows:
        return True
    estimate = master_seconds(sched)
    if estimate <= MASTER_FLOOR_S:
        return True
    return estimate <= MASTER_CAP_S and dependent_trees(topo, sched) >= DEPENDENT_SHARE * trees


def dependent_trees(topo: Topology, sched: Schedule) -> int:
    """How many of ``sched``'s trees exceed their rank as columns over the rows the
    master keeps tight at its rate: every root's row and every link ``sched`` saturates
    (its bottleneck).  0: ``sched``'s weights are already a basic solution of the master
    over its own trees at that rate, with no direction along which a tree leaves at equal
    loads on those rows, and the master can only reach another vertex, seldom smaller
    (leaf-spine 8x2x8 with 4 spines at ``None``: 366 trees of rank 366, 366 -> 365 and
    328 -> 328 for 0.2-0.3 s CPU); where it pays the trees are dependent, and a vertex
    keeps about their rank (irregular(7) 80 trees of rank 50 -> 39, HPN 1x2x8 116 of rank
    46 -> 45; docs/allgather_history.md "When the re-weighting pays")."""
    from .general.method import chunk_columns
    from .general.restriction_seed import table_columns

    roots, trees = table_columns(sched, topo) or chunk_columns((sched,), topo)
    if len(roots) != len(sched.chunks):
        return 0
    ratio = share_loads(topo, sched.chunks) / topo.arrays.capacity
    tight = np.flatnonzero(ratio >= ratio.max() * (1 - 1e-9))
    row = np.full(topo.num_links, -1, np.int64)
    row[tight] = np.arange(tight.size) + topo.num_gpus
    ptr = np.zeros(len(trees) + 1, np.int64)
    np.cumsum([len(e) for e in trees], out=ptr[1:])
    return len(trees) - column_rank(np.asarray(roots, np.int64), ptr,
                                    np.concatenate([np.zeros(0, np.int64), *trees]).astype(np.int64),
                                    row, topo.num_gpus + tight.size)


def master_seconds(sched: Schedule) -> float:
    """The master's estimated CPU seconds over ``sched``'s trees: its nonzeros
    (:func:`master_nonzeros`) at :data:`MASTER_S_PER_NONZERO` each."""
    return master_nonzeros(sched) * MASTER_S_PER_NONZERO


def master_nonzeros(sched: Schedule) -> int:
    """The tree master's nonzeros over ``sched``'s trees: every tree's link crossings
    (the hops of its edge paths), a repeated tree counted each time."""
    chunks = sched.chunks
    if isinstance(chunks, TreeChunks):
        table = chunks.table
        used = table.used_paths()
        hops = np.zeros(len(table.paths), np.int64)
        hops[used] = path_nodes(table.paths, used)[0] - 1
        return int(hops[table.edges].sum())
    return sum(len(path) - 1 for c in chunks for path in getattr(c, "edges", ()))


def _reweighted_once(topo: Topology, sched: Schedule, backend: str) -> Schedule:
    """``sched`` on the trees of the master's basic optimum (:func:`_vertex`) when they
    are fewer and reach its rate within :data:`RATE_TOL`; else ``sched`` (also when a
    time limit passes during the master: ``sched`` is already exact and was not offered
    as the limit's incumbent)."""
    t = time.perf_counter()
    try:
        vertex = _vertex(topo, sched, backend)
    except (SolveError, TopologyError):
        return sched
    except anytime.TimeLimitReached as stop:   # a finishing touch: the exact schedule
        if stop.owner.is_stage:                # stands (a warm step's expiry: the route's)
            raise
        return sched
    if vertex is None:
        return sched
    chunks, loads, saturated = vertex
    rate = schedule_rate(topo, loads)
    if len(chunks) >= len(sched.chunks) or rate < sched.rate_gbps * (1 - RATE_TOL):
        return sched
    return _on(sched, chunks, rate, loads,
               bottleneck_links(topo, loads, rate, None, saturated=saturated),
               fewer_trees_s=time.perf_counter() - t)


def _vertex(topo: Topology, sched: Schedule, backend: str
            ) -> tuple[Sequence[TreeChunk], np.ndarray, np.ndarray] | None:
    """A basic optimum of the tree master over ``sched``'s distinct trees, solved once
    and stopped at ``sched``'s certified rate (:func:`.general.tree_colgen.
    tree_column_generation`, one round): its trees as ``sched``'s own chunks at their
    new shares (no tree rebuilt from the LP's columns), their link loads and the links
    the LP saturates; ``None`` when a chunk is no tree of ``topo``, the LP dropped a
    column or fell short of the rate."""
    from ..backends import get_backend                  # the general method loads on use
    from .general.live_master import TreePool
    from .general.method import chunk_columns, rate_scale
    from .general.restriction_seed import table_columns
    from .general.tree_colgen import TreeCGOptions, tree_column_generation
    from .general.tree_rounding import fractional_shares

    roots, trees = table_columns(sched, topo) or chunk_columns((sched,), topo)
    if len(roots) != len(sched.chunks):
        return None
    distinct = TreePool().append(roots, trees)          # a repeated tree is one column
    scale = rate_scale(topo)
    capacity = topo.arrays.capacity / scale
    with get_backend(backend) as lp:
        res = tree_column_generation(topo, lp, capacity, [roots[i] for i in distinct],
                                     [trees[i] for i in distinct], TreeCGOptions(max_rounds=1),
                                     upper_bound=sched.lp_rate_gbps / scale)
    if res.status != "optimal" or len(res.pool) != distinct.size:
        return None
    shares = fractional_shares(res.pool, res.weights, topo.num_gpus)
    keep = np.flatnonzero(shares > 0)
    loads = res.pool.loads(np.where(shares > 0, shares, 0.0), topo.num_links)
    saturated = res.pool.loads(res.weights, topo.num_links) >= capacity * (1 - 1e-9)
    return _reweighted(sched.chunks, distinct[keep], shares[keep]), loads, saturated


def _reweighted(chunks: Sequence[TreeChunk], idx: np.ndarray, shares: np.ndarray
                ) -> Sequence[TreeChunk]:
    """The chunks ``idx`` of ``chunks`` at ``shares`` (a tree table stays a table)."""
    if isinstance(chunks, TreeChunks):
        t = chunks.table
        return TreeChunks(TreeTable(t.node_ids, t.paths, t.src[idx], shares, t.edges[idx]))
    return tuple(dataclasses.replace(chunks[i], share=float(f))
                 for i, f in zip(idx.tolist(), shares.tolist()))


def _previous_trees(topo: Topology, sched: Schedule, previous: Schedule | None
                    ) -> Schedule | None:
    """``sched`` on the trees of the warm start ``previous`` when they are fewer, every
    hop is a link of ``topo`` and their rate on ``topo`` reaches ``sched``'s within
    :data:`RATE_TOL` (then it is the same certified optimum); else ``None``.  After a
    warm solve that reuses ForestColl's kept trees the previous re-weighted trees
    usually still fit: one load sum instead of the master (docs/allgather_history.md "Fewer
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
    return _on(sched, previous.chunks, rate, loads, bottleneck_links(topo, loads, rate, None),
               fewer_trees_reused=True)


def _on(sched: Schedule, chunks: tuple, rate: float, loads: np.ndarray, bottleneck: tuple,
        **stats: object) -> Schedule:
    """``sched`` on ``chunks`` with link ``loads`` (its report's method and certificate,
    ForestColl's warm state: its kept trees in units of ``1/k``, with the loads of
    ``chunks``); ``k`` becomes ``None``."""
    return dataclasses.replace(sched, chunks=chunks, rate_gbps=rate, bottleneck=bottleneck,
                               stats={**sched.stats, "fewer_trees_from": len(sched.chunks),
                                      **stats},
                               warm_state=_with_loads(sched.warm_state, loads),
                               report=dataclasses.replace(sched.report, k=None))


def _with_loads(state: object, loads: np.ndarray) -> object:
    """``state`` with its kept trees' link loads replaced by ``loads``: a warm start keeps
    the schedule when its chunks still reach the rate, judged by these loads
    (:meth:`.warm.previous.Previous.kept_loads`), so they must be the loads of the
    chunks the schedule carries, not of the trees they were re-weighted from (fuzz
    seed 3533: a kept schedule claimed 59.35 Gbps that its chunks ran at 47.86)."""
    if isinstance(state, AllGatherWarmState) and state.trees is not None:
        return dataclasses.replace(state, trees=dataclasses.replace(state.trees, loads=loads))
    return state
