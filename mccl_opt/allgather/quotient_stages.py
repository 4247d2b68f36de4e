"""The symmetry-quotient stages of the AllGather method chain (:mod:`.chain`, step 1, at
``max_chunks=None``; docs/allgather_history.md "Symmetric quotient", "Seeded quotient"): the
fabric's automorphism group, found once per solve (:func:`symmetry_of`), the quotient's
column generation from its own cheapest trees before the balanced restriction
(:func:`by_quotient`), and from the restriction seed's trees, stopped at the restriction's
certified optimum, once the restriction is known (:func:`by_seeded_quotient`)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

import numpy as np

from .. import anytime, progress
from ..schedule import Schedule
from ..topology import Topology
from .stage import Trail

if TYPE_CHECKING:                          # imported by the functions that use them
    from .general.restriction_seed import RestrictionSeed
    from .general.symmetry import Symmetry
    from .restriction.stages import Restricted
    from .warm.route import WarmRoute

__all__ = ["QUOTIENT_MIN_GPUS", "QUOTIENT_MIN_SHRINK", "QUOTIENT_MAX_COST",
           "SEEDED_QUOTIENT_MIN_SHRINK", "SEEDED_QUOTIENT_ROUNDS", "SEEDED_QUOTIENT_MAX_COPIES",
           "symmetry_of", "by_quotient", "by_seeded_quotient"]

#: the symmetry quotient (:func:`by_quotient`) is tried from this many GPUs at
#: ``max_chunks=None`` (shared aggregation 2x8x8 with a NIC slowed one way: 0.3 s against
#: 1.5-3 s for the restriction and the general method; with its sparse pricing, 64-112
#: GPUs too: shared aggregation 2x6x8 / multi-spine 2x6x8 / leaf-spine 4x3x8 one way
#: 0.06-0.11 s against 4.4 / 4.1 / 2.9 s, docs/allgather_history.md "Pricing on the cheapest
#: in-edges"); below, the fabrics measured rarely shrink 8-fold
QUOTIENT_MIN_GPUS = 64

#: ... when its rows (link and root orbits) are at most this fraction of the master's
QUOTIENT_MIN_SHRINK = 8

#: ... and when its predicted cost, rows x columns with ``rows x root orbits`` columns
#: (its rounds grow with the rows, each adds up to one tree per root orbit), is at most
#: this.  Measured (rows, root orbits, quotient CPU s against the path it replaces):
#: shared aggregation 2x8x8 with one NIC one way 31, 5: 0.2 s vs 4 s; leaf-spine 4x4x8
#: 46, 6: 0.8 vs 8.7; shared aggregation 2x8x8 with three links slowed 75, 13 (73k):
#: 0.5 vs 0.8; HPN 2x8x8 / 4x8x8 with one NIC one way (no rail shift commutes with the
#: per-rail aggregation switches) 152, 24 (554k) / 264, 40 (2.8M): out of rounds after
#: 1.3 / 4.5 s, where the restriction takes 0.5 / 1.6 s
QUOTIENT_MAX_COST = 200_000

#: a quotient over that cap is still solved once the balanced restriction is known, from
#: the restriction seed's trees and stopped at the restriction's certified optimum
#: (:func:`by_seeded_quotient`), when its rows are at most this fraction of the
#: master's: HPN 2x8x8 with one NIC one way (152 of 672 rows) certifies in the first
#: quotient master, where the full master over the same trees falls short
#: (docs/allgather_history.md "Seeded quotient")
SEEDED_QUOTIENT_MIN_SHRINK = 2

#: ... in at most this many rounds, its expansion copying at most this many trees (its
#: positive columns times the group's pieces); else the general method runs.  Measured
#: (copies, seeded quotient CPU s against the general method's): HPN 2x8x8 with one NIC
#: one way 84 x 14, 0.18 s vs 1.5 s; fat-tree 4x2x2x8 / dragonfly 4x4x1x8 one way
#: (fuzz seed 3471) 31 x 134 / 31 x 518, 0.85 / 1.9 s vs 0.48 / 0.68 s: the tree
#: table and re-rating of 4-16 thousand copies cost more than the full master; where
#: twice the root orbits times the pieces exceeds it (:func:`_too_many_copies`), the
#: quotient is not tried and, unless the unseeded one runs, the group's elements are not
#: listed.  Since the expansion's path images are told apart by integer keys
#: (:func:`.general.tree_table.distinct_rows`, was ``np.unique(axis=0)``, 0.63 s of the
#: 0.66 s expansion), fat-tree 4x2x2x8 one way (fuzz seed 3460, 10 root orbits x 134
#: pieces, 69 x 134 copies) takes 0.29-0.40 s where the general method took 2.6-2.9 s
SEEDED_QUOTIENT_ROUNDS = 20
SEEDED_QUOTIENT_MAX_COPIES = 10_000


def _too_big(topo: Topology, shrink: int, max_cost: float = np.inf) -> Callable[[int, int], bool]:
    """Whether a quotient of ``rows`` rows (link and root orbits) and ``roots`` root
    orbits is too big: its rows above a ``shrink``-th of the master's, or its predicted
    cost ``rows x rows x roots`` above ``max_cost`` (:data:`QUOTIENT_MAX_COST`)."""

    def too_big(rows: int, roots: int) -> bool:
        return rows * rows * roots > max_cost or \
            rows * shrink > topo.num_links + topo.num_gpus

    return too_big


def _too_many_copies(roots: int, pieces: int) -> bool:
    """Whether the seeded quotient's expansion would copy more than
    :data:`SEEDED_QUOTIENT_MAX_COPIES` trees at its fewest positive columns (the positive
    columns were 1.3-3.5 per root orbit on the fabrics measured: twice the root orbits)."""
    return 2 * roots * pieces > SEEDED_QUOTIENT_MAX_COPIES


def symmetry_of(topo: Topology, max_chunks: int | None) -> Symmetry | None:
    """At ``max_chunks=None`` on a fabric of at least :data:`QUOTIENT_MIN_GPUS` GPUs, its
    automorphism group (:func:`.general.symmetry.find_symmetry`) when a quotient could
    run: the unseeded one (:func:`by_quotient`) or the seeded one, whose rows are at most
    a :data:`SEEDED_QUOTIENT_MIN_SHRINK`-th of the master's and whose expansion is not
    :func:`_too_many_copies`; else ``None``, before the group's elements are listed."""
    if max_chunks is not None or topo.num_gpus < QUOTIENT_MIN_GPUS:
        return None
    from .general.symmetry import find_symmetry

    loose = _too_big(topo, SEEDED_QUOTIENT_MIN_SHRINK)
    strict = _too_big(topo, QUOTIENT_MIN_SHRINK, QUOTIENT_MAX_COST)

    def too_big(rows: int, roots: int, pieces: int) -> bool:
        return loose(rows, roots) or (strict(rows, roots) and _too_many_copies(roots, pieces))

    return find_symmetry(topo, too_big)


