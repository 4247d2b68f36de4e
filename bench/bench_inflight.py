"""The in-flight switch on CPU gloo ranks (docs/executor.md, "In-flight switch").

    python bench/bench_inflight.py [--world 8] [--kib 256] [--iters 10]

Two tables.  **Cost**: per-collective time of an AllToAll with ``pieces = 1, 4, 8, 16``
(one 16-byte all-reduce per piece boundary, plus the copies of each piece), no version
change, medians over ranks and iterations.  **Benefit**: version 1 is slowed by
``--slow-ms`` per message (a degraded link: every message waits), version 2 is not; version 2
reaches the ranks ``--arrive-ms`` into one collective.  Without pieces that collective
runs version 1 to its end; with pieces the ranks switch at the next agreed boundary.
The row reports that collective's time and the piece it switched at.  The ``abort`` rows
run whole collectives with :class:`~executor_cuda.abort.StaleAbort` (one 8-byte
all-reduce per collective; the stale collective is given up once the swap round decided
version 2 and re-run on it, docs/executor.md "Aborting a stale collective").  8 ranks on a
shared 2-core machine: absolute times are the machine's; compare within one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import executor_cuda.communicator  # noqa: E402,F401  (imported before forking)
from executor_cuda.launch import run_ranks  # noqa: E402
from instances import hpn  # noqa: E402
from mccl_opt.baselines import rail_alltoall  # noqa: E402


class _SlowOld:
    """Version 1 runs as if every link carried ``mb_s`` MB/s (a message is posted
    ``bytes / rate`` after its round starts); version 2 is not slowed."""

    def __init__(self, mb_s: float) -> None:
        self.rate = mb_s * 1e6

    def message_delay_s(self, prog, rnd, message, nbytes) -> float:
        return nbytes / self.rate if prog.version == 1 else 0.0


def _cost(rank: int, world: int, pieces: int, every: int, numel: int, iters: int, abort: bool = False) -> list[float]:
    from executor_cuda.communicator import Communicator

    warnings.simplefilter("ignore")
    comm = Communicator(None, rail_alltoall(hpn(1, 2, world // 2), version=1), pieces=pieces,
                        check_every=every, abort=abort)
    inp, out = torch.ones(world * numel), torch.empty(world * numel)
    times = []
    for i in range(iters + 2):
        t = time.perf_counter()
        comm.all_to_all_single(out, inp)
        if i >= 2:
            times.append(time.perf_counter() - t)
    comm.close()
    return times


def _benefit(rank: int, world: int, pieces: int, numel: int, mb_s: float, arrive_s: float,
             abort: bool = False) -> dict:
    from executor_cuda.communicator import Communicator

    warnings.simplefilter("ignore")
    topo = hpn(1, 2, world // 2)
    comm = Communicator(None, rail_alltoall(topo, version=1), faults=_SlowOld(mb_s), pieces=pieces, abort=abort)
    inp, out = torch.ones(world * numel), torch.empty(world * numel)
    comm.all_to_all_single(out, inp)                       # compile, connect
    comm.all_to_all_single(out, inp)
    timer = threading.Timer(arrive_s, comm.stage, args=(rail_alltoall(topo, split=True, version=2),))
    timer.start()
    t = time.perf_counter()
    comm.all_to_all_single(out, inp)
    dt = time.perf_counter() - t
    timer.join()
    switched = comm.inflight.switches if comm.inflight is not None else []
    aborted = len(comm.aborter.aborts) if abort else 0
    comm.close()
    return {"s": dt, "switch": switched, "aborted": aborted}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=8)
    ap.add_argument("--kib", type=int, default=256, help="KiB per AllToAll block")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--slow-mb-s", type=float, default=20.0, help="version 1's rate per link, MB/s")
    ap.add_argument("--arrive-ms", type=float, default=100.0)
    args = ap.parse_args()
    numel = args.kib * 256
    print(f"cost: AllToAll, {args.world} gloo ranks, {args.kib} KiB per block, ms per collective (median)")
    base = None
    for pieces, every, abort in ((1, 1, False), (1, 1, True), (4, 1, False), (8, 1, False), (8, 4, False),
                                 (16, 1, False)):
        res = run_ranks(_cost, args.world, pieces, every, numel, args.iters, abort, timeout=600)
        med = statistics.median(x for r in res for x in r) * 1e3
        base = base or med
        print(f"  pieces {pieces:2d}, check every {every}{', abort' if abort else ''}: {med:8.2f} ms  "
              f"({med / base:.2f}x)")
    print(f"benefit: version 1 at {args.slow_mb_s:g} MB/s per link, version 2 not slowed, arriving "
          f"{args.arrive_ms:g} ms into the collective")
    for pieces, abort in ((1, False), (8, False), (16, False), (1, True)):
        res = run_ranks(_benefit, args.world, pieces, numel, args.slow_mb_s, args.arrive_ms / 1e3, abort,
                        timeout=600)
        med = statistics.median(r["s"] for r in res) * 1e3
        sw = res[0]["switch"]
        how = (f"aborted {res[0]['aborted']}x, re-run on v2" if abort
               else f"switched {'at piece ' + str(sw[0][1]) if sw else 'never'}")
        print(f"  pieces {pieces:2d}{', abort' if abort else '       '}: {med:8.1f} ms  {how}")


if __name__ == "__main__":
    main()
