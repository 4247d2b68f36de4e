"""Compile cost of a fresh installation: first process, second process, second call.

    python bench/bench_first_run.py              # this interpreter, a fresh numba cache
    python bench/bench_first_run.py --installed  # a wheel of this checkout, installed by pip
                                                 # into a new virtualenv, run outside the checkout

Each step runs in a new Python process with ``NUMBA_CACHE_DIR`` pointing at one empty
temporary folder, so the first step sees what the first process after an installation
sees:

1. ``first process``: ``mccl warmup`` with the empty cache (compiles every kernel);
2. ``new process``: what a user's script pays once the cache is written -- a new process
   imports the package and solves AllToAll and AllGather on HPN 1x2x8 healthy, cold after
   Fail2 and warm from the healthy schedule (6 solves), whole-process wall time from start
   to exit, median and fastest of ``--repeat`` processes;
3. ``second process``: a new process loads every path's kernels from the cache
   (:func:`mccl_runtime.warmup.load_kernels`), then solves AllToAll and AllGather on
   HPN 1x2x8 cold (Fail2) and warm (from the healthy schedule);
4. ``second call``: the same solves again in that process.

Also ``no warm-up``: a process with another empty cache that solves directly (what a
user skipping ``mccl warmup`` waits for on the first solve).  Wall seconds per step; the
solves' own ``seconds`` exclude kernel loading.  One run on a shared machine: noisy (the
load average is printed).

``--installed`` measures what a user gets after ``pip install``: :func:`build_wheel`
builds a wheel of the checkout, :func:`fresh_install` installs it with its dependencies
into a new virtualenv (pip's configured index; no editable install), and every step runs
with that virtualenv's interpreter from a folder outside the checkout.  The wheel-install
test (``tests/test_wheel_install.py``) uses the same two functions.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: what a wheel is built from (copied first, so the checkout gets no build/ folder)
SOURCES = ("pyproject.toml", "README.md", "formulations", "mccl_opt", "instances", "mccl_runtime",
           "executor_cuda")

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


def build_wheel(dest: Path) -> Path:
    """A wheel of the checkout in ``dest`` (built from a copy of :data:`SOURCES`, without
    build isolation: setuptools and wheel come from this interpreter, nothing is fetched)."""
    src = dest / "src"
    src.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy2(path, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--quiet", "-w", str(dest), str(src)], check=True, capture_output=True, text=True)
    return next(dest.glob("mccl-*.whl"))


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without what would import the checkout or reuse a numba cache."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "NUMBA_CACHE_DIR", "VIRTUAL_ENV", "PYTHONHOME")}
    return {**env, **extra}


def fresh_install(wheel: Path, venv: Path) -> Path:
    """A new virtualenv at ``venv`` with ``wheel`` installed by pip (its dependencies
    from pip's configured index); returns its ``bin`` folder."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    bindir = venv / "bin"
    done = subprocess.run([str(bindir / "python"), "-m", "pip", "install", "--quiet", str(wheel)],
                          env=clean_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pip install {wheel.name} failed:\n{done.stdout}\n{done.stderr}")
    return bindir


def _run(argv: list[str], cache: str, cwd: Path = ROOT) -> tuple[float, str]:
    env = clean_env(NUMBA_CACHE_DIR=cache)
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return time.perf_counter() - start, done.stdout


def _measure(python: str, cwd: Path, repeat: int) -> dict[str, float]:
    mccl = [python, "-m", "mccl_opt.cli"]
    rows = {}
    with tempfile.TemporaryDirectory() as fresh, tempfile.TemporaryDirectory() as other:
        rows["first process: mccl warmup, empty cache (wall s)"], _ = _run(mccl + ["warmup"], fresh, cwd)
        walls = sorted(_run([python, "-c", SOLVES, "direct"], fresh, cwd)[0] for _ in range(repeat))
        wall, out = _run([python, "-c", SOLVES, "load"], fresh, cwd)
        second = json.loads(out.strip().splitlines()[-1])
        wall_direct, out = _run([python, "-c", SOLVES, "direct"], other, cwd)
        direct = json.loads(out.strip().splitlines()[-1])
    rows[f"new process: 6 solves on 16 GPUs, whole process (wall s, median of {repeat})"] = \
        walls[len(walls) // 2]
    rows[f"new process: the same, fastest of {repeat} (wall s)"] = walls[0]
    rows["second process with mccl_runtime.warmup.load_kernels: whole process (wall s)"] = wall
    rows["second process: load_kernels, every path's kernels (s)"] = second["kernel_load_s"]
    rows["second process: 2 collectives x (healthy, cold, warm) on 16 GPUs (s)"] = second["first_all_solves_s"]
    rows["second call: the same 6 solves (s)"] = second["second_all_solves_s"]
    for k in ("alltoall_cold", "alltoall_warm", "allgather_cold", "allgather_warm"):
        rows[f"second process: {k.replace('_', ' ')} (s)"] = second[f"first_{k}_s"]
    rows["no warm-up, empty cache: first alltoall healthy solve (s)"] = direct["first_alltoall_healthy_s"]
    rows["no warm-up, empty cache: first allgather healthy solve (s)"] = direct["first_allgather_healthy_s"]
    rows["no warm-up, empty cache: whole process (wall s)"] = wall_direct
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--installed", action="store_true",
                    help="measure a wheel of this checkout installed into a fresh virtualenv")
    ap.add_argument("--repeat", type=int, default=5,
                    help="new processes timed for the 6-solve row (median and fastest)")
    args = ap.parse_args(argv)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        python, cwd = sys.executable, ROOT
        if args.installed:
            t = time.perf_counter()
            bindir = fresh_install(build_wheel(Path(tmp)), Path(tmp) / "venv")
            print(f"wheel built and installed in {time.perf_counter() - t:.1f} s", file=sys.stderr)
            python, cwd = str(bindir / "python"), Path(tmp)
        rows = _measure(python, cwd, max(1, args.repeat))
    width = max(map(len, rows))
    for k, v in rows.items():
        print(f"{k:<{width}}  {v:8.3f}")
    print(f"load average (1 min) {load_before:.2f} before, {os.getloadavg()[0]:.2f} after, "
          f"on {os.cpu_count()} CPUs; {'installed wheel' if args.installed else sys.executable}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
