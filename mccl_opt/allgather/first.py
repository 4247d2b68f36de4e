"""The first valid AllGather schedule of a time-limited solve (:mod:`mccl_opt.anytime`).

Built before any optimisation so that a limit that passes early still returns trees:

* warm: the previous schedule's trees, re-rated on the new capacities, when they are
  still trees of the fabric (same GPUs, every hop a link);
* otherwise ``r = min(4, max_chunks)`` multiplicative-weights rounds of every root's
  cheapest tree (:func:`.general.tree_colgen.mwu_trees`, the general method's starting columns), each
  tree carrying ``1/r`` of its root's shard.

Neither is optimal; the solve then improves on it and the report says which one was
returned (:class:`~mccl_opt.report.Method.FIRST`).
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import TopologyError
from ..report import Method, SolveReport, Termination, WarmUse
from ..schedule import Schedule, TreeChunk, bottleneck_links, schedule_rate, share_loads
from ..topology import Topology
from .general.tree_colgen import mwu_trees
from .general.method import forest_edges

__all__ = ["first_schedule", "previous_trees", "FIRST_ROUNDS"]

#: multiplicative-weights rounds of the cold first schedule (its shares are ``1/r``)
FIRST_ROUNDS = 4


def previous_trees(topo: Topology, warm: Schedule | None) -> Schedule | None:
    """``warm``'s trees re-rated on ``topo``'s capacities, or ``None`` when they are not
    trees of ``topo`` (other GPUs, or a hop that is no link)."""
    if warm is None or tuple(warm.gpus) != tuple(topo.gpus) or not len(warm.chunks):
        return None
    try:
        loads = share_loads(topo, warm.chunks)
    except TopologyError:
        return None
    rate = schedule_rate(topo, loads)
    if not 0 < rate < float("inf"):
        return None
    return Schedule(collective="allgather", topology=topo.name, gpus=topo.gpus, rate_gbps=rate,
                    lp_rate_gbps=rate, max_chunks=warm.max_chunks, chunks=warm.chunks,
                    bottleneck=bottleneck_links(topo, loads, rate, warm.max_chunks),
                    solver={"backend": "none", "seconds": 0.0, "algorithm": "previous-trees"},
                    stats={"warm": True, "method": "previous-trees"},
                    report=_report(WarmUse.KEPT, warm.max_chunks, None))


def first_schedule(topo: Topology, warm: Schedule | None, max_chunks: int | None) -> Schedule:
    """The previous trees if still valid (:func:`previous_trees`), else cheapest trees by
    multiplicative weights; ``lp_rate_gbps`` is the schedule's own rate (no optimum is
    known yet)."""
    t = time.perf_counter()
    previous = previous_trees(topo, warm)
    if previous is not None:
        return previous
    rounds = FIRST_ROUNDS if max_chunks is None else min(FIRST_ROUNDS, max_chunks)
    arr = topo.arrays
    roots, trees = mwu_trees(topo, arr.capacity / float(arr.capacity.max()), rounds)
    per_root = np.bincount(np.asarray(roots, np.int64), minlength=topo.num_gpus)
    gpus = topo.gpus
    chunks = tuple(TreeChunk(gpus[r], 1.0 / int(per_root[r]), edges)
                   for r, edges in zip(roots, forest_edges(topo, trees)))
    loads = share_loads(topo, chunks)
    rate = schedule_rate(topo, loads)
    k = int(per_root.max())
    return Schedule(collective="allgather", topology=topo.name, gpus=gpus, rate_gbps=rate,
                    lp_rate_gbps=rate, max_chunks=max_chunks, chunks=chunks,
                    bottleneck=bottleneck_links(topo, loads, rate, k),
                    solver={"backend": "none", "seconds": time.perf_counter() - t,
                            "algorithm": "cheapest-trees"},
                    stats={"warm": warm is not None, "method": "cheapest-trees", "k": k},
                    report=_report(WarmUse.COLD, max_chunks, k))


def _report(warm: WarmUse, max_chunks: int | None, k: int | None) -> SolveReport:
    """A first schedule's report: no optimum known, so no bound of its own."""
    return SolveReport(collective="allgather", method=Method.FIRST,
                       termination=Termination.TIME_LIMIT, bound_gbps=None, warm=warm,
                       max_chunks=max_chunks, seconds=0.0, k=k)
