"""Simulator benchmark: wall time per fabric size and mode, and the Figure 9 speedups.

Smoke (CI): ``pytest bench/bench_sim.py --benchmark-disable``.
Tables:
    python bench/bench_sim.py sim 1x8x8 1x16x8 1x64x8      # simulation time, 64/128/512 GPUs
    python bench/bench_sim.py eval 1x4x8 1x16x8            # speedup table (paper Figure 9)

The AllToAll schedule is a 10-chunk one (5 chunks of every cross-rail pair on the PXN
path, 5 on the direct path); the AllGather schedule is the NCCL ring (one ring per rail).
Each row pairs the time with quality: ``efficiency`` = claimed-rate time / simulated time.
"""

from __future__ import annotations

import sys
import time

from instances import hpn
from mccl_opt.baselines import direct_alltoall, pxn_alltoall, ring_allgather
from mccl_opt.schedule import PathChunk, Schedule
from mccl_opt.sim import simulate
from mccl_opt.topology import Topology

MIB = 2**20


def ten_chunk_alltoall(topo: Topology) -> Schedule:
    """5 chunks per pair on the PXN path and 5 on the direct path (same path if equal)."""
    chunks = []
    for p, d in zip(pxn_alltoall(topo).chunks, direct_alltoall(topo).chunks):
        chunks += [PathChunk(p.src, p.dst, 0.1, p.path)] * 5 + [PathChunk(d.src, d.dst, 0.1, d.path)] * 5
    from mccl_opt.schedule import schedule_rate, share_loads

    rate = schedule_rate(topo, share_loads(topo, chunks))
    return Schedule("alltoall", topo.name, topo.gpus, rate, rate, 10, chunks)


MODES = {"fluid": {"fluid": True}, "pieces=1": {"pieces": 1}, "512KiB": {}}


def sim_rows(shape: tuple[int, int, int], modes: list[str]) -> list[dict]:
    topo = hpn(*shape)
    n = topo.num_gpus
    rows = []
    for coll, build, block in (("alltoall", ten_chunk_alltoall, 128 * MIB / n),
                               ("allgather", ring_allgather, 128 * MIB)):
        t = time.perf_counter()
        sched = build(topo)
        t_build = time.perf_counter() - t
        for mode in modes:
            t = time.perf_counter()
            res = simulate(topo, sched, block, **MODES[mode])
            rows.append({"fabric": topo.name, "gpus": n, "collective": coll, "mode": mode,
                         "chunks": len(sched.chunks), "streams": res.num_streams,
                         "events": res.num_events, "build_s": t_build,
                         "sim_s": time.perf_counter() - t, "efficiency": res.efficiency,
                         "algbw": res.algbw_gbytes_per_s})
    return rows


def test_smoke_sim(benchmark):
    topo = hpn(1, 2, 4)
    sched = ten_chunk_alltoall(topo)
    res = benchmark(simulate, topo, sched, 4 * MIB)
    assert 0.9 < res.efficiency <= 1.0 + 1e-9


def _print(rows: list[dict], cols: list[str]) -> None:
    print(" ".join(f"{c:>12s}" for c in cols))
    for r in rows:
        print(" ".join(f"{r[c]:>12.4g}" if isinstance(r[c], float) else f"{r[c]!s:>12s}" for c in cols),
              flush=True)


if __name__ == "__main__":
    what, *shapes = sys.argv[1:] or ["sim", "1x8x8"]
    parsed = [tuple(int(x) for x in s.split("x")) for s in shapes]
    simulate(hpn(1, 2, 2), ring_allgather(hpn(1, 2, 2)), MIB)   # compile the kernel first
    if what == "sim":
        for shape in parsed:
            modes = ["fluid", "pieces=1"] + (["512KiB"] if shape[0] * shape[1] * shape[2] <= 64 else [])
            _print(sim_rows(shape, modes), ["fabric", "gpus", "collective", "mode", "chunks", "streams",
                                            "events", "build_s", "sim_s", "efficiency", "algbw"])
    else:
        from instances import apply_failure
        from mccl_opt.evaluate import run_failure_experiment

        for shape in parsed:
            for coll in ("allgather", "alltoall"):
                topo = hpn(*shape)
                failures = {f: apply_failure(topo, f) for f in ("fail1", "fail2", "fail3")}
                _print(run_failure_experiment(topo, coll, failures),
                       ["topology", "collective", "failure", "baseline_algbw", "no_reopt_algbw",
                        "reopt_algbw", "no_reopt_speedup", "reopt_speedup", "reopt_needed"])
