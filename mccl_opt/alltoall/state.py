"""What a finished AllToAll run leaves for the next one: :class:`AllToAllWarmState`.

A warm state is plain data, never mutated, so any number of warm starts may share one.
It is made of small typed pieces, each with one meaning:

* :class:`OldFabric`: the topology the run solved (node ids, links, capacities), to
  match columns against a new topology and to see which capacities changed;
* :class:`LPColumns`: the final master's path columns, their LP shares ``y`` and the
  optimum ``t = 1/z`` (paper §4.2);
* :class:`ChunkRoutes`: the rounded schedule's chunks as routes over the old links, so
  the local re-optimisation (:mod:`.local`) can keep the pairs a change does not touch
  (the schedule's chunk arrays are made from them, :func:`~.assemble.make_schedule`);
* :class:`PricingCertificate`: the last pricing's arc prices and the sum of shortest
  paths under them, a Farley bound that :func:`~.local.reuse_certified` re-checks under
  new capacities;
* ``basis``: the final master's simplex basis (:class:`~mccl_opt.backends.Basis`).

The routes are :class:`~.rows.Rows`: a warm state derived by the local
re-optimisation shares its parent's arrays for the routes it keeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
import numpy as np

from ..backends.base import Basis
from .master import ColumnPool
from .problem import Problem
from .rows import Rows

__all__ = ["AllToAllWarmState", "OldFabric", "LPColumns", "ChunkRoutes", "PricingCertificate"]


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
    """The final master: column ``j`` routes pair ``pair[j]`` over the old links of row
    ``j`` of ``routes`` with LP share ``y[j]``; ``t`` is the LP optimum."""

    pair: np.ndarray
    routes: Rows
    y: np.ndarray
    t: float

    @property
    def count(self) -> int:
        return int(self.y.size)

    @property
    def start(self) -> np.ndarray:
        """The routes as a plain CSR list: column ``j`` crosses ``arcs[start[j]:start[j+1]]``."""
        return self.routes.flat[0]

    @property
    def arcs(self) -> np.ndarray:
        return self.routes.flat[1]

    @classmethod
    def from_pool(cls, pool: ColumnPool, y: np.ndarray, t: float) -> "LPColumns":
        """The first ``len(y)`` columns of ``pool`` (those ``y`` are the shares of), as
        views: a pool replaces its arrays when it changes, never writes into them."""
        n = len(y)
        return cls(pool.pair[:n], Rows(pool.start[:n + 1], pool.arcs[:pool.start[n]]),
                   np.asarray(y, dtype=float).copy(), float(t))


@dataclass(frozen=True)
class ChunkRoutes:
    """The rounded schedule: chunk ``i`` carries share ``share[i]`` of pair ``pair[i]``
    over the old links of row ``i`` of ``routes``; ``of_column[j]`` is the chunk LP
    column ``j`` became (-1: none); ``max_chunks`` is the schedule's chunk count per
    pair (``None``: fractional)."""

    pair: np.ndarray
    routes: Rows
    share: np.ndarray
    of_column: np.ndarray
    max_chunks: int | None


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
class AllToAllWarmState:
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
        return self.lp.routes.loads(self.lp.y, self.fabric.tail.size)
