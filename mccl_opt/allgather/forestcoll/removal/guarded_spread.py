"""Phase 2's spread proposal kept within the rooted cut condition (paper §4.3; docs/allgather_history.md,
"Structure-independent packing").

When the plain spread split's (:mod:`.spread`) logical graph fails the rooted cut test
for ``k`` trees per root, the split is redone with every switch's pairing
guarded (:mod:`.cut_guard`): first against the node sets learned from the logical graphs
that failed (each round one rooted sweep over the logical graph and one minimum cut in the
physical one: cheap), then, if that does not converge in :data:`LEARN_ROUNDS` rounds, with
a rooted sweep at every switch.  Where neither gets there in
:func:`.splitting.switch_order` (on NCCL-XML imports with CPU paths the sweep guard finds
no exchange at a PCIe switch split after the rails), all of it is tried once more with
the switches with the fewest links first (:func:`.splitting.fewest_links_first`).
None of this depends on how the switches are wired or named: the sets come from minimum cuts, and the exchanges keep every link's units.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from mccl_opt import anytime
from .cut_guard import KnownCuts, SweepGuard, violated_set, violated_sets, zero_slack_sets
from .splitting import LogicalGraph, SplitGraph, fewest_links_first, sink_order, switch_order
from .spread import spread_split

__all__ = ["guarded_spread", "LEARN_ROUNDS"]

#: spread splits guarded by learned sets before the per-switch sweep guard
LEARN_ROUNDS = 8

#: a packing tried on a guarded split before its rooted sweep: whether it completed
Packs = Callable[[LogicalGraph], bool]


def guarded_spread(g: SplitGraph, rank_of: np.ndarray, failed: LogicalGraph,
                   siblings_last: bool = True, packs: Packs | None = None
                   ) -> LogicalGraph | None:
    """The spread split of ``g`` redone with guarded pairings (module docstring), given
    the plain split ``failed`` whose logical graph fails the rooted test for ``g.k``
    trees per root; ``None`` when ``g`` itself fails it (no split can pass) or no guard
    gets a logical graph that passes in either order; ``siblings_last``: of the proposal
    the guard adjusts (:func:`.spread.spread_split`).  ``packs``: the caller's packing,
    tried on each guarded split before its rooted sweep; where it completes, the split
    is returned unswept (a packing of ``g.k`` trees per root proves the test passes)."""
    sweeps = [0.0]                                # the longest rooted sweep so far (s)
    near = np.asarray(rank_of, np.int64)[sink_order(g)]     # the sweeps' sink order
    found = _violated_ranks(failed, g.k, sweeps, near)
    if found is None:
        return failed
    keys = list(g.units)
    arcs = (np.array([a for a, _ in keys], np.int64), np.array([b for _, b in keys], np.int64),
            np.fromiter(g.units.values(), np.int64, count=len(keys)))
    t = time.perf_counter()
    hosts = sink_order(g)                         # the same sinks, hosts together
    if violated_set(g.n, hosts, g.k, arcs, roots=g.gpus) is not None:
        return None
    sweeps[0] = max(sweeps[0], time.perf_counter() - t)     # a whole sweep: none failed
    known = KnownCuts(g.n, g.gpus, g.k, arcs)
    for inside in zero_slack_sets(g.n, g.gpus, g.k, arcs, g.gpus.size, hosts):
        known.add(inside)
    for order in (switch_order, fewest_links_first):
        lg, found = _guarded_in(g, rank_of, order(g), known, found, sweeps, near,
                                siblings_last, packs)
        if lg is not None:
            return lg
    return None


def _guarded_in(g: SplitGraph, rank_of: np.ndarray, order: list[int], known: KnownCuts,
                found: list[np.ndarray], sweeps: list[float], near: np.ndarray,
                siblings_last: bool = True, packs: Packs | None = None
                ) -> tuple[LogicalGraph | None, list[np.ndarray]]:
    """Splits in ``order`` guarded by the sets learned so far (``known`` keeps learning
    from ``found``, the violated rank sets of the last failed split), then by the sweep
    guard: the passing logical graph or ``None``, and the rank sets still violated.
    The sets learned in an earlier order are tried once in this one before learning
    stops.  ``packs``: as for :func:`guarded_spread`."""
    fresh = True
    for _ in range(LEARN_ROUNDS):
        anytime.check("Phase 2: a guarded spread split")
        if not any([known.learn(inside) for inside in found]) and not fresh:
            break
        fresh = False
        lg = spread_split(g, rank_of, known, order, siblings_last)
        if packs is not None and packs(lg):
            return lg, []                         # packed: it passes the rooted test
        found = _violated_ranks(lg, g.k, sweeps, near)
        if found is None:
            return lg, []
    anytime.check("Phase 2: the spread split guarded by sweeps")
    return spread_split(g, rank_of, SweepGuard(g.n, g.gpus, g.k), order, siblings_last), found


def _violated_ranks(lg: LogicalGraph, k: int, sweeps: list[float], near: np.ndarray
                    ) -> list[np.ndarray] | None:
    """Sets of ranks violating the rooted cut condition of ``lg`` (masks), one per
    failing rank (in ``near``'s order: the split's :func:`.splitting.sink_order`, hosts
    together, not the ranks' listing) not inside a set found before; ``None`` when none
    does.  In rank order a scrambled listing moved the sweep's sink across the fabric at
    every step (leaf-spine 8x2x8 with 4 spines at ``None``: 0.10 s plain, 0.45 s
    scrambled; docs/allgather_history.md "Guard sweeps in structural order").  One rooted
    sweep that goes on past each failing rank (:func:`.cut_guard.violated_sets`): the
    same sets as a fresh sweep per set, as a failing rank's sink side is unique
    (shared aggregation 2x16x8 at ``None`` before :mod:`.siblings`: 31 host sets, 32
    sweeps -> 1, 0.27-0.34 -> 0.19-0.28 s CPU).  ``sweeps[0]``: the longest rooted sweep so far (one compiled call of ``n``
    max-flows, 0.2 s CPU at 256 GPUs), updated; a sweep is not started where the solve's
    limit has less left (:func:`mccl_opt.anytime.check_room`): its result would come
    past the limit."""
    anytime.check_room("Phase 2: the rooted sweep of a failed split", sweeps[0])
    t = time.perf_counter()
    found = violated_sets(lg.num_gpus, near, k, (lg.tail, lg.head, lg.units), lg.num_gpus)
    sweeps[0] = max(sweeps[0], time.perf_counter() - t)
    return list(found) or None
