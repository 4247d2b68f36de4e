"""One rank of ``mccl loop --executor gloo`` (docs/executor.md, "Scenarios on real ranks").

Each rank fetches the controller's first schedule, runs the collective back to back on
a :class:`~executor_cuda.communicator.Communicator` paced by a
:class:`~executor_cuda.faults.FabricEmulator`, reports its passive telemetry to the
controller after every collective (:class:`ModelReporter`), stages every version the
controller publishes (the hot-swap of paper §3.3; the ranks agree on the last one,
:class:`~executor_cuda.follower.VersionFollower`), and finally runs each event's
offline schedule directly on that event's fabric.

Ranks must issue the same collectives: after each one they all-reduce (max) one small
row ``[fabric state, stop, suspect pairs, readings]`` on a gloo side group, so every rank
uses the same fabric for the next collective, stops at the same one, probes the same
pairs the schedule no longer loads (:class:`~executor_cuda.reporting.PairProber`), and
knows which ranks stalled in it, whose readings are then no link evidence
(:class:`~executor_cuda.stalls.StallDetector`).
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np

from mccl_opt.piece_rule import PieceRule
from mccl_opt.schedule import Schedule
from mccl_opt.topology import Topology

from .faults import FabricEmulator
from .pair_levels import ModelReporter, PieceWindow
from .stalls import StallDetector

__all__ = ["RankPlan", "ModelReporter", "rank_main"]

COMM, NAME = "world", "loop"


@dataclass(frozen=True)
class RankPlan:
    """What every rank runs (built by :mod:`executor_cuda.scenario_run`)."""

    endpoint: str
    topology: Topology
    collective: str
    block_numel: int                      # float32 elements per shard / per pair block
    time_scale: float                     # real seconds per fabric second
    byte_scale: float                     # fabric bytes per real byte
    timeline: tuple[tuple[float, np.ndarray], ...]   # (real seconds from origin, capacities)
    duration_s: float                     # real seconds of the scenario
    offline: tuple[tuple[int, Schedule], ...]        # (timeline state, schedule) per event
    offline_reps: int = 5
    warmup: int = 5
    client_timeout_s: float = 10.0
    first_schedule_s: float = 60.0
    oob_timeout_s: float = 20.0
    collective_timeout_s: float = 10.0    # Communicator(timeout_s=); a rank stopped this long fails the run
    probe_every: int = 4                  # collectives between probes of unused suspect pairs (0: off)
    probe_numel: int = 256                # float32 elements per probe message
    pieces: int = 1                       # pieces per collective (in-flight switch; 1: whole)
    pipeline: int | PieceRule = 1         # slices per chunk (Communicator(pipeline=); scenario_run.rank_pipeline)
    telemetry_endpoint: str | None = None  # a telemetry front end (None: ``endpoint``)
    window_s: float = 0.18                # pieces: report mid-collective once it ran this long (PieceWindow;
                                          # at least 3 warm-up collectives)
    abort: bool = True                    # abort a collective stuck on a dead link, re-run it (StaleAbort)
    early: bool = False                   # send drops still being confirmed as ``early`` (controller --speculate)
    stalls: bool = True                   # a stalled rank's readings are no link evidence (StallDetector)


def _state_at(plan: RankPlan, elapsed: float) -> int:
    state = 0
    for i, (t, _) in enumerate(plan.timeline):
        if elapsed >= t:
            state = i
    return state


class _Pusher:
    """Sends telemetry batches (to the controller or its front end) from a queue on its own
    thread and client, so a collective never waits for the controller; ``dead`` is set when
    it stops answering."""

    def __init__(self, endpoint: str, timeout_s: float) -> None:
        from mccl_runtime.client import ControllerClient

        self.client = ControllerClient(endpoint, timeout_s=timeout_s)
        self.queue: queue.Queue = queue.Queue(maxsize=256)
        self.dead: str = ""
        self.sent = 0
        self.thread = threading.Thread(target=self._loop, name="mccl-loop-push", daemon=True)
        self.thread.start()

    def put(self, samples: list[dict[str, Any]]) -> None:
        if samples and not self.dead:
            try:
                self.queue.put_nowait(samples)
            except queue.Full:
                pass                                # telemetry is best effort

    def _loop(self) -> None:
        while (batch := self.queue.get()) is not None:
            if self.dead:
                continue
            try:
                self.client.push_telemetry(batch)
                self.sent += len(batch)
            except Exception as exc:  # noqa: BLE001 - ends the run on every rank, reported
                self.dead = str(exc) or type(exc).__name__

    def close(self) -> None:
        """Stop the thread; its client is closed only once the thread has returned (a
        request still waiting on a dead controller ends by its own timeout)."""
        self.queue.put(None)
        self.thread.join(5 * self.client.timeout_s)
        if not self.thread.is_alive():
            self.client.close()


def _first_schedule(client: Any, plan: RankPlan) -> Schedule:
    from mccl_opt.errors import MCCLError

    deadline = time.monotonic() + plan.first_schedule_s
    while time.monotonic() < deadline:
        _, sched = client.get_schedule(COMM, NAME)
        if sched is not None:
            return sched
        time.sleep(0.1)
    raise MCCLError(f"the controller published no first schedule within {plan.first_schedule_s:g} s")


class _Workload:
    """Input/output tensors of the collective and a check of every result."""

    def __init__(self, collective: str, rank: int, world: int, n: int) -> None:
        import torch

        self.collective, self.rank, self.world, self.n = collective, rank, world, n
        if collective == "allgather":
            self.inp = torch.empty(n)
            self.out = torch.empty(world * n)
        else:
            self.inp = torch.empty(world * n)
            self.out = torch.empty(world * n)
        self.wrong = 0

    def run(self, comm: Any, i: int) -> float:
        """One collective with fresh contents; returns its seconds."""
        import torch

        if self.collective == "allgather":
            self.inp.fill_(self.rank * 1000.0 + i % 997)
            t = time.perf_counter()
            comm.all_gather_into_tensor(self.out, self.inp)
            dt = time.perf_counter() - t
            want = torch.arange(self.world, dtype=torch.float32) * 1000.0 + i % 997
            ok = torch.equal(self.out.view(self.world, self.n),
                             want.unsqueeze(1).expand(self.world, self.n))
        else:
            base = torch.arange(self.world, dtype=torch.float32)
            self.inp.view(self.world, self.n).copy_(
                (self.rank * 1000.0 + base * 10.0 + i % 7).unsqueeze(1).expand(self.world, self.n))
            t = time.perf_counter()
            comm.all_to_all_single(self.out, self.inp)
            dt = time.perf_counter() - t
            want = base * 1000.0 + self.rank * 10.0 + i % 7
            ok = torch.equal(self.out.view(self.world, self.n),
                             want.unsqueeze(1).expand(self.world, self.n))
        self.wrong += not ok
        return dt


def rank_main(rank: int, world: int, plan: RankPlan) -> dict[str, Any]:
    """The body of one rank (``run_ranks``); returns its measurements."""
    import torch
    import torch.distributed as dist

    from mccl_runtime.client import ControllerClient

    from .communicator import Communicator
    from .follower import VersionFollower, agree_first
    from .reporting import PairProber, pair_nominal
    from .telemetry import Telemetry

    client = ControllerClient(plan.endpoint, timeout_s=plan.client_timeout_s)
    sub = client.subscribe()                         # before the first fetch: no version missed
    sub.wait_connected(5.0)
    sched = agree_first(lambda: _first_schedule(client, plan))     # the same on every rank
    emu = FabricEmulator(plan.topology, sched.gpus, time_scale=plan.time_scale, byte_scale=plan.byte_scale)
    emu.set_capacities(plan.timeline[0][1])
    tel = Telemetry(flush_interval=None)
    comm = Communicator(None, sched, pipeline=plan.pipeline, telemetry=tel, faults=emu, stage_timeout=10,
                        timeout_s=plan.collective_timeout_s, oob_timeout=plan.oob_timeout_s, pieces=plan.pieces, abort=plan.abort)
    side = dist.new_group(backend="gloo", timeout=timedelta(seconds=plan.oob_timeout_s))
    reporter = ModelReporter(emu, pair_nominal(plan.topology), early=plan.early)
    stalls = StallDetector(emu)
    prober = PairProber(emu, rank, world, plan.probe_numel, plan.probe_every)
    pusher = _Pusher(plan.telemetry_endpoint or plan.endpoint, plan.client_timeout_s)
    received: list[tuple[int, float, float | None]] = []      # version, arrival, synthesis s
    rates: dict[int, float] = {}                                # version -> its rate (Gbps)
    origin = [0.0]

    def log(version: int, schedule: Schedule) -> None:
        seconds = schedule.solver.get("seconds") if isinstance(schedule.solver, dict) else None
        received.append((version, time.time() - origin[0],
                         float(seconds) if isinstance(seconds, (int, float)) else None))
        rates[version] = schedule.rate_gbps

    window = None
    if comm.inflight is not None:                    # pieces: windows bounded in time (PieceWindow)
        window = PieceWindow(tel.drain, lambda samples, prog, times: pusher.put(
            reporter(samples, prog, 4, time.time(), times)), plan.window_s)
        comm.inflight.on_piece = lambda schedule, numel: window.piece(comm.cache.get(schedule, numel, comm.pipeline))
    if comm.aborter is not None:                     # links read while a message is in flight (StaleAbort)
        comm.aborter.on_progress = lambda prog, rnd, got: pusher.put([x for x in (
            reporter.progress(prog, 4, rnd, src, rank, nb, dl, sec, time.time()) for src, nb, dl, sec in got) if x])
    work = _Workload(plan.collective, rank, world, plan.block_numel)
    warm = []
    for i in range(plan.warmup):                     # compile, connect, set baselines
        warm.append(work.run(comm, i))
        _report(tel, comm, plan, reporter, pusher, window)
    reporter.calibrating = False
    if plan.probe_every > 0:                         # each pair's probe cost (the 3x rule)
        prober.warm_up(side, timeout_s=plan.oob_timeout_s)
    if window is not None:                           # pieces cost per piece: a window of 3 healthy collectives
        window.window_s = max(plan.window_s, 3 * sorted(warm)[len(warm) // 2])
    if comm.aborter is not None:                     # a message in flight is read every third of a healthy collective
        comm.aborter.progress_s = max(0.01, sorted(warm)[len(warm) // 2] / 3)
    clock = torch.tensor([time.time() + 0.05], dtype=torch.float64)
    dist.broadcast(clock, 0, group=side)
    origin[0] = float(clock.item())
    time.sleep(max(0.0, origin[0] - time.time()))
    follower = VersionFollower(comm, sub, COMM, NAME, plan.collective, on_version=log)
    rows: list[tuple[int, int, int, float, float, int]] = []      # seq, version, state, start, s, attempt
    probes: list[tuple[int, float, float, int]] = []        # seq, start, seconds, pairs
    state, i, dead = 0, plan.warmup, ""
    while True:
        if not np.array_equal(emu.capacities, plan.timeline[state][1]):
            emu.set_capacities(plan.timeline[state][1])
        start = time.time() - origin[0]
        aborted = len(comm.aborter.aborts) if comm.aborter is not None else 0
        dt = work.run(comm, i)
        rows += _attempts(comm, aborted, state, start, dt, origin[0])
        prog = _program(comm, plan)
        samples = tel.drain() if window is None else []       # pieces: reported by the window
        if window is not None:
            window.flush()
        i += 1
        elapsed = time.time() - origin[0]
        dead = dead or pusher.dead
        due = prober.due(i)
        wanted = prober.wanted(reporter, prog) if due else []
        flags = [_state_at(plan, elapsed), int(elapsed >= plan.duration_s or bool(dead))] + wanted
        readings = reporter.readings(samples, prog, 4) if plan.stalls else {}
        flags, stalled = stalls.agree(readings, flags, side, comm.seq)   # lock step, and every rank's readings
        if samples:
            pusher.put(reporter(samples, prog, 4, time.time(), stalled=frozenset(emu.gpus[r] for r in stalled)))
        state = flags[0]
        if flags[1]:
            break
        if due and sum(flags[2:]):
            start = time.time() - origin[0]
            pusher.put(prober.run(flags[2:], side, reporter, plan.oob_timeout_s))
            probes.append((comm.seq, start, time.time() - origin[0] - start, sum(flags[2:])))
    follower.finish(group=side, timeout_s=plan.oob_timeout_s)   # the same versions on every rank
    comm.rescheduler.wait(timeout=plan.oob_timeout_s + 15)
    swaps = [(e.outcome, e.version, e.k) for e in comm.rescheduler.events]
    offline = _offline(plan, emu, work, i) if not dead else {}
    prober.close()
    comm.close()
    sub.close()
    pusher.close()
    client.close()
    return {"rows": rows, "probes": probes, "received": received, "rates": rates, "swaps": swaps, "offline": offline,
            "wrong": work.wrong, "dead": dead, "pushed": pusher.sent, "first_version": sched.version,
            "inflight": list(comm.inflight.switches) if comm.inflight is not None else [],
            "aborts": [(a.seq, a.from_version, a.to_version) for a in comm.aborter.aborts] if comm.aborter else [],
            "stalls": stalls.seen}


def _attempts(comm: Any, aborted: int, state: int, start: float, dt: float,
              origin: float) -> list[tuple[int, int, int, float, float, int]]:
    """The rows of the collective just run: one, or one per attempt when it was aborted
    and re-run (:class:`~executor_cuda.abort.StaleAbort`): each on its own version, from its
    start to the next one's."""
    new = comm.aborter.aborts[aborted:] if comm.aborter is not None else []
    if not new:
        return [(comm.seq, comm.trace[-1][2], state, start, dt, 0)]
    edges = [start] + [a.rerun - origin for a in new] + [start + dt]
    versions = [a.from_version for a in new] + [new[-1].to_version]
    return [(comm.seq, v, state, edges[k], edges[k + 1] - edges[k], k) for k, v in enumerate(versions)]


