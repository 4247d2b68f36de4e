"""Per-job overhead of synthesis on Ray (mccl_runtime.ray_pool.RayPool), docs/scale.md.

A 64-GPU warm re-synthesis after Fail2 (HPN 1x8x8, AllGather and AllToAll, warm from the
healthy schedule) run ``--repeat`` times three ways: in this process (:func:`run_job`, what
the manager's thread does), through a :class:`SynthesisPool` of one process, and as a Ray
task on one of the actors of a local Ray instance.  Overhead = the wall time from ``submit`` to the result
minus the job's own seconds (measured inside the worker); medians.

    python bench/bench_ray_pool.py --repeat 10
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

from instances import fail2, hpn
from mccl_runtime.synthesizer import solver_synthesizer
from mccl_runtime.pool import SynthesisPool, run_job
from mccl_runtime.ray_pool import RayPool


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--shape", default="1x8x8")
    args = ap.parse_args()
    s, h, g = (int(x) for x in args.shape.split("x"))
    topo = hpn(s, h, g)
    failed = fail2(topo)
    synth = solver_synthesizer("highs", 10)
    factory = functools.partial(solver_synthesizer, "highs", 10)
    warm = {k: synth(k, topo, None, None) for k in ("allgather", "alltoall")}
    ray_pool = RayPool(topo, factory, num_cpus=2)
    ray_pool.start()
    proc_pool = SynthesisPool(topo, factory, workers=1)
    proc_pool.start()
    print(f"{args.shape}, {args.repeat} jobs per row, load average {os.getloadavg()[0]:.1f}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print("| collective | where | job s (median) | submit-to-result s (median) | overhead ms (median) | max |")
    print("|---|---|---|---|---|---|")
    for kind in ("allgather", "alltoall"):
        for where in ("thread", "process pool", "ray"):
            jobs, walls = [], []
            for i in range(args.repeat + 1):
                t0 = time.perf_counter()
                if where == "thread":
                    _, seconds, _ = run_job(failed, synth, kind, warm[kind], 60.0)
                else:
                    pool = ray_pool if where == "ray" else proc_pool
                    _, seconds, _ = pool.submit(kind, failed.arrays.capacity, warm[kind], 60.0).result(120.0)
                if i:                                      # the first loads the worker's state
                    walls.append(time.perf_counter() - t0)
                    jobs.append(seconds)
            over = [1e3 * (w - j) for w, j in zip(walls, jobs)]
            print(f"| {kind} | {where} | {statistics.median(jobs):.4f} | {statistics.median(walls):.4f} | "
                  f"{statistics.median(over):.1f} | {max(over):.1f} |")
    print(f"warm schedules put in Ray's object store: {ray_pool.puts} (one per collective)")
    ray_pool.shutdown()
    proc_pool.shutdown()


if __name__ == "__main__":
    main()
