"""Warm start: carry path columns over to a changed topology (paper §4.1, §4.2).

A previous run leaves a :class:`~.state.AllToAllWarmState` (its final master's columns, in
``Schedule.warm_state``); a schedule read from a file has only its chunk paths.  Either
way a column survives when every node and link of its path still exists in the new
topology (matched by node id) and its endpoints are GPUs; its pair is re-derived from
the endpoints' ranks in the new topology, so renumbered GPUs map correctly.  Columns
through a vanished node or link (Fail3 replaces a GPU: every path through the old GPU
goes) are dropped; pairs left without a column get fresh initial columns.  Capacities
may change freely: a column is a route, not an amount.

Every carried column remembers its index in the old pool (``origin``), and the state
remembers which chunk each old column became (``chunk_of``), so the new schedule reuses
the old :class:`~mccl_opt.schedule.PathChunk` objects whose route and share did not
change instead of building them again (hundreds of thousands at 512 GPUs).

**Basis reuse.**  The state also keeps the final master's simplex basis (plain data,
:class:`~mccl_opt.backends.Basis`).  On a topology with the same nodes and links whose
changed links were *not* binding in the old LP and still carry its loads at the old
rate (e.g. Fail1: an NVSwitch link that was never the bottleneck), the old basis stays
primal and dual feasible: a changed link's slack is basic, so its dual is 0 and neither
the other duals nor the other basic values move.  :func:`reusable_basis` checks exactly
that; the re-solve then needs no pivot.  When a binding link changes (Fail2) the basis
is not used: HiGHS cannot presolve a model started from a basis, and on these masters
(hundreds of thousands of pair rows, most pairs on one path) a presolved cold solve
measured 3x (128 GPUs) to 50x (512 GPUs) faster than pivoting from the old basis.
Capacity-only changes first try :mod:`.local` (certified reuse of the old schedule, then
the local re-optimisation of the pairs the change touches).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from ..backends.base import Basis
from ..errors import ScheduleError
from ..schedule import PathChunk, Schedule
from ..topology import Topology
from .master import ColumnPool
from .problem import Problem, problem_for
from .state import AllToAllWarmState

__all__ = ["warm_columns", "reusable_basis", "changes_are_nonbinding", "link_lookup",
           "sharply_fallen", "fell_sharply", "SHARP_FALL"]

#: A link whose capacity falls to this fraction of its old capacity or below (a dead or
#: nearly dead NIC) makes every column through it worthless: a warm start drops those
#: columns and routes their pairs afresh instead of pricing flow off them round by
#: round (docs/alltoall.md, *Warm is never the slow path*).
SHARP_FALL = 0.1


def link_lookup(prob: Problem, tails: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """New link index of each (tail, head) node pair of the new topology, -1 if absent."""
    ar = prob.topo.arrays
    n = prob.topo.num_nodes
    keys = ar.tail * n + ar.head
    order = np.argsort(keys)
    want = tails * n + heads
    pos = np.clip(np.searchsorted(keys[order], want), 0, max(keys.size - 1, 0))
    found = (tails >= 0) & (heads >= 0) & (keys[order][pos] == want)
    return np.where(found, order[pos], -1)


def _node_map(prob: Problem, node_ids: Sequence[str]) -> np.ndarray:
    topo = prob.topo
    return np.array([topo.node_index(v) if topo.has_node(v) else -1 for v in node_ids],
                    dtype=np.int64)


def _columns(prob: Problem, start: np.ndarray, arcs: np.ndarray) -> tuple[np.ndarray, ...]:
    """Keep the columns whose arcs all exist (``arcs >= 0``) and whose endpoints are two
    different GPUs; returns (pair, start, arcs, origin) on the new topology, ``origin``
    being each kept column's index in the input."""
    lengths = np.diff(start)
    seg = np.repeat(np.arange(lengths.size), lengths)
    bad = np.bincount(seg, weights=(arcs < 0).astype(float), minlength=lengths.size) > 0
    bad |= lengths == 0
    ar = prob.topo.arrays
    first = np.where(bad, 0, arcs[np.minimum(start[:-1], max(arcs.size - 1, 0))])
    last = np.where(bad, 0, arcs[np.maximum(start[1:] - 1, 0)])
    src = ar.rank_of[ar.tail[first]] if arcs.size else np.zeros(0, dtype=np.int64)
    dst = ar.rank_of[ar.head[last]] if arcs.size else np.zeros(0, dtype=np.int64)
    ok = ~bad & (src >= 0) & (dst >= 0) & (src != dst)
    keep_arcs = arcs[ok[seg]] if arcs.size else arcs
    new_start = np.concatenate([[0], np.cumsum(lengths[ok])]).astype(np.int64)
    return (prob.pair_index(src[ok], dst[ok]), new_start, keep_arcs.astype(np.int64),
            np.flatnonzero(ok))


