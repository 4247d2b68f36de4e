"""Equal-rate AllGather schedules that tiny capacity errors do not reshape.

With a chunk budget, ForestColl gives every link ``floor(cap / y)`` trees of bandwidth
``y`` (paper §4.3, :mod:`.budget`).  A capacity measured a hair below a multiple of
``y`` (49.9 for a true 50 Gbps NIC, ``y`` = 8.33) therefore loses a whole tree unit:
the budget rate is often unchanged, but the packing is a different forest, and two
forests of one fluid rate can differ by ~9 % once chunks are cut into pieces and
pipelined (:mod:`mccl_opt.sim`; on irregular fabric 7 with a 50 Gbps NIC cable the
49.9 solve simulated at 0.912 of the 50.0 one on the true fabric).

:func:`unit_snapped` raises every capacity lying within a relative ``tol`` below a
multiple of the budget's ``y`` (Phase 1 and the budget only: ~1 ms on 10 GPUs) to that
multiple; :func:`tolerant_allgather` solves that fabric instead of the given one, so a
schedule built on a measured 49.9 is the one the true 50 gives, its rate on the given
fabric at most ``tol`` below (0.2 % there), at the cost of one solve (two when the
snapped solve does not realise the snapped budget, :func:`tolerant_allgather`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import InputError, SolveError
from ..schedule import SATURATION_TOL, Schedule, bottleneck_links, schedule_rate, share_loads
from ..topology import Topology
from .forestcoll.pipeline import phase_one_budget

__all__ = ["DEFAULT_TOLERANCE", "Snap", "unit_snapped", "tolerant_allgather"]

#: relative capacity error a measurement may carry without reshaping the forest (the
#: closed loop's estimates of a 50 Gbps NIC read 49.5-49.94; at most this much rate is
#: given up on the given fabric, so the fluid model's ranking wins above it)
DEFAULT_TOLERANCE = 0.005

#: relative distance below which a capacity already is a multiple of ``y``
_ON_MULTIPLE = 1e-9


@dataclass(frozen=True)
class Snap:
    """``fabric``: the snapped capacities; ``k`` trees per root of ``y_gbps`` each, the
    budget of both fabrics; ``x_star_gbps``: Phase 1's optimum of the given fabric."""

    fabric: Topology
    k: int
    y_gbps: float
    x_star_gbps: float


def unit_snapped(topo: Topology, max_chunks: int | None, tol: float = DEFAULT_TOLERANCE) -> Snap | None:
    """``topo`` with each capacity within ``tol`` (relative) below a multiple of the tree
    bandwidth ``y`` the chunk budget ``max_chunks`` chooses raised to that multiple
    (Phase 1 and the budget, §4.3, on both fabrics: a few max-flows); ``None`` when no
    capacity is near a multiple, when the snapped fabric's budget is not the same ``k``
    trees of ``y`` (raising capacities moved the optimum itself), or when the budget is
    the exact optimum (``max_chunks=None``)."""
    if not 0 <= tol < 1:
        raise InputError(f"the capacity tolerance must be in [0, 1), got {tol!r}")
    if max_chunks is None:
        return None
    budget = _budget(topo, max_chunks)
    if budget is None:
        return None
    k, y_gbps, x_star = budget
    cap = topo.arrays.capacity.astype(float)
    units = cap / y_gbps
    raised = np.ceil(units - _ON_MULTIPLE * np.maximum(units, 1.0)) * y_gbps
    near = (raised > cap * (1 + _ON_MULTIPLE)) & (raised <= cap * (1 + tol)) & (cap > 0)
    if not near.any():
        return None
    snapped = topo.with_capacities(np.where(near, raised, cap))
    again = _budget(snapped, max_chunks)          # the snap must remove cliffs, not move the budget
    if again is None or again[0] != k or abs(again[1] - y_gbps) > _ON_MULTIPLE * y_gbps:
        return None
    return Snap(snapped, k, y_gbps, x_star)


def _budget(topo: Topology, max_chunks: int) -> tuple[int, float, float] | None:
    """``(k, y, x*)`` of Phase 1 and the chunk budget on ``topo`` (Gbps), ``None`` if no
    tree fits."""
    try:
        budget = phase_one_budget(topo, max_chunks, {})
    except SolveError:
        return None
    return budget.k, float(budget.y) * budget.quantum, budget.x_star_gbps


def tolerant_allgather(topo: Topology, solve: Callable[[Topology], Schedule], max_chunks: int | None,
                       tol: float = DEFAULT_TOLERANCE) -> Schedule:
    """``solve`` on the :func:`unit_snapped` capacities, rated on ``topo`` (at most
    ``tol`` below the budget rate), when a capacity lies just below a multiple of the
    tree bandwidth and that solve realises the snap's budget (``k`` trees of ``y``: the
    balanced restriction may pick its own, for which the snap means nothing; on irregular
    fabric 7 with a NIC at 89.06 such a forest lost 1.4 % of rate and 8 % of simulated
    time); else ``solve(topo)``.  A capacity measured a hair low then yields the forest
    its true value gives.  ``solve`` must use the chunk budget ``max_chunks``."""
    snap = unit_snapped(topo, max_chunks, tol)
    if snap is None:
        return solve(topo)
    other = solve(snap.fabric)
    realised = other.report is not None and other.report.k == snap.k
    if not realised or abs(other.rate_gbps - snap.k * snap.y_gbps) > 1e-9 * other.rate_gbps:
        return solve(topo)
    return _rated_on(topo, other, snap.fabric, snap.x_star_gbps)


def _rated_on(topo: Topology, other: Schedule, snapped: Topology, x_star: float) -> Schedule:
    """``other`` (solved on ``snapped``) with its rate, bottleneck and bounds those of
    ``topo``, whose optimum is ``x_star``.  The bottleneck cut (paper §3.2) keeps the
    links ``other`` saturates on ``snapped`` besides the raised ones that bound it on
    ``topo``: with those alone, a further drop of a raised link would scale the whole cut
    and move no slack, and drift detection (Algorithm 1) would never flag it."""
    loads = share_loads(topo, other.chunks)
    rate = min(schedule_rate(topo, loads), x_star)
    saturated = (loads > 0) & (1.0 - rate * loads / topo.arrays.capacity <= SATURATION_TOL)
    for b in other.bottleneck:
        saturated[topo.link_index(b.src, b.dst)] = True
    stats = dict(other.stats, unit_snapped=int(np.count_nonzero(
        snapped.arrays.capacity != topo.arrays.capacity)))
    report = other.report
    if report is not None:
        report = dataclasses.replace(report, bound_gbps=x_star, cut_bound_gbps=None)
    return dataclasses.replace(other, rate_gbps=rate, lp_rate_gbps=x_star,
                               bottleneck=bottleneck_links(topo, loads, rate, other.max_chunks, saturated),
                               stats=stats, report=report)
