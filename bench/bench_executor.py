"""Executor benchmarks on CPU gloo ranks (docs/executor.md): executor time against torch's own
collectives, telemetry overhead, and hot-swap latency (paper §6.2.2: swap 11.6 ms of
which OOB synchronization 5.74 ms, on an 8-GPU prototype).

    python bench/bench_executor.py [--world 8] [--iters 20]

Everything runs as forked processes on this machine, so absolute times reflect the
machine's cores (8 ranks on 2 cores oversubscribe it); the table reports medians and
ratios.  Hot-swap rows: ``stage`` compiles the staged version for the last size,
``arrive`` waits for every rank to reach the round (store, not paused), ``oob`` is the
exchange during which issuing is paused, ``total`` is the swap round end to end.  The
last table times the paused exchange alone, interleaved so that all three see the same
load: the former pickled ``all_gather_object`` (two collectives), a ring
``all_gather_single`` of the int64 row, and the one-hop ``all_to_all_single`` of the
replicated row that the rescheduler uses.
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
import executor_cuda.rescheduler  # noqa: E402,F401
from executor_cuda.launch import run_ranks  # noqa: E402
from mccl_opt.baselines import rail_allgather, rail_alltoall  # noqa: E402
from executor_cuda.rescheduler import ROW_LEN, encode_row  # noqa: E402
from instances import hpn  # noqa: E402

SIZES_KB = (16, 256, 2048)


def _time(fn, iters: int) -> float:
    fn()
    dist.barrier()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _collectives(rank: int, world: int, iters: int) -> list[tuple]:
    from executor_cuda.communicator import Communicator
    from executor_cuda.telemetry import Telemetry

    warnings.simplefilter("ignore")
    topo = hpn(1, 2, world // 2)
    scheds = [rail_alltoall(topo, split=True), rail_allgather(topo)]
    plain = Communicator(None, scheds, hot_swap=False)
    tel = Telemetry(capacity=1 << 16, flush_interval=0.05)
    measured = Communicator(None, scheds, hot_swap=False, telemetry=tel)
    rows = []
    for kb in SIZES_KB:
        numel = kb * 256 // world * world                      # float32 elements per rank
        x = torch.rand(numel)
        y = torch.empty_like(x)
        shard = torch.rand(numel // world)
        rows.append(("alltoall", kb,
                     _time(lambda: dist.all_to_all_single(y, x), iters),
                     _time(lambda: plain.all_to_all_single(y, x), iters),
                     _time(lambda: measured.all_to_all_single(y, x), iters)))
        rows.append(("allgather", kb,
                     _time(lambda: dist.all_gather_into_tensor(y, shard), iters),
                     _time(lambda: plain.all_gather_into_tensor(y, shard), iters),
                     _time(lambda: measured.all_gather_into_tensor(y, shard), iters)))
    measured.close()
    return rows + [("dropped", tel.dropped, tel.recorded)]


def _hot_swap(rank: int, world: int, swaps: int) -> list[tuple]:
    from executor_cuda.communicator import Communicator

    warnings.simplefilter("ignore")
    topo = hpn(1, 2, world // 2)
    comm = Communicator(None, rail_alltoall(topo, version=1))
    x = torch.rand(64 * world)
    y = torch.empty_like(x)
    for v in range(2, swaps + 2):
        comm.stage(rail_alltoall(topo, split=v % 2 == 0, version=v))
        for _ in range(5):
            comm.all_to_all_single(y, x)
        comm.rescheduler.wait(timeout=30)
    out = [(e.stage_s, e.arrive_s, e.oob_s, e.total_s, e.outcome) for e in comm.rescheduler.events]
    comm.close()
    return out


def _oob_exchange(rank: int, world: int, iters: int) -> dict[str, float]:
    """Median seconds of each way to exchange the OOB rows, interleaved per iteration."""
    from datetime import timedelta

    group = dist.new_group(list(range(world)), backend="gloo", timeout=timedelta(seconds=30))
    row = encode_row(1, "alltoall", 2, 1234, [2])
    send, rows = row.repeat(world, 1), torch.empty((world, ROW_LEN), dtype=torch.int64)
    ways = {
        "all_gather_object (before)": lambda: dist.all_gather_object(
            [None] * world, (1, "alltoall", [2], 1234), group=group),
        "all_gather_single int64 row": lambda: dist.all_gather_single(
            rows.view(-1), row, group=group),
        "all_to_all_single int64 row (now)": lambda: dist.all_to_all_single(
            rows.view(-1), send.view(-1), group=group),
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(iters):
        for name, fn in ways.items():
            dist.barrier(group=group)
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--swaps", type=int, default=10)
    args = ap.parse_args()

    res = run_ranks(_collectives, args.world, args.iters, timeout=600)
    print(f"executor vs torch on {args.world} gloo ranks (median of {args.iters}, rank 0)")
    print(f"{'collective':10} {'KB/rank':>8} {'torch ms':>9} {'mccl ms':>8} {'ratio':>6} "
          f"{'+telem ms':>9} {'overhead':>8}")
    for coll, kb, t_torch, t_mccl, t_tel in res[0][:-1]:
        print(f"{coll:10} {kb:8d} {t_torch * 1e3:9.2f} {t_mccl * 1e3:8.2f} {t_mccl / t_torch:6.2f} "
              f"{t_tel * 1e3:9.2f} {100 * (t_tel / t_mccl - 1):7.1f}%")
    print(f"telemetry samples recorded {res[0][-1][2]}, dropped {res[0][-1][1]}")

    ev = run_ranks(_hot_swap, args.world, args.swaps, timeout=600)
    flat = [e for rank in ev for e in rank]
    switched = sum(e[-1] == "switch" for e in flat)
    print(f"\nhot-swap on {args.world} gloo ranks: {switched}/{len(flat)} rank-rounds switched "
          "(paper: swap 11.6 ms, OOB 5.74 ms)")
    for i, name in enumerate(("stage", "arrive", "oob (paused)", "total")):
        vals = [e[i] * 1e3 for e in flat]
        print(f"  {name:13} median {statistics.median(vals):7.2f} ms   max {max(vals):7.2f} ms")

    oob = run_ranks(_oob_exchange, args.world, 3 * args.iters, timeout=600)
    print(f"\nOOB exchange alone on {args.world} gloo ranks (median over ranks of each "
          f"rank's median of {3 * args.iters})")
    ref = statistics.median(r["all_gather_object (before)"] for r in oob)
    for name in oob[0]:
        t = statistics.median(r[name] for r in oob)
        print(f"  {name:34} {t * 1e3:7.2f} ms   {t / ref:5.2f} x before")


if __name__ == "__main__":
    main()
