"""Equal-rate AllGather schedules that tiny capacity errors do not reshape.

With a chunk budget, ForestColl gives every link ``floor(cap / y)`` trees of bandwidth
``y`` (paper §4.3, :mod:`.budget`).  A capacity measured a hair below a multiple of
``y`` (49.9 for a true 50 Gbps NIC, ``y`` = 8.33) therefore loses a whole tree unit:
the budget rate is often unchanged, but the packing is a different forest, and two
forests of one fluid rate can differ by ~9 % once chunks are cut into pieces and
pipelined (:mod:`mccl_opt.sim`; on irregular fabric 7 with a 50 Gbps NIC cable the
49.9 solve simulated at 0.912 of the 50.0 one on the true fabric).

:func:`unit_snapped` raises every capacity lying within a relative ``tol`` below a
multiple of ``y`` to that multiple; :func:`tolerant_allgather` solves that fabric
instead, so a schedule built on a measured 49.9 is the one the true 50 gives (its rate
on the given fabric at most ``tol`` below; optionally only when it simulates faster).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

import numpy as np

from ..errors import InputError
from ..schedule import SATURATION_TOL, Schedule, bottleneck_links, schedule_rate, share_loads
from ..topology import Topology

__all__ = ["DEFAULT_TOLERANCE", "unit_snapped", "tolerant_allgather"]

#: relative capacity error a measurement may carry without reshaping the forest
DEFAULT_TOLERANCE = 0.015

#: relative distance below which a capacity already is a multiple of ``y``
_ON_MULTIPLE = 1e-9


def unit_snapped(topo: Topology, sched: Schedule, tol: float = DEFAULT_TOLERANCE) -> Topology | None:
    """``topo`` with each capacity within ``tol`` (relative) below a multiple of the tree
    bandwidth ``y = rate / k`` of ``sched`` (a ForestColl schedule with ``stats["k"]``)
    raised to that multiple; ``None`` when no capacity is (nothing to snap, or no ``k``)."""
    if not 0 <= tol < 1:
        raise InputError(f"the capacity tolerance must be in [0, 1), got {tol!r}")
    k = sched.stats.get("k")
    if not isinstance(k, int) or k < 1 or not sched.rate_gbps > 0:
        return None
    y = sched.rate_gbps / k
    cap = topo.arrays.capacity.astype(float)
    units = cap / y
    up = np.ceil(units - _ON_MULTIPLE * np.maximum(units, 1.0))
    raised = up * y
    near = (raised > cap * (1 + _ON_MULTIPLE)) & (raised <= cap * (1 + tol)) & (cap > 0)
    if not near.any():
        return None
    return topo.with_capacities(np.where(near, raised, cap))


def tolerant_allgather(topo: Topology, sched: Schedule, solve: Callable[[Topology], Schedule],
                       tol: float = DEFAULT_TOLERANCE, message_bytes: float | None = None,
                       fluid: bool | None = None) -> Schedule:
    """The schedule ``solve`` gives on :func:`unit_snapped` capacities, rated on ``topo``
    (at most ``tol`` below ``sched``, which was solved on ``topo``): a capacity measured a
    hair below a multiple of ``y`` then yields the forest its true value gives.  Returns
    ``sched`` itself when no capacity is near a multiple.

    ``message_bytes``: keep whichever of the two completes ``message_bytes`` per GPU
    sooner when simulated on ``topo`` (ties keep ``sched``), at two simulations' cost.
    Chunks are simulated whole (store and forward, ``pieces=1``): ~6x cheaper than
    512 KiB pieces and it ranks the pair of the module doc alike (0.892 vs 0.912);
    ``fluid`` (default: above 16 GPUs) is cheaper still but blind to pipelining, so
    equal rates keep ``sched``."""
    from ..sim import simulate

    if message_bytes is not None and not (message_bytes > 0 and math.isfinite(message_bytes)):
        raise InputError(f"message_bytes must be a positive number of bytes, got {message_bytes!r}")
    snapped = unit_snapped(topo, sched, tol)
    if snapped is None:
        return sched
    other = _rated_on(topo, solve(snapped), sched, snapped)
    if other.rate_gbps < sched.rate_gbps * (1 - tol):
        return sched
    if message_bytes is None:
        return other
    fluid = topo.num_gpus > 16 if fluid is None else fluid
    pieces = None if fluid else 1
    mine = simulate(topo, sched, message_bytes, fluid=fluid, pieces=pieces).completion_s
    theirs = simulate(topo, other, message_bytes, fluid=fluid, pieces=pieces).completion_s
    return other if theirs < mine else sched


def _rated_on(topo: Topology, other: Schedule, sched: Schedule, snapped: Topology) -> Schedule:
    """``other`` (solved on ``snapped``) with its rate, bottleneck and bounds those of
    ``topo``, where ``sched`` was solved.  The bottleneck cut (paper §3.2) keeps the links
    ``other`` saturates on ``snapped`` besides the raised ones that bound it on ``topo``:
    with those alone, a further drop of a raised link would scale the whole cut and
    move no slack, and drift detection (Algorithm 1) would never flag it."""
    loads = share_loads(topo, other.chunks)
    rate = min(schedule_rate(topo, loads), sched.lp_rate_gbps)
    saturated = (loads > 0) & (1.0 - rate * loads / topo.arrays.capacity <= SATURATION_TOL)
    for b in other.bottleneck:
        saturated[topo.link_index(b.src, b.dst)] = True
    stats = dict(other.stats, unit_snapped=int(np.count_nonzero(
        snapped.arrays.capacity != topo.arrays.capacity)))
    report = other.report
    if report is not None and sched.report is not None:
        report = dataclasses.replace(report, bound_gbps=sched.report.bound_gbps,
                                     cut_bound_gbps=sched.report.cut_bound_gbps)
    return dataclasses.replace(other, topology=topo.name, rate_gbps=rate, lp_rate_gbps=sched.lp_rate_gbps,
                               bottleneck=bottleneck_links(topo, loads, rate, other.max_chunks, saturated),
                               stats=stats, report=report)
