"""Closed-loop simulation (``mccl loop``), in the spirit of paper §6.2 / Fig. 13(a).

A training loop issues the same collective back to back on the fluid fabric simulator
(:func:`mccl_opt.sim.simulate`).  At ``t0`` a gray failure lowers some capacities (and
optionally clears at ``t1``); capacities change at collective boundaries.  After each
collective the executors report telemetry derived from the simulator's per-link
throughput: like the paper's measurement (§5), which records only while enough channels
keep a link busy, a link is sampled only over the intervals where it ran saturated, as
``link`` samples with multiplicative Gaussian noise.  The controller (EWMA store +
:class:`~mccl_runtime.manager.ScheduleManager`) runs Algorithm 1 after every batch.

Timing model (simulated clock, real synthesis):

* ``detect``: from ``t0`` to the collective boundary at which Algorithm 1 flags.
* ``synth``: the synthesizer's measured wall time; collectives keep running on the
  stale schedule meanwhile (and their telemetry is ingested), then the manager re-checks
  the latest ``M`` and publishes or aborts.
* ``swap``: until the next collective boundary, plus the measured dispatch cost
  (serialising, parsing and validating the schedule) and ``oob_ms``, the out-of-band
  version/sequence AllGather of the Online Rescheduler (paper §3.3; 5.74 ms measured in
  Fig. 13(b)).  The next collective runs on the new version.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np

from mccl_opt.errors import MCCLError
from mccl_opt.schedule import Schedule
from mccl_opt.topology import Topology

from .manager import Policy, ScheduleManager, Synthesizer, solver_synthesizer
from .telemetry import MeasurementStore

__all__ = ["LoopConfig", "LoopResult", "run_loop", "telemetry_from_sim", "add_arguments", "main"]


@dataclass(frozen=True)
class LoopConfig:
    """A closed-loop scenario (defaults: the built-in HPN 1x2x4 / AllGather / Fail2)."""

    shape: str = "1x2x4"
    collective: str = "allgather"
    failure: str = "fail2"
    gpu: int = 0
    message_bytes: float = 16 * 2**20
    t0_ms: float = 20.0
    t1_ms: float | None = None
    duration_ms: float = 250.0
    alpha: float = 0.012
    gamma: float = 0.1
    noise: float = 0.01
    oob_ms: float = 5.74
    dwell_ms: float = 20.0
    seed: int = 0
    backend: str = "highs"
    max_chunks: int = 10


@dataclass
class LoopResult:
    """The timeline: one row per collective and the headline figures (ms, GB/s)."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)


def telemetry_from_sim(result: Any, capacity: np.ndarray, t: float, rng: np.random.Generator,
                       noise: float) -> list[dict[str, Any]]:
    """``link`` samples for the links that ran saturated during a simulated collective:
    their time-weighted throughput over the saturated intervals, times ``1 + noise*N(0,1)``."""
    dt = np.diff(result.times)
    sat = result.link_gbps >= capacity[None, :] * (1.0 - 1e-6)
    busy = (sat * dt[:, None]).sum(axis=0)
    samples = []
    for a in np.flatnonzero(busy > 0):
        gbps = float((result.link_gbps[:, a] * sat[:, a] * dt).sum() / busy[a])
        src, dst = result.link_names[a]
        samples.append({"kind": "link", "src": src, "dst": dst, "t": t,
                        "gbps": max(0.0, gbps * (1.0 + noise * float(rng.standard_normal())))})
    return samples


def _fabric(cfg: LoopConfig) -> tuple[Topology, Topology]:
    from instances import apply_failure, hpn, parse_shape

    healthy = hpn(*parse_shape(cfg.shape))
    degraded = apply_failure(healthy, cfg.failure, cfg.gpu)
    if degraded.gpus != healthy.gpus or [(l.src, l.dst) for l in degraded.links] != \
            [(l.src, l.dst) for l in healthy.links]:
        raise MCCLError(f"{cfg.failure} changes the fabric's nodes or links; the closed loop models gray "
                        "failures as capacity changes only (use fail1 or fail2)")
    return healthy, degraded


