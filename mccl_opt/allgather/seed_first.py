"""At ``max_chunks=None``, on fabrics with unbalanced switches of :data:`SEED_FIRST_MIN_GPUS`
to :data:`SEED_FIRST_MAX_GPUS` GPUs: the general method's master over the restriction
seed's trees, solved once, before ForestColl on the balanced restriction ``c'``
(docs/allgather_history.md "Seed first").

ForestColl's exact optimum on ``c'`` (paper §4.3) needs ``k0`` trees per root, hundreds
to thousands where one NIC is degraded one way, and its packing then takes most of the
solve (shared aggregation 2x4x8 with a NIC at 200 Gbps one way: ``k0 = 749``, the repair
packer stuck, the few-trees packer 13 774 max-flows, 0.9 s CPU), while the master over
ForestColl's trees on ``c'`` at a few chunks per root (the general method's seed,
:mod:`.general.restriction_seed`) often reaches ``c'``'s certified optimum at once
(0.2 s there).  Its optimum is then the forwarding-only optimum, certified like the
general method's.  Where the master falls short, the chain goes on as before and the
seed, made once (:class:`.chain.SeedOnce`), seeds the general method if it runs.

A warm solve takes this path too, before any warm step: were it skipped there, a warm
start whose steps on ``c'`` do not pay would carry on with cold ForestColl packing
``c'``, a slower path than the cold solve's (shared aggregation 2x8x8 after a one-way
fault, fuzz seed 7101: warm 2.8 s vs cold 0.6 s CPU; docs/allgather_history.md "Warm takes
cold's path").
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

from ..errors import MCCLError
from ..report import Termination
from ..schedule import Schedule
from ..topology import Topology
from .budget import EXACT_TREES_LIMIT, exact_k
from .fabric import fabric_of
from .forestcoll.throughput import optimal_rate

if TYPE_CHECKING:
    from .restriction.stages import Restricted
    from .stage import Trail
    from .warm.route import WarmRoute
    from .general.restriction_seed import RestrictionSeed

__all__ = ["seed_first", "SEED_FIRST_MIN_GPUS", "SEED_FIRST_MAX_GPUS", "SEED_FIRST_MIN_TREES"]

#: from this many GPUs: below, ForestColl on ``c'`` took at most ~0.2 s CPU on the fabrics
#: measured (shared aggregation 2x2x8 / 2x3x8 with a NIC at 200 Gbps one way: 0.15 /
#: 0.13 s) and a master that falls short is mostly lost (2x3x8: 0.13 -> 0.25 s)
SEED_FIRST_MIN_GPUS = 64

#: up to this many GPUs (the 64-128-GPU fabrics the one-master try was measured on:
#: shared aggregation, SuperPOD and leaf-spine with a one-way NIC fault); past it the
#: seed's master costs seconds (HPN 4x8x8: ~2.9 s) and the scaled packing is the exact path
SEED_FIRST_MAX_GPUS = 128


#: above this many exact trees per root on ``c'``: at or below it ForestColl's exact packing
#: of ``c'`` costs about what the seed's own ForestColl run (16 chunks, ``k = 15``) does, and
#: it certifies itself, where the seed still needs the master over its ``k * n`` trees
#: (shared-nic 2x8x8 at ``None`` after a two-way fault, fuzz seed 3413: ``k0 = 65``, seed
#: 0.24 s + master over 1 503 trees 0.30 s, exact packing 0.31 s; after a one-way fault
#: ``k0 = 80``); above it the exact packing can cost several times the seed (dragonfly
#: 4x4x1x8 at ``k0 = 149``: 2.6-3.4 s vs 0.8 s; docs/allgather_history.md "Few exact trees: pack,
#: do not seed")
SEED_FIRST_MIN_TREES = 128


def _seed_goes_first(sub: Topology) -> bool:
    """Whether the seed's master should go first on the restriction ``sub`` (Phase 1
    alone, milliseconds): ForestColl's exact optimum on it needs more than
    :data:`SEED_FIRST_MIN_TREES` trees per root (fewer: its exact packing is as cheap as
    the seed) but not above :data:`.budget.EXACT_TREES_LIMIT`, where it declines at once
    and the general method runs anyway (shared aggregation 2x8x8 with a NIC at 200 Gbps
    one way: a master over the seed that falls short would be solved twice)."""
    try:
        fab, _ = fabric_of(sub)
        return SEED_FIRST_MIN_TREES < exact_k(fab, optimal_rate(fab)) <= EXACT_TREES_LIMIT
    except (MCCLError, ArithmeticError, ValueError):
        return False


def seed_first(topo: Topology, restricted: Restricted | None, route: WarmRoute,
               max_chunks: int | None, backend: str, bound: float | None, trail: Trail,
               seed: Callable[[], RestrictionSeed | None]) -> Schedule | None:
    """At ``max_chunks=None``, with a certified balanced restriction ``restricted`` that
    ForestColl would pack: the general method's schedule from one master solve over the
    restriction seed ``seed()``'s trees when it reaches the seed's certified bound
    (``stats["general_reason"]`` says so; a warm ``route`` is declined: the schedule is
    cold's); else ``None`` (a master that falls short is recorded in ``trail``, and a
    warm route goes on); ``bound``: the cut bound, for the report."""
    from .general.method import solve_general      # column generation over trees: only here

    if restricted is None or max_chunks is not None or \
            not SEED_FIRST_MIN_GPUS <= topo.num_gpus <= SEED_FIRST_MAX_GPUS or \
            not _seed_goes_first(restricted.sub):
        return None
    made = seed()
    if made is None:
        return None
    t = time.perf_counter()
    sched = solve_general(topo, backend=backend, max_chunks=None, cut_bound_gbps=bound,
                          seed=made, first_only=True)
    found = trail.general(t, sched if sched.report.termination is Termination.OPTIMAL else None,
                          "one master over the restriction seed's trees fell short of c''s "
                          "optimum", "restriction seed: one master reaches c''s optimum")
    if found is not None and route.active:
        route.decline("one master over the restriction seed reached c''s optimum (cold's path)")
    return found
