"""Warm start: carry path columns over to a changed topology (issue item 4).

A previous run leaves a :class:`WarmState` (its final master's columns, in
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

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Iterable, Sequence

import numpy as np

from ..backends.base import Basis
from ..schedule import PathChunk, Schedule
from .master import ColumnPool
from .problem import Problem

__all__ = ["WarmState", "warm_columns", "reusable_basis", "changes_are_nonbinding", "csr_take",
           "csr_mask"]


def csr_take(start: np.ndarray, arcs: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``idx`` (in that order) of the CSR list ``start/arcs``."""
    idx = np.asarray(idx, dtype=np.int64)
    lengths = start[idx + 1] - start[idx]
    new_start = np.zeros(idx.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_start[1:])
    pos = np.arange(new_start[-1]) - np.repeat(new_start[:-1] - start[idx], lengths)
    return new_start, arcs[pos]


def csr_mask(start: np.ndarray, arcs: np.ndarray, mask: np.ndarray, seg: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
    """The rows where ``mask`` holds (in order) of the CSR list ``start/arcs``; ``seg``
    is the row of every entry (``np.repeat(arange, diff(start))``)."""
    new_start = np.zeros(int(mask.sum()) + 1, dtype=np.int64)
    np.cumsum(np.diff(start)[mask], out=new_start[1:])
    return new_start, arcs[mask[seg]]


def object_array(items: Sequence) -> np.ndarray:
    """``items`` as a 1-D numpy object array (elements kept as they are, even tuples)."""
    out = np.empty(len(items), dtype=object)
    out[:] = list(items)
    return out


@dataclass(frozen=True)
class WarmState:
    """What a warm start needs from a finished run (kept in ``Schedule.warm_state``).

    ``tail``/``head`` index ``node_ids`` and describe the old topology's links; the
    columns ``start/arcs`` refer to those links; ``y`` are the final path shares;
    ``chunks[chunk_of[j]]`` is the schedule chunk column ``j`` became (-1: none),
    ``chunk_share[i]`` the share of ``chunks[i]``;
    ``basis`` is the final master's basis over ``t`` and these columns, ``capacity`` and
    ``t`` the old capacities and optimum.  ``pair`` is each column's pair; chunk ``i``
    routes pair ``chunk_pair[i]`` over links ``chunk_arcs[chunk_start[i]:chunk_start[i+1]]``
    and the schedule had ``max_chunks`` chunks per pair (what the local re-optimisation
    of :mod:`.local` needs).  Plain data, never mutated: any number of
    warm starts may share one state."""

    node_ids: tuple[str, ...]
    tail: np.ndarray
    head: np.ndarray
    start: np.ndarray
    arcs: np.ndarray
    y: np.ndarray
    chunks: tuple[PathChunk, ...] = ()
    chunk_of: np.ndarray | None = None
    chunk_share: np.ndarray | None = None
    basis: Basis | None = None
    capacity: np.ndarray | None = None
    t: float = 0.0
    pair: np.ndarray | None = None
    chunk_pair: np.ndarray | None = None
    chunk_start: np.ndarray | None = None
    chunk_arcs: np.ndarray | None = None
    max_chunks: int | None = None
    w: np.ndarray | None = None
    sp_sum: float = 0.0
    max_steps: int | None = None

    def with_prices(self, res, prob: Problem, max_steps: int) -> "WarmState":
        """This state plus the last pricing of column generation ``res`` (arc prices
        ``w`` and ``sum_p SP_p(w)``, a Farley certificate for :mod:`.local`)."""
        if res.shortest is None or res.shortest_w is None:
            return replace(self, max_steps=max_steps)
        sp = float(res.shortest[prob.pair_src, prob.pair_dst].sum())
        return replace(self, w=res.shortest_w.copy(), sp_sum=sp, max_steps=max_steps)

    @cached_property
    def column_of_arc(self) -> np.ndarray:
        """The column of every entry of ``arcs`` (built once)."""
        return np.repeat(np.arange(self.y.size), np.diff(self.start))

    @cached_property
    def lp_load(self) -> np.ndarray:
        """Per-link load of the old LP shares (old link indices; built once)."""
        return np.bincount(self.arcs, weights=self.y[self.column_of_arc],
                           minlength=self.tail.size)

    @cached_property
    def chunk_of_arc(self) -> np.ndarray:
        """The chunk of every entry of ``chunk_arcs`` (built once)."""
        return np.repeat(np.arange(self.chunk_pair.size), np.diff(self.chunk_start))

    @cached_property
    def chunk_array(self) -> np.ndarray:
        """``chunks`` as a numpy object array (built once; fancy-indexed by chunk reuse)."""
        return object_array(self.chunks)

    @classmethod
    def from_pool(cls, prob: Problem, pool: ColumnPool, y: np.ndarray, t: float,
                  basis: Basis | None = None, chunks: tuple[PathChunk, ...] = (),
                  chunk_of: np.ndarray | None = None,
                  chunk_share: np.ndarray | None = None,
                  chunk_routes: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
                  max_chunks: int | None = None) -> "WarmState":
        """The first ``len(y)`` columns of ``pool`` (those ``y`` are the shares of);
        ``chunk_routes``: (pair, start, arcs) of the chunks."""
        ar = prob.topo.arrays
        n = len(y)
        cp, cs, ca = chunk_routes if chunk_routes is not None else (None, None, None)
        return cls(tuple(n.id for n in prob.topo.nodes), ar.tail.copy(), ar.head.copy(),
                   pool.start[:n + 1].copy(), pool.arcs[:pool.start[n]].copy(),
                   np.asarray(y, dtype=float).copy(), chunks, chunk_of, chunk_share, basis,
                   prob.capacity.copy(), float(t), pool.pair[:n].copy(), cp, cs, ca, max_chunks)


def _link_lookup(prob: Problem, tails: np.ndarray, heads: np.ndarray) -> np.ndarray:
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


def _from_state(prob: Problem, state: WarmState) -> tuple[np.ndarray, ...]:
    node_map = _node_map(prob, state.node_ids)
    arc_map = _link_lookup(prob, node_map[state.tail], node_map[state.head])
    return _columns(prob, state.start, arc_map[state.arcs] if state.arcs.size else state.arcs)


def _from_paths(prob: Problem, paths: Iterable[Sequence[str]]) -> tuple[np.ndarray, ...]:
    unique = sorted({tuple(p) for p in paths})
    ids = sorted({v for p in unique for v in p})
    node_map = dict(zip(ids, _node_map(prob, ids)))
    tails = np.array([node_map[u] for p in unique for u in p[:-1]], dtype=np.int64)
    heads = np.array([node_map[v] for p in unique for v in p[1:]], dtype=np.int64)
    start = np.concatenate([[0], np.cumsum([len(p) - 1 for p in unique])]).astype(np.int64)
    pair, new_start, arcs, _ = _columns(prob, start, _link_lookup(prob, tails, heads))
    return pair, new_start, arcs, np.full(pair.size, -1, dtype=np.int64)


def warm_columns(prob: Problem, warm: Schedule | WarmState) -> tuple[np.ndarray, ...]:
    """(pair, start, arcs, origin) of the previous columns still valid on ``prob``'s
    topology; ``origin`` indexes the :class:`WarmState` columns (-1 for file paths)."""
    state = warm.warm_state if isinstance(warm, Schedule) else warm
    if isinstance(state, WarmState):
        return _from_state(prob, state)
    if isinstance(warm, Schedule):
        return _from_paths(prob, (c.path for c in warm.chunks if isinstance(c, PathChunk)))
    raise TypeError(f"warm must be a Schedule or WarmState, got {type(warm).__name__}")


def reusable_basis(prob: Problem, state: WarmState, pool: ColumnPool, backend: str,
                   rel_tol: float = 1e-9) -> Basis | None:
    """``state.basis`` when it is optimal for the master over ``pool`` on ``prob``'s
    capacities (module docstring), else ``None``.  Requires the same nodes and links,
    the same columns in the same order, and every changed link non-binding in the old
    LP and still feasible at the old rate."""
    basis = state.basis
    if basis is None or basis.backend != backend or state.capacity is None:
        return None
    ar = prob.topo.arrays
    same_fabric = (state.node_ids == tuple(n.id for n in prob.topo.nodes)
                   and np.array_equal(state.tail, ar.tail) and np.array_equal(state.head, ar.head))
    n = state.y.size
    if not same_fabric or len(pool) != n or not np.array_equal(pool.origin, np.arange(n)):
        return None
    return basis if changes_are_nonbinding(prob, state, rel_tol) else None


def changes_are_nonbinding(prob: Problem, state: WarmState, rel_tol: float = 1e-9) -> bool:
    """Every link whose capacity changed was non-binding in the old LP and still carries
    the old LP's load at the old rate (``state`` on the same links as ``prob``)."""
    if state.capacity is None:
        return False
    load = state.lp_load
    changed = np.flatnonzero(state.capacity != prob.capacity)
    slack_old = state.capacity[changed] * state.t * (1 - rel_tol) - load[changed]
    slack_new = prob.capacity[changed] * state.t * (1 - rel_tol) - load[changed]
    return bool((slack_old > 0).all() and (slack_new > 0).all())
