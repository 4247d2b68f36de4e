"""What a finished AllToAll run leaves for the next one: :class:`WarmState`.

A warm state is plain data, never mutated, so any number of warm starts may share one.
It is made of small typed pieces, each with one meaning:

* :class:`OldFabric`: the topology the run solved (node ids, links, capacities), to
  match columns against a new topology and to see which capacities changed;
* :class:`LPColumns`: the final master's path columns, their LP shares ``y`` and the
  optimum ``t = 1/z`` (paper §4.2);
* :class:`ChunkRoutes`: the rounded schedule's chunks as routes over the old links, so
  unchanged chunks are reused and the local re-optimisation (:mod:`.local`) can keep
  the pairs a change does not touch;
* :class:`PricingCertificate`: the last pricing's arc prices and the sum of shortest
  paths under them, a Farley bound that :func:`~.local.reuse_certified` re-checks under
  new capacities;
* ``basis``: the final master's simplex basis (:class:`~mccl_opt.backends.Basis`).

Also the CSR helpers that slice these column lists.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import numpy as np

from ..backends.base import Basis
from .master import ColumnPool
from .problem import Problem

__all__ = ["WarmState", "OldFabric", "LPColumns", "ChunkRoutes", "PricingCertificate",
           "csr_take", "csr_mask_then", "object_array"]


def csr_take(start: np.ndarray, arcs: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows ``idx`` (in that order) of the CSR list ``start/arcs``."""
    idx = np.asarray(idx, dtype=np.int64)
    lengths = start[idx + 1] - start[idx]
    new_start = np.zeros(idx.size + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_start[1:])
    pos = np.arange(new_start[-1]) - np.repeat(new_start[:-1] - start[idx], lengths)
    return new_start, arcs[pos]


def csr_mask_then(start: np.ndarray, arcs: np.ndarray, mask: np.ndarray,
                  start2: np.ndarray, arcs2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows where ``mask`` holds (in order) of the CSR list ``start/arcs``, followed
    by every row of ``start2/arcs2`` (``start2[0] == 0``); each output array is
    allocated once (no intermediate as long as ``arcs``)."""
    lengths = np.diff(start)
    kept = int(mask.sum())
    new_start = np.empty(kept + start2.size, dtype=np.int64)
    new_start[0] = 0
    np.cumsum(lengths[mask], out=new_start[1:kept + 1])
    mid = int(new_start[kept])
    new_start[kept + 1:] = mid + start2[1:]
    out = np.empty(mid + int(start2[-1]), dtype=arcs.dtype)
    np.compress(np.repeat(mask, lengths), arcs, out=out[:mid])
    out[mid:] = arcs2[:start2[-1]]
    return new_start, out


def object_array(items: Sequence) -> np.ndarray:
    """``items`` as a 1-D numpy object array (elements kept as they are, even tuples).
    ``np.fromiter`` copies the references only; assigning a list into an object array
    first probes every element as a possible sequence (5x slower at 1M chunks)."""
    return np.fromiter(items, dtype=object, count=len(items))


@dataclass(frozen=True)
class OldFabric:
    """The solved topology: link ``a`` runs from ``node_ids[tail[a]]`` to
    ``node_ids[head[a]]`` with ``capacity[a]`` Gbps."""

    node_ids: tuple[str, ...]
    tail: np.ndarray
    head: np.ndarray
    capacity: np.ndarray

    @classmethod
    def of(cls, prob: Problem) -> "OldFabric":
        ar = prob.topo.arrays
        return cls(tuple(n.id for n in prob.topo.nodes), ar.tail.copy(), ar.head.copy(),
                   prob.capacity.copy())

    def same_links(self, prob: Problem) -> bool:
        """``prob``'s topology has the same nodes and links in the same order (its
        capacities may differ)."""
        ar = prob.topo.arrays
        return (self.node_ids == tuple(n.id for n in prob.topo.nodes)
                and np.array_equal(self.tail, ar.tail) and np.array_equal(self.head, ar.head))


@dataclass(frozen=True)
class LPColumns:
    """The final master: column ``j`` routes pair ``pair[j]`` over the old links
    ``arcs[start[j]:start[j+1]]`` with LP share ``y[j]``; ``t`` is the LP optimum."""

    pair: np.ndarray
    start: np.ndarray
    arcs: np.ndarray
    y: np.ndarray
    t: float

    @property
    def count(self) -> int:
        return int(self.y.size)

    @classmethod
    def from_pool(cls, pool: ColumnPool, y: np.ndarray, t: float) -> "LPColumns":
        """The first ``len(y)`` columns of ``pool`` (those ``y`` are the shares of)."""
        n = len(y)
        return cls(pool.pair[:n].copy(), pool.start[:n + 1].copy(),
                   pool.arcs[:pool.start[n]].copy(), np.asarray(y, dtype=float).copy(), float(t))


@dataclass(frozen=True)
class ChunkRoutes:
    """The rounded schedule: chunk ``i`` is ``array[i]`` (a numpy object array of
    :class:`~mccl_opt.schedule.PathChunk`, fancy-indexed by chunk reuse) with share ``share[i]``,
    routing pair ``pair[i]`` over the old links ``arcs[start[i]:start[i+1]]``;
    ``of_column[j]`` is the chunk LP column ``j`` became (-1: none); ``max_chunks`` is
    the schedule's chunk count per pair (``None``: fractional)."""

    array: np.ndarray
    pair: np.ndarray
    start: np.ndarray
    arcs: np.ndarray
    share: np.ndarray
    of_column: np.ndarray
    max_chunks: int | None

    @property
    def complete(self) -> bool:
        """Every chunk object has its route."""
        return self.array.size == self.pair.size


@dataclass(frozen=True)
class PricingCertificate:
    """The last pricing of a run at step bound ``max_steps``: arc prices ``w`` and
    ``sp_sum = sum_p SP_p(w)``, so ``t* >= sp_sum / max(1, cap·w)`` (Farley bound,
    :mod:`.colgen`) for any capacities ``cap``."""

    w: np.ndarray
    sp_sum: float
    max_steps: int

    def bound_t(self, capacity: np.ndarray) -> float:
        """The certified lower bound on the optimal ``t`` under ``capacity``."""
        return self.sp_sum / max(1.0, float(capacity @ self.w))


@dataclass(frozen=True)
class WarmState:
    """What a warm start needs from a finished run (kept in ``Schedule.warm_state``):
    the solved ``fabric``, the final master's ``lp`` columns, the schedule's ``chunks``
    (``None``: unknown, then only the columns carry over), the master's ``basis`` and
    the last pricing's ``certificate`` (``None`` when the run did not price)."""

    fabric: OldFabric
    lp: LPColumns
    chunks: ChunkRoutes | None = None
    basis: Basis | None = None
    certificate: PricingCertificate | None = None

    @cached_property
    def lp_load(self) -> np.ndarray:
        """Per-link load of the old LP shares (old link indices; built once)."""
        from ._segments import column_loads
        return column_loads(self.lp.start, self.lp.arcs, self.lp.y, self.fabric.tail.size)
