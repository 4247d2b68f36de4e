"""Why AllToAll on gloo ranks recovers 0.54-1.05 of offline (docs/executor.md, "AllToAll
on gloo ranks: the pair-telemetry bias").

    python bench/bench_pair_bias.py [--shape 1x2x4] [--gbps 50] [--runs 3] [--reps 12]

The ``steady`` class: GPU0 <-> its ToR (``s0h0g0 <-> s0tor0``) at ``--gbps`` of 400, an
AllToAll of 16 MiB, the scales of ``mccl loop --executor gloo`` (32 KiB blocks, 60 ms
per healthy collective).  The controller sees the link only through the ``pair`` samples
of the GPU pair that crosses it (``s0h0g0 <-> s0h1g0`` on one-segment HPN), so what
matters is the level ``X`` the ranks report for that pair.

1. **Sensitivity** (no ranks): the controller's warm re-synthesis from the healthy
   schedule, given the link at ``X`` (as pair samples of both directions into a
   ``MeasurementStore``), run on the true fabric by the emulator's step model: offline /
   that schedule's time, for ``X`` around the truth.
2. **Model-only reading** (no ranks): what the ranks' :class:`ModelReporter` reports for
   the pair when every message takes exactly its emulated time (no gloo cost): under the
   healthy schedule (before the swap) and under the offline one (after).
3. **gloo reading**: ``--runs`` runs of 8 forked gloo ranks: 5 healthy warm-ups (the
   reporter's calibration), then ``--reps`` collectives of the healthy schedule on the
   degraded fabric; per run, the reported level of the pair (the reporter's median of 3,
   last value and range over the collectives), and each message's measured minus
   emulated time, split by how many messages the receiving rank waits for in that round.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402,F401  (imported before the ranks fork)

from executor_cuda.launch import run_ranks  # noqa: E402

NIC = ("s0h0g0", "s0tor0")
PAIR = ("s0h0g0", "s0h1g0")


def _caps(topo, gbps: float) -> np.ndarray:
    cap = topo.arrays.capacity.astype(float).copy()
    for a, b in (NIC, NIC[::-1]):
        cap[topo.link_index(a, b)] = gbps
    return cap


def _store_caps(topo, x: float) -> np.ndarray:
    """The controller's ``M`` after pair samples at ``x`` for both directions of ``PAIR``."""
    from mccl_runtime.telemetry import MeasurementStore

    store = MeasurementStore(topo, alpha=1.0)
    now = time.time()
    store.ingest([{"kind": "pair", "src": s, "dst": d, "gbps": x, "t": now} for s, d in (PAIR, PAIR[::-1])], now)
    return store.measured()


def _rank(rank: int, world: int, plan: dict) -> dict:
    from executor_cuda.communicator import Communicator
    from executor_cuda.faults import FabricEmulator
    from executor_cuda.reporting import pair_nominal
    from executor_cuda.scenario_rank import ModelReporter, _Workload
    from executor_cuda.telemetry import Telemetry

    warnings.simplefilter("ignore")
    topo, sched = plan["topo"], plan["healthy"]
    emu = FabricEmulator(topo, sched.gpus, time_scale=plan["time_scale"], byte_scale=plan["byte_scale"])
    emu.set_capacities(topo.arrays.capacity.astype(float))
    tel = Telemetry(flush_interval=None)
    comm = Communicator(None, sched, telemetry=tel, faults=emu, hot_swap=False)
    reporter = ModelReporter(emu, pair_nominal(topo))
    work = _Workload("alltoall", rank, world, plan["block"])
    prog = comm.cache.get(sched, plan["block"], 1)
    for i in range(5):
        work.run(comm, i)
        reporter(tel.drain(), prog, 4, time.time())
    reporter.calibrating = False
    emu.set_capacities(plan["caps"])
    delays = emu.program_delays(prog, 4)                   # (round, src, dst) -> real s
    fan_in = {}
    for (rnd, s, d) in delays:
        fan_in[(rnd, d)] = fan_in.get((rnd, d), 0) + 1
    levels, excess = [], []
    me = sched.gpus[rank]
    for i in range(plan["reps"]):
        work.run(comm, 100 + i)
        samples = tel.drain()
        for s in samples:
            if s.dst == me:
                src = sched.gpus.index(s.src)
                emulated = sum(t for (r, a, b), t in delays.items() if a == src and b == rank)
                fans = sorted({fan_in[(r, rank)] for (r, a, b) in delays if a == src and b == rank})
                excess.append((fans[-1], (s.seconds - emulated) / max(s.count, 1)))
        for out in reporter(samples, prog, 4, time.time()):
            if (out["src"], out["dst"]) in (PAIR, PAIR[::-1]):
                levels.append((out["src"], out["gbps"]))
    comm.close()
    return {"levels": levels, "excess": excess, "wrong": work.wrong}