def by_quotient(topo: Topology, sym: Symmetry | None, backend: str, bound: float | None,
                 trail: Trail) -> Schedule | None:
    """With the fabric's symmetry ``sym`` (:func:`symmetry_of`) whose quotient shrinks the
    master's rows at least :data:`QUOTIENT_MIN_SHRINK`-fold, to a predicted cost of at
    most :data:`QUOTIENT_MAX_COST`: the general method on the symmetry quotient
    (:mod:`.general.quotient`), when it certifies the forwarding-only optimum; else
    ``None`` (recorded in ``trail``).  Warm or cold alike (it does not use the previous
    trees): a warm solve then costs what a cold one does (shared aggregation 2x8x8 with a
    second NIC slowed, warm from the first state: 0.51 s, cold 0.50 s CPU)."""
    if sym is None or _too_big(topo, QUOTIENT_MIN_SHRINK, QUOTIENT_MAX_COST)(
            sym.num_link_orbits + sym.num_root_orbits, sym.num_root_orbits):
        return None
    from .general.quotient import solve_quotient

    t = time.perf_counter()
    progress.update("AllGather: general method on the symmetry quotient")
    sched = solve_quotient(topo, cut_bound_gbps=bound, sym=sym, backend=backend,
                           time_limit=anytime.limit_left())
    return trail.general(t, sched, "the symmetry quotient's master did not certify its "
                         "optimum", "symmetry quotient: certified by its Lagrangian bound")


def by_seeded_quotient(topo: Topology, sym: Symmetry | None, restricted: Restricted | None,
                        seed: Callable[[], RestrictionSeed | None], route: WarmRoute,
                        backend: str, bound: float | None, trail: Trail) -> Schedule | None:
    """With the fabric's symmetry ``sym`` (:func:`symmetry_of`) and a certified balanced
    restriction ``restricted``: the symmetry quotient's column generation
    started from the restriction seed ``seed()``'s trees and stopped at the restriction's
    optimum (the forwarding-only optimum) within :data:`SEEDED_QUOTIENT_ROUNDS` rounds,
    expanded to at most :data:`SEEDED_QUOTIENT_MAX_COPIES` tree copies; else ``None``
    (recorded in ``trail``).  Each symmetrised seed tree stands for its
    images under the group, so the quotient's master over the seed reaches the optimum
    where the full master over the same trees falls short (docs/allgather_history.md "Seeded
    quotient").  A warm ``route`` is declined: the schedule is cold's."""
    if sym is None or restricted is None or \
            _too_many_copies(sym.num_root_orbits, len(sym.pieces())):
        return None
    made = seed()
    if made is None:
        return None
    from .general.quotient import solve_quotient
    from .general.method import chunk_columns

    t = time.perf_counter()
    progress.update("AllGather: the symmetry quotient from the restriction seed")
    sched = solve_quotient(topo, upper_gbps=made.rate_gbps, cut_bound_gbps=bound, sym=sym,
                           backend=backend, time_limit=anytime.limit_left(),
                           seed=made.columns(topo) or chunk_columns(made.schedules, topo),
                           max_rounds=SEEDED_QUOTIENT_ROUNDS,
                           max_copies=SEEDED_QUOTIENT_MAX_COPIES)
    found = trail.general(t, sched, "the symmetry quotient from the restriction seed did not "
                          "reach c''s optimum or expands to too many trees",
                          "seeded symmetry quotient: reaches c''s optimum")
    if found is not None and route.active:
        route.decline("the symmetry quotient from the restriction seed reached c''s optimum "
                      "(cold's path)")
    return found
