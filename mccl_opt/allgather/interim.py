"""Intermediate schedules of a time-limited exact solve of an unbalanced fabric
(issue 25: "a valid schedule first, then better ones"; docs/allgather.md, *Schedules
between the first one and the optimum*).

At ``max_chunks=None`` an unbalanced fabric of hundreds of GPUs is solved exactly by
ForestColl on its best balanced restriction ``c'`` (:mod:`.chain`): the cutting-plane
LP (2 s CPU on HPN 4x16x8 with one NIC at a quarter speed one way), then the scaled
packing of the exact optimum's thousands of trees per root (4.6 s CPU, more than
the whole limit on a loaded machine).  A limit shorter
than that used to return the first schedule (:mod:`.first`), at ~12.5 % of the
optimum there.  Under a limit, on such fabrics, the chain now offers
(:func:`mccl_opt.anytime.offer`) two cheap schedules on the way:

* ForestColl at :data:`WEAKER_CHUNKS` chunks per root on the *weaker-direction*
  fabric, before the cutting-plane LP (its trees are valid on the real fabric; 0.09 s
  CPU, 90.1 % of the optimum there);
* ForestColl at :data:`RESTRICTED_CHUNKS` on ``c'``, once the LP has certified it,
  before the exact packing (0.15 s, 99.75 %; its certified bound is ``c'``'s optimum,
  the forwarding-only one).

A few chunks per root suffice (measured on HPN 4x16x8 above, CPU s and share of the
optimum: weaker-direction K=1/2/4/10: 0.08/0.09/0.13/0.31 s, 90.1/90.1/90.6/90.7 %;
``c'`` K=2/4/10: 0.10/0.15/0.32 s, 99.36/99.75/99.99 %): the first offer must come
early, and the exact packing follows.

Each costs one ForestColl solve at a small chunk budget, a fraction of the exact one; without a limit, below :data:`INTERIM_FROM_GPUS` GPUs and with a
chunk budget (where the chain's own schedules are these) nothing is built.
"""

from __future__ import annotations

import dataclasses
import time
from fractions import Fraction
from typing import TYPE_CHECKING, Sequence

from .. import anytime
from ..errors import SolveError, TopologyError
from ..report import Attempt, Method
from ..schedule import Schedule, bottleneck_links, schedule_rate, share_loads
from ..topology import Topology
from .forestcoll.pack_plan import ForestCollAsk

if TYPE_CHECKING:
    from .stage import ForestColl, Trail

__all__ = ["WEAKER_CHUNKS", "RESTRICTED_CHUNKS", "INTERIM_FROM_GPUS", "wanted", "offer_on",
           "rerated"]

#: the chunk budget of the weaker-direction fabric's intermediate schedule
WEAKER_CHUNKS = 2

#: the chunk budget of the balanced restriction's intermediate schedule
RESTRICTED_CHUNKS = 4

#: from this many GPUs (where the exact solve of an unbalanced fabric takes seconds:
#: the scaled packing on ``c'``, :data:`.restriction.stages.SCALED_RESTRICTION_FROM`)
INTERIM_FROM_GPUS = 256


def wanted(topo: Topology, max_chunks: int | None) -> bool:
    """Whether this solve offers intermediate schedules: under a time limit, at
    ``max_chunks=None``, from :data:`INTERIM_FROM_GPUS` GPUs."""
    return (max_chunks is None and topo.num_gpus >= INTERIM_FROM_GPUS
            and anytime.limit_left() is not None)


def offer_on(topo: Topology, sub: Topology, k: int, forestcoll: ForestColl, method: Method,
             trail: Trail, bound_gbps: float | None = None, to_gbps: float = 1.0,
             headroom: Sequence[Fraction] | None = None) -> None:
    """ForestColl at ``k`` chunks per root on the balanced sub-fabric ``sub`` of
    ``topo`` (its trees valid on ``topo``), re-rated on ``topo`` and offered to the
    limit as ``method``; ``bound_gbps``: a certified bound on ``topo`` (``c'``'s
    optimum), if any; ``to_gbps``/``headroom``: as :class:`.restriction.stages.Restricted`'s.  A
    failure is recorded in ``trail`` and leaves the offers as they were."""
    t = time.perf_counter()
    where = f"an intermediate schedule (K={k})"
    try:
        found = forestcoll(sub, None, k, ForestCollAsk(headroom=headroom))
    except (SolveError, TopologyError) as e:
        trail.add(Attempt(method, time.perf_counter() - t, f"failed: {where}: {e}"))
        return
    if not isinstance(found, Schedule):             # declined: nothing to offer
        trail.add(Attempt(method, time.perf_counter() - t, f"declined: {where}"))
        return
    anytime.check(where)                            # re-rating: ~6 ms CPU at 512 GPUs
    sched = rerated(found, topo, found.lp_rate_gbps * to_gbps, method, where)
    sched.report = dataclasses.replace(sched.report, bound_gbps=bound_gbps)
    trail.add(Attempt(method, time.perf_counter() - t, f"offered: {where}"))
    anytime.offer(sched)


def rerated(sched: Schedule, topo: Topology, lp_rate: float, method: Method, reason: str,
            cut_bound: float | None = None) -> Schedule:
    """``sched`` (trees synthesized for a sub-fabric of ``topo``) on ``topo``'s
    capacities: loads, rate and bottleneck recomputed, ``lp_rate_gbps`` set, reported as
    ``method`` (optimal when ``lp_rate`` is the forwarding-only optimum, bound by it)."""
    loads = share_loads(topo, sched.chunks)
    rate = schedule_rate(topo, loads)
    stats = {**sched.stats, "method": method.value, "general_reason": reason}
    stats.pop("cut_bound_gbps", None)
    if cut_bound is not None:
        stats["cut_bound_gbps"] = cut_bound
    report = dataclasses.replace(sched.report, method=method, bound_gbps=max(lp_rate, rate),
                                 cut_bound_gbps=cut_bound)
    return dataclasses.replace(
        sched, lp_rate_gbps=lp_rate, rate_gbps=rate, stats=stats, report=report,
        bottleneck=bottleneck_links(topo, loads, rate, report.k))
