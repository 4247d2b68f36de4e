"""GPU check for the executor (docs/executor.md), one script, well under five minutes.

* With 2+ GPUs: one NCCL rank per GPU.  For the rail AllToAll / AllGather schedules
  (HPN 1x2x(G/2), or direct schedules for an odd count) and several dtypes it checks
  the executor's result bit for bit against torch's ``all_to_all_single`` /
  ``all_gather_into_tensor`` and prints algbw (nccl-tests definition, README "Units and definitions")
  of both, plus the CUDA-event telemetry of the last run.
* With 1 GPU: every rank's compiled program is executed on the one device (each
  message becomes a device copy between the ranks' buffers, timed with CUDA events by
  :class:`executor_cuda.telemetry.Telemetry`), checked against the expected result,
  and the per-collective time and the telemetry's bandwidth are printed.

    python bench/gpu_check.py            # on the GPU machine
    python bench/gpu_check.py --device cpu --ranks 4   # dry run of the 1-device path

Exit status 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from mccl_opt.lowering.program import OUT, compile_schedule, direct_schedule  # noqa: E402
from mccl_opt.baselines import rail_allgather, rail_alltoall  # noqa: E402
from instances import hpn  # noqa: E402

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8)
SIZES_MB = (1, 16, 64)


def _schedules(n: int) -> list:
    if n >= 4 and n % 2 == 0:
        topo = hpn(1, 2, n // 2)
        return [rail_alltoall(topo, split=True), rail_allgather(topo, split=True)]
    gpus = tuple(f"gpu{i}" for i in range(n))
    return [direct_schedule("alltoall", gpus, 1), direct_schedule("allgather", gpus, 1)]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------- multi-GPU NCCL
def _nccl_rank(rank: int, world: int, port: int, iters: int, q) -> None:
    import torch.distributed as dist

    from executor_cuda.communicator import Communicator
    from executor_cuda.telemetry import Telemetry

    warnings.simplefilter("ignore")
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, device_id=dev)
    tel = Telemetry(flush_interval=None)
    comm = Communicator(None, _schedules(world), pipeline=2, telemetry=tel, hot_swap=False)
    rows, ok = [], True
    for dtype in DTYPES:                          # correctness, uneven sizes included
        for numel in (world * 1000 + world, world * 7):
            g = torch.Generator(device=dev).manual_seed(rank)
            size = torch.empty(0, dtype=dtype).element_size()
            x = torch.randint(0, 256, (numel * size,), generator=g, device=dev,
                              dtype=torch.uint8).view(dtype)
            a, b = torch.empty_like(x), torch.empty_like(x)
            comm.all_to_all_single(a, x)
            dist.all_to_all_single(b, x)
            ok &= torch.equal(a.view(torch.uint8), b.view(torch.uint8))
            s = x[:numel // world]
            comm.all_gather_into_tensor(a, s)
            dist.all_gather_into_tensor(b, s)
            ok &= torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    for mb in SIZES_MB:                            # algbw, float32
        numel = mb * (1 << 20) // 4 // world * world
        x = torch.rand(numel, device=dev)
        y = torch.empty_like(x)
        s = x[:numel // world]
        for name, fn in (("alltoall torch", lambda: dist.all_to_all_single(y, x)),
                         ("alltoall mccl", lambda: comm.all_to_all_single(y, x)),
                         ("allgather torch", lambda: dist.all_gather_into_tensor(y, s)),
                         ("allgather mccl", lambda: comm.all_gather_into_tensor(y, s))):
            fn()
            _sync(dev)
            dist.barrier()
            t = time.perf_counter()
            for _ in range(iters):
                fn()
            _sync(dev)
            sec = (time.perf_counter() - t) / iters
            rows.append((name, mb, sec * 1e3, numel * 4 / sec / 1e9))
    _sync(dev)
    samples = tel.drain()
    q.put((rank, ok, rows, [(s.src, s.dst, s.gbps) for s in samples[:4]]))
    dist.destroy_process_group()


def multi_gpu(n: int, iters: int) -> bool:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=_nccl_rank, args=(r, n, port, iters, q)) for r in range(n)]
    for p in procs:
        p.start()
    results = sorted(q.get(timeout=240) for _ in procs)
    for p in procs:
        p.join(30)
    ok = all(r[1] for r in results)
    print(f"NCCL, {n} GPUs: bit-exact vs torch for {len(DTYPES)} dtypes: {'PASS' if ok else 'FAIL'}")
    print(f"{'collective':16} {'MB/rank':>7} {'ms':>8} {'algbw GB/s':>10}")
    for name, mb, ms, bw in results[0][2]:
        print(f"{name:16} {mb:7d} {ms:8.3f} {bw:10.2f}")
    print("telemetry (rank 0, first links):", results[0][3])
    return ok


# --------------------------------------------------------------------- one device
def one_device(device: torch.device, ranks: int, iters: int) -> bool:
    """Run every rank's program on one device; messages are device copies."""
    from executor_cuda.telemetry import Telemetry

    ok = True
    print(f"one device ({device}): {ranks} emulated ranks, programs executed on-device")
    print(f"{'schedule':10} {'MB out':>7} {'rounds':>6} {'ms/coll':>8} {'copy GB/s':>9} "
          f"{'telemetry GB/s':>14} {'check':>5}")
    for sched in _schedules(ranks):
        for mb in SIZES_MB:
            numel = mb * (1 << 20) // 4 // ranks
            inputs = [torch.rand(numel * (ranks if sched.collective == "alltoall" else 1),
                                 device=device) for _ in range(ranks)]
            prog = compile_schedule(sched, numel, 2)
            tel = Telemetry(flush_interval=None)
            outs = None
            _sync(device)
            t = time.perf_counter()
            for _ in range(iters):
                outs = _emulate(prog, inputs, ranks * numel, tel, device)
            _sync(device)
            sec = (time.perf_counter() - t) / iters
            if sched.collective == "alltoall":
                want = [torch.cat([inputs[s][d * numel:(d + 1) * numel] for s in range(ranks)])
                        for d in range(ranks)]
            else:
                want = [torch.cat(inputs)] * ranks
            good = all(torch.equal(o, w) for o, w in zip(outs, want))
            ok &= good
            moved = sum(m.numel for m in prog.messages) * 4
            samples = tel.drain()
            tgbps = (sum(s.bytes for s in samples) / max(1e-12, sum(s.seconds for s in samples))
                     / 1e9)
            print(f"{sched.collective:10} {mb:7d} {prog.num_rounds:6d} {sec * 1e3:8.3f} "
                  f"{moved / sec / 1e9:9.2f} {tgbps:14.2f} {'ok' if good else 'FAIL':>5}")
    return ok


