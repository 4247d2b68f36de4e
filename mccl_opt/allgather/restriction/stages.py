"""The balanced-restriction stages of the AllGather method chain (:mod:`..chain`, step 1;
docs/allgather_history.md "General method"): the certified best balanced restriction ``c' <= c``
of a fabric with unbalanced switches, computed once per solve (:func:`restrict`,
:func:`restrict_recorded`), and ForestColl on it (:func:`solve_by_restriction`), kept
only at the restriction's certified optimum.  The cutting-plane LP itself is
:mod:`.balanced`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ... import anytime, progress
from ...errors import SolveError, TopologyError
from ...report import Attempt, Method
from ...schedule import Schedule
from ...topology import Topology
from ..budget import ChunkCounts
from ..forestcoll.pack_plan import ForestCollAsk, Goal
from ..interim import rerated
from ..stage import REACH_TOL, Declined, ForestColl, Trail

if TYPE_CHECKING:                          # imported by the functions that use them
    from ..warm.route import WarmRoute
    from .balanced import Restriction

__all__ = ["Restricted", "restrict", "restrict_recorded", "solve_by_restriction",
           "SCALED_RESTRICTION_FROM"]

#: from this many GPUs, at ``max_chunks=None``, ForestColl on the balanced restriction packs
#: above the tree limit by the scaled packing instead of declining (HPN 4x16x8 with one NIC
#: at a quarter one way: 13 s CPU, exact, where the general method seeded on ``c'`` was
#: still 6.6e-5 below after 45 s; 4x8x8: 1.6 s against 2.8 s); below it the general
#: method is the cheaper exact path on the fabrics measured (docs/allgather_history.md "Scaled
#: packing on the restriction")
SCALED_RESTRICTION_FROM = 256


@dataclass(frozen=True)
class Restricted:
    """The certified best balanced restriction ``c'`` of a fabric
    (:mod:`.balanced`), computed once per solve and used by ForestColl on
    ``c'`` and by the general method's seed: ``sub`` is ``c'`` as a canonically listed
    topology (same node ids), ``to_gbps`` turns its Gbps into the fabric's, ``seconds``
    what the cutting-plane LP took, ``optimum_gbps`` the certified optimum (the
    forwarding-only one).  ``restriction`` is the one ``sub`` is built from: the LP's
    vertex, or its balanced rounding onto a coarser grid where the vertex has more digits
    than the fabric's quantum keeps (:func:`.balanced.coarsened`; its own
    rate then sits ~1e-7 below ``optimum_gbps``, and ``coarsened`` is true: ForestColl on
    it cannot be exact, so at ``max_chunks=None`` it only seeds the general method)."""

    restriction: Restriction
    sub: Topology
    to_gbps: float
    seconds: float
    optimum_gbps: float
    coarsened: bool = False


def restrict(topo: Topology, backend: str) -> Restricted | None:
    """The best balanced restriction of ``topo`` (cutting planes, certified in exact
    integers), ``None`` when it is not certified; raises :class:`SolveError` or
    :class:`TopologyError` when it cannot be computed or scaled exactly."""
    from ..canonical import canonical
    from .balanced import balanced_restriction, coarsened, restricted_topology

    t = time.perf_counter()
    found = balanced_restriction(topo, backend)
    if found is None:
        return None
    kept = coarsened(topo, found, backend)   # too many digits: a balanced rounding
    sub, to_gbps = restricted_topology(topo, kept)
    return Restricted(kept, canonical(sub), to_gbps, time.perf_counter() - t, found.rate_gbps,
                      kept is not found)


def restrict_recorded(topo: Topology, backend: str, trail: Trail) -> Restricted | None:
    """:func:`restrict`, a decline or failure recorded in ``trail``."""
    progress.update("AllGather: balanced restriction (cutting planes)")
    t = time.perf_counter()
    try:
        restricted = restrict(topo, backend)
    except (SolveError, TopologyError) as e:
        trail.add(Attempt(Method.BALANCED_RESTRICTION, time.perf_counter() - t, f"failed: {e}"))
        return None
    if restricted is None:
        trail.add(Attempt(Method.BALANCED_RESTRICTION, time.perf_counter() - t,
                          "declined: no certified restriction"))
    return restricted


def solve_by_restriction(topo: Topology, restricted: Restricted, route: WarmRoute,
                         max_chunks: int | None, forestcoll: ForestColl,
                         bound: float | None, trail: Trail) -> Schedule | None:
    """ForestColl on the best balanced restriction ``c'`` of ``topo`` (``restricted``,
    :func:`restrict`), kept only when ForestColl's optimum on ``c'`` is the restriction's
    certified optimum; ``None`` otherwise (the caller falls back to the general
    method).  ForestColl's tree units on ``c'`` round up where ``c`` has room so that
    switches stay balanced (:mod:`..forestcoll.removal.unit_rounding`); with ``max_chunks=K``
    it is asked for ``K`` chunks, then fewer while it still raises on ``c'`` (skipping the
    limits that choose a budget already failed, :class:`..budget.ChunkCounts`); at
    ``max_chunks=None`` from :data:`SCALED_RESTRICTION_FROM` GPUs, above the tree limit by
    the scaled packing.  At ``None`` a balancing of ``c'`` that loses capacity declines
    before Phases 2-3: its trees rate below the optimum on ``c`` and were dropped after
    the packing (dragonfly 4x4x1x8 one way, fuzz seed 3511: 1.4 s of packing for
    nothing; docs/allgather_history.md "Lossy restriction balancing at None").  Its warm steps
    run on ``route`` (the cutting-plane LP before it is cold anyway)."""
    from .balanced import CERT_TOL

    t = time.perf_counter() - restricted.seconds     # the attempt includes the LP
    found, sub, to_gbps = restricted.restriction, restricted.sub, restricted.to_gbps
    counts = ChunkCounts(max_chunks) if max_chunks is not None else None
    scaled = counts is None and topo.num_gpus >= SCALED_RESTRICTION_FROM
    for k in [None] if counts is None else counts:
        try:
            sched = forestcoll(sub, route, k, ForestCollAsk(
                headroom=found.headroom(), scaled=scaled, goal=Goal.of(k)))
        except (SolveError, TopologyError) as e:
            if counts is not None and isinstance(e, SolveError):
                counts.failed(e)
            continue
        if isinstance(sched, Declined) or abs(sched.lp_rate_gbps * to_gbps - found.rate_gbps) \
                > CERT_TOL * found.rate_gbps:
            break
        best = restricted.optimum_gbps    # certified; a c' rounded coarser rates ~1e-7 below
        cut = bound if bound is not None and bound > best * (1 + REACH_TOL) else None
        out = rerated(sched, topo, best, Method.BALANCED_RESTRICTION,
                      "balanced restriction: cut bound of c' <= c", cut)
        if max_chunks is None and out.rate_gbps < best * (1 - CERT_TOL):
            break
        out.stats["cut_rounds"] = found.rounds
        trail.add(Attempt(Method.BALANCED_RESTRICTION, time.perf_counter() - t, "returned"))
        anytime.offer(out)
        return out
    trail.add(Attempt(Method.BALANCED_RESTRICTION, time.perf_counter() - t,
                      "declined: ForestColl on c' did not reach its certified optimum"))
    return None
