"""``mccl loop --executor gloo``: a closed-loop scenario on real ranks (paper §6.2.2, Fig. 13).

The parent process

1. reads the ``mccl-scenario/1`` file and synthesizes, for the scenario's healthy fabric
   and for every event's true fabric, the offline schedule (cold, like the simulated
   loop's ``algbw_offline``);
2. chooses the emulation scales: ranks move ``block_kib`` KiB blocks that stand for the
   scenario's ``message_bytes`` (``byte_scale``), and fabric time is dilated so the
   healthy offline schedule takes ``collective_ms`` of real time (``time_scale``); the
   scenario's event times are dilated the same way;
3. starts the controller as a real ``mccl controller serve`` subprocess on a free
   loopback port, with the collective registered;
4. launches ``world`` ranks with torch.distributed (gloo, CPU tensors;
   :mod:`executor_cuda.scenario_rank`), each pacing its sends with a
   :class:`~executor_cuda.faults.FabricEmulator` that follows the scenario's timeline;
   the ranks emulate GPUs, which take none of the controller's CPU, so they run
   ``rank_nice`` below it, in its session (docs/executor.md, "The ranks yield to the
   controller");
5. merges the ranks' measurements into the summary (:mod:`.scenario_report`).

Every wait is bounded: the controller must announce itself within ``start_timeout_s``,
the ranks must finish within the scenario's real duration plus margins
(:func:`~executor_cuda.launch.run_ranks` kills them after), and a controller that stops
answering ends the run.  Failures are :class:`~mccl_opt.errors.MCCLError` (``mccl``
exits 2 with the message).
"""

from __future__ import annotations

import math

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mccl_opt.errors import MCCLError
from mccl_opt.piece_rule import PieceRule

__all__ = ["GlooLoopConfig", "RANK_NICE", "run_gloo_loop", "ControllerProcess", "plan_scales", "rank_pipeline",
           "rank_failure_line"]


#: real seconds one more round of a collective costs 8 gloo CPU ranks on the 2 shared cores,
#: whatever its bytes (``bench/bench_piece_cost.py``: 9.5-12.9 ms, 0.4-0.5 ms per message)
GLOO_ROUND_S = 0.010
#: how far below the controller the emulated GPUs run (docs/executor.md, "The ranks yield to the controller")
RANK_NICE = 10


@dataclass(frozen=True)
class GlooLoopConfig:
    """Settings of a real-rank run (see the module docstring)."""

    world: int = 8
    block_kib: float = 32.0
    collective_ms: float = 60.0
    alpha: float = 1.0
    gamma: float = 0.3
    dwell_s: float = 1.0
    gather_s: float = 0.0                 # the controller's ``--gather`` (0: off; 0.6 ~ one degraded collective)
    anytime_s: float | None = 0.5         # the controller's ``--anytime`` (None: off; docs/executor.md)
    time_limit_s: float = 30.0
    backend: str = "highs"
    offline_reps: int = 5
    warmup: int = 5
    max_real_s: float = 600.0
    start_timeout_s: float = 90.0
    telemetry_frontend: bool = False      # ranks send telemetry to a front end (`serve --frontends 1`)
    client_timeout_s: float = 10.0
    probe_every: int = 4
    probe_kib: float = 512.0              # fabric KiB per probe (the simulated loop's probe_bytes)
    shallow_trees: bool = True            # the controller's ``--shallow-trees`` (a tree hop per round)
    pieces: int = 1                       # collectives run in pieces, in-flight switch (executor_cuda.pieces)
    pipeline: int = 0                     # slices per chunk (0: the simulator's piece rule on fabric bytes)
    abort: bool = True                    # abort a stale collective, re-run it on the new version (executor_cuda.abort)
    stalls: bool = True                   # a stalled rank's readings are no link evidence (executor_cuda.stalls)
    controller_log: str | None = None     # keep the controller's decision log (``serve -v``) at this path
    workers: int = 0                      # the controller's ``--workers`` (0: synthesis in its own thread)
    kernels: str = "eager"                # the controller's ``--kernels`` (eager: loaded before it serves)
    speculate: bool = True                # ranks send drops being confirmed as ``early``; the controller
                                          # synthesizes on them (``--speculate``, docs/executor.md)
    early_hold_s: float = 1.0             # with ``speculate``: the controller's ``--early-hold``
    cable_wait_s: float = 0.2             # the controller's ``--cable-wait`` (0: off; docs/executor.md)
    rank_nice: int = RANK_NICE            # the ranks yield to the controller: nice, in its session
                                          # (0: the controller in a session of its own, as before)