def main() -> None:
    from executor_cuda.faults import FabricEmulator
    from executor_cuda.reporting import pair_nominal
    from executor_cuda.scenario_rank import ModelReporter
    from executor_cuda.scenario_run import GlooLoopConfig, plan_scales
    from instances import hpn
    from mccl_opt.lowering.program import compile_schedule
    from mccl_runtime.synthesizer import solver_synthesizer
    from mccl_runtime.scenario import parse_scenario

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="1x2x4")
    ap.add_argument("--gbps", type=float, default=50.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--xs", default="25,35,45,50,55,70,100,150,200")
    args = ap.parse_args()
    a, b, c = (int(x) for x in args.shape.split("x"))
    topo = hpn(a, b, c)
    scn = parse_scenario({"format": "mccl-scenario/1", "topology": f"hpn {args.shape}", "collective": "alltoall",
                          "message_bytes": 16 * 2**20, "duration_ms": 1.0, "events": []})
    synth = solver_synthesizer("highs")
    healthy = synth("alltoall", topo, None, None)
    true = _caps(topo, args.gbps)
    offline = synth("alltoall", topo.with_capacities(true), None, None)
    block, byte_scale, time_scale, _ = plan_scales(scn, healthy, GlooLoopConfig())
    emu = FabricEmulator(topo, healthy.gpus, time_scale=time_scale, byte_scale=byte_scale)

    def run_time(s) -> float:
        return emu.program_time_s(compile_schedule(s, block), 4, true)

    t_off = run_time(offline)
    print(f"AllToAll, hpn {args.shape}, {NIC[0]} <-> {NIC[1]} at {args.gbps:g} of 400 Gbps; offline "
          f"{t_off * 1e3:.1f} ms real (lock step), healthy schedule on it {run_time(healthy) * 1e3:.1f} ms")
    print("1. sensitivity: warm re-synthesis for the pair read at X, run on the true fabric")
    for x in (float(v) for v in args.xs.split(",")):
        new = synth("alltoall", topo.with_capacities(_store_caps(topo, x)), healthy, None)
        print(f"   X = {x:6.1f} Gbps: rate {new.rate_gbps:6.1f}, offline / it = {t_off / run_time(new):.2f}")

    print("2. model-only reading of the pair (no gloo cost)")
    rep = ModelReporter(emu, pair_nominal(topo))
    rank = {g: r for r, g in enumerate(healthy.gpus)}
    for label, s in (("healthy schedule (before the swap)", healthy), ("offline schedule (after)", offline)):
        prog = compile_schedule(s, block)
        exp = rep.expected(prog, 4)
        got: dict[tuple[int, int], float] = {}
        for (_, src, dst), t in emu.program_delays(prog, 4, true).items():
            got[(src, dst)] = got.get((src, dst), 0.0) + t
        reads = [f"{p[0]}->{p[1]} {400 * min(1.0, exp[(rank[p[0]], rank[p[1]])] / got[(rank[p[0]], rank[p[1]])]):.1f}"
                 for p in (PAIR, PAIR[::-1]) if (rank[p[0]], rank[p[1]]) in got]
        print(f"   {label}: {', '.join(reads) or 'the pair carries nothing'} Gbps")

    print(f"3. gloo ranks ({args.runs} runs, {args.reps} degraded collectives each, healthy schedule)")
    plan = {"topo": topo, "healthy": healthy, "caps": true, "block": block, "time_scale": time_scale,
            "byte_scale": byte_scale, "reps": args.reps}
    for run in range(args.runs):
        res = run_ranks(_rank, topo.num_gpus, plan, timeout=300)
        for src, dst in (PAIR, PAIR[::-1]):
            vals = [g for r in res for s, g in r["levels"] if s == src]
            if vals:
                print(f"   run {run}: {src}->{dst} reported {vals[-1]:.1f} Gbps (range {min(vals):.1f}-"
                      f"{max(vals):.1f}, median {statistics.median(vals):.1f}) vs true {args.gbps:g}")
        by_fan: dict[int, list[float]] = {}
        for r in res:
            for fan, x in r["excess"]:
                by_fan.setdefault(fan, []).append(x * 1e3)
        print("          measured - emulated ms per message, by messages into the receiver in that round: " +
              ", ".join(f"{k}: {statistics.median(v):.2f} (p90 {sorted(v)[int(0.9 * (len(v) - 1))]:.2f})"
                        for k, v in sorted(by_fan.items())))


if __name__ == "__main__":
    main()
