"""One rank of ``mccl loop --executor gloo`` (docs/executor.md, "Scenarios on real ranks").

Each rank fetches the controller's first schedule, runs the collective back to back on
a :class:`~executor_cuda.communicator.Communicator` paced by a
:class:`~executor_cuda.faults.FabricEmulator`, reports its passive telemetry to the
controller after every collective (:class:`ModelReporter`), stages every version the
controller publishes (the hot-swap of paper §3.3; the ranks agree on the last one,
:class:`~executor_cuda.follower.VersionFollower`), and finally runs each event's
offline schedule directly on that event's fabric.

Ranks must issue the same collectives: after each one they all-reduce (max) one small
row ``[fabric state, stop, suspect pairs]`` on a gloo side group, so every rank uses
the same fabric for the next collective, stops at the same one, and probes the same
pairs the schedule no longer loads (:class:`~executor_cuda.reporting.PairProber`).
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Sequence

import numpy as np

from mccl_opt.schedule import Schedule
from mccl_opt.topology import Topology

from .faults import FabricEmulator
from .telemetry import LinkSample

__all__ = ["RankPlan", "ModelReporter", "rank_main"]

COMM, NAME = "world", "loop"
LOW = 0.95              # a pair reported below this share of nominal is probed once unused


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
    probe_every: int = 4                  # collectives between probes of unused suspect pairs (0: off)
    probe_numel: int = 256                # float32 elements per probe message
    pieces: int = 1                       # pieces per collective (in-flight switch; 1: whole)
    telemetry_endpoint: str | None = None  # a telemetry front end (None: ``endpoint``)


class ModelReporter:
    """Executor telemetry in the topology's units, for the controller's ``pair`` samples.

    A message's time on the emulated fabric depends on how many messages share its
    links in its round, which changes with the schedule; so each pair's measured
    seconds over a collective are compared with the seconds the schedule's own round
    model predicts on the *nominal* fabric (:meth:`FabricEmulator.program_delays`).
    gloo adds a roughly fixed cost per message (posting, copying, waking the receiving
    thread), which would make a slow link look faster than it is if it were divided
    out as a ratio; so the healthy warm-up collectives (:attr:`calibrating`, like the
    paper's startup probing) estimate it per message, as the median of
    ``(measured - expected) / messages`` of the pair (for a pair first used later, of
    all pairs), and later samples report
    ``nominal * min(1, expected / (measured - messages * cost))``.  Each pair reports
    the median of its last ``window`` collectives: the median of a few measurement
    windows (paper §5) ignores one slow collective (a busy shared core) and follows a
    lasting change after ``window // 2 + 1`` collectives.

    A pair's ratio ``expected / measured`` is exact only for a degraded link that is also
    the pair's bottleneck on the nominal fabric.  Once a new schedule moves load off a
    degraded link, another link of the path becomes the nominal bottleneck and the ratio
    overstates the degraded one (a link at 800 Gbps read as 1200-2880 on real ranks, so
    the controller published a version per swap).  So the ratio may lower a pair's level
    or raise it by at most ``1 + tol``; a larger rise is taken only as far as every link
    of the path proves it (:meth:`proven`: the level at which the path's most lightly
    loaded link alone would not have slowed the messages), and a sample that proves no
    rise carries no news: the level is reported again and the pair is ``blind``, so
    the prober measures it alone (:class:`~executor_cuda.reporting.PairProber`).  A pair
    first used by a later version starts at what it proves.
    """

    def __init__(self, emulator: FabricEmulator, nominal: dict[tuple[str, str], float],
                 window: int = 3, tol: float = 0.2) -> None:
        self.emu = emulator
        self.nominal = nominal
        self.nominal_cap = emulator.topo.arrays.capacity.astype(float)
        self.window = window
        self.tol = tol
        self.overhead: dict[tuple[str, str], list[float]] = {}
        self.recent: dict[tuple[str, str], deque[float]] = {}
        self.low: dict[tuple[str, str], bool] = {}          # last report below LOW x nominal
        self.blind: dict[tuple[str, str], bool] = {}        # last sample fit its level and nominal
        self.calibrating = True
        self._expected: dict[int, tuple[Any, dict[tuple[int, int], np.ndarray]]] = {}

    def drains(self, prog: Any, elem_bytes: int) -> dict[tuple[int, int], np.ndarray]:
        """Per rank pair of ``prog``: nominal-fabric drain seconds, one row per message of
        the pair and one column per link of its route (:meth:`FabricEmulator.route_drains`)."""
        hit = self._expected.get(id(prog))
        if hit is None or hit[0] is not prog:
            rows: dict[tuple[int, int], list[np.ndarray]] = {}
            for (_, s, d), dr in self.emu.route_drains(prog, elem_bytes, self.nominal_cap).items():
                rows.setdefault((s, d), []).append(dr)
            hit = self._expected[id(prog)] = (prog, {k: np.vstack(v) for k, v in rows.items()})
        return hit[1]

    def expected(self, prog: Any, elem_bytes: int) -> dict[tuple[int, int], float]:
        """Nominal-fabric seconds per rank pair of one collective of ``prog``."""
        return {k: float(d.max(axis=1).sum()) for k, d in self.drains(prog, elem_bytes).items()}

    #: ratios tried when solving for a pair's proven level (:meth:`proven`)
    GRID = np.geomspace(1e-3, 1.0, 241)

    @classmethod
    def proven(cls, drains: np.ndarray, seconds: float) -> float:
        """The level every link of a pair's route must at least have for its messages
        (``drains``, :meth:`drains`) to have taken no more than ``seconds``: per link, the
        smallest ratio at which that link alone would not make them slower, and the
        lowest of these (the most lightly loaded link proves the least).  Delays (a busy
        core, the per-message cost) only add time, so this is a lower bound."""
        bottleneck = drains.max(axis=1)[None, :, None]
        t = np.maximum(bottleneck, drains[None, :, :] / cls.GRID[:, None, None]).sum(axis=1)  # grid x links
        ok = t <= seconds
        first = np.where(ok.any(axis=0), ok.argmax(axis=0), len(cls.GRID) - 1)
        return float(cls.GRID[first].min())

    def level(self, key: tuple[str, str]) -> float | None:
        """The pair's current level: the median of its recent samples; 1 for a pair
        measured in the healthy warm-up and not since, ``None`` for one never measured."""
        recent = self.recent.get(key)
        if recent:
            return statistics.median(recent)
        return 1.0 if key in self.overhead else None

    def _ratio(self, key: tuple[str, str], drains: np.ndarray, seconds: float) -> float | None:
        """The ratio one collective's sample adds to the pair's median, ``None`` when it
        carries no news (class docstring)."""
        level, high = self.level(key), float(drains.max(axis=1).sum()) / seconds
        self.blind[key] = False
        if level is None:                   # a pair first used by a later version: only what it proves
            return self.proven(drains, seconds)
        if high <= (1.0 + self.tol) * level:
            return high
        least = self.proven(drains, seconds)
        if least > level:                   # a rise every link of the path shows
            return least
        self.blind[key] = True              # faster, but not on the path's lightly loaded link
        return None

    def __call__(self, samples: Sequence[LinkSample], prog: Any, elem_bytes: int,
                 now: float) -> list[dict[str, Any]]:
        rank = {g: r for r, g in enumerate(self.emu.gpus)}
        drains = self.drains(prog, elem_bytes)
        pooled = [x for h in self.overhead.values() for x in h]
        out: list[dict[str, Any]] = []
        for s in samples:
            key = (s.src, s.dst)
            dr = drains.get((rank.get(s.src, -1), rank.get(s.dst, -1)))
            exp = float(dr.max(axis=1).sum()) if dr is not None else 0.0
            nominal = self.nominal.get(key)
            if nominal is None or exp <= 0 or s.seconds <= 0 or s.count < 1:
                continue
            if self.calibrating:
                self.overhead.setdefault(key, []).append((s.seconds - exp) / s.count)
                continue
            hist = self.overhead.get(key) or pooled
            if not hist:
                continue
            seconds = max(s.seconds - s.count * max(0.0, statistics.median(hist)), 1e-9)
            ratio = self._ratio(key, dr, seconds)
            out.append(self._level(key, ratio, now) if ratio is not None else self._report(key, self.level(key), now))
        return out

    def probe(self, src: str, dst: str, seconds: float, expected: float, now: float) -> dict[str, Any] | None:
        """The ``pair`` sample of one probe of ``src -> dst`` (one message measured
        ``seconds``, ``expected`` on the nominal fabric), folded into the pair's median
        like a collective's sample (a pair with a level only rises: a probe is one short
        message, and waiting for a busy core reads as a slow link); ``None`` while
        calibrating or for an unknown pair."""
        key = (src, dst)
        hist = self.overhead.get(key) or [x for h in self.overhead.values() for x in h]
        if self.calibrating or key not in self.nominal or not hist or expected <= 0:
            return None
        cost = max(0.0, statistics.median(hist))
        ratio, level = expected / max(seconds - cost, 1e-9), self.level(key)
        # a late probe may only have waited for a busy core: it raises a level, never lowers one
        return self._level(key, ratio if level is None else max(ratio, level), now)

    def _level(self, key: tuple[str, str], ratio: float, now: float) -> dict[str, Any]:
        recent = self.recent.setdefault(key, deque(maxlen=self.window))
        recent.append(min(1.0, ratio))
        return self._report(key, statistics.median(recent), now)

    def _report(self, key: tuple[str, str], level: float, now: float) -> dict[str, Any]:
        gbps = self.nominal[key] * level
        self.low[key] = gbps < LOW * self.nominal[key]
        return {"kind": "pair", "src": key[0], "dst": key[1], "gbps": gbps, "t": now}


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
    comm = Communicator(None, sched, telemetry=tel, faults=emu, stage_timeout=10,
                        oob_timeout=plan.oob_timeout_s, pieces=plan.pieces)
    side = dist.new_group(backend="gloo", timeout=timedelta(seconds=plan.oob_timeout_s))
    reporter = ModelReporter(emu, pair_nominal(plan.topology))
    prober = PairProber(emu, rank, world, plan.probe_numel, plan.probe_every)
    pusher = _Pusher(plan.telemetry_endpoint or plan.endpoint, plan.client_timeout_s)
    received: list[tuple[int, float, float | None]] = []      # version, arrival, synthesis s
    origin = [0.0]

    def log(version: int, schedule: Schedule) -> None:
        seconds = schedule.solver.get("seconds") if isinstance(schedule.solver, dict) else None
        received.append((version, time.time() - origin[0],
                         float(seconds) if isinstance(seconds, (int, float)) else None))

    if comm.inflight is not None:                    # pieces: telemetry after every piece
        def piece_report(schedule: Schedule, numel: int) -> None:
            samples = tel.drain()
            if samples:
                pusher.put(reporter(samples, comm.cache.get(schedule, numel, comm.pipeline), 4, time.time()))

        comm.inflight.on_piece = piece_report
    work = _Workload(plan.collective, rank, world, plan.block_numel)
    for i in range(plan.warmup):                     # compile, connect, set baselines
        work.run(comm, i)
        _report(tel, comm, plan, reporter, pusher)
    reporter.calibrating = False
    clock = torch.tensor([time.time() + 0.05], dtype=torch.float64)
    dist.broadcast(clock, 0, group=side)
    origin[0] = float(clock.item())
    time.sleep(max(0.0, origin[0] - time.time()))
    follower = VersionFollower(comm, sub, COMM, NAME, plan.collective, on_version=log)
    rows: list[tuple[int, int, int, float, float]] = []
    probes: list[tuple[int, float, float, int]] = []        # seq, start, seconds, pairs
    state, i, dead = 0, plan.warmup, ""
    while True:
        if not np.array_equal(emu.capacities, plan.timeline[state][1]):
            emu.set_capacities(plan.timeline[state][1])
        start = time.time() - origin[0]
        dt = work.run(comm, i)
        rows.append((comm.seq, comm.trace[-1][2], state, start, dt))
        _report(tel, comm, plan, reporter, pusher)
        i += 1
        elapsed = time.time() - origin[0]
        dead = dead or pusher.dead
        due = prober.due(i)
        wanted = prober.wanted(reporter, _program(comm, plan)) if due else []
        flags = torch.tensor([_state_at(plan, elapsed), int(elapsed >= plan.duration_s or bool(dead))] + wanted)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=side)
        state = int(flags[0])
        if flags[1]:
            break
        if due and int(flags[2:].sum()):
            start = time.time() - origin[0]
            pusher.put(prober.run(flags[2:].tolist(), side, reporter, plan.oob_timeout_s))
            probes.append((comm.seq, start, time.time() - origin[0] - start, int(flags[2:].sum())))
    follower.finish(group=side, timeout_s=plan.oob_timeout_s)   # the same versions on every rank
    comm.rescheduler.wait(timeout=plan.oob_timeout_s + 15)
    swaps = [(e.outcome, e.version, e.k) for e in comm.rescheduler.events]
    offline = _offline(plan, emu, work, i) if not dead else {}
    prober.close()
    comm.close()
    sub.close()
    pusher.close()
    client.close()
    return {"rows": rows, "probes": probes, "received": received, "swaps": swaps, "offline": offline,
            "wrong": work.wrong, "dead": dead, "pushed": pusher.sent, "first_version": sched.version,
            "inflight": list(comm.inflight.switches) if comm.inflight is not None else []}


def _report(tel: Any, comm: Any, plan: RankPlan, reporter: ModelReporter, pusher: _Pusher) -> None:
    if comm.inflight is not None:         # reported after every piece (``piece_report``)
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
        comm = Communicator(None, schedule, faults=emu, hot_swap=plan.pieces > 1, pieces=plan.pieces)
        work.run(comm, i)                            # compiles the program
        out[state] = [work.run(comm, i + k + 1) for k in range(plan.offline_reps)]
        i += plan.offline_reps + 1
        comm.close()
    return out