class ControllerProcess:
    """``mccl controller serve`` in a subprocess on a free loopback port; with
    ``message_bytes`` (the scenario's) its round-aware pick cuts chunks as the ranks do."""

    def __init__(self, topology_path: str, collective: str, cfg: GlooLoopConfig, log_path: str,
                 message_bytes: float | None = None) -> None:
        from .scenario_rank import COMM, NAME

        cmd = [sys.executable, "-m", "mccl_opt.cli", "controller", "serve", "--estimator", "ewma", "--topology", topology_path,
               "--bind", "tcp://127.0.0.1:0", "--collective", f"{COMM}/{NAME}:{collective}",
               "--alpha", str(cfg.alpha), "--gamma", str(cfg.gamma), "--dwell", str(cfg.dwell_s),
               "--gather", str(cfg.gather_s), *(["--anytime", str(cfg.anytime_s)] if cfg.anytime_s is not None else []),
               "--time-limit", str(cfg.time_limit_s), "--backend", cfg.backend, "--kernels", cfg.kernels]
        if cfg.shallow_trees:
            cmd.append("--shallow-trees")
            if message_bytes is not None:
                cmd += round_pieces_args(cfg, message_bytes)
        if cfg.workers:
            cmd += ["--workers", str(cfg.workers)]
        if cfg.cable_wait_s:
            cmd += ["--cable-wait", str(cfg.cable_wait_s)]
        if cfg.speculate:
            cmd += ["--speculate", "--early-hold", str(cfg.early_hold_s)]
        if cfg.telemetry_frontend:
            cmd += ["--frontends", "1"]
        if cfg.controller_log:
            cmd.append("-v")
            log_path = cfg.controller_log
        self.log_path = log_path
        self._log = open(log_path, "w")
        # its own process group (a terminal's signals stay with the caller's); with ranks that
        # yield (``rank_nice``) the caller's session too, i.e. the ranks' scheduling group
        # under autogroup, where their nice value ranks them below its synthesis
        group = {"process_group": 0} if cfg.rank_nice else {"start_new_session": True}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log, text=True, **group)
        self.endpoint: str | None = None
        self.frontend: str | None = None            # the telemetry front end's endpoint
        self._want_frontend = cfg.telemetry_frontend
        self._lines: list[str] = []
        self._found = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.append(line)
            m = re.match(r"controller on (\S+)", line)
            if m and self.endpoint is None:
                self.endpoint = m.group(1)
            m = re.match(r"frontend 0 on (\S+)", line)
            if m and self.frontend is None:
                self.frontend = m.group(1)
            if self.endpoint is not None and (self.frontend is not None or not self._want_frontend):
                self._found.set()
        self._found.set()

    def wait_ready(self, timeout_s: float) -> str:
        """The request endpoint, once the controller (and its front end, when asked for)
        announced it; raises :class:`MCCLError` if it exits or stays silent for ``timeout_s``."""
        self._found.wait(timeout_s)
        if self.endpoint is None or (self._want_frontend and self.frontend is None):
            when = "exited before it announced itself" if self.proc.poll() is not None \
                else f"did not start within {timeout_s:g} s"
            raise MCCLError(f"the controller (`mccl controller serve`) {when}: {self.tail()}")
        return self.endpoint

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 5) -> str:
        self._log.flush()
        try:
            text = Path(self.log_path).read_text().strip().splitlines()[-lines:]
        except OSError:
            text = []
        code = self.proc.poll()
        state = "still running" if code is None else f"exit status {code}"
        return f"{state}; log: " + (" | ".join(text) if text else "(empty)")

    def stop(self) -> None:
        """SIGTERM (the service saves and closes), SIGKILL after 10 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


def rank_pipeline(cfg: GlooLoopConfig, message_bytes: float, byte_scale: float) -> int | PieceRule:
    """The ranks' slices per chunk: ``cfg.pipeline``, or (0) the simulator's piece rule on
    the fabric bytes a float32 element stands for, with a gloo floor and no 512 KiB cap
    (docs/executor.md "Pieces per chunk"): a round costs gloo ``GLOO_ROUND_S`` whatever its
    size, so a block of ``n`` pieces on ``d`` hops takes about ``T (1 + (d - 1) / n) + n
    GLOO_ROUND_S`` (``T`` = ``collective_ms``), least at ``n = sqrt(T / GLOO_ROUND_S)`` on
    2 hops: pieces no smaller than ``message_bytes * sqrt(GLOO_ROUND_S / T)``."""
    if cfg.pipeline:
        return cfg.pipeline
    return PieceRule(max_bytes=math.inf, floor_bytes=_gloo_floor(cfg, message_bytes), element_bytes=4.0 * byte_scale)


def _gloo_floor(cfg: GlooLoopConfig, message_bytes: float) -> float:
    """The real ranks' smallest piece in fabric bytes (:func:`rank_pipeline`)."""
    return message_bytes * math.sqrt(min(1.0, GLOO_ROUND_S / (cfg.collective_ms / 1e3)))


