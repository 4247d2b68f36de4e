"""Closed-loop simulation (``mccl loop``), in the spirit of paper §6.2 / Fig. 13(a).

A training loop issues the same collective back to back on the fabric simulator
(:func:`mccl_opt.sim.simulate`; fluid mode above 16 GPUs).  A scenario
(:mod:`mccl_runtime.scenario`) changes capacities at given times, also in the middle of
a collective (the simulator's capacity timeline).  The controller is a
:class:`~mccl_runtime.telemetry.MeasurementStore` (change-point level estimator by
default, the paper's EWMA with ``estimator="ewma"``) and a
:class:`~mccl_runtime.manager.ScheduleManager` running Algorithm 1 after every
collective.

Re-synthesis is warm (the active schedule starts the solver), except on fabrics of at
most ``cold_gpus`` GPUs (:func:`~.synthesizer.cold_on_small`): there a cold solve costs
tens of milliseconds at most and avoids warm optima of the same rate that simulate slower.

Telemetry, like the paper's measurement windows (§5): a link is measured only while it
runs saturated (the channels keep it busy); each saturated stretch is cut into windows
of about ``window_bytes`` (the proxy's per-chunk measurement), at most ``max_windows``
per link and collective, and each window reports its mean throughput times
``1 + noise * N(0, 1)``.  Windows are bounded in time too: a stretch gets at least one
window per ``window_s``, so a link at 1 % of nominal (whose collectives last 100 x
longer) reports as often per millisecond as a healthy one and is confirmed as fast.
Links the estimator holds below nominal, or whose change is being confirmed, are *probed*
(:mod:`.probes`): the only way to see that a link the schedule avoids, or no longer
saturates, has changed.  When a synthesis job's time has elapsed, the links its schedule
loads that no sample has read since the latest change was alarmed are probed before the
manager decides on it, so a change there holds the result (``Probe.unread``).

Timing model (simulated clock, real synthesis):

* ``detect``: from the event to the decision that starts a job.  The controller gets each
  window's sample at the window's end and decides every ``tick_ms`` (1 ms) and at every
  collective boundary, so a long collective does not delay detection to its end.
* ``synth``: the synthesizer's measured wall time (summed over superseded jobs; with
  ``synth_clock="cpu"`` the process's CPU time, so a loaded machine does not count as slow
  synthesis; the dispatch below is timed on the same clock), or
  ``synth_ms`` when given (a modelled synthesizer speed: deterministic runs on a loaded
  machine);
  collectives keep running on the stale schedule meanwhile and their telemetry is
  ingested.  When that time has elapsed (also in the middle of a collective) the
  manager re-checks on the telemetry received so far and publishes, aborts or restarts.
* ``swap``: the measured dispatch cost (or ``dispatch_ms`` when given, as ``synth_ms``;
  serialising and parsing the schedule; the
  manager validated it when it was made) and ``oob_ms``, the out-of-band
  version/sequence AllGather of the Online Rescheduler (paper §3.3; 5.74 ms in
  Fig. 13(b)), then the wait for the next collective boundary: the next collective runs
  on the new version.
* **A collective stuck on a stale version is aborted** (``abort_stale``): when the new
  version is ready (after the OOB exchange, where every rank already agrees on the
  version) while a collective of an older one is in flight, the time it still needs is
  bounded from below by the bytes left on each link (the ranks' per-connection
  counters) over that link's measured capacity ``M``.  If that bound exceeds the new
  version's expected time under ``M`` (``8 x bytes / rate``, the executor's deadline
  base), the collective is aborted on all ranks and re-run from scratch on the new
  version; its partial work is lost (reported as ``lost_ms``).  So a collective crawling
  over a near-dead link does not hold the swap hostage.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from mccl_opt.errors import MCCLError
from mccl_opt.schedule import Schedule
from mccl_opt.topology import Topology

from .drift import bottleneck_rate
from .gc_pause import GcPause, paused
from .channels import reverse_links
from .inflight import InFlight
from .level import LevelParams
from .loop_report import DEFAULT_OOB_MS
from .loop_sim import link_windows, simulate_span
from .probes import Probe
from .manager import Action, Policy, ScheduleManager
from .synthesizer import Synthesizer, cold_on_small, solver_synthesizer
from .scenario import Event, Scenario
from .telemetry import CLI_ESTIMATOR, MeasurementStore

__all__ = ["LoopConfig", "LoopResult", "run_loop", "builtin_scenario", "link_windows", "simulate_span", "GcPause",
           "SYNTH_CLOCKS"]

#: how the loop times a synthesis job: wall time, or the process's CPU time (which the load
#: of other processes on a shared machine does not inflate)
SYNTH_CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


@dataclass(frozen=True)
class LoopConfig:
    """Controller and simulation settings; the scenario fields (shape ... duration_ms)
    describe the built-in case (HPN 1x2x4 / AllGather / Fail2) used without a file."""

    shape: str = "1x2x4"
    collective: str = "allgather"
    failure: str = "fail2"
    gpu: int = 0
    message_bytes: float = 16 * 2**20
    t0_ms: float = 20.0
    t1_ms: float | None = None
    duration_ms: float = 250.0
    noise: float = 0.01
    seed: int = 0
    estimator: str = CLI_ESTIMATOR
    alpha: float = 0.012
    gamma: float = 0.1
    oob_ms: float = DEFAULT_OOB_MS
    dwell_ms: float = 20.0
    backend: str = "highs"
    max_chunks: int = 10
    window_bytes: float = 512 * 2**10
    max_windows: int = 16
    window_s: float = 0.001
    abort_stale: bool = True
    probe_period_ms: float = 10.0
    probe_bytes: float = 512 * 2**10
    probe_idle_only: bool = True
    fluid: bool | None = None
    level: LevelParams = LevelParams()
    synth_ms: float | None = None
    dispatch_ms: float | None = None
    tick_ms: float = 1.0
    cold_gpus: int = 16
    synth_clock: str = "wall"
    rate_loss: float = Policy.rate_loss
    speculate: bool = False


@dataclass
class LoopResult:
    """The timeline (one row per completed collective), the collectives aborted for a
    new version (``aborted``: start, abort time, version, progress), the manager's
    events, the scenario, and ``alarms``: the times (ms) at which some link's change
    began to be confirmed while none was (level estimator: the first pending link)."""

    scenario: Scenario
    rows: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)
    aborted: list[dict[str, Any]] = field(default_factory=list)
    alarms: list[float] = field(default_factory=list)


def builtin_scenario(cfg: LoopConfig) -> Scenario:
    """The scenario of the CLI flags: ``failure`` on rank ``gpu`` at ``t0_ms`` (cleared at
    ``t1_ms`` if given) on HPN ``shape``."""
    from instances import apply_failure, hpn, parse_shape

    healthy = hpn(*parse_shape(cfg.shape))
    degraded = apply_failure(healthy, cfg.failure, cfg.gpu)
    if degraded.gpus != healthy.gpus or [(l.src, l.dst) for l in degraded.links] != \
            [(l.src, l.dst) for l in healthy.links]:
        raise MCCLError(f"{cfg.failure} changes the fabric's nodes or links; the closed loop models gray "
                        "failures as capacity changes only (use fail1 or fail2)")
    diff = np.flatnonzero(degraded.arrays.capacity != healthy.arrays.capacity)
    events = [Event(cfg.t0_ms / 1e3, "degrade", tuple((int(a), float(degraded.arrays.capacity[a])) for a in diff))]
    if cfg.t1_ms is not None:
        if cfg.t1_ms <= cfg.t0_ms:
            raise MCCLError(f"--t1-ms ({cfg.t1_ms:g}) must be after --t0-ms ({cfg.t0_ms:g})")
        events.append(Event(cfg.t1_ms / 1e3, "clear"))
    return Scenario(healthy, cfg.collective, cfg.message_bytes, cfg.duration_ms / 1e3, tuple(events),
                    cfg.noise, cfg.seed)


class _Controller:
    """The controller's side of the loop: telemetry arrives in time order and is decided on
    every ``tick_ms`` (also inside a long collective), and when a job's time has elapsed."""

    def __init__(self, cfg: LoopConfig, store: MeasurementStore, manager: ScheduleManager,
                 topo: Topology, out: LoopResult, message_bytes: float, probe: Probe,
                 noisy: Callable[[np.ndarray], np.ndarray], gc_pause: GcPause) -> None:
        self.cfg, self.store, self.manager, self.topo, self.out = cfg, store, manager, topo, out
        self.gc_pause = gc_pause                     # kept around the timed dispatch
        self.message_bytes = message_bytes
        self.probe, self.noisy = probe, noisy
        timeline = out.scenario.timeline()
        self.breaks, self.caps = np.array([tb for tb, _, _ in timeline]), [cap for _, cap, _ in timeline]
        self.tick = cfg.tick_ms / 1e3
        self.cursor, self.ready_t, self.swap_at = 0.0, math.inf, math.inf
        self.swap_held = False
        self.new_loads: np.ndarray | None = None    # link loads of the finished job's schedule
        self.alarmed = False                         # some link's change is being confirmed
        self.coll = manager.collectives()[0]

    def advance(self, until: float, links: np.ndarray, times: np.ndarray, gbps: np.ndarray,
                inflight: InFlight | None = None) -> float:
        """Ingest the samples (all at or before ``until``), deciding on the way; returns
        ``until``, or the earlier time at which ``inflight`` was aborted for a new
        version (then only the samples up to that time were ingested)."""
        order = np.argsort(times, kind="stable")
        links, times, gbps = links[order], times[order], gbps[order]
        i = 0
        while True:
            swap = self.swap_at if inflight is not None and self.cursor < self.swap_at < until else math.inf
            tau = min(self.cursor + self.tick, until, self.ready_t, swap)
            if i < len(times) and self.manager.awaiting_sample(self.cursor):
                tau = min(tau, max(float(times[i]), self.cursor))    # a held result waits for the next sample
            j = int(np.searchsorted(times, tau, side="right"))
            if j > i:
                self.store.ingest_links(links[i:j], times[i:j], gbps[i:j])
                i = j
                self._alarm(tau)
            if inflight is not None:                 # links the collective leaves half free: probed for free
                cap = self.caps[int(np.searchsorted(self.breaks, tau, side="right")) - 1]
                pl, pt, py = self.probe.during(tau, self.store, cap, inflight.load(tau))
                if pl.size:
                    self.store.ingest_links(pl, pt, self.noisy(py))
                    self._alarm(tau)
            if tau >= self.ready_t:          # the job's time has elapsed: decide on the telemetry so far
                self.ready_t = math.inf
                self._probe_unread(tau, inflight)
                events = self.manager.poll(tau)
            else:
                events = self.manager.step(tau) if math.isinf(self.ready_t) else []
            for e in events:
                self._handle(tau, e)
            self.cursor = max(self.cursor, tau)
            if tau >= swap and self.swap_at == swap and self.swap_fits(tau) and self._abort(inflight, tau):
                return tau
            if tau >= until and self.ready_t > until:
                break
        if i < len(times):
            self.store.ingest_links(links[i:], times[i:], gbps[i:])
        return until

    def _alarm(self, t: float) -> None:
        """Record ``t`` when a change starts being confirmed (the store's first pending
        link): where detection ends and confirmation begins (docs/runtime.md, "Where the
        reaction's time goes")."""
        pending = bool(self.store.pending_links().size)
        if pending and not self.alarmed:
            self.out.alarms.append(t * 1e3)
        self.alarmed = pending

    def _probe_unread(self, t: float, inflight: InFlight | None) -> None:
        """Before a finished job is decided on: probe the links its schedule loads that no
        sample has read since the latest change was alarmed (:meth:`.Probe.unread`), so a
        change on a link the running version does not load holds the result instead of
        being found once the new version runs on it (docs/runtime.md, "The lane the
        running version does not load")."""
        if self.new_loads is None or not self.out.alarms:
            return
        cap = self.caps[int(np.searchsorted(self.breaks, t, side="right")) - 1]
        load = inflight.load(t) if inflight is not None else np.zeros(self.topo.num_links)
        pl, pt, py = self.probe.unread(t, self.store, cap, self.new_loads > 0, load, self.out.alarms[-1] / 1e3)
        self.new_loads = None
        if pl.size:
            self.store.ingest_links(pl, pt, self.noisy(py))
            self._alarm(t)

    def swap_fits(self, t: float) -> bool:
        """Whether the version due at ``t`` still fits everything the controller knows
        (:meth:`ScheduleManager.swap_hold`); a change since its publish holds the swap,
        at most ``settle_max_s`` past its due time (the ranks keep the old version)."""
        held = self.manager.swap_hold(self.coll.comm, self.coll.name)
        if not held or t - self.swap_at >= self.manager.policy.settle_max_s:
            return True
        if not self.swap_held:
            self.swap_held = True
            self.out.events.append({"t": t, "t_ms": t * 1e3, "comm": self.coll.comm, "name": self.coll.name,
                                    "action": Action.SWAP_HELD.value, "version": self.coll.version,
                                    "detail": {"links": held}})
        return False

    def _abort(self, inflight: InFlight, t: float) -> bool:
        """Whether the in-flight collective is aborted for the version ready at ``t``: it
        runs an older version and would take longer to finish than a fresh run of the new
        one under ``M`` (module docstring)."""
        coll = self.coll
        if not self.cfg.abort_stale or coll.schedule.version == inflight.version:
            return False
        m = self.store.measured()
        built = bottleneck_rate(coll.synth_capacity, coll.profile.n)
        fresh = 8.0 * self.message_bytes / (coll.schedule.rate_gbps * 1e9 * bottleneck_rate(m, coll.profile.n) / built)
        return inflight.remaining_s(t, m) > fresh

    def _handle(self, now: float, e: Any) -> None:
        cfg = self.cfg
        self.out.events.append(e.to_dict() | {"t_ms": now * 1e3})
        detail = self.out.events[-1]["detail"]
        modelled = cfg.synth_ms is not None and not detail.get("known_fabric")
        if modelled and "synth_s" in detail:
            detail["synth_s"] = cfg.synth_ms / 1e3
        if e.action is Action.RESYNTHESIS:
            # the job's result becomes visible once its (measured or modelled) time has elapsed
            self.manager.wait_idle()
            seconds, known, self.new_loads = _last_job(self.manager)
            self.ready_t = now + (cfg.synth_ms / 1e3 if cfg.synth_ms is not None and not known else seconds)
        elif e.action is Action.PUBLISHED:
            coll = self.manager.get(e.comm, e.name)
            clock = SYNTH_CLOCKS[cfg.synth_clock]                 # the synthesis clock times the dispatch too
            with self.gc_pause:
                t0 = clock()
                Schedule.from_dict(json.loads(json.dumps(coll.schedule.to_dict())))     # what an executor parses
                spent = clock() - t0
            detail["dispatch_s"] = spent if cfg.dispatch_ms is None else cfg.dispatch_ms / 1e3
            self.swap_at = now + detail["dispatch_s"] + cfg.oob_ms / 1e3
            self.swap_held = False