def run_loop(cfg: LoopConfig = LoopConfig(), synthesize: Synthesizer | None = None) -> LoopResult:
    """Run the closed loop of the module docstring."""
    from mccl_opt.sim import simulate
    from mccl_opt.validate import validate

    healthy, degraded = _fabric(cfg)
    synthesize = synthesize or solver_synthesizer(cfg.backend, cfg.max_chunks)
    store = MeasurementStore(healthy, alpha=cfg.alpha)
    policy = Policy(gamma=cfg.gamma, min_dwell_s=cfg.dwell_ms / 1e3, time_limit_s=600.0)
    manager = ScheduleManager(store, synthesize, policy)
    manager.register("world", cfg.collective, cfg.collective,
                     synthesize(cfg.collective, healthy, None, None))
    coll = manager.get("world", cfg.collective)
    rng = np.random.default_rng(cfg.seed)
    t0, t1 = cfg.t0_ms / 1e3, (cfg.t1_ms / 1e3 if cfg.t1_ms is not None else math.inf)
    cache: dict[tuple[int, bool], Any] = {}
    out = LoopResult()
    t, active, ready_t, swap_at = 0.0, coll.schedule, math.inf, math.inf
    detect_t = synth_s = swap_start = None
    try:
        while t < cfg.duration_ms / 1e3:
            bad = t0 <= t < t1
            topo = degraded if bad else healthy
            if t >= swap_at:                               # the next collective runs the new version
                active, swap_at = coll.schedule, math.inf
                swap_start = t if swap_start is None else swap_start
            key = (active.version, bad)
            if key not in cache:
                cache[key] = simulate(topo, active, cfg.message_bytes)
            res = cache[key]
            start, t = t, t + res.completion_s
            out.rows.append({"t_ms": start * 1e3, "end_ms": t * 1e3, "version": active.version,
                             "degraded": bad, "algbw": res.algbw_gbytes_per_s})
            store.ingest(telemetry_from_sim(res, topo.arrays.capacity, t, rng, cfg.noise), now=t)
            events = manager.step(t) if math.isinf(ready_t) else []
            if t >= ready_t:
                events += manager.poll(t)
                ready_t = math.inf
            for e in events:
                out.events.append(e.to_dict() | {"t_ms": t * 1e3})
                if e.action == "resynthesis":
                    # the job's result becomes visible once its measured wall time has elapsed
                    detect_t = t if detect_t is None else detect_t
                    manager.wait_idle()
                    ready_t = t + _last_synth_s(manager)
                elif e.action == "published":
                    synth_s = synth_s if synth_s is not None else e.detail["synth_s"]
                    wall = time.perf_counter()
                    validate(healthy.with_capacities(coll.synth_capacity),
                             Schedule.from_dict(json.loads(json.dumps(coll.schedule.to_dict()))))
                    swap_at = t + time.perf_counter() - wall + cfg.oob_ms / 1e3
    finally:
        manager.close()
    out.summary = _summary(out, t0, t1, detect_t, synth_s, swap_start)
    return out


def _last_synth_s(manager: ScheduleManager) -> float:
    """Wall time of the job that just finished (read without publishing it)."""
    for c in manager.collectives():
        if c.job is not None and c.job.future.done() and c.job.future.exception() is None:
            return c.job.future.result()[1]
    return 0.0


def _summary(out: LoopResult, t0: float, t1: float, detect_t: float | None,
             synth_s: float | None, swap_start: float | None) -> dict[str, Any]:
    rows = out.rows
    v0 = rows[0]["version"] if rows else 1

    def mean(sel: list[dict[str, Any]]) -> float | None:
        return float(np.mean([r["algbw"] for r in sel])) if sel else None

    before = [r for r in rows if r["t_ms"] < t0 * 1e3]
    degraded = [r for r in rows if r["degraded"] and r["version"] == v0]
    new = [r for r in rows if r["degraded"] and r["version"] != v0]
    after = [r for r in new if r["version"] == new[0]["version"]] if new else []
    final = [r for r in new if r["version"] == new[-1]["version"]] if new else []
    ms = (lambda x: None if x is None else x * 1e3)
    detect = None if detect_t is None else detect_t - t0
    swap = None if swap_start is None or detect_t is None or synth_s is None else swap_start - detect_t - synth_s
    reaction = None if swap_start is None else swap_start - t0
    return {"detect_ms": ms(detect), "synth_ms": ms(synth_s), "swap_ms": ms(swap), "reaction_ms": ms(reaction),
            "algbw_before": mean(before), "algbw_degraded": mean(degraded), "algbw_after": mean(after),
            "algbw_final": mean(final),
            "versions": [{"version": e["version"], "t_ms": e["t_ms"]} for e in out.events
                         if e["action"] == "published"],
            "aborted": sum(e["action"] == "aborted" for e in out.events),
            "collectives": len(rows), "failure_cleared_ms": None if math.isinf(t1) else t1 * 1e3}