def _report(tel: Any, comm: Any, plan: RankPlan, reporter: ModelReporter, pusher: _Pusher,
            window: PieceWindow | None = None) -> None:
    if window is not None:                # pieces: what the window has not reported yet
        window.flush()
        return
    samples = tel.drain()
    if samples:
        pusher.put(reporter(samples, _program(comm, plan), 4, time.time()))


def _program(comm: Any, plan: RankPlan) -> Any:
    """The lowered program of the active version (the one the last collective ran)."""
    return comm.cache.get(comm.active[plan.collective], plan.block_numel, comm.pipeline)


def _offline(plan: RankPlan, emu: FabricEmulator, work: _Workload, i: int) -> dict[int, list[float]]:
    """Each event's offline schedule run directly on its fabric: seconds per collective."""
    from .communicator import Communicator

    out: dict[int, list[float]] = {}
    for state, schedule in plan.offline:
        emu.set_capacities(plan.timeline[state][1])
        # the same executor as the loop's (pieces need the hot-swap side groups; nothing is staged)
        comm = Communicator(None, schedule, pipeline=plan.pipeline, faults=emu, hot_swap=plan.pieces > 1 or plan.abort,
                            pieces=plan.pieces, abort=plan.abort)
        work.run(comm, i)                            # compiles the program
        out[state] = [work.run(comm, i + k + 1) for k in range(plan.offline_reps)]
        i += plan.offline_reps + 1
        comm.close()
    return out
