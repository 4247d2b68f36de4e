"""Command line of the closed loop (``mccl loop``, registered by :mod:`.cli`): the
built-in case's flags or a ``mccl-scenario/1`` file, the table, ``--json`` and
``--png`` (docs/runtime.md)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from mccl_opt.number_args import float_arg, int_arg

from .loop import LoopConfig, run_loop
from .loop_report import builtin_summary, plot, public_summary
from .scenario import load_scenario
from .telemetry import CLI_ESTIMATOR, ESTIMATORS

__all__ = ["add_arguments", "main"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = LoopConfig()
    p.add_argument("--scenario", help="mccl-scenario/1 file (replaces the built-in case's flags)")
    p.add_argument("--shape", default=d.shape, help="HPN SxHxN of the built-in case (default %(default)s)")
    p.add_argument("--collective", choices=["allgather", "alltoall"], default=d.collective,
                   help="collective of the built-in case (default %(default)s)")
    p.add_argument("--fail", dest="failure", choices=["fail1", "fail2"], default=d.failure,
                   help="paper failure injected at --t0-ms (default %(default)s)")
    p.add_argument("--gpu", type=int_arg, default=d.gpu, help="rank hit by the failure (default %(default)s)")
    p.add_argument("--size-mib", type=float_arg, default=d.message_bytes / 2**20,
                   help="per-GPU shard (AllGather) or per-pair block (AllToAll) in MiB")
    p.add_argument("--t0-ms", type=float_arg, default=d.t0_ms, help="failure time, ms (default %(default)s)")
    p.add_argument("--t1-ms", type=float_arg, default=None, help="failure clears at this time (optional)")
    p.add_argument("--duration-ms", type=float_arg, default=d.duration_ms,
                   help="simulated time, ms (default %(default)s)")
    p.add_argument("--noise", type=float_arg, default=d.noise, help="telemetry noise (relative std)")
    p.add_argument("--seed", type=int_arg, default=d.seed, help="telemetry noise seed (default %(default)s)")
    p.add_argument("--estimator", choices=list(ESTIMATORS), default=CLI_ESTIMATOR,
                   help="link estimate: the change-point level or the paper's EWMA (--alpha); "
                        "default %(default)s, as `mccl controller serve`")
    p.add_argument("--alpha", type=float_arg, default=d.alpha, help="EWMA smoothing factor (--estimator ewma)")
    p.add_argument("--gamma", type=float_arg, default=d.gamma, help="Algorithm 1 threshold")
    p.add_argument("--probe-period-ms", type=float_arg, default=d.probe_period_ms,
                   help="probe links held below nominal this often (0: never)")
    p.add_argument("--oob-ms", type=float_arg, default=d.oob_ms, help="hot-swap out-of-band sync cost")
    p.add_argument("--cold-gpus", type=int_arg, default=d.cold_gpus,
                   help="simulated loop: re-synthesize cold, not warm, on fabrics of at most this many GPUs "
                        "(equal-rate warm optima can simulate slower; default %(default)s, 0: always warm)")
    p.add_argument("--synth-clock", choices=["wall", "cpu"], default=d.synth_clock,
                   help="simulated loop: time synthesis on the wall clock or on the process's CPU time "
                        "(not inflated by other processes' load; default %(default)s)")
    p.add_argument("--speculate", action="store_true",
                   help="start synthesis on early estimates of a change still being confirmed, when no cable "
                        "is read in one direction only; publish only once it is confirmed (Policy.speculate)")
    p.add_argument("--backend", default=d.backend, help="LP backend of the synthesizers (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--png", help="write an algbw-over-time plot (paper Fig. 13(a))")
    p.add_argument("--workload", help="instead: estimate training speedup for a workload profile JSON")


def _fmt(v: Any, unit: str) -> str:
    return "n/a" if v is None else f"{v:.2f} {unit}"


def main(args: argparse.Namespace, out: TextIO) -> int:
    if args.workload:
        from .workload import main as workload_main

        return workload_main(args, out)
    cfg = LoopConfig(shape=args.shape, collective=args.collective, failure=args.failure, gpu=args.gpu,
                     message_bytes=args.size_mib * 2**20, t0_ms=args.t0_ms, t1_ms=args.t1_ms,
                     duration_ms=args.duration_ms, noise=args.noise, seed=args.seed, estimator=args.estimator,
                     alpha=args.alpha, gamma=args.gamma, probe_period_ms=args.probe_period_ms,
                     oob_ms=args.oob_ms, backend=args.backend, cold_gpus=args.cold_gpus,
                     synth_clock=args.synth_clock, speculate=args.speculate)
    scenario = load_scenario(args.scenario) if args.scenario else None
    res = run_loop(cfg, scenario=scenario)
    scn = res.scenario
    title = f"{scn.topology.name} {scn.collective}, {scn.message_bytes / 2**20:g} MiB"
    if args.png:
        plot(res, args.png, title)
    if args.json:
        summary = public_summary(res.summary) if scenario else builtin_summary(res.summary, cfg)
        print(json.dumps(summary), file=out)
        return 0
    s = res.summary
    print(f"closed loop: {title}, {len(scn.events)} event(s), {s['collectives']} collectives, "
          f"healthy {_fmt(s['algbw_healthy'], 'GB/s')}, false swaps {s['false_swaps']}", file=out)
    for ev in s["events"]:
        print(f"event at {ev['t_ms']:g} ms ({ev['kind']})", file=out)
        for label, k, unit in (("detection", "detect_ms", "ms"), ("synthesis", "synth_ms", "ms"),
                               ("swap", "swap_ms", "ms"), ("reaction", "reaction_ms", "ms"),
                               ("algbw before", "algbw_before", "GB/s"), ("algbw degraded", "algbw_degraded", "GB/s"),
                               ("algbw after", "algbw_after", "GB/s"), ("algbw final", "algbw_final", "GB/s"),
                               ("algbw offline", "algbw_offline", "GB/s"), ("at 0.95 offline", "recovered_ms", "ms"),
                               ("lost to aborts", "lost_ms", "ms")):
            print(f"  {label:<15} {_fmt(ev[k], unit)}", file=out)
        ratio = ev["recovery_ratio"]
        print(f"  recovery ratio  {'n/a' if ratio is None else f'{ratio:.3f}'}", file=out)
        print("  versions        " + (", ".join(f"v{v['version']} at {v['t_ms']:.1f} ms" for v in ev["versions"])
                                      or "none published"), file=out)
        first = ev["first_version"]
        print(f"  first run       {'none' if first is None else f'v{first}'}", file=out)
    if args.png:
        print(f"wrote {args.png}", file=sys.stderr)
    return 0