def plot(out: LoopResult, cfg: LoopConfig, path: str) -> None:
    """Algorithm bandwidth over time, like paper Fig. 13(a)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.step([r["t_ms"] for r in out.rows], [r["algbw"] for r in out.rows], where="post", label="algbw")
    s = out.summary
    ax.axvline(cfg.t0_ms, color="tab:red", ls="--", label=f"{cfg.failure} at {cfg.t0_ms:g} ms")
    if s["detect_ms"] is not None:
        ax.axvline(cfg.t0_ms + s["detect_ms"], color="tab:orange", ls=":", label=f"detected (+{s['detect_ms']:.1f} ms)")
    if s["reaction_ms"] is not None:
        ax.axvline(cfg.t0_ms + s["reaction_ms"], color="tab:green", ls="-.",
                   label=f"new schedule (+{s['reaction_ms']:.1f} ms)")
    if cfg.t1_ms is not None:
        ax.axvline(cfg.t1_ms, color="tab:gray", ls="--", label=f"cleared at {cfg.t1_ms:g} ms")
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("algbw (GB/s)")
    ax.set_title(f"HPN {cfg.shape} {cfg.collective}, {cfg.message_bytes / 2**20:g} MiB per GPU")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = LoopConfig()
    p.add_argument("--shape", default=d.shape, help="HPN SxHxN (default %(default)s)")
    p.add_argument("--collective", choices=["allgather", "alltoall"], default=d.collective)
    p.add_argument("--fail", dest="failure", choices=["fail1", "fail2"], default=d.failure)
    p.add_argument("--gpu", type=int, default=d.gpu, help="rank hit by the failure")
    p.add_argument("--size-mib", type=float, default=d.message_bytes / 2**20,
                   help="per-GPU shard (AllGather) or per-pair block (AllToAll) in MiB")
    p.add_argument("--t0-ms", type=float, default=d.t0_ms, help="failure time")
    p.add_argument("--t1-ms", type=float, default=None, help="failure clears at this time (optional)")
    p.add_argument("--duration-ms", type=float, default=d.duration_ms)
    p.add_argument("--alpha", type=float, default=d.alpha, help="EWMA smoothing factor")
    p.add_argument("--gamma", type=float, default=d.gamma, help="Algorithm 1 threshold")
    p.add_argument("--noise", type=float, default=d.noise, help="telemetry noise (relative std)")
    p.add_argument("--oob-ms", type=float, default=d.oob_ms, help="hot-swap out-of-band sync cost")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--backend", default=d.backend)
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--png", help="write an algbw-over-time plot (paper Fig. 13(a))")
    p.add_argument("--workload", help="instead: estimate training speedup for a workload profile JSON")


def main(args: argparse.Namespace, out: TextIO) -> int:
    if args.workload:
        from .workload import main as workload_main

        return workload_main(args, out)
    cfg = LoopConfig(shape=args.shape, collective=args.collective, failure=args.failure, gpu=args.gpu,
                     message_bytes=args.size_mib * 2**20, t0_ms=args.t0_ms, t1_ms=args.t1_ms,
                     duration_ms=args.duration_ms, alpha=args.alpha, gamma=args.gamma, noise=args.noise,
                     oob_ms=args.oob_ms, seed=args.seed, backend=args.backend)
    res = run_loop(cfg)
    if args.png:
        plot(res, cfg, args.png)
    if args.json:
        print(json.dumps(res.summary), file=out)
        return 0
    s = res.summary
    print(f"closed loop: HPN {cfg.shape}, {cfg.collective}, {cfg.failure} on rank {cfg.gpu} at "
          f"{cfg.t0_ms:g} ms, {res.summary['collectives']} collectives", file=out)
    fmt = (lambda v, unit: "n/a" if v is None else f"{v:.2f} {unit}")
    for label, k, unit in (("detection", "detect_ms", "ms"), ("synthesis", "synth_ms", "ms"),
                           ("swap", "swap_ms", "ms"), ("reaction", "reaction_ms", "ms"),
                           ("algbw before", "algbw_before", "GB/s"),
                           ("algbw degraded", "algbw_degraded", "GB/s"), ("algbw after", "algbw_after", "GB/s"),
                           ("algbw final", "algbw_final", "GB/s")):
        print(f"  {label:<15} {fmt(s[k], unit)}", file=out)
    print("  versions        " + (", ".join(f"v{v['version']} at {v['t_ms']:.1f} ms" for v in s["versions"])
                                  or "none published"), file=out)
    if args.png:
        print(f"wrote {args.png}", file=out)
    return 0
