"""The Schedule Manager (paper §3.1-3.2; its optimizer wrapper is :mod:`.synthesizer`,
which collectives start a job :mod:`.flagging`).

Longer than ~400 lines on purpose: the registry, the job life cycle (start, settle,
supersede, abort, publish) and the re-check before publishing are one state machine
whose invariants are read together.

It keeps a registry of collectives per communicator, runs Algorithm 1
(:mod:`mccl_runtime.drift`, through :class:`~.flagging.Flagger`) on each dynamic one under
the measured capacities ``M``, re-synthesizes flagged ones warm in a worker thread, or with
a :class:`~mccl_runtime.pool.SynthesisPool` in worker processes (one job per affected
collective, concurrently), and publishes new versions.

* AllGather and AllToAll are dynamic.  An AllReduce is registered as a *static*
  ReduceScatter (left to the vendor library, never re-synthesized) plus a dynamic
  AllGather, ``<name>/reducescatter`` and ``<name>/allgather`` (paper §3).
* The optimizer input is the measured topology (``Topology.with_capacities(M)``); the
  current schedule is passed as ``warm`` (AllToAll: column generation; AllGather:
  ForestColl-warm).
* Every synthesized schedule is validated (:func:`mccl_opt.validate.validate`) on the
  job's topology in the worker; an invalid one ends the job as ``failed``.
* Time bound: the synthesizer gets ``time_limit_s`` (both synthesizers honour it and
  return their best valid schedule by then, ``report.termination`` saying so); a job still
  running after it is abandoned (its result is discarded; a Python thread cannot be
  killed, so the CPU is freed only when it returns).
* One decision: what happens to a finished job (publish, reuse, hold, restart, abort
  ``cleared`` or ``no_gain``) is :func:`~.publish_decision.publish_decision`, a pure
  function of the job, the active version and the store's estimates; the rules below are
  its parts, in its order.
* Speculative synthesis (``Policy.speculate``, off by default): while changes are still
  being confirmed (level estimator), a job may start on their early estimates
  (:meth:`MeasurementStore.early`) when no cable of its fabric is read in one direction
  only (:func:`~.publish_decision.speculation_covers`); its result is held until they are
  confirmed and then re-checked as any other.  With the EWMA (real ranks) the early
  estimates are the executors' (``pair`` samples' ``early``: a drop their reporter is still
  confirming), used only when the confirmed ``M`` flags nothing (a speculation on a stall
  beside a confirmed drop cost a restart on real ranks),
  the hold lasts up to ``early_hold_s``, and a speculation aborted as ``cleared`` (a stall)
  starts no dwell.
* Re-check before publish: a finished job is published only if, under the *latest*
  ``M``, the current schedule still deviates (``max delta > clear_ratio * Gamma``) and
  the new schedule's rate beats the current one's by more than ``min_gain``; otherwise
  it is aborted and the current schedule kept (after ``no_gain`` its cut and base
  slacks are re-derived on the ``M`` of that decision, except links that rose above
  the job's input, so the same drift does not flag again).
* Newest estimate wins: a finished job whose input capacities differ from the latest
  ``M`` by more than ``restart_tol`` (relative, on any link), and whose schedule's rate
  under the latest ``M`` is more than ``restart_tol`` below its rate on the job's input, is
  ``superseded``: it is discarded and a new job starts at once on the latest ``M`` (at
  most ``max_restarts`` times in a row; then the re-check below decides).  A move that
  costs the schedule nothing (capacities that fell where it has headroom) publishes it: a
  re-synthesis could not do better on capacities that only fell.  A failure that cleared meanwhile
  aborts (``cleared``) before this test.
* Confidence before synthesis: while the store reports links with an unconfirmed change
  (:meth:`MeasurementStore.pending_links`, level estimator), no job starts, for at most
  ``settle_max_s``; so two links failing together are synthesized for together.
  With the EWMA nothing holds decisions back (the executors' early estimates only start
  speculative jobs): ``gather_s`` holds a flagged collective's job until
  every channel on its links sampled in the ``gather_s`` before the flag has been sampled
  again (at most ``gather_s``), so a change that some samples read one collective later
  than others is synthesized for in one job.  ``cable_wait_s`` (real ranks) holds a job
  while a cable the schedule loads both ways reads dropped in one direction only (two
  ranks' readings of one cable arrive a push or a collective apart), at most that long.
* Everything known at publish time: a finished job is also checked against changes
  still being confirmed.  When a pending link that the new schedule uses, or that the
  job saw degraded, has a newest estimate (:meth:`MeasurementStore.provisional`) more
  than ``restart_tol`` away from the job's input, the result is *held* (event ``held``)
  until the change is confirmed or ``settle_max_s`` has passed, and then re-checked as
  usual: a failure that clears during synthesis aborts (``cleared``), a further drop
  supersedes it.  A superseded job restarts once no change is pending (at most
  ``settle_max_s`` later), so one restart covers both directions of a cable that are
  confirmed a few samples apart.  So the newest estimate wins however long synthesis
  takes.  A version already published is checked the same way when executors are about to
  swap it in (:meth:`ScheduleManager.swap_hold`): a rise it relies on, or a drop that
  costs it more than ``rate_loss`` of its rate, that started after the publish holds the
  swap (the loop waits for the next version, at most ``settle_max_s``).
* Rises still moving (EWMA at alpha 1, real ranks): a finished job started on a link
  read more than ``restart_tol`` above what the active version was built for, while that
  reading still moves (:meth:`MeasurementStore.moving_links`), is held until it settles,
  at most ``moving_max_s`` per collective; if it settled more than ``restart_tol`` from
  the job's input the job is superseded (docs/runtime.md, "Recoveries read in steps").
* Capacity lost (ramps, one-link cuts): a collective whose rate under ``M`` has fallen
  more than ``rate_loss`` below its rate on the capacities it was synthesized for is
  flagged at the hysteresis floor ``clear_ratio * Gamma`` instead of ``Gamma``: drift
  that arrives in small steps is measured against the fabric the schedule was built
  for.  A loss that moves no slack (a cut of one link, or links that drop together)
  flags once the rate has fallen by more than ``Gamma``, with no deviation.  When no
  schedule does better the job ends ``no_gain`` and the schedule is re-based on that
  ``M``, so the loss flags once; the rate test still measures from the fabric the
  schedule was built for (``Collective.built_for``), so later small steps add up: a
  re-based collective flags once its rate is more than ``Gamma`` below its built-for
  rate and more than ``rate_loss`` below its rate at the re-base.
* Rounded input: a job synthesizes on ``M`` rounded to ``capacity_digits`` significant
  digits (:func:`significant`; 0 keeps every digit): an estimate is known to about 1 %,
  and the synthesizers' time depends on its digits.
* Capacity gained: a link measured above ``(1 + Gamma)`` times the capacity the schedule
  was synthesized for also flags it (Algorithm 1 cannot see a recovered link that the
  schedule stopped using, because it is in no cut).
* Known fabrics: every published schedule is remembered with the capacities it was
  synthesized for (``known_fabrics`` per collective, most recent first).  When ``M``
  matches one of them within ``restart_tol / 2`` on every link, that schedule is reused
  instead of synthesized (e.g. the healthy schedule after a failure clears: warm
  re-synthesis from the degraded schedule reaches the same rate, but not always the
  same tree shapes).
* Anti-thrashing: hysteresis on Gamma (flag above ``Gamma``, "cleared" only below
  ``clear_ratio * Gamma``) and a minimum dwell time: a collective is not re-flagged
  within ``min_dwell_s`` of its last publish or abort, unless (level estimator) a link
  its schedule relies on has a confirmed level ``restart_tol`` away from what it was
  built for (a change confirmed after its synthesis started: a confirmed level does not
  drift, so this is a new change, not an estimate being chased).
* Versions are per collective, start at 1 and only grow (also across restarts).
* Communicators over sub-fabrics: a communicator registered with its members (GPU ids,
  in rank order) has its collectives synthesized on the sub-fabric they induce
  (:mod:`mccl_runtime.groups`, :func:`mccl_opt.subfabric.induced`: members and
  switches, no other GPU); Algorithm 1 sees their profiles on the fabric's links, and
  every capacity comparison above looks only at the sub-fabric's links, so a drift
  re-synthesizes only the communicators whose sub-fabric it touches.
* Warm state after a restart: a schedule read from a file (a resumed state, or one given
  at registration) has no solver state.  An AllGather's is rebuilt from its trees when it
  is loaded (~60 ms at 128 GPUs).  An AllToAll's is rebuilt from its chunk paths on the
  fabric it was synthesized for (``restore_on``: its synthesis capacities) inside its
  next synthesis job, in the worker, so a resume stays fast and the first warm start
  after a failure takes the local path (:func:`mccl_opt.restore_warm_state`:
  0.3 s at 512 GPUs, 1.3-2.4 s at 1024); a job that publishes nothing leaves it to the next
  job, which rebuilds it again.
"""

