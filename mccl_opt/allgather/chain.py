"""Which AllGather method solves a fabric (docs/allgather_history.md "General method").

ForestColl (paper §4.3) is exact when every switch is balanced (in-capacity equals
out-capacity): directed splitting-off then preserves the cut optimum, and that optimum
is reached with forwarding-only switches.  Elsewhere the cut bound can lie above every
forwarding-only schedule and switch removal can fail, so the chain is:

1. unbalanced switches -> ForestColl on the *weaker-direction* fabric (every cable at a
   switch at the smaller of its two directions' capacities: balanced by construction, and
   its trees are valid on the real fabric).  When that optimum reaches the real fabric's
   cut bound it is the forwarding-only optimum (no schedule exceeds the cut bound) and
   costs milliseconds (a one-direction NIC degradation usually lands here; where Phase 1
   says it falls short, with a chunk budget it is packed only after the restriction, and
   not where that reaches the cut bound); otherwise
   ForestColl on the best *balanced restriction* ``c' <= c`` (:mod:`.restriction.balanced`: its cut
   bound is the forwarding-only optimum, found by a cutting-plane LP and certified in
   exact integers; at ``max_chunks=None`` on a symmetric fabric first the symmetry
   quotient's master from the restriction seed's trees,
   :func:`.quotient_stages.by_seeded_quotient`);
   if that is not certified (or, with ``max_chunks=K``, rounds more
   than :data:`RESTRICTION_ROUNDING_GAP` below its optimum), the general method
   (:mod:`.general.method`), seeded with ForestColl's trees on the restriction and
   stopped at its certified optimum (the weaker-direction trees are added only if the
   master falls short); the best rounded schedule of these and the weaker-direction one
   is kept.  At ``max_chunks=None`` what cannot certify only seeds (a weaker-direction
   fabric whose optimum is below the cut bound, a restriction rounded onto a coarser
   grid), and ForestColl's exact trees on ``c'`` go onto fewer (:mod:`.fewer_trees`);
2. balanced -> ForestColl; if it raises (a :class:`SolveError`, typed by the
   orchestrator), gives up capacity while balancing (``stats['balanced_exactly']`` is
   false), or, with ``max_chunks=None``, needs more than :data:`.budget.EXACT_TREES_LIMIT` trees
   per root (exact multiplicities of arbitrary float capacities explode) -> the general
   method, seeded with ForestColl's own trees at a few chunks per root and stopped at the
   cut bound ``x*``, the forwarding-only optimum of a balanced fabric
   (:func:`.general.restriction_seed.balanced_seed`).

The general method never fails on a connected fabric with positive capacities.

The chain is one decision procedure read top to bottom (which method, in which order,
kept when); the balanced-restriction stages are :mod:`.restriction.stages`, and what
every stage shares (the :class:`~.stage.Trail` of offers) is :mod:`.stage`.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Callable

import numpy as np

from .. import anytime, progress
from ..errors import MCCLError, SolveError, TopologyError
from ..report import Attempt, Method
from ..schedule import Schedule
from ..topology import Topology
from .fabric import fabric_of
from .fewer_trees import fewer_trees
from . import interim
from .interim import rerated
from .restriction.stages import Restricted, restrict_recorded, solve_by_restriction
from .quotient_stages import by_quotient, by_seeded_quotient, symmetry_of
from .seed_first import seed_first
from .stage import REACH_TOL, Declined, ForestColl, Trail
from .forestcoll.pack_plan import ForestCollAsk, Goal
from .forestcoll.pipeline import gbps
from .forestcoll.throughput import optimal_rate
from .warm.route import WarmRoute

if TYPE_CHECKING:                          # imported by the functions that use them
    from .general.restriction_seed import RestrictionSeed

__all__ = ["RESTRICTION_ROUNDING_GAP", "cut_bound_gbps", "SeedOnce",
           "solve_by_general", "weaker_directions", "solve_unbalanced"]

#: with ``max_chunks=K``, a balanced-restriction schedule rounded further than this below
#: its optimum also runs the general method, and the better rounding is kept (ForestColl's
#: chunk rounding on a restriction ``c'`` is coarse on small fabrics: 133.3 of 197.7 Gbps
#: on HPN 1x2x8 with one NVLink at 360 Gbps one way, where the general method rounds to
#: 190.5; from 128 GPUs it stayed within 1 %)
RESTRICTION_ROUNDING_GAP = 0.05


def cut_bound_gbps(topo: Topology) -> float | None:
    """Phase 1's cut bound (the optimum were switches able to copy), ``None`` if it
    cannot be computed."""
    try:
        fab, quantum = fabric_of(topo)
        return gbps(optimal_rate(fab), quantum)
    except (MCCLError, ArithmeticError, ValueError):
        return None


def solve_by_general(topo: Topology, route: WarmRoute, backend: str,
                     max_chunks: int | None, reason: str, bound: float | None,
                     trail: Trail, seed: Callable[[], RestrictionSeed | None] | None = None
                     ) -> Schedule:
    """The general method, with the cut bound ``bound`` (:func:`cut_bound_gbps`) for the
    report and ``stats['general_reason']`` saying why it ran; offered to the time limit.
    Warm-started on ``route`` only from the general method's own previous columns
    (:meth:`.warm.route.WarmRoute.general_warm`), else cold; ``seed`` makes its
    restriction seed (:mod:`.general.restriction_seed`; on unbalanced fabrics), once,
    outside the warm step (a warm start does not shorten it).  With a seed, the first
    master is the seed's alone, cold's own, and the previous columns join only when it
    falls short: the run is not a warm stage, whose expiry would redo that master cold
    (SuperPOD 2x2x8 after two one-way faults: the allowance spent in the seed's master,
    warm 0.10-0.13 s vs cold 0.08 s CPU; docs/allgather_history.md "Warm takes cold's path")."""
    from .general.method import solve_general      # column generation over trees: only here

    own = route.general_warm()
    made = None if seed is None else seed()

    def general(warm: Schedule | None) -> Schedule:
        progress.update("AllGather: general method (column generation over trees)")
        return trail.run(Method.GENERAL, lambda: solve_general(
            topo, warm=warm, backend=backend, max_chunks=max_chunks, cut_bound_gbps=bound,
            seed=made), "returned")

    if own is None or made is not None:
        sched = general(own)
    else:
        sched = route.attempt("the general method", Method.GENERAL, lambda _: general(own),
                              lambda: general(None), trail.attempts)
    sched.stats["general_reason"] = reason
    anytime.offer(sched)
    return sched


def weaker_directions(topo: Topology) -> Topology | None:
    """``topo`` with every cable at a switch at its weaker direction's capacity, so every
    switch's in-capacity equals its out-capacity; ``None`` when a link at a switch has no
    reverse link (no balanced sub-fabric of this kind exists)."""
    arr = topo.arrays
    at_switch = arr.is_switch[arr.tail] | arr.is_switch[arr.head]
    n = topo.num_nodes
    key = arr.tail.astype(np.int64) * n + arr.head
    order = np.argsort(key)
    reverse_key = arr.head.astype(np.int64) * n + arr.tail
    pos = np.minimum(np.searchsorted(key, reverse_key, sorter=order), key.size - 1)
    reverse = order[pos]
    has_reverse = key[reverse] == reverse_key
    if not has_reverse[at_switch].all():
        return None
    capacity = np.where(at_switch, np.minimum(arr.capacity, arr.capacity[reverse]), arr.capacity)
    return topo.with_capacities(capacity)


def solve_unbalanced(topo: Topology, route: WarmRoute, backend: str,
                     max_chunks: int | None, forestcoll: ForestColl, trail: Trail) -> Schedule:
    """A fabric with unbalanced switches (step 1 of the chain above): ForestColl on
    :func:`weaker_directions` if its optimum reaches the cut bound, else the balanced
    restriction or the general method, keeping the better rounded schedule.  At
    ``max_chunks=None`` the weaker-direction fabric is packed only when Phase 1 says its
    optimum reaches the cut bound, and a coarsened restriction is not packed exactly:
    neither could certify, and both only seed the general method (shared aggregation
    2x5x8, one-way NIC fault: 31 rounds -> 3), cold first in one master (:mod:`.seed_first`).
    With a chunk budget such a weaker-direction fabric is packed after the restriction,
    and skipped where the restriction's schedule reaches the cut bound (:func:`_at_bound`:
    no schedule exceeds it, so the weaker direction's could not replace it; dragonfly
    4x4x1x8 one way at K=10, both packings through the guarded split: 0.54-0.75 -> 0.35 s
    CPU, docs/allgather_history.md "One-way faults: the weaker direction after the restriction").

    Every warm-started method (the weaker-direction ForestColl, ForestColl on the balanced
    restriction, the general method) takes its warm steps on ``route``, under the one
    allowance of the solve: once it is spent the rest of the chain runs cold.  (Each
    method had its own budget before, each redone cold past it: leaf-spine 4x2x8 after
    a repair, warm 0.26 s where cold takes 0.12 s.)  The restriction's cutting-plane LP,
    which a warm start does not shorten, is cold."""
    bound = cut_bound_gbps(topo)
    sub = weaker_directions(topo)
    weaker = None
    seed_trees: Schedule | Topology | None = sub     # the weaker direction's (packed on use)
    interim_offers = interim.wanted(topo, max_chunks)   # cheap schedules for a time limit
    if interim_offers and sub is not None:
        interim.offer_on(topo, sub, interim.WEAKER_CHUNKS, forestcoll, Method.WEAKER_DIRECTIONS,
                         trail)
    # below the cut bound the weaker direction cannot certify: with a chunk budget it is
    # packed after the restriction, and only where that falls short of the cut bound
    short = sub is not None and not _reaches(sub, bound)
    deferred = short and max_chunks is not None

    def weaker_stage() -> Schedule | None:
        """ForestColl on the weaker-direction fabric: its schedule when it reaches the
        cut bound (optimal; at ``max_chunks=None`` where its exact packing is declined as
        dearer than the seeded master, :func:`_weaker_seeded_general`'s); else ``None``, keeping it in ``weaker`` (and, with a chunk
        budget, its trees as the general method's further seed, ``seed_trees``)."""
        nonlocal weaker, seed_trees
        try:
            found = trail.run(Method.WEAKER_DIRECTIONS,
                              lambda: forestcoll(sub, route, max_chunks, ForestCollAsk(
                                  goal=Goal.of(max_chunks, declinable=True))),
                              "returned")
        except (SolveError, TopologyError):
            found = None
        if isinstance(found, Declined) and bound is not None and max_chunks is None:
            return _weaker_seeded_general(topo, sub, route, backend, bound, forestcoll, trail,
                                          found.reason)
        if isinstance(found, Schedule):
            if bound is not None and found.lp_rate_gbps >= bound * (1 - REACH_TOL):
                return rerated(found, topo, bound, Method.WEAKER_DIRECTIONS,
                               "weaker-direction fabric reaches the cut bound")
            weaker = rerated(found, topo, found.lp_rate_gbps, Method.WEAKER_DIRECTIONS,
                             "weaker-direction fabric")
            weaker.report = dataclasses.replace(weaker.report, bound_gbps=None)   # not certified
            anytime.offer(weaker)
        if max_chunks is not None:          # its K chunks seed; a failed K is not retried
            seed_trees = found if isinstance(found, Schedule) else None
        return None

    t = time.perf_counter()
    if short and max_chunks is None:
        trail.add(Attempt(Method.WEAKER_DIRECTIONS, time.perf_counter() - t, "declined: its "
                          "optimum is below the cut bound (no certificate at max_chunks=None); "
                          "seeds only"))
    elif sub is not None and not deferred:
        reached = weaker_stage()
        if reached is not None:             # no schedule exceeds the cut bound: optimal
            return reached
    sym = symmetry_of(topo, max_chunks)
    quotient = by_quotient(topo, sym, backend, bound, trail)
    if quotient is not None:
        return quotient
    anytime.check("the balanced restriction")
    restricted = restrict_recorded(topo, backend, trail)
    if interim_offers and restricted is not None:
        interim.offer_on(topo, restricted.sub, interim.RESTRICTED_CHUNKS, forestcoll,
                         Method.BALANCED_RESTRICTION, trail, restricted.optimum_gbps,
                         restricted.to_gbps, restricted.restriction.headroom())
    best = None
    if max_chunks is not None and restricted is not None:
        best = solve_by_restriction(topo, restricted, route, max_chunks, forestcoll, bound, trail)
    if deferred and not _at_bound(best, bound):
        weaker_stage()                      # below the cut bound: never returns a schedule
    elif deferred:
        trail.add(Attempt(Method.WEAKER_DIRECTIONS, 0.0, "skipped: the balanced restriction "
                          "reached the cut bound, above every weaker-direction schedule"))
    seed = _restriction_seed(restricted, forestcoll, seed_trees)
    if max_chunks is None:
        best = by_seeded_quotient(topo, sym, restricted, seed, route, backend, bound, trail)
        if best is not None:
            return best
        best = seed_first(topo, restricted, route, max_chunks, backend, bound, trail, seed)
    if best is None and restricted is not None and max_chunks is None and restricted.coarsened:
        trail.add(Attempt(Method.BALANCED_RESTRICTION, restricted.seconds, "declined: rounded "
                          "onto a coarser grid, not exact at max_chunks=None; seeds only"))
    elif best is None and restricted is not None and max_chunks is None:
        best = solve_by_restriction(topo, restricted, route, max_chunks, forestcoll, bound, trail)
        best = fewer_trees(topo, best, max_chunks, backend, route)
    if best is None:
        best = solve_by_general(topo, route, backend, max_chunks, "unbalanced switches", bound,
                                trail, _general_seed(topo, seed, restricted, forestcoll,
                                                     seed_trees, max_chunks))
    elif best.rate_gbps < best.lp_rate_gbps * (1 - RESTRICTION_ROUNDING_GAP):
        general = solve_by_general(topo, route, backend, max_chunks, "balanced restriction "
                                   "rounded too far below its optimum", bound, trail, seed)
        if general.rate_gbps > best.rate_gbps * (1 + REACH_TOL):
            best = general
    if weaker is not None and weaker.rate_gbps > best.rate_gbps * (1 + REACH_TOL):
        stats = {**best.stats, "rounded_by": "forestcoll on the weaker-direction fabric"}
        return dataclasses.replace(best, chunks=weaker.chunks, rate_gbps=weaker.rate_gbps,
                                   max_chunks=weaker.max_chunks,   # the trees' own budget
                                   bottleneck=weaker.bottleneck, stats=stats,
                                   warm_state=weaker.warm_state,
                                   report=dataclasses.replace(best.report, k=weaker.report.k))
    return best


def _weaker_seeded_general(topo: Topology, sub: Topology, route: WarmRoute, backend: str,
                           bound: float, forestcoll: ForestColl, trail: Trail,
                           reason: str) -> Schedule:
    """The general method stopped at the cut bound ``bound`` and seeded with ForestColl's
    trees on the weaker-direction fabric ``sub`` at a few chunks per root
    (:func:`.general.restriction_seed.balanced_seed`), where ``sub``'s optimum reaches
    ``bound`` but its exact packing needs so many trees per root that ForestColl declined
    it (``reason``): the same certified rate on at most ``roots + links`` trees.
    Half-uplinks multi-spine 2x8x8 after a two-way fault (fuzz seed 3525): ``k = 293``,
    15 661 chunks, 0.63 s CPU -> 207 chunks, 0.19 s (docs/allgather_history.md "Weaker
    direction past the exact tree count")."""
    from .general.restriction_seed import balanced_seed

    return solve_by_general(topo, route, backend, None, f"weaker-direction fabric: {reason}",
                            bound, trail, SeedOnce(lambda: balanced_seed(sub, bound, forestcoll)))


def _at_bound(best: Schedule | None, bound: float | None) -> bool:
    """Whether ``best`` (the balanced restriction's rounded schedule) is within
    :data:`.stage.REACH_TOL` of the cut bound ``bound``: no schedule exceeds that bound,
    so no weaker-direction schedule could replace it (:func:`solve_unbalanced` keeps one
    only more than ``REACH_TOL`` above)."""
    return best is not None and bound is not None and \
        best.rate_gbps * (1 + REACH_TOL) >= bound


def _reaches(sub: Topology, bound: float | None) -> bool:
    """Whether the weaker-direction fabric ``sub``'s optimum (its cut bound, Phase 1 alone)
    reaches ``topo``'s cut bound ``bound``: only then is its exact schedule certified."""
    own = cut_bound_gbps(sub)
    return bound is None or own is None or own >= bound * (1 - REACH_TOL)


class SeedOnce:
    """The general method's seed ``make()``, made on first use and kept (a warm stage
    redone cold asks again); ``made``: whether it was asked for yet."""

    def __init__(self, make: Callable[[], RestrictionSeed | None]) -> None:
        self._make = make
        self._seed: RestrictionSeed | None = None
        self.made = False

    def __call__(self) -> RestrictionSeed | None:
        if not self.made:
            self._seed, self.made = self._make(), True
        return self._seed


def _restriction_seed(restricted: Restricted | None, forestcoll: ForestColl,
                      weaker: Schedule | Topology | None, dense: bool = False) -> SeedOnce:
    """:func:`.general.restriction_seed.restriction_seed` of ``restricted`` with the
    weaker-direction trees ``weaker`` (``dense``: at the denser packing's chunks), made
    once (:class:`SeedOnce`)."""

    def make() -> RestrictionSeed | None:
        from .general.restriction_seed import restriction_seed

        return None if restricted is None else \
            restriction_seed(restricted, forestcoll, weaker, dense=dense)

    return SeedOnce(make)


def _general_seed(topo: Topology, seed: SeedOnce, restricted: Restricted | None,
                  forestcoll: ForestColl, weaker: Schedule | Topology | None,
                  max_chunks: int | None) -> SeedOnce:
    """The seed of the general method at the end of the chain: ``seed`` itself where the
    seeded quotient or *Seed first* already made it, else, at ``max_chunks=None`` on
    65-128 GPUs (:func:`.general.restriction_seed.dense_seed`: the full master is the
    seed's only user and each master that falls short is dear), the restriction seed at
    the denser packing's chunks where that adds few trees per root
    (:func:`.general.restriction_seed.dense_pays`; shared-nic 2x8x8-p2 with a NIC at 4
    Gbps one way, fuzz seed 3515: 16 chunks, ``k = 15``, fell short twice and took the
    weaker direction's packing and a third master; 32 chunks, ``k = 19``, certify in the
    first master; docs/allgather_history.md "Shared-nic 2x8x8-p2: the general method's seed")."""
    from .general.restriction_seed import dense_seed

    if seed.made or max_chunks is not None or not dense_seed(topo.num_gpus):
        return seed
    return _restriction_seed(restricted, forestcoll, weaker, dense=True)