def _from_state(prob: Problem, state: AllToAllWarmState) -> tuple[np.ndarray, ...]:
    node_map = _node_map(prob, state.fabric.node_ids)
    arc_map = link_lookup(prob, node_map[state.fabric.tail], node_map[state.fabric.head])
    lp = state.lp
    return _columns(prob, lp.start, arc_map[lp.arcs] if lp.arcs.size else lp.arcs)


def _from_paths(prob: Problem, paths: Iterable[Sequence[str]]) -> tuple[np.ndarray, ...]:
    unique = sorted({tuple(p) for p in paths})
    ids = sorted({v for p in unique for v in p})
    node_map = dict(zip(ids, _node_map(prob, ids)))
    tails = np.array([node_map[u] for p in unique for u in p[:-1]], dtype=np.int64)
    heads = np.array([node_map[v] for p in unique for v in p[1:]], dtype=np.int64)
    start = np.concatenate([[0], np.cumsum([len(p) - 1 for p in unique])]).astype(np.int64)
    pair, new_start, arcs, _ = _columns(prob, start, link_lookup(prob, tails, heads))
    return pair, new_start, arcs, np.full(pair.size, -1, dtype=np.int64)


def warm_columns(prob: Problem, warm: Schedule | AllToAllWarmState) -> tuple[np.ndarray, ...]:
    """(pair, start, arcs, origin) of the previous columns still valid on ``prob``'s
    topology; ``origin`` indexes the :class:`AllToAllWarmState` columns (-1 for file paths)."""
    state = warm.warm_state if isinstance(warm, Schedule) else warm
    if isinstance(state, AllToAllWarmState):
        return _from_state(prob, state)
    if isinstance(warm, Schedule):
        return _from_paths(prob, (c.path for c in warm.chunks if isinstance(c, PathChunk)))
    raise ScheduleError(f"warm must be a Schedule or AllToAllWarmState, got {type(warm).__name__}")


def sharply_fallen(prob: Problem, state: AllToAllWarmState) -> np.ndarray:
    """Per link of ``prob``, whether its capacity fell to :data:`SHARP_FALL` of the old
    one or below (all false unless ``state`` was solved on the same links)."""
    if not state.fabric.same_links(prob):
        return np.zeros(prob.num_links, dtype=bool)
    return prob.capacity <= state.fabric.capacity * SHARP_FALL


def fell_sharply(topo: Topology, warm: Schedule) -> bool:
    """Whether a link of ``topo`` fell to :data:`SHARP_FALL` of its capacity in ``warm``'s
    AllToAll state or below (``False`` without such a state): the round-aware pick of
    :mod:`mccl_runtime.synthesizer` skips its cold candidates then."""
    state = warm.warm_state
    if not isinstance(state, AllToAllWarmState):
        return False
    return bool(sharply_fallen(problem_for(topo), state).any())


def reusable_basis(prob: Problem, state: AllToAllWarmState, pool: ColumnPool, backend: str,
                   rel_tol: float = 1e-9) -> Basis | None:
    """``state.basis`` when it is optimal for the master over ``pool`` on ``prob``'s
    capacities (module docstring), else ``None``.  Requires the same nodes and links,
    the same columns in the same order, and every changed link non-binding in the old
    LP and still feasible at the old rate."""
    basis = state.basis
    if basis is None or basis.backend != backend:
        return None
    n = state.lp.count
    if (not state.fabric.same_links(prob) or len(pool) != n
            or not np.array_equal(pool.origin, np.arange(n))):
        return None
    return basis if changes_are_nonbinding(prob, state, rel_tol) else None


def changes_are_nonbinding(prob: Problem, state: AllToAllWarmState, rel_tol: float = 1e-9) -> bool:
    """Every link whose capacity changed was non-binding in the old LP and still carries
    the old LP's load at the old rate (``state`` on the same links as ``prob``)."""
    load = state.lp_load
    old, t = state.fabric.capacity, state.lp.t
    changed = np.flatnonzero(old != prob.capacity)
    slack_old = old[changed] * t * (1 - rel_tol) - load[changed]
    slack_new = prob.capacity[changed] * t * (1 - rel_tol) - load[changed]
    return bool((slack_old > 0).all() and (slack_new > 0).all())