def round_pieces_args(cfg: GlooLoopConfig, message_bytes: float) -> list[str]:
    """The controller's ``--round-pieces``: its round model cuts chunks as the ranks do
    (:func:`rank_pipeline`); none with a forced ``cfg.pipeline`` (a fixed count is no piece rule)."""
    return [] if cfg.pipeline else ["--round-pieces", f"{message_bytes!r},{_gloo_floor(cfg, message_bytes)!r}"]


def plan_scales(scenario: Any, healthy: Any, cfg: GlooLoopConfig) -> tuple[int, float, float, float]:
    """``(block_numel, byte_scale, time_scale, healthy_fabric_s)``: float32 elements per
    block, fabric bytes per real byte, real seconds per fabric second, and the healthy
    offline schedule's emulated time on the fabric (lowered as the ranks lower it)."""
    from mccl_opt.lowering.program import compile_schedule

    from .faults import FabricEmulator

    block = max(1, int(cfg.block_kib * 1024 // 4))
    byte_scale = scenario.message_bytes / (4.0 * block)
    emu = FabricEmulator(scenario.topology, healthy.gpus, time_scale=1.0, byte_scale=byte_scale)
    fabric_s = emu.program_time_s(compile_schedule(healthy, block, rank_pipeline(cfg, scenario.message_bytes,
                                                                                 byte_scale)), 4)
    if not fabric_s > 0:
        raise MCCLError("the healthy schedule moves no data; nothing to emulate")
    return block, byte_scale, cfg.collective_ms / 1e3 / fabric_s, fabric_s


#: pieces per collective: each piece costs a round trip on gloo ranks, so a collective of
#: more would not finish inside a scenario (``--pieces 1000000`` ran until killed)
MAX_PIECES = 1024
#: ranks of a run (processes on this machine), and events of its scenario
MAX_WORLD, MAX_EVENTS = 64, 64
#: the shortest real time of a healthy collective: gloo's own cost per message is ~0.1 ms
MIN_COLLECTIVE_MS = 1.0
#: real bytes per block a CPU rank moves (1 GiB)
MAX_BLOCK_KIB = float(1 << 20)


def _check(scenario: Any, cfg: GlooLoopConfig) -> None:
    from mccl_runtime.warmup import check_kernels_mode

    check_kernels_mode(cfg.kernels)
    n = scenario.topology.num_gpus
    if cfg.world != n:
        raise MCCLError(f"--world {cfg.world} does not match the scenario's fabric ({n} GPUs in "
                        f"{scenario.topology.name!r}); pass --world {n}")
    if not 2 <= cfg.world <= MAX_WORLD:
        raise MCCLError(f"--world must be in [2, {MAX_WORLD}] for CPU ranks, got {cfg.world}")
    if len(scenario.events) > MAX_EVENTS:
        raise MCCLError(f"the scenario has {len(scenario.events)} events; real ranks take at most {MAX_EVENTS} "
                        "(each event's offline schedule is synthesized before the run)")
    if not (0 < cfg.alpha <= 1 and math.isfinite(cfg.gamma) and cfg.gamma > 0):
        raise MCCLError(f"--alpha must be in (0, 1] and --gamma > 0, got {cfg.alpha:g} and {cfg.gamma:g} "
                        "(the controller would refuse them after the offline syntheses)")
    if not 1 <= cfg.pieces <= MAX_PIECES:
        raise MCCLError(f"--pieces must be in [1, {MAX_PIECES}], got {cfg.pieces}")
    if not 0 <= cfg.pipeline <= MAX_PIECES:
        raise MCCLError(f"--pipeline must be in [0, {MAX_PIECES}] (0: the piece rule), got {cfg.pipeline}")
    if not 0 <= cfg.rank_nice <= 19:
        raise MCCLError(f"the ranks' nice value must be in [0, 19] (they yield, never preempt), got {cfg.rank_nice}")
    if not (math.isfinite(cfg.cable_wait_s) and 0 <= cfg.cable_wait_s <= 60
            and math.isfinite(cfg.early_hold_s) and 0 <= cfg.early_hold_s <= 60):
        raise MCCLError(f"the cable wait and the early hold must be in [0, 60] s, got {cfg.cable_wait_s:g} and "
                        f"{cfg.early_hold_s:g}")
    # finite and bounded: inf reached int() as a traceback, a NaN --max-real-s never stopped a run
    # a collective of 1e-9 ms ran a run of no collective at all and exited 0 (eighth pass)
    for label, v, low, top in (("--block-kib", cfg.block_kib, 0.0, MAX_BLOCK_KIB),
                               ("--collective-ms", cfg.collective_ms, MIN_COLLECTIVE_MS, 1e6),
                               ("--max-real-s", cfg.max_real_s, 0.0, 86400.0)):
        if not (math.isfinite(v) and low < v <= top if low == 0 else low <= v <= top):
            bounds = f"(0, {top:g}]" if low == 0 else f"[{low:g}, {top:g}]"
            raise MCCLError(f"{label} must be in {bounds}, got {v:g}")


def run_gloo_loop(scenario: Any, cfg: GlooLoopConfig) -> dict[str, Any]:
    """Run ``scenario`` on ``cfg.world`` gloo ranks with a controller process; returns
    the summary of :func:`executor_cuda.scenario_report.summarize`."""
    import torch  # noqa: F401 - imported before forking, so the ranks start in milliseconds

    from mccl_runtime.synthesizer import solver_synthesizer

    from .launch import RankFailure, run_ranks
    from .scenario_rank import RankPlan, rank_main
    from .scenario_report import summarize

    _check(scenario, cfg)
    synth = solver_synthesizer(cfg.backend)
    topo = scenario.topology
    timeline = scenario.timeline()
    healthy = synth(scenario.collective, topo, None, None)
    block, byte_scale, time_scale, fabric_s = plan_scales(scenario, healthy, cfg)
    real_s = scenario.duration_s * time_scale
    if real_s > cfg.max_real_s:
        raise MCCLError(f"the scenario would run {real_s:.0f} s on real ranks ({scenario.duration_s * 1e3:g} ms "
                        f"of fabric time at {time_scale:.0f}x so a healthy collective takes "
                        f"{cfg.collective_ms:g} ms); shorten duration_ms or lower --collective-ms")
    first_state: dict[int, int] = {}
    for k, (_, _, ev) in enumerate(timeline):
        first_state.setdefault(ev, k)
    offline = tuple((first_state[i], synth(scenario.collective, topo.with_capacities(timeline[first_state[i]][1]),
                                           None, None)) for i in range(len(scenario.events)))
    with tempfile.TemporaryDirectory(prefix="mccl-loop-") as tmp:
        topo_path = os.path.join(tmp, "topology.json")
        topo.save(topo_path)
        ctrl = ControllerProcess(topo_path, scenario.collective, cfg, os.path.join(tmp, "controller.log"),
                                 scenario.message_bytes)
        try:
            endpoint = ctrl.wait_ready(cfg.start_timeout_s)
            plan = RankPlan(endpoint=endpoint, telemetry_endpoint=ctrl.frontend, topology=topo, collective=scenario.collective,
                            block_numel=block, time_scale=time_scale, byte_scale=byte_scale,
                            timeline=tuple((t * time_scale, cap) for t, cap, _ in timeline),
                            duration_s=real_s, offline=offline, offline_reps=cfg.offline_reps,
                            warmup=cfg.warmup, client_timeout_s=cfg.client_timeout_s,
                            probe_every=cfg.probe_every, pieces=cfg.pieces, abort=cfg.abort, window_s=3 * cfg.collective_ms / 1e3,
                            pipeline=rank_pipeline(cfg, scenario.message_bytes, byte_scale),
                            probe_numel=max(1, round(cfg.probe_kib * 1024 / byte_scale / 4)), early=cfg.speculate,
                            stalls=cfg.stalls)
            budget = (cfg.start_timeout_s + real_s + 60
                      + len(offline) * (cfg.offline_reps + 1) * 20 * cfg.collective_ms / 1e3)
            t0 = time.monotonic()
            try:
                res = run_ranks(rank_main, cfg.world, plan, timeout=budget, stopped_s=plan.collective_timeout_s,
                                nice=cfg.rank_nice)
            except TimeoutError as exc:
                raise MCCLError(f"the ranks did not finish within {budget:.0f} s ({exc}); controller "
                                f"{ctrl.tail(2)}") from None
            except RankFailure as exc:
                # a dead controller is the cause, whichever rank noticed first (the others
                # may only see their peers leave the process group); else the first rank
                # that died or hung, else the first that failed
                if not ctrl.alive():
                    raise MCCLError(f"the controller stopped answering during the run: "
                                    f"{rank_failure_line(exc, scenario.collective)}; controller {ctrl.tail(2)}") from None
                raise MCCLError(f"{rank_failure_line(exc, scenario.collective)} (the controller is still "
                                "running; restart the job)") from None
            wall = time.monotonic() - t0
            dead = [r["dead"] for r in res if r["dead"]]
            if dead or not ctrl.alive():
                raise MCCLError(f"the controller stopped answering during the run ({dead[0] if dead else ''}); "
                                f"controller {ctrl.tail(3)}")
            stats = _controller_stats(endpoint, cfg.client_timeout_s)
        finally:
            ctrl.stop()
    return summarize(scenario, res, plan, fabric_s, wall, stats)


def _controller_stats(endpoint: str, timeout_s: float) -> dict[str, Any]:
    """The controller's counters (re-syntheses, published, aborted, superseded,
    telemetry accepted/rejected, requests by kind) at the end of the run."""
    from mccl_runtime.client import ControllerClient

    with ControllerClient(endpoint, timeout_s=timeout_s) as client:
        stats = client.stats()
    return {"manager": stats.get("manager", {}), "telemetry": stats.get("telemetry", {}),
            "requests": stats.get("requests", {})}


def rank_failure_line(exc: Any, collective: str) -> str:
    """One line for a :class:`~executor_cuda.launch.RankFailure`: the rank that caused it
    (died, stopped or hung; else the first that raised) and how, then the collective its
    peers were in when they noticed (``allgather #14``, from their
    :class:`~executor_cuda.timeouts.CollectiveTimeoutError`), without tracebacks."""
    ranks = list(exc.ranks) or [(-1, str(exc).strip().splitlines()[-1] if str(exc).strip() else "failed")]
    rank, how = ranks[0]
    how = re.sub(r"^Rank(Died|Stopped|Hung): ", "", how)
    where = next((m.group(0) for _, line in ranks for m in [re.search(rf"\b{collective} #\d+", line)] if m), None)
    seen = next((f"; rank {r}: {line[:300]}" for r, line in ranks[1:] if where and where in line), "")
    return (f"rank {rank} failed in the {where or collective + ' collective'}: {how[:300]}{seen}"
            if rank >= 0 else f"a rank failed in the {collective} collective: {how[:300]}")
