"""CPU seconds of lowering a schedule into the executor's global round program (issue 26:
``Communicator.prepare`` lowers every new version on the loop's reaction path;
docs/executor.md "Compiler").

``python bench/bench_lowering.py [--repeat R] [--block E]``

For each schedule (synthesized first, not timed): GPUs, chunks, hops (GPU-to-GPU hops of
every chunk x pipeline slices), messages of the program, and the best of ``R`` (default 3)
CPU times of :func:`~mccl_opt.lowering.program.compile_schedule` at ``E`` elements per
block (default 65536) for pipeline 1 and 2, with microseconds per hop.  The script imports
the package of the checkout it sits in, so compare two checkouts by running each one's
own copy back to back.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_allgather_quotient import fabric                      # noqa: E402
from instances import hpn                                               # noqa: E402
from mccl_opt.allgather import solve_allgather                          # noqa: E402
from mccl_opt.alltoall import solve_alltoall                            # noqa: E402
from mccl_opt.baselines import pxn_alltoall                             # noqa: E402
from mccl_opt.lowering.program import compile_schedule                  # noqa: E402
from mccl_opt.schedule import Schedule                                  # noqa: E402

CASES: dict[str, Callable[[], Schedule]] = {
    "ag general shared-agg 2x8x8 @200": lambda: solve_allgather(fabric("shared-agg:2x8x8:200"), max_chunks=None),
    "ag general hpn 2x8x8 @150.8": lambda: solve_allgather(fabric("hpn:2x8x8:150.8"), max_chunks=None),
    "ag K=10 leaf-spine 2x8x8 @200": lambda: solve_allgather(fabric("leaf-spine:2x8x8:200"), max_chunks=10),
    "ag K=64 shared-agg 2x8x8 @150.8": lambda: solve_allgather(fabric("shared-agg:2x8x8:150.8"), max_chunks=64),
    "a2a lp hpn 1x4x8 @150": lambda: solve_alltoall(fabric("hpn:1x4x8:150")),
    "a2a pxn hpn 2x8x8": lambda: pxn_alltoall(hpn(2, 8, 8)),
}


def gpu_hops(schedule: Schedule) -> int:
    """GPU-to-GPU hops of all chunks (one slice each)."""
    gpus = set(schedule.gpus)
    if schedule.collective == "allgather":
        return sum(len(c.edges) for c in schedule.chunks)
    return sum(sum(v in gpus for v in c.path) - 1 for c in schedule.chunks)


def best_cpu(schedule: Schedule, block: int, pipeline: int, repeat: int) -> tuple[float, int]:
    """Best CPU seconds of ``repeat`` lowerings, and the program's message count."""
    best, msgs = float("inf"), 0
    for _ in range(repeat):
        t = time.process_time()
        prog = compile_schedule(schedule, block, pipeline)
        best = min(best, time.process_time() - t)
        msgs = len(prog.messages)
    return best, msgs


def main(argv: list[str]) -> None:
    repeat, block = 3, 1 << 16
    it = iter(argv)
    for a in it:
        if a == "--repeat":
            repeat = int(next(it))
        elif a == "--block":
            block = int(next(it))
    print(f"{'schedule':34s} {'gpus':>5s} {'chunks':>7s} {'P':>2s} {'hops':>8s} {'msgs':>7s} "
          f"{'cpu s':>7s} {'us/hop':>7s}")
    for name, make in CASES.items():
        schedule = make()
        hops = gpu_hops(schedule)
        for pipeline in (1, 2):
            cpu, msgs = best_cpu(schedule, block, pipeline, repeat)
            print(f"{name:34s} {len(schedule.gpus):5d} {len(schedule.chunks):7d} {pipeline:2d} "
                  f"{hops * pipeline:8d} {msgs:7d} {cpu:7.3f} {cpu / (hops * pipeline) * 1e6:7.2f}",
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
