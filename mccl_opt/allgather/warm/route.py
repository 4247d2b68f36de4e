"""The warm route of one AllGather solve: which warm start is tried, and for how long
(paper §4.3, ForestColl-warm; docs/allgather.md, *Warm never slower than cold*).

A solve given a previous schedule makes one :class:`WarmRoute`.  It decides up front
whether the previous schedule can help at all (:meth:`WarmRoute.plan`: a schedule of
other GPUs is *unrelated* and declined at once), and holds **one warm allowance for the
whole solve**, in the solving thread's CPU seconds: :data:`WARM_SHARE` of the cold
solve's CPU time the previous schedule carries (``report.cold_cpu``; at least
:data:`WARM_FLOOR_S`), or, when it carries none, a measured proxy (the CPU seconds of
this fabric's exact Phase 1, a part of every cold solve); the proxy too when
the carried time is of a costly cold solve (``report.cold_costly``: past ForestColl on
the fabric itself) and this fabric is balanced, where going cold is the cheap option.
Once a ForestColl run on this fabric knows its budget ``k``, the allowance shrinks to the
same share of this state's predicted cold cost where that is smaller
(:meth:`WarmRoute.expect_cold`).  Every
warm-influenced step of the method chain runs through :meth:`WarmRoute.attempt`: as a
CPU stage of what is left of the allowance (:func:`mccl_opt.anytime.stage`), its
solving CPU time (not numba kernel loads) charged to it.  CPU, not wall, on both sides: a loaded machine inflates wall
times, and a cold time measured under load made the allowance (and rerouting's cap,
:func:`.reroute.calibrated_cold_seconds`) too generous for a warm step measured later
(docs/allgather.md, *Warm caps in CPU seconds*).  The clock is ``time.thread_time``,
not ``time.process_time``: a controller may solve in a worker thread while its other
threads run, and their CPU is not this solve's.  Once the allowance is spent, the step
that overran is redone cold and every later step runs cold; what the warm attempt
offered (:func:`mccl_opt.anytime.offer`) stays the incumbent of a time limit.  So a
warm solve costs at most a cold solve plus the allowance (and one compiled kernel call
overrunning it), and at ``max_chunks=None`` reaches cold's rate: every warm step is
certified optimal or replaced by the cold step.  A warm step that predicts itself
costlier than this state's cold solve (:class:`.reroute.RerouteCostlier`) declines the
route before doing that work; a predicted cost in CPU seconds is compared with the
allowance left (:meth:`WarmRoute.cpu_left`).

The general method is warm-started only from its own previous columns
(:meth:`WarmRoute.general_warm`): seeding its column generation with ForestColl's
trees (thousands of unit trees) made the first master LP slower than a cold start.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from typing import Callable, TypeVar

from mccl_opt import anytime
from mccl_opt.errors import MCCLError
from mccl_opt.kernel_time import thread_kernel_cpu_seconds, thread_kernel_seconds
from mccl_opt.report import Attempt, Method, WarmUse
from mccl_opt.schedule import Schedule
from mccl_opt.topology import Topology
from ..fabric import fabric_of, switches_balanced
from ..forestcoll.throughput import optimal_rate
from .kept import AllGatherWarmState
from .reroute import REROUTE_COLD_SHARE as COLD_SHARE, RerouteCostlier

__all__ = ["WARM_SHARE", "WARM_FLOOR_S", "RouteTaken", "WarmRoute", "warm_allowance_s"]

#: the warm allowance is this share of the cold CPU time the previous schedule carries
#: (0.4 before: a warm step abandoned at the allowance costs cold + the allowance, and
#: the target is 1.5 x cold; docs/allgather.md, *Warm never slower than cold*) ...
WARM_SHARE = 0.25
#: ... and never less than this (CPU s): a warm solve costs at most cold + the allowance
WARM_FLOOR_S = 0.005

T = TypeVar("T")


class RouteTaken(str, Enum):
    """Which route a solve took (``stats["warm_route"]``)."""

    COLD = "cold"                    # no previous schedule
    WARM = "warm"                    # the returned schedule reuses the previous one
    DECLINED = "declined"            # warm not tried or not paying: the schedule is cold's


def warm_allowance_s(warm: Schedule) -> float | None:
    """The warm allowance carried by ``warm`` (CPU s): :data:`WARM_SHARE` of its cold
    solve's CPU time (``report.cold_cpu``), at least :data:`WARM_FLOOR_S`; ``None`` when
    it carries none (a file written without a report, a solve stopped at its time
    limit)."""
    report = warm.report if isinstance(warm, Schedule) else None
    cold = report.cold_cpu if report is not None else None
    return None if cold is None else max(WARM_FLOOR_S, WARM_SHARE * cold)


def _costly_then_balanced(warm: Schedule, topo: Topology) -> bool:
    """Whether ``warm`` carries the time of a costly cold solve (past ForestColl on the
    fabric itself: unbalanced switches, or ForestColl declined) while ``topo``'s switches
    are balanced (a repair): ForestColl then most likely solves ``topo`` cold in a
    fraction of that time, so going cold is the cheap option and the carried time says
    nothing about it (docs/allgather.md, *Warm never slower than cold*)."""
    report = warm.report if isinstance(warm, Schedule) else None
    return report is not None and bool(report.cold_costly) and switches_balanced(topo)


def _phase_one_seconds(topo: Topology) -> float:
    """The measured proxy of a cold solve's CPU time: this fabric's exact Phase 1 (every
    cold solve runs it, so this is at most what cold costs)."""
    t = time.thread_time()
    k0 = thread_kernel_cpu_seconds()
    try:
        optimal_rate(fabric_of(topo)[0])
    except (MCCLError, ArithmeticError, ValueError):
        pass                              # the solve itself reports an unusable fabric
    return time.thread_time() - t - (thread_kernel_cpu_seconds() - k0)


@dataclass
class WarmRoute:
    """One solve's warm route (module doc).  ``warm``: the previous schedule while warm
    steps may still run, ``None`` once declined; ``allowance``: CPU seconds of warm
    solving left of ``total``, the whole allowance; ``reason``: why the warm start was
    declined, if it was; ``used``: CPU seconds the warm steps took (``used_wall``: wall
    seconds); ``given``: the previous schedule
    as given (kept when declined: :func:`..fewer_trees.fewer_trees` reuses its trees
    where they still reach the certified rate)."""

    warm: Schedule | None
    allowance: float
    total: float
    reason: str | None = None
    used: float = 0.0
    used_wall: float = 0.0
    given: Schedule | None = None
    stage_cpu: float | None = None
    stage: anytime.Anytime | None = None
    topo: Topology | None = None

    @classmethod
    def plan(cls, topo: Topology, warm: Schedule | None) -> "WarmRoute":
        """The route for ``topo`` warm-started from ``warm``: cold without one, declined
        at once when ``warm`` is of other GPUs (fewer than half of its GPUs are
        ``topo``'s, or their number differs), else warm under the allowance (the
        measured proxy when ``warm`` carries no cold time, or the time of a costly cold
        solve while ``topo`` is balanced)."""
        if warm is None:
            return cls(None, 0.0, 0.0)
        common = len(set(warm.gpus) & set(topo.gpus))
        if len(warm.gpus) != topo.num_gpus or 2 * common < topo.num_gpus:
            return cls(None, 0.0, 0.0, reason="unrelated: the previous schedule is of other GPUs")
        allowance = warm_allowance_s(warm)
        if allowance is None or _costly_then_balanced(warm, topo):
            allowance = max(WARM_FLOOR_S, _phase_one_seconds(topo))
        return cls(warm, allowance, allowance, given=warm, topo=topo)

    @property
    def active(self) -> bool:
        """Whether a warm step may still run."""
        return self.warm is not None

    def general_warm(self) -> Schedule | None:
        """The previous schedule for the general method: only one it made itself (its
        columns, or a file of its trees), else ``None`` (cold)."""
        warm = self.warm
        if warm is None:
            return None
        state = warm.warm_state
        if isinstance(state, AllGatherWarmState) and state.columns is not None:
            return warm
        return warm if warm.report is not None and warm.report.method is Method.GENERAL \
            and state is None else None

    def attempt(self, step: str, method: Method, warm_step: Callable[[Schedule], T],
                cold_step: Callable[[], T], attempts: list[Attempt] | None = None,
                most: float | None = None) -> T:
        """``warm_step(previous)`` as a stage of the allowance left (and at most ``most``
        CPU seconds, :meth:`cold_cap`; a CPU stage, :func:`mccl_opt.anytime.stage`), ``cold_step()`` when the route is not warm any more
        or past either (then the route is declined, recorded in ``attempts`` as
        ``method``)."""
        if self.warm is not None and most is not None and most <= 0:
            self.decline(f"the warm steps passed {COLD_SHARE:g} x this fabric's predicted "
                         f"cold solve before {step}")
        if self.warm is not None and self.allowance <= 0:
            self.decline(f"the warm allowance of {self.total:.3g} s CPU was spent before {step}")
        if self.warm is None:
            return cold_step()
        capped = most is not None and most < self.allowance
        seconds = most if capped else self.allowance
        t, k0 = time.perf_counter(), thread_kernel_seconds()
        c, kc0 = time.thread_time(), thread_kernel_cpu_seconds()
        self.stage_cpu = c
        try:
            result, expired = anytime.stage(seconds, lambda: self._staged(warm_step), cpu=True)
        except RerouteCostlier as costlier:
            result, expired = None, str(costlier)
        finally:
            self.stage_cpu, self.stage = None, None
        took = time.perf_counter() - t
        self.used_wall += took - (thread_kernel_seconds() - k0)
        self.used += time.thread_time() - c - (thread_kernel_cpu_seconds() - kc0)
        self.allowance = max(0.0, self.total - self.used)
        if not expired:
            return result                 # type: ignore[return-value]
        self.decline(expired if isinstance(expired, str) else
                     f"the warm steps passed {COLD_SHARE:g} x this fabric's predicted cold "
                     f"solve in {step}" if capped else
                     f"the warm allowance of {self.total:.3g} s CPU was spent in {step}")
        if attempts is not None:
            attempts.append(Attempt(method, took, f"declined: {self.reason}"))
        return cold_step()

    def _staged(self, warm_step: Callable[[Schedule], T]) -> T:
        """``warm_step`` on the previous schedule, inside the stage :meth:`attempt`
        entered (kept: :meth:`expect_cold` may shorten it)."""
        self.stage = anytime.current()
        return warm_step(self.warm)        # type: ignore[arg-type]

    def expect_cold(self, cold_cpu_s: float, topo: Topology) -> None:
        """Size the allowance by this state's predicted cold cost too (``cold_cpu_s``
        CPU seconds, :func:`.reroute.predicted_cold_seconds` once a ``k`` is known, of a
        ForestColl run on ``topo``; ignored unless ``topo`` is the solve's own: a chain's
        run on a sub-fabric predicts a part of the solve):
        :data:`WARM_SHARE` of the smaller of it and the previous state's cold time (at
        least :data:`WARM_FLOOR_S`), the running stage shortened to match.  The previous
        state's cold time may be twice this state's, and a warm solve that gives up costs
        cold plus the whole allowance (half-uplinks 2x8x8 two way at ``K=10``, fuzz seed
        3529: 0.0164 s allowed against a cold solve of 0.037 s; docs/allgather.md,
        *The warm allowance sized by this state's cold cost*)."""
        total = max(WARM_FLOOR_S, WARM_SHARE * cold_cpu_s)
        if self.warm is None or topo is not self.topo or total >= self.total:
            return
        self.total = total
        self.allowance = max(0.0, total - self.used)
        stage = self.stage
        if stage is not None and stage.cpu_deadline is not None:
            left = total - self.spent(self.used)
            stage.cpu_deadline = min(stage.cpu_deadline,
                                     time.thread_time() - thread_kernel_cpu_seconds() + left)

    def cold_cap(self, cold_cpu_s: float, since_used: float) -> float:
        """CPU seconds left to the warm steps of one ForestColl run once its cold cost
        is predicted (``cold_cpu_s`` CPU seconds, :func:`.reroute.predicted_cold_seconds`):
        :data:`COLD_SHARE` of it (at least :data:`WARM_FLOOR_S`), less what its warm
        steps took since ``since_used`` (a reading of :attr:`used`).  The allowance is sized by the *previous* state's cold time,
        which may be several times this state's (docs/allgather.md, *A guess certified
        by packing*)."""
        return max(WARM_FLOOR_S, COLD_SHARE * cold_cpu_s) - (self.used - since_used)

    def spent(self, since_used: float) -> float:
        """CPU seconds the warm steps took since ``since_used`` (a reading of
        :attr:`used`), the running step's so far included: what a step inside it
        counts against the same cap (:func:`.reroute.reroute`'s ``spent_s``)."""
        running = 0.0 if self.stage_cpu is None else time.thread_time() - self.stage_cpu
        return self.used - since_used + running

    def cpu_left(self) -> float:
        """The allowance left in CPU seconds, the unit of a step's predicted cost."""
        return self.allowance

    def decline(self, reason: str) -> None:
        """Run every later step cold, saying why (the first reason is kept)."""
        self.warm = None
        self.reason = self.reason or reason

    def taken(self, use: WarmUse) -> RouteTaken:
        """The route the returned schedule took, from its warm use."""
        if use is WarmUse.COLD:
            return RouteTaken.DECLINED if self.total or self.reason else RouteTaken.COLD
        return RouteTaken.DECLINED if use is WarmUse.DECLINED else RouteTaken.WARM