def run_loop(cfg: LoopConfig = LoopConfig(), synthesize: Synthesizer | None = None,
             scenario: Scenario | None = None) -> LoopResult:
    """Run the closed loop of the module docstring on ``scenario`` (default: the
    built-in one of ``cfg``); ``summary`` is filled by :mod:`.loop_report`."""
    from mccl_opt.validate import validate

    from .loop_report import summarize

    scn = scenario or builtin_scenario(cfg)
    topo, timeline = scn.topology, scn.timeline()
    fluid = cfg.fluid if cfg.fluid is not None else topo.num_gpus > 16
    synthesize = synthesize or solver_synthesizer(cfg.backend, cfg.max_chunks)
    store = MeasurementStore(topo, alpha=cfg.alpha, estimator=cfg.estimator, level_params=cfg.level)
    if cfg.synth_clock not in SYNTH_CLOCKS:
        raise MCCLError(f"the synthesis clock (--synth-clock) must be one of {sorted(SYNTH_CLOCKS)}, "
                        f"got {cfg.synth_clock!r}")
    pause = GcPause()
    manager = ScheduleManager(store, paused(cold_on_small(synthesize, cfg.cold_gpus), pause),
                              Policy(gamma=cfg.gamma, min_dwell_s=cfg.dwell_ms / 1e3, time_limit_s=600.0,
                                     rate_loss=cfg.rate_loss, speculate=cfg.speculate),
                              synth_clock=SYNTH_CLOCKS[cfg.synth_clock])
    manager.register("world", scn.collective, scn.collective, synthesize(scn.collective, topo, None, None))
    coll = manager.get("world", scn.collective)
    validate(topo, coll.schedule)                          # loads the validator's kernels before timing swaps
    rng = np.random.default_rng(scn.seed)
    breaks = np.array([tb for tb, _, _ in timeline])
    cache: dict[tuple[int, int], tuple[Any, tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    out = LoopResult(scn)
    probe = Probe(cfg.probe_period_ms / 1e3, cfg.probe_bytes, topo.arrays.capacity, cfg.probe_idle_only,
                  reverse_links(topo))

    def noisy(gbps: np.ndarray) -> np.ndarray:
        return np.maximum(0.0, gbps * (1.0 + scn.noise * rng.standard_normal(gbps.size)))

    ctl = _Controller(cfg, store, manager, topo, out, scn.message_bytes, probe, noisy, pause)
    t, active = 0.0, coll.schedule
    used = coll.profile.loads > 0                          # links the active schedule uses
    try:
        while t < scn.duration_s:
            if t >= ctl.swap_at and ctl.swap_fits(t):       # the next collective runs the new version
                active, ctl.swap_at, used = coll.schedule, math.inf, coll.profile.loads > 0
            k = int(np.searchsorted(breaks, t, side="right")) - 1
            key = (active.version, k)
            hit = cache.get(key)
            if hit is None or (k + 1 < len(breaks) and breaks[k + 1] < t + hit[0].completion_s):
                res, cap_rows = simulate_span(topo, active, scn.message_bytes, timeline, t, k, fluid)
                hit = (res, link_windows(res, cap_rows, cfg.window_bytes, cfg.max_windows, cfg.window_s))
                if k + 1 >= len(breaks) or breaks[k + 1] >= t + res.completion_s:
                    cache[key] = hit
            res, (links, tw, gw) = hit
            charged, pl, pt, py = probe.between(t, store, timeline[k][1], used)
            start, end = t, t + charged + res.completion_s
            gbps = noisy(np.concatenate([gw, py]))
            flight = InFlight.of(start + charged, active.version, res)
            t = ctl.advance(end, np.concatenate([links, pl]), np.concatenate([start + charged + tw, pt]), gbps,
                            flight)
            if t < end:                                    # aborted for the new version: re-run on it
                out.aborted.append({"t_ms": start * 1e3, "end_ms": t * 1e3, "version": active.version,
                                    "progress": flight.progress(t)})
                continue
            out.rows.append({"t_ms": start * 1e3, "end_ms": t * 1e3, "version": active.version, "state": k,
                             "probe_ms": charged * 1e3,
                             "algbw": scn.topology.num_gpus * scn.message_bytes / (t - start) / 1e9})
    finally:
        manager.close()
    out.summary = summarize(out, cfg, synthesize, fluid)
    return out


def _last_job(manager: ScheduleManager) -> tuple[float, bool, np.ndarray | None]:
    """``(wall seconds, known fabric, link loads of its schedule)`` of the job that just
    finished (read without publishing it)."""
    for c in manager.collectives():
        if c.job is not None and c.job.future.done() and c.job.future.exception() is None:
            schedule, seconds, profile = c.job.future.result()
            return seconds, c.job.known is not None, manager.groups.lift(c.gpus, profile).loads
    return 0.0, False, None
