"""Per-message cost of gloo CPU ranks against the pipeline fill that pieces save (issue 26;
docs/executor.md "Pieces per chunk").

    python bench/bench_piece_cost.py [--world 8] [--iters 15] [--block-kib 32]

The healthy HPN 1x2x4 AllGather (16 MiB per GPU, as ``bench/bench_executor_loop.py``: blocks
of ``--block-kib`` real KiB stand for the 16 MiB shards) lowered with 1, 2, 4, 8, 16 slices
per chunk, with the simulator's piece rule on fabric bytes (``sim``, :mod:`mccl_opt.piece_rule`)
and with the real-rank runs' rule (``gloo``, :func:`~executor_cuda.scenario_run.rank_pipeline`), run on
``world`` forked gloo ranks with no emulated link (what gloo alone costs): rounds and
messages of the program, median real ms per collective (slowest rank), and the cost per
round and per message beyond pipeline 1; then the fabric time the emulator gives each
lowering (:meth:`~executor_cuda.faults.FabricEmulator.program_time_s`, lock step) at the
scale where pipeline 1 takes 60 ms, the real-rank runs' healthy collective.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import executor_cuda.communicator  # noqa: E402,F401  (imported before forking)
from executor_cuda.launch import run_ranks  # noqa: E402
from mccl_opt.lowering.program import compile_schedule  # noqa: E402
from executor_cuda.scenario_run import GlooLoopConfig, rank_pipeline  # noqa: E402
from mccl_opt.piece_rule import PieceRule  # noqa: E402

MESSAGE = 16 * 2**20


def _lowerings(byte_scale: float) -> list[tuple[str, object]]:
    return [(str(p), p) for p in (1, 2, 4, 8, 16)] + [
        ("sim", PieceRule(element_bytes=4.0 * byte_scale)),
        ("gloo", rank_pipeline(GlooLoopConfig(), MESSAGE, byte_scale))]


def _rank(rank: int, world: int, sched, block: int, byte_scale: float, iters: int) -> list[float]:
    from executor_cuda.communicator import Communicator

    warnings.simplefilter("ignore")
    shard = torch.rand(block)
    out = torch.empty(world * block)
    res = []
    for _, pipe in _lowerings(byte_scale):
        comm = Communicator(None, sched, pipeline=pipe, hot_swap=False)
        for _ in range(3):
            comm.all_gather_into_tensor(out, shard)
        times = []
        for _ in range(iters):
            dist.barrier()
            t = time.perf_counter()
            comm.all_gather_into_tensor(out, shard)
            times.append(time.perf_counter() - t)
        res.append(statistics.median(times))
        comm.close()
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--block-kib", type=float, default=32.0)
    args = ap.parse_args()
    from executor_cuda.faults import FabricEmulator
    from instances import hpn
    from mccl_runtime.synthesizer import solver_synthesizer

    topo = hpn(1, 2, args.world // 2)
    sched = solver_synthesizer()("allgather", topo, None, None)
    block = int(args.block_kib * 1024 // 4)
    byte_scale = MESSAGE / (4.0 * block)
    emu = FabricEmulator(topo, sched.gpus, time_scale=1.0, byte_scale=byte_scale)
    progs = [(name, compile_schedule(sched, block, pipe)) for name, pipe in _lowerings(byte_scale)]
    fabric = [emu.program_time_s(p, 4) for _, p in progs]
    scale = 0.060 / fabric[0]
    per_rank = run_ranks(_rank, args.world, sched, block, byte_scale, args.iters, timeout=600)
    real = [max(r[i] for r in per_rank) for i in range(len(progs))]
    print(f"HPN {topo.name}, AllGather {len(sched.chunks)} chunks, {args.world} gloo ranks, "
          f"{args.block_kib:g} real KiB per shard for 16 MiB (x{byte_scale:g}), no emulated links")
    print(f"{'slices':>6s} {'rounds':>6s} {'msgs':>6s} {'real ms':>8s} {'ms/round+':>9s} {'ms/msg+':>8s} "
          f"{'fabric ms @60':>13s} {'sum ms':>7s}")
    r0, m0 = progs[0][1].num_rounds, len(progs[0][1].messages)
    for (name, p), t, f in zip(progs, real, fabric):
        dr, dm = p.num_rounds - r0, len(p.messages) - m0
        per_r = f"{1e3 * (t - real[0]) / dr:9.2f}" if dr else f"{'':9s}"
        per_m = f"{1e3 * (t - real[0]) / dm:8.3f}" if dm else f"{'':8s}"
        print(f"{name:>6s} {p.num_rounds:6d} {len(p.messages):6d} {1e3 * t:8.2f} {per_r} {per_m} "
              f"{1e3 * f * scale:13.1f} {1e3 * (f * scale + t):7.1f}")


if __name__ == "__main__":
    main()