from __future__ import annotations

import enum
import math
import time
from concurrent.futures import BrokenExecutor, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from mccl_opt.errors import MCCLError, ScheduleError
from mccl_opt.schedule import Schedule
from mccl_opt.topology import Topology

from .drift import DriftReport, ScheduleProfile, detect, profile_schedule
from .flagging import Flagger
from .gain_bound import VertexBound
from .groups import Groups
from .pool import JobResult, SynthesisPool, job_result, run_job
from .publish_decision import (Active, Estimate, Finished, Verdict, drift_gone, gained, moved, near, held_against,
                               no_schedule_gains, outdated, publish_decision, rate, swap_holding)
from .synthesizer import Synthesizer, solver_synthesizer
from .telemetry import MeasurementStore

__all__ = ["Policy", "Collective", "Action", "Event", "ScheduleManager", "DYNAMIC_KINDS", "KINDS"]

DYNAMIC_KINDS = ("allgather", "alltoall")
KINDS = DYNAMIC_KINDS + ("allreduce",)


@dataclass(frozen=True)
class Policy:
    """Detection and anti-thrashing parameters (see the module docstring)."""

    gamma: float = 0.1
    clear_ratio: float = 0.5
    min_dwell_s: float = 1.0
    time_limit_s: float = 60.0
    min_gain: float = 0.01
    restart_tol: float = 0.1
    max_restarts: int = 3
    settle_max_s: float = 0.05
    moving_max_s: float = 2.5
    gather_s: float = 0.0
    known_fabrics: int = 4
    rate_loss: float = 0.05
    capacity_digits: int = 3
    speculate: bool = False
    early_hold_s: float | None = None
    cable_wait_s: float = 0.0
    anytime_s: float | None = None
    fresh_s: float = 0.002

    def __post_init__(self) -> None:
        if not self.gamma > 0:
            raise MCCLError(f"Gamma must be > 0, got {self.gamma!r}")
        if not 0.0 <= self.clear_ratio <= 1.0:
            raise MCCLError(f"clear_ratio must be in [0, 1], got {self.clear_ratio!r}")
        if self.min_dwell_s < 0 or self.time_limit_s <= 0 or self.min_gain < 0:
            raise MCCLError("min_dwell_s and min_gain must be >= 0 and time_limit_s > 0")
        if self.restart_tol <= 0 or self.max_restarts < 0 or self.settle_max_s < 0 or self.gather_s < 0 \
                or not self.moving_max_s >= 0 or not self.cable_wait_s >= 0 or not self.fresh_s >= 0:
            raise MCCLError("restart_tol must be > 0, max_restarts, settle_max_s, moving_max_s, gather_s, "
                            "cable_wait_s and fresh_s >= 0")
        if not (isinstance(self.capacity_digits, int) and self.capacity_digits >= 0):
            raise MCCLError(f"capacity_digits must be an int >= 0 (0 keeps the estimates' digits), "
                            f"got {self.capacity_digits!r}")
        if self.early_hold_s is not None and not self.early_hold_s >= 0:
            raise MCCLError(f"early_hold_s must be >= 0 or None (settle_max_s), got {self.early_hold_s!r}")
        if self.anytime_s is not None and not self.anytime_s >= 0:
            raise MCCLError(f"anytime_s must be >= 0 or None (off), got {self.anytime_s!r}")
        if not 0.0 < self.rate_loss <= 1.0:
            raise MCCLError(f"rate_loss must be in (0, 1] (1 turns the capacity-lost test off), got {self.rate_loss!r}")