def _emulate(prog, inputs: list, out_numel: int, tel, device: torch.device) -> list:
    n = len(prog.ranks)
    bufs = [(inputs[r], torch.empty(out_numel, device=device, dtype=inputs[r].dtype),
             torch.empty(prog.ranks[r].stage_numel, device=device, dtype=inputs[r].dtype))
            for r in range(n)]
    for r, rp in enumerate(prog.ranks):
        for s, d in rp.copies:
            bufs[r][d.buf].narrow(0, d.offset, d.length).copy_(
                bufs[r][s.buf].narrow(0, s.offset, s.length))
    cuda = device.type == "cuda"
    for t in range(prog.num_rounds):
        msgs = [m for m in prog.messages if m.round == t]
        payload = []
        for m in msgs:   # all sends of a round read before any receive lands
            start = _event(cuda) if cuda else time.perf_counter()
            data = torch.cat([bufs[m.src][s.buf].narrow(0, s.offset, s.length) for s in m.src_segs])
            payload.append((m, data, start))
        for m, data, start in payload:
            pos = 0
            for s in m.dst_segs:
                bufs[m.dst][s.buf].narrow(0, s.offset, s.length).copy_(data.narrow(0, pos, s.length))
                pos += s.length
            nbytes = data.numel() * data.element_size()
            if cuda:
                tel.record_cuda(f"r{m.src}", f"r{m.dst}", nbytes, start, _event(True), 0)
            else:
                tel.record(f"r{m.src}", f"r{m.dst}", nbytes, time.perf_counter() - start, 0)
    return [b[OUT] for b in bufs]


def _event(cuda: bool):
    if not cuda:
        return None
    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    return ev


def main() -> int:
    ap = argparse.ArgumentParser(description="executor GPU check (docs/executor.md)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--ranks", type=int, default=8, help="emulated ranks on one device")
    ap.add_argument("--iters", type=int, default=10)
    args = ap.parse_args()
    t0 = time.time()
    n = torch.cuda.device_count() if args.device == "cuda" else 0
    if args.device == "cuda" and n == 0:
        print("no CUDA device visible; use --device cpu for a dry run")
        return 1
    ok = multi_gpu(n, args.iters) if n >= 2 else one_device(
        torch.device("cuda", 0) if n else torch.device("cpu"), args.ranks, args.iters)
    print(f"{'PASS' if ok else 'FAIL'} in {time.time() - t0:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
