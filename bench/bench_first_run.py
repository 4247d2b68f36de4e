"""Compile cost of a fresh installation: first process, second process, second call.

    python bench/bench_first_run.py            # a fresh numba cache in a temporary folder

Each step runs in a new Python process with ``NUMBA_CACHE_DIR`` pointing at one empty
temporary folder, so the first step sees what the first process after an installation
sees:

1. ``first process``: ``mccl warmup`` with the empty cache (compiles every kernel);
2. ``second process``: a new process loads the kernels from the cache
   (:func:`mccl_runtime.warmup.load_kernels`), then solves AllToAll and AllGather on
   HPN 1x2x8 cold (Fail2) and warm (from the healthy schedule);
3. ``second call``: the same solves again in that process.

Also ``no warm-up``: a process with another empty cache that solves directly (what a
user skipping ``mccl warmup`` waits for on the first solve).  Wall seconds per step; the
solves' own ``seconds`` exclude kernel loading.  One run on a shared machine: noisy.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SOLVES = r"""
import json, sys, time
t0 = time.perf_counter()
from instances import fail2, hpn
import mccl_opt as mo
out = {"import_s": time.perf_counter() - t0}
if sys.argv[1] == "load":
    from mccl_runtime.warmup import load_kernels
    t = time.perf_counter(); load_kernels(); out["kernel_load_s"] = time.perf_counter() - t
healthy = hpn(1, 2, 8); degraded = fail2(healthy)
for rnd in ("first", "second"):
    t = time.perf_counter()
    for name, solve in (("alltoall", mo.solve_alltoall), ("allgather", mo.solve_allgather)):
        s = time.perf_counter(); before = solve(healthy); out[f"{rnd}_{name}_healthy_s"] = time.perf_counter() - s
        s = time.perf_counter(); solve(degraded); out[f"{rnd}_{name}_cold_s"] = time.perf_counter() - s
        s = time.perf_counter(); solve(degraded, warm=before); out[f"{rnd}_{name}_warm_s"] = time.perf_counter() - s
    out[f"{rnd}_all_solves_s"] = time.perf_counter() - t
out["process_s"] = time.perf_counter() - t0
print(json.dumps(out))
"""


def _run(argv: list[str], cache: str) -> tuple[float, str]:
    env = {**__import__("os").environ, "NUMBA_CACHE_DIR": cache}
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, done.stdout


def main() -> int:
    mccl = [sys.executable, "-m", "mccl_opt.cli"]
    rows = {}
    with tempfile.TemporaryDirectory() as fresh, tempfile.TemporaryDirectory() as other:
        rows["first process: mccl warmup, empty cache (wall s)"], _ = _run(mccl + ["warmup"], fresh)
        wall, out = _run([sys.executable, "-c", SOLVES, "load"], fresh)
        second = json.loads(out.strip().splitlines()[-1])
        wall_direct, out = _run([sys.executable, "-c", SOLVES, "direct"], other)
        direct = json.loads(out.strip().splitlines()[-1])
    rows["second process: whole process (wall s)"] = wall
    rows["second process: kernel load (s)"] = second["kernel_load_s"]
    rows["second process: 2 collectives x (healthy, cold, warm) on 16 GPUs (s)"] = second["first_all_solves_s"]
    rows["second call: the same 6 solves (s)"] = second["second_all_solves_s"]
    for k in ("alltoall_cold", "alltoall_warm", "allgather_cold", "allgather_warm"):
        rows[f"second process: {k.replace('_', ' ')} (s)"] = second[f"first_{k}_s"]
    rows["no warm-up, empty cache: first alltoall healthy solve (s)"] = direct["first_alltoall_healthy_s"]
    rows["no warm-up, empty cache: first allgather healthy solve (s)"] = direct["first_allgather_healthy_s"]
    rows["no warm-up, empty cache: whole process (wall s)"] = wall_direct
    width = max(map(len, rows))
    for k, v in rows.items():
        print(f"{k:<{width}}  {v:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