@dataclass
class _Job:
    initial: bool
    topo: Topology                   # what the job synthesizes on: the (sub-)fabric under ``capacity``
    capacity: np.ndarray             # the fabric's measured capacities the job started on
    started_t: float
    trigger: DriftReport | None = None
    restarts: int = 0
    known: tuple[np.ndarray, Schedule] | None = None
    future: Future | None = None
    wall_start: list[float] = field(default_factory=list)
    warm_capacity: np.ndarray | None = None  # the warm schedule's synthesis capacities, to restore on
    result: JobResult | None = None          # the finished result (profile lifted), kept while held
    held_since: float | None = None          # when the result was first held for a pending change
    moving: np.ndarray | None = None         # links held for a rise still moving (EWMA), re-checked on release
    replaces_held: bool = False              # started to replace a held version (:meth:`supersede_held`)
    speculative: bool = False                # started on early estimates of changes still pending
    done_t: float | None = None              # when the result was first seen


@dataclass
class Collective:
    """A registered collective and its active schedule."""

    comm: str
    name: str
    kind: str
    dynamic: bool
    schedule: Schedule | None = None
    version: int = 0
    synth_capacity: np.ndarray | None = None
    built_for: np.ndarray | None = None     # what the schedule was synthesized for (a re-base keeps it)
    profile: ScheduleProfile | None = None
    last_decision_t: float = -math.inf
    job: _Job | None = None
    known: list[tuple[np.ndarray, Schedule]] = field(default_factory=list)
    gpus: tuple[str, ...] | None = None     # the communicator's members; None: the whole fabric
    restore_on: np.ndarray | None = None    # an AllToAll schedule without warm state: its synthesis capacities
    deferred: tuple[DriftReport | None, int] | None = None  # a superseded job's restart (trigger, restarts)
    flagged_since: float | None = None      # when Algorithm 1 flagged it, while its job waits (``gather_s``)
    one_way_since: float | None = None      # since when a cable it loads reads dropped one way (``cable_wait_s``)
    rising_since: float | None = None       # when its jobs began to be held for rises still moving

    @property
    def key(self) -> tuple[str, str]:
        return (self.comm, self.name)

    def record(self) -> dict[str, Any]:
        """This collective's entry in the controller state, the one shape it is saved in:
        :class:`~.state.StateWriter` adds the schedule version as a file reference, and
        :meth:`ScheduleManager.restore` reads it back once :func:`~.state.load_state`
        has inlined that file."""
        return {"comm": self.comm, "name": self.name, "kind": self.kind, "dynamic": self.dynamic,
                "version": self.version, "gpus": list(self.gpus) if self.gpus is not None else None,
                "last_decision_t": self.last_decision_t if math.isfinite(self.last_decision_t) else None}


class Action(str, enum.Enum):
    """What the manager (or the loop, at a swap) did with a collective; an event's
    ``action``.  A ``str`` enum: its value is the word logs and JSON records carry."""

    RESYNTHESIS = "resynthesis"     # a job started
    PUBLISHED = "published"         # a new version
    ABORTED = "aborted"             # a finished job discarded: ``cleared`` or ``no_gain``
    SUPERSEDED = "superseded"       # discarded for a newer estimate; a restart follows
    HELD = "held"                   # a finished job waits for a pending change to confirm
    TIMEOUT = "timeout"             # a job past the time bound, abandoned
    FAILED = "failed"               # the synthesizer raised (or its worker died)
    SWAP_HELD = "swap_held"         # executors told to wait before swapping a version in

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Event:
    """Something the manager did with one collective (:class:`Action`), at ``t``, with
    the collective's version after it and the details of the decision."""

    t: float
    comm: str
    name: str
    action: Action
    version: int
    detail: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "action", Action(self.action))     # its word is accepted too

    def to_dict(self) -> dict[str, Any]:
        return {"t": self.t, "comm": self.comm, "name": self.name, "action": self.action.value,
                "version": self.version, "detail": self.detail}


