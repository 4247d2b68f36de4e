"""From rounded columns to a :class:`~mccl_opt.Schedule`: the one AllToAll assembler.

Every way a run can end (certified reuse, local re-optimisation, full column
generation; :mod:`.solve`) produces an :class:`Outcome` -- the rounded chunks, their
per-link share loads, the LP rate, the links the LP saturates, the new
:class:`~.state.AllToAllWarmState` and a typed :class:`RunReport` -- and
:func:`make_schedule` turns it into the schedule, with the rate recomputed from the
loads (``min_a cap_a / load_a``) and the bottleneck cut ``K_s`` of paper §3.2.
``Schedule.stats`` is the report's JSON view (:meth:`RunReport.to_stats`).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from ..errors import SolveError
from ..report import Method, SolveReport, Termination, WarmUse
from ..schedule import PathChunks, PathTable, Schedule, bottleneck_links, schedule_rate
from ..schedule_chunks import FlatPaths
from .colgen import CGStatus
from .master import ColumnPool
from .problem import Problem
from .rounding import Rounded, rounded_rate
from .state import ChunkRoutes, AllToAllWarmState

__all__ = ["SATURATION_REL_TOL", "WarmMode", "RunReport", "Outcome", "make_schedule",
           "chunk_view", "fractional", "rounded_columns"]

#: A link counts as saturated by the LP (in the bottleneck cut) within this relative tolerance.
SATURATION_REL_TOL = 1e-6


class WarmMode(enum.Enum):
    """How a run used its warm start (docs/alltoall.md): none (``COLD``), the full warm
    master (``FULL``), the old basis (``BASIS``), the certified local re-optimisation
    (``LOCAL``) or the old schedule itself, re-certified (``REUSE``)."""

    COLD = "cold"
    FULL = "full"
    BASIS = "basis"
    LOCAL = "local"
    REUSE = "reuse"

    @property
    def use(self) -> WarmUse:
        """The collective-neutral :class:`~mccl_opt.report.WarmUse`."""
        return {WarmMode.COLD: WarmUse.COLD, WarmMode.FULL: WarmUse.COLUMNS,
                WarmMode.BASIS: WarmUse.BASIS, WarmMode.LOCAL: WarmUse.LOCAL,
                WarmMode.REUSE: WarmUse.KEPT}[self]


@dataclass
class RunReport:
    """What a run did, typed; :meth:`to_stats` is the JSON view in ``Schedule.stats``.

    ``status``: how the LP phase ended; ``lp_bound_gbps``: the certified upper bound on
    the LP rate; ``rounding``: the rounding that won (``"fractional"``, ``"reused"``,
    ``"balanced"``, ...); ``extra``: the JSON-only details of the phases (deep-dive
    counters, the step search, the local path's free pairs)."""

    status: CGStatus
    warm_mode: WarmMode
    backend: str
    iterations: int
    rounds: int
    columns: int
    columns_dropped: int
    warm_columns: int
    lp_bound_gbps: float
    bound_history: list[list[float]]
    max_steps: int
    rounding: str
    lp_seconds: float = 0.0
    pricing_seconds: float = 0.0
    rounding_seconds: float = 0.0
    extra: dict = field(default_factory=dict)

    def solve_report(self, max_chunks: int | None) -> SolveReport:
        """The shared :class:`~mccl_opt.report.SolveReport` (``seconds`` set by the solve)."""
        bound = self.lp_bound_gbps if 0 < self.lp_bound_gbps < float("inf") else None
        return SolveReport(collective="alltoall", method=Method.COLUMN_GENERATION,
                           termination=Termination(self.status.value), bound_gbps=bound,
                           warm=self.warm_mode.use, max_chunks=max_chunks, seconds=0.0,
                           k=max_chunks, phases=(("lp", self.lp_seconds),
                                                 ("pricing", self.pricing_seconds),
                                                 ("rounding", self.rounding_seconds)))

    def to_stats(self, lp_rate: float) -> dict:
        """The JSON view; ``lp_gap`` is the bound's relative excess over ``lp_rate``."""
        return {
            "status": self.status.value,
            "rounds": self.rounds,
            "columns": self.columns,
            "columns_dropped": self.columns_dropped,
            "warm_columns": self.warm_columns,
            "warm_basis": self.warm_mode is WarmMode.BASIS,
            "warm_mode": self.warm_mode.value,
            "lp_seconds": self.lp_seconds,
            "pricing_seconds": self.pricing_seconds,
            "rounding_seconds": self.rounding_seconds,
            "lp_bound_gbps": self.lp_bound_gbps,
            "bound_history": self.bound_history,
            "max_steps": self.max_steps,
            "rounding": self.rounding,
            **self.extra,
            "lp_gap": max(0.0, self.lp_bound_gbps / lp_rate - 1.0) if lp_rate > 0 else 0.0,
        }


@dataclass
class Outcome:
    """A finished run before assembly: the rounded chunks' per-link share ``loads``, the
    LP rate, the links the LP ``saturated``, the new warm state (its chunk routes are
    the rounded chunks), the report, and when the LP phase ended
    (``time.perf_counter``; ``None``: no LP was solved)."""

    loads: np.ndarray
    lp_rate: float
    saturated: np.ndarray
    warm_state: AllToAllWarmState
    report: RunReport
    lp_done: float | None = None


def make_schedule(prob: Problem, outcome: Outcome, max_chunks: int | None) -> Schedule:
    """The :class:`Schedule` of ``outcome``: rate recomputed from the share loads, the
    LP rate raised to it within float noise, or whenever the LP phase stopped short of
    its optimum (a time limit: the repair and the dive may have priced paths that beat
    the last master, and every schedule is a point of the LP, so its optimum is at least
    the rate), the bottleneck cut of the LP-saturated links."""
    rate = schedule_rate(prob.topo, outcome.loads)
    if not np.isfinite(rate):
        raise SolveError("rounding produced a schedule that loads no link; report this as a bug")
    report = outcome.report
    lp_rate = outcome.lp_rate
    if lp_rate < rate and (report.status is not CGStatus.OPTIMAL or rate <= lp_rate * (1 + 1e-9)):
        lp_rate = rate
    bottleneck = bottleneck_links(prob.topo, outcome.loads, rate, max_chunks,
                                  saturated=outcome.saturated)
    return Schedule("alltoall", prob.topo.name, prob.topo.gpus, rate, lp_rate, max_chunks,
                    chunk_view(prob, outcome.warm_state.chunks), bottleneck, 1,
                    {"backend": report.backend, "seconds": 0.0, "iterations": report.iterations},
                    report.to_stats(lp_rate), outcome.warm_state,
                    report=report.solve_report(max_chunks))


def chunk_view(prob: Problem, routes: ChunkRoutes | None) -> PathChunks:
    """The schedule's chunks: the chunk routes of a run's warm state, ordered by pair, as
    arrays (:class:`PathChunks`; no chunk object is built unless one is read).  The
    table is made when first read (the writer, ``share_loads``, the validator), not in
    the solve: a path is the tail of its first link, then the head of every link."""
    if routes is None:
        raise SolveError("a run ended without its chunk routes; report this as a bug")
    return PathChunks(partial(_route_table, prob, routes), size=routes.pair.size)


def _route_table(prob: Problem, routes: ChunkRoutes) -> PathTable:
    """The :class:`PathTable` of ``routes`` (rows ordered by pair, stably)."""
    order = np.argsort(routes.pair, kind="stable")
    start, arcs = routes.routes.take(order)
    ar = prob.topo.arrays
    first = start + np.arange(start.size)                   # one node more than links per path
    flat = np.empty(int(first[-1]), np.int64)
    opens = first[:-1]
    flat[opens] = ar.tail[arcs[start[:-1]]]
    rest = np.ones(flat.size, bool)
    rest[opens] = False
    flat[rest] = ar.head[arcs]
    pair = routes.pair[order]
    return PathTable([n.id for n in prob.topo.nodes], ar.gpu_nodes[prob.pair_src[pair]],
                     ar.gpu_nodes[prob.pair_dst[pair]], routes.share[order], FlatPaths(flat, first))


def fractional(pool: ColumnPool, y: np.ndarray, prob: Problem) -> Rounded:
    """The LP solution itself, as shares ``y_j / sum_p y`` (``max_chunks=None``)."""
    y = np.where(y > 1e-12, y, 0.0)
    total = np.bincount(pool.pair, weights=y, minlength=prob.num_pairs)
    shares = y / total[pool.pair]
    return Rounded(shares, rounded_rate(pool, shares, 1, prob.capacity), pool.pair.copy(),
                   pool.start.copy(), pool.arcs.copy(), pool.origin.copy(), "fractional")


def rounded_columns(prob: Problem, rounded: Rounded, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The pool columns the rounding uses (ordered by pair, then column: the schedule's
    chunks) and their per-link share loads."""
    used = np.flatnonzero(rounded.counts > 0)
    used = used[np.argsort(rounded.pool_pair[used], kind="stable")]
    from ._segments import column_loads
    loads = column_loads(rounded.pool_start, rounded.pool_arcs, rounded.counts / k, prob.num_links)
    return used, loads