class ScheduleManager:
    """Registry, drift detection, warm re-synthesis and publishing (module docstring)."""

    def __init__(self, store: MeasurementStore, synthesize: Synthesizer | None = None,
                 policy: Policy = Policy(), clock: Callable[[], float] = time.monotonic,
                 pool: SynthesisPool | None = None,
                 synth_clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock                       # wall clock of the time bound (injectable for tests)
        self.synth_clock = synth_clock           # what a thread job's reported seconds are read on
        self.store = store
        self.topo = store.topo
        self.pool = pool                         # synthesis in worker processes (owned: closed with us)
        self.synthesize = synthesize or (None if pool else solver_synthesizer())
        self.policy = policy
        self._collectives: dict[tuple[str, str], Collective] = {}
        self.groups = Groups(self.topo)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mccl-synth")
        self.counters = {"resyntheses": 0, "published": 0, "aborted": 0, "timeouts": 0, "failures": 0,
                         "superseded": 0}
        self._queued_m: np.ndarray | None = None       # the M queued jobs were last checked against
        self._bounds: dict[tuple[str, ...] | None, VertexBound] = {}
        self.flagger = Flagger(store, self.groups, policy, self._collectives)     # what starts a job (Algorithm 1)

    # ------------------------------------------------------------------ registry
    def register(self, comm: str, name: str, kind: str, schedule: Schedule | None = None,
                 now: float = 0.0, gpus: Iterable[str] | None = None) -> list[Collective]:
        """Register a collective; without ``schedule`` a baseline is synthesized
        asynchronously on the current ``M`` (startup phase, paper §3.1).  An
        ``allreduce`` becomes a static ReduceScatter plus a dynamic AllGather.
        ``gpus``: the communicator's members in rank order (default: the members it was
        first registered with, else every GPU); bad or disconnected members raise
        :class:`~mccl_opt.errors.TopologyError`."""
        if kind not in KINDS:
            raise ScheduleError(f"collective kind must be one of {KINDS}, got {kind!r}")
        members = self.groups.members(comm, None if gpus is None else list(gpus))
        if kind == "allreduce":
            for part in ("reducescatter", "allgather"):     # all or nothing
                if (comm, f"{name}/{part}") in self._collectives:
                    raise ScheduleError(f"collective {comm}/{name}/{part} is already registered")
            rs = self._add(Collective(comm, f"{name}/reducescatter", "reducescatter", dynamic=False, gpus=members))
            return [rs] + self.register(comm, f"{name}/allgather", "allgather", schedule, now, members)
        if schedule is not None and schedule.collective != kind:
            raise ScheduleError(f"{comm}/{name}: a {kind} needs a {kind} schedule, got {schedule.collective}")
        coll = self._add(Collective(comm, name, kind, dynamic=True, gpus=members))
        if schedule is None:
            self._start(coll, now, None)
        else:
            self._install(coll, schedule, self.store.measured(), version=max(1, schedule.version))
        return [coll]

    def _add(self, coll: Collective) -> Collective:
        if coll.key in self._collectives:
            raise ScheduleError(f"collective {coll.comm}/{coll.name} is already registered")
        self._collectives[coll.key] = coll
        self.groups.bind(coll.comm, coll.gpus)
        return coll

    def unregister(self, comm: str, names: Iterable[str]) -> None:
        """Forget collectives of ``comm`` registered a moment ago whose registration could
        not be saved (the service undoes it); a job they started is abandoned."""
        for name in names:
            self._collectives.pop((comm, name), None)
            self.flagger.forget((comm, name))
        if not any(c.comm == comm for c in self._collectives.values()):
            self.groups.unbind(comm)

    def get(self, comm: str, name: str) -> Collective:
        try:
            return self._collectives[(comm, name)]
        except KeyError:
            raise ScheduleError(f"no collective {comm}/{name} is registered") from None

    def collectives(self) -> list[Collective]:
        return [self._collectives[k] for k in sorted(self._collectives)]

    def _install(self, coll: Collective, schedule: Schedule, capacity: np.ndarray, version: int,
                 profile: ScheduleProfile | None = None) -> None:
        """Make ``schedule`` the active version; ``profile`` is its profile on ``capacity``
        if already known (a job computes it in its worker)."""
        if profile is None:
            profile = self.groups.lift(coll.gpus, profile_schedule(self.groups.topology(coll.gpus, capacity),
                                                                   schedule))
        coll.profile = profile
        coll.schedule = replace(schedule, version=version)
        coll.version = version
        coll.synth_capacity = coll.built_for = np.array(capacity, dtype=float)
        coll.restore_on = coll.synth_capacity if schedule.collective == "alltoall" and \
            schedule.warm_state is None else None
        coll.known = [(coll.synth_capacity, schedule)] + [
            (c, s) for c, s in coll.known if not np.array_equal(c, coll.synth_capacity)]
        del coll.known[self.policy.known_fabrics:]

    # ------------------------------------------------------------------ the loop
    def check(self, now: float) -> list[tuple[Collective, DriftReport]]:
        """Algorithm 1 on every dynamic collective that is idle and past its dwell time;
        returns the flagged ones."""
        return self._check(now)[1]

    def _check(self, now: float) -> tuple[np.ndarray | None, list[tuple[Collective, DriftReport]]]:
        """:meth:`check`, with the ``M`` it flagged on (:meth:`.Flagger.check`: ``None`` for
        the confirmed ``M``, else the early estimates a speculative job starts on)."""
        return self.flagger.check(self.collectives(), now)

    def _recovered(self, m: np.ndarray, coll: Collective) -> bool:
        """The drift that started ``coll``'s job is gone under ``m``
        (:func:`~.publish_decision.drift_gone`)."""
        return drift_gone(m, coll.profile, coll.synth_capacity, self.groups.mask(coll.gpus),
                          self.flagger.known_flag(m, coll), self.policy)

    def _active(self, coll: Collective, m: np.ndarray) -> Active:
        """The facts about ``coll``'s active version a decision reads."""
        return Active(coll.profile, coll.synth_capacity, self.groups.mask(coll.gpus), self._recovered(m, coll),
                      coll.rising_since)

    @staticmethod
    def _facts(job: _Job, loads: np.ndarray | None = None, synth_s: float = 0.0,
               unheard: np.ndarray | None = None) -> Finished:
        return Finished(job.capacity, loads, job.restarts, job.initial, job.known is not None, job.replaces_held,
                        job.held_since, job.moving, job.speculative, synth_s,
                        job.done_t, unheard)

    def _unheard(self, coll: Collective, job: _Job, now: float) -> np.ndarray | None:
        """For a finished speculative job (level estimator, within ``fresh_s`` of its end):
        the links it was started on (more than ``restart_tol`` from what the active version
        was built for) that no sample newer than its end has measured yet
        (:func:`~.publish_decision.publish_decision`, rule 2, *unheard*)."""
        if not job.speculative or self.store.estimator != "level" or job.done_t is None \
                or now - job.done_t >= self.policy.fresh_s or coll.synth_capacity is None:
            return None
        built = coll.synth_capacity
        moved = np.flatnonzero(self.groups.mask(coll.gpus)
                               & (np.abs(job.capacity - built) > self.policy.restart_tol * built))
        return np.setdiff1d(moved, self.store.heard_links(job.done_t)).astype(np.int64)

    def awaiting_sample(self, now: float) -> bool:
        """Whether a finished job waits for a newer sample (*unheard*): the closed loop
        then decides again at the next sample rather than at its next tick (a service
        decides after each telemetry request anyway)."""
        for c in self.collectives():
            if c.job is not None and c.job.result is not None:
                unheard = self._unheard(c, c.job, now)
                if unheard is not None and unheard.size:
                    return True
        return False

    def step(self, now: float) -> list[Event]:
        """One controller decision: collect finished jobs, then detect and start jobs (or
        decide ``no_gain`` at once, :meth:`_bounded`)."""
        events = self.poll(now)
        if not self.flagger.unsettled(now):
            for coll in [c for c in self.collectives() if c.deferred is not None]:
                (trigger, restarts), coll.deferred = coll.deferred, None
                events.append(self._start(coll, now, trigger, restarts))
        early, flagged = self._check(now)
        for coll, report in flagged:
            events.append(self._start(coll, now, report, early=early) if early is not None
                          else self._bounded(coll, now) or self._start(coll, now, report))
        return events

    def _bounded(self, coll: Collective, now: float) -> Event | None:
        """A flagged collective whose rate under ``M`` is within ``min_gain`` of the
        single-vertex cut bound (:class:`~.gain_bound.VertexBound`): no schedule could
        pass the re-check, so it ends ``no_gain`` now, with no job (a star sub-fabric whose
        member's NIC drops).  ``None`` when a schedule might gain (the usual job starts)."""
        if coll.profile is None or coll.synth_capacity is None or coll.kind not in DYNAMIC_KINDS:
            return None
        bound = self._bounds.get(coll.gpus)
        if bound is None:
            bound = self._bounds[coll.gpus] = VertexBound(self.topo, self.groups.links(coll.gpus),
                                                          coll.gpus or self.topo.gpus)
        m = self.store.measured()
        current, best = rate(m, coll.profile.loads), bound.rate(m, coll.kind)
        if not no_schedule_gains(current, best, self.policy.min_gain):
            return None
        self._rebase(coll, m)
        coll.last_decision_t = now
        self.counters["aborted"] += 1
        return Event(now, coll.comm, coll.name, Action.ABORTED, coll.version,
                     {"reason": "no_gain", "bound": best, "rate_before": current})

    def _rebase(self, coll: Collective, m: np.ndarray, job_input: np.ndarray | None = None) -> None:
        """The current schedule is as good as any for the confirmed ``m`` a ``no_gain``
        decision was made under (rounded as a job's input): measure drift from here on (its
        cut re-derived there, also in what is saved: a restart profiles it the same;
        ``built_for`` is left alone).  After a job (``job_input``), a link that rose above
        the job's input keeps that input: no synthesis saw the rise, so it stays drift
        (capacity gained).  A fall since the job started cost its schedule less than
        ``restart_tol`` (else it restarts), and a synthesis cannot do better on capacities
        that only fell.  The job's input itself (one direction of a cable confirmed, the
        other still at its old level: fuzz seed 1 #21) left a stale slack in the profile,
        and the same ``M`` flagged again (docs/runtime.md, "Ramps after no gain")."""
        q = significant(m if job_input is None else np.minimum(m, job_input), self.policy.capacity_digits)
        coll.schedule = replace(coll.schedule, bottleneck=())
        coll.profile = self.groups.lift(coll.gpus, profile_schedule(self.groups.topology(coll.gpus, q),
                                                                    coll.schedule))
        coll.synth_capacity = np.array(q, dtype=float)

    def _start(self, coll: Collective, now: float, report: DriftReport | None, restarts: int = 0,
               early: np.ndarray | None = None) -> Event:
        """Start a job on the latest ``M``, or speculatively on ``early`` (estimates of
        changes not confirmed yet: its result waits for their confirmation)."""
        m = self.store.measured() if early is None else early
        q = significant(m, self.policy.capacity_digits)
        topo = self.store.measured_topology() if coll.gpus is None and q is m and early is None \
            else self.groups.topology(coll.gpus, q)
        job = _Job(initial=coll.schedule is None, topo=topo, capacity=q, started_t=now, trigger=report,
                   restarts=restarts, known=self.flagger.known(coll, m), warm_capacity=coll.restore_on,
                   speculative=early is not None)
        if self.pool is not None and job.known is None:
            job.future = self.pool.submit(coll.kind, q, coll.schedule, self.policy.time_limit_s, coll.gpus,
                                          warm_capacity=job.warm_capacity)
        else:
            job.future = self._pool.submit(self._run, job, coll.kind, coll.schedule, coll.gpus)
        coll.job = job
        self.counters["resyntheses"] += 1
        detail = report.to_dict(self.topo, coll.profile.cut) if report and coll.profile else {}
        if job.speculative:
            detail["speculative"] = True
        if report and not report.flagged and coll.profile:
            mine = self.groups.mask(coll.gpus)
            detail["capacity"] = "gained" if gained(m, coll.synth_capacity, mine, self.policy.gamma) else \
                "known" if self.flagger.better_known(m, coll) is not None else "lost"
        return Event(now, coll.comm, coll.name, Action.RESYNTHESIS, coll.version, detail)

    def _run(self, job: _Job, kind: str, warm: Schedule | None, gpus: tuple[str, ...] | None) -> JobResult:
        """A job in the worker thread (no process pool, or a known fabric)."""
        job.wall_start.append(self.clock())
        if job.known is not None:
            return job.known[1], 0.0, profile_schedule(job.topo, job.known[1])
        cap = job.warm_capacity              # built here, not through Groups' cache of the measured fabrics
        warm_fabric = None if cap is None else (
            self.topo.with_capacities(cap) if gpus is None else self.groups.fabric(gpus).measured(cap))
        return run_job(job.topo, self.synthesize, kind, warm, self.policy.time_limit_s, warm_fabric,
                       self.synth_clock)

    def poll(self, now: float, wait_s: float | None = None) -> list[Event]:
        """Finish jobs that are done (waiting up to ``wait_s`` for running ones): re-check,
        then publish or abort; abandon jobs past the time bound."""
        running = [c for c in self.collectives() if c.job is not None]
        m = self.store.measured()
        recheck = self._queued_m is None or (m is not self._queued_m and not np.array_equal(m, self._queued_m))
        self._queued_m = m                       # queued jobs go stale only when M moves
        if wait_s and running:
            wait_futures([c.job.future for c in running], timeout=wait_s)
        events = []
        for coll in running:
            job = coll.job
            if not job.future.done():
                if not job.wall_start and job.future.running():
                    job.wall_start.append(self.clock())     # a process job's start, seen from here
                stale = None if job.wall_start or not recheck else self._stale(coll, job)
                if stale and job.future.cancel():           # still queued: drop it now
                    events += self._drop_queued(coll, job, stale, now)
                    continue
                if job.wall_start and self.clock() - job.wall_start[0] > self.policy.time_limit_s:
                    coll.job, coll.last_decision_t = None, now
                    self.counters["timeouts"] += 1
                    events.append(Event(now, coll.comm, coll.name, Action.TIMEOUT, coll.version,
                                        {"time_limit_s": self.policy.time_limit_s}))
                continue
            coll.job = None
            event = self._finish(coll, job, now)
            if event is None:                                # still held; announced when first held
                continue
            events.append(event)
            if event.action is Action.SUPERSEDED or event.detail.get("anytime"):
                events += self._restart(coll, job, now)
        return events

    def _stale(self, coll: Collective, job: _Job) -> Verdict | None:
        """Whether a queued job is already out of date: ``CLEARED`` or ``RESTART``
        (:func:`~.publish_decision.outdated`, the rule finished jobs are re-checked with)."""
        if job.initial or job.speculative or coll.profile is None:    # speculative: decided when finished
            return None
        m = self.store.measured()
        return outdated(self._facts(job), self._active(coll, m), m, self.policy)

    def _drop_queued(self, coll: Collective, job: _Job, why: Verdict, now: float) -> list[Event]:
        """A cancelled queued job: abort it (``cleared``) or restart it on the latest ``M``."""
        coll.job, coll.last_decision_t = None, now
        detail: dict[str, Any] = {"started_t": job.started_t, "queued": True}
        if why is Verdict.CLEARED:
            self.counters["aborted"] += 1
            return [Event(now, coll.comm, coll.name, Action.ABORTED, coll.version, {**detail, "reason": "cleared"})]
        self.counters["superseded"] += 1
        detail["moved"] = self._moved(self.store.measured(), coll, job)
        return [Event(now, coll.comm, coll.name, Action.SUPERSEDED, coll.version, detail)] + self._restart(coll, job, now)

    def _restart(self, coll: Collective, job: _Job, now: float) -> list[Event]:
        """Restart a superseded job on the latest ``M`` now, or once no change is pending
        (:meth:`step`; at most ``settle_max_s`` later)."""
        if self.flagger.unsettled(now):
            coll.deferred = (job.trigger, job.restarts + 1)
            return []
        event = self._start(coll, now, job.trigger, job.restarts + 1)
        coll.job.replaces_held = job.replaces_held
        return [event]

    def _finish(self, coll: Collective, job: _Job, now: float) -> Event | None:
        """Act on :func:`~.publish_decision.publish_decision` for a finished job: ``held``
        (kept in ``coll.job``; ``None`` once announced), ``failed``, ``aborted``,
        ``superseded`` or ``published``."""
        if job.result is None:
            try:
                new, seconds, new_profile = job_result(job.future)
            except (MCCLError, BrokenExecutor) as exc:          # a synthesizer error, or a worker died
                coll.last_decision_t, coll.rising_since = now, None
                self.counters["failures"] += 1
                return Event(now, coll.comm, coll.name, Action.FAILED, coll.version, {"error": str(exc)})
            job.result = (new, seconds, self.groups.lift(coll.gpus, new_profile))
            job.done_t = now
        new, seconds, new_profile = job.result
        detail: dict[str, Any] = {"synth_s": seconds, "started_t": job.started_t}
        m = self.store.measured()
        active = None if job.initial else self._active(coll, m)
        decision = publish_decision(self._facts(job, new_profile.loads, seconds, self._unheard(coll, job, now)),
                                    active, Estimate.of(self.store), now, self.policy)
        if decision.rising.size:
            coll.rising_since = now if coll.rising_since is None else coll.rising_since
            job.moving = decision.rising if job.moving is None else np.union1d(job.moving, decision.rising)
        if decision.verdict is Verdict.HOLD:
            coll.job = job
            if job.held_since is not None:
                return None
            job.held_since = now
            return Event(now, coll.comm, coll.name, Action.HELD, coll.version,
                         {**detail, "pending": self._named(decision.held)})
        if not (job.speculative and decision.verdict is Verdict.CLEARED):
            coll.last_decision_t = now          # a speculation on a change that went away decided nothing
        if job.held_since is not None:
            detail["held_s"] = now - job.held_since
        if job.moving is not None:
            detail["rising"] = self._named(job.moving)
        if active is not None:
            detail.update(max_delta=detect(m, coll.profile, self.policy.gamma).max_delta,
                          rate_before=decision.rate_before, rate_after=decision.rate_after)
        if decision.verdict is Verdict.RESTART:
            self.counters["superseded"] += 1
            detail["moved"] = self._moved(m, coll, job)
            return Event(now, coll.comm, coll.name, Action.SUPERSEDED, coll.version, detail)
        coll.rising_since = None                          # decided: the next rise has its own bound
        if decision.verdict in (Verdict.CLEARED, Verdict.NO_GAIN):
            self.counters["aborted"] += 1
            detail["reason"] = decision.reason
            if decision.verdict is Verdict.NO_GAIN:
                self._rebase(coll, m, job.capacity)
            return Event(now, coll.comm, coll.name, Action.ABORTED, coll.version, detail)
        cap = job.known[0] if decision.verdict is Verdict.REUSE else job.capacity
        self._install(coll, new, cap, coll.version + 1, None if decision.verdict is Verdict.REUSE else new_profile)
        if decision.verdict is Verdict.REUSE:
            detail["known_fabric"] = True
        if decision.verdict is Verdict.ANYTIME:
            detail["anytime"] = True                      # outdated under ``M``: restarted (:meth:`poll`)
        self.counters["published"] += 1
        return Event(now, coll.comm, coll.name, Action.PUBLISHED, coll.version, detail)

    def _named(self, links: np.ndarray) -> list[list[str]]:
        """Links as ``[src, dst]`` (what events and swap holds name)."""
        return [[self.topo.links[a].src, self.topo.links[a].dst] for a in links.tolist()]

    def swap_hold(self, comm: str, name: str) -> list[list[str]]:
        """The links whose change since the active version was published, confirmed or
        still being confirmed, makes it unfit to be swapped in now (what the controller
        would tell executors that have not swapped yet: wait for the next version): a
        rise, or a drop that costs the version more than ``rate_loss`` of its rate
        (:func:`swap_holding`).  Empty when the version fits everything known."""
        return self._named(self._unfit(self.get(comm, name))[1])

    def swap_holds(self, comm: str, name: str) -> tuple[list[list[str]], list[list[str]]]:
        """``(held, unfit)`` for real executors (:class:`~.swap_holds.SwapHolds`), from one
        estimate: ``unfit`` is :meth:`swap_hold`; ``held`` the part of it that holds while
        the ranks run the version before: a drop holds only while that version is not
        slower under the newest estimate (:func:`held_against`)."""
        coll = self.get(comm, name)
        provisional, unfit = self._unfit(coll)
        held = unfit if unfit.size == 0 or len(coll.known) < 2 else \
            held_against(unfit, provisional, coll.profile.loads, self.flagger.loads_of(coll, *coll.known[1]),
                         self.policy.min_gain)
        return self._named(held), self._named(unfit)

    def _unfit(self, coll: Collective) -> tuple[np.ndarray, np.ndarray]:
        """The provisional estimate and :func:`swap_holding`'s links for ``coll``'s active
        version (both empty before it has a profile)."""
        none = np.zeros(0, dtype=np.int64)
        if coll.profile is None or coll.synth_capacity is None:
            return none, none
        provisional = self.store.provisional()
        est = Estimate(self.store.measured(), provisional, none, none, none, self.topo.arrays.capacity)
        return provisional, swap_holding(est, self.groups.mask(coll.gpus), coll.synth_capacity, coll.profile.loads,
                                         self.policy.restart_tol, self.policy.rate_loss)

    def hold_settled(self, comm: str, name: str, links: list[list[str]], since: float, recent_s: float) -> bool:
        """Whether a swap hold on ``links`` (``[src, dst]``, held since ``since``) may end
        although they still differ from what the held version was built for: every
        channel on them that was sampled in the ``recent_s`` before ``since`` has been
        sampled again since (:meth:`MeasurementStore.unheard_links`: the estimate is no
        older than the hold), and either they do not read as the version before it was
        built for, or the version before no longer fits the rest of the fabric.  A change
        that reverted (a stalled reading the held version was made for) keeps the ranks on
        the version before while that version still fits everything, until a newer version
        replaces the held one; when the fabric moved elsewhere too (a ramp's step on the
        NIC, the held version built on it and on another NIC's stall), neither version
        fits, and the hold settles so that a job replaces both (docs/runtime.md, "Swap
        holds on real executors")."""
        idx = np.array([self.topo.link_index(src, dst) for src, dst in links], dtype=np.int64)
        if np.isin(idx, self.store.unheard_links(since, recent_s)).any():
            return False
        coll = self.get(comm, name)
        if len(coll.known) < 2:
            return True
        before, m = coll.known[1][0], self.store.provisional()
        if np.any(np.abs(m[idx] - before[idx]) > self.policy.restart_tol * before[idx]):
            return True
        mine = self.groups.links(coll.gpus)
        return not near(m[mine], before[mine], self.policy.restart_tol)

    def supersede_held(self, comm: str, name: str, now: float, held: bool = True) -> Event | None:
        """A swap hold on the active version settled on a real change (:meth:`hold_settled`):
        the version was built on a partial picture, so a job starts now on the latest ``M``
        instead of the held version being released and the next one waiting for the dwell
        time (docs/runtime.md, "Swap holds on real executors").  The job is not ``cleared``
        when the drift is gone under ``M`` (the held version, built on a transient, then
        reads as fitting): only the gain over it decides.  ``held=False``: the version was
        not held (it beat the version before) but a settled drop costs it its rate
        (:class:`~.swap_holds.SwapHolds`); the same job replaces it.  ``None`` when a job
        is already running or waiting to restart; its event otherwise."""
        coll = self.get(comm, name)
        if not coll.dynamic or coll.job is not None or coll.deferred is not None:
            return None
        report = detect(self.store.measured(), coll.profile, self.policy.gamma) if coll.profile else None
        event = self._start(coll, now, report)
        coll.job.replaces_held = True
        event.detail["held_version" if held else "unfit_version"] = True
        return event

    def superseding(self, comm: str, name: str, version: int) -> bool:
        """Whether ``version`` of the collective is being replaced: a job is running or
        waiting to restart, or a newer version is already published."""
        coll = self.get(comm, name)
        return coll.version > version or coll.job is not None or coll.deferred is not None

    def _moved(self, m: np.ndarray, coll: Collective, job: _Job) -> float:
        """The largest relative change of ``m`` from the job's input on ``coll``'s links."""
        links = self.groups.links(coll.gpus)
        return moved(m[links], job.capacity[links])

    def busy(self) -> bool:
        return any(c.job is not None or c.deferred is not None for c in self._collectives.values())

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Block until running jobs finish (without publishing them); True if all did."""
        futures = [c.job.future for c in self._collectives.values() if c.job is not None]
        return not wait_futures(futures, timeout=timeout_s).not_done if futures else True

    def close(self) -> None:
        """Stop accepting jobs; running ones are abandoned (not waited for)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.pool is not None:
            self.pool.shutdown()

    # ------------------------------------------------------------------ persistence
    def restore(self, data: Mapping[str, Any]) -> None:
        """Re-register the collectives of a loaded controller state (``state["manager"]``
        of :func:`~.state.load_state`: :meth:`Collective.record` entries with their
        schedule versions inlined) with their schedules and versions (nothing is
        re-synthesized)."""
        for d in _as_list(data.get("collectives", [])):
            if not isinstance(d, Mapping) or not {"comm", "name", "kind", "dynamic", "version"} <= set(d):
                raise ScheduleError("controller state: a collective entry lacks comm/name/kind/dynamic/version; "
                                    "delete the state file to start fresh")
            members = self.groups.members(str(d["comm"]), d.get("gpus"))
            coll = self._add(Collective(str(d["comm"]), str(d["name"]), str(d["kind"]), bool(d["dynamic"]),
                                        gpus=members))
            ldt = d.get("last_decision_t")
            coll.last_decision_t = -math.inf if ldt is None else float(ldt)
            if d.get("schedule") is not None:
                from mccl_opt import restore_warm_state

                # AllGather trees get their warm state back now, an AllToAll's in its next
                # job (``restore_on``, set by _install): the next failure reroutes/re-optimises locally
                fabric = self.topo if members is None else self.groups.fabric(members).topology
                parsed = d.get("parsed_schedule")       # checked by load_state: not parsed again
                schedule = parsed if isinstance(parsed, Schedule) else Schedule.from_dict(d["schedule"])
                if schedule.collective == "allgather":
                    schedule = restore_warm_state(schedule, fabric)
                self._install(coll, schedule, np.asarray(d["synth_capacity"], dtype=float),
                              int(d["version"]))
            elif coll.dynamic:
                self._start(coll, 0.0, None)
        self.counters.update({k: int(v) for k, v in dict(data.get("counters", {})).items()
                              if k in self.counters})


def significant(m: np.ndarray, digits: int) -> np.ndarray:
    """``m`` rounded to ``digits`` significant digits (``m`` itself when that changes
    nothing, or ``digits == 0``): a job's input capacities.  An estimate is known to about
    1 % (telemetry noise), and the synthesizers' time depends on the capacities' digits:
    on a 10-GPU irregular fabric a cold AllGather on a NIC estimated at 49.943 Gbps took
    32 ms, at 49.9 or 50 Gbps 17 ms (docs/runtime.md, "Synthesis inside the loop")."""
    if digits == 0:
        return m
    exp = np.floor(np.log10(np.where(m > 0, m, 1.0))) - (digits - 1)
    up, down = 10.0 ** np.maximum(exp, 0), 10.0 ** np.maximum(-exp, 0)      # exact powers of ten
    q = np.where(m > 0, np.round(m * down / up) * up / down, m)            # 49.943 -> 49.9, not 49.900000000000006
    return m if np.array_equal(q, m) else q


def _as_list(v: Any) -> Iterable:
    if not isinstance(v, list):
        raise ScheduleError("controller state: 'collectives' must be a list")
    return v
