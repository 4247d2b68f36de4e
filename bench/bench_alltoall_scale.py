"""AllToAll synthesis at scale: cold and warm time, rounds, columns, peak memory.

    python bench/bench_alltoall_scale.py --sizes 2x32x8 4x32x8
    python bench/bench_alltoall_scale.py --sizes 2x32x8 --base /tmp/a2a-base   # before/after
    python bench/bench_alltoall_scale.py --sizes 4x64x8 --states healthy --mem-gb 16 --timeout-s 300
    python bench/bench_alltoall_scale.py --sizes 4x32x8 --states fail1 fail2 --no-cold --warm-repeat 5

Each size runs in its own Python process (per code tree with ``--base``: the two
alternate, size by size, so both see the same machine load).  A process loads the
compiled kernels first (outside the timers), solves the healthy fabric cold, then for
every failure state (``fail1``: an NVSwitch link, ``fail2``: rank 0's NIC 400 -> 50
Gbps, ``fail3``: a GPU replaced) the failed fabric cold and warm from the healthy
schedule (``--warm-repeat`` times, each from a fresh copy of its warm state).  Rows:
wall and CPU seconds of ``solve_alltoall``, column generation rounds, columns, the LP rate (cold and warm must agree to 1e-6), the process's peak resident memory so
far (``ru_maxrss``), and ``warm_mode``.  ``--base DIR`` runs the same cases with the code
of another checkout (``git worktree add DIR <commit>``) put first on ``PYTHONPATH``;
``--without cut_columns warm_restart`` adds runs of the new code with one of its
switches off (``colgen.CUT_COLUMNS``, ``master.WARM_RESTART``).
A process gets ``--timeout-s`` of wall time and an address-space cap of ``--mem-gb``.
The load average is printed with the table: on a shared machine compare ratios within
one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
STATES = ("healthy", "fail1", "fail2", "fail3")
SWITCHES = ("cut_columns", "warm_restart")     # colgen.CUT_COLUMNS, master.WARM_RESTART

CHILD = r"""
import dataclasses, json, resource, sys, time
cap = float(sys.argv[3])
if cap > 0:
    lim = int(cap * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
from instances import FAILURES, hpn, parse_shape
from mccl_opt.alltoall import solve_alltoall
import mccl_opt.alltoall.colgen, mccl_opt.alltoall.master
for switch in filter(None, sys.argv[4].split(",")):
    module, name = {"cut_columns": ("colgen", "CUT_COLUMNS"),
                    "warm_restart": ("master", "WARM_RESTART")}[switch]
    setattr(getattr(mccl_opt.alltoall, module), name, False)

def rss_gb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20

def row(state, mode, sched, seconds, cpu):
    st = sched.stats
    print(json.dumps({"state": state, "mode": mode, "seconds": seconds, "cpu_s": cpu,
                      "rounds": st.get("rounds"), "columns": st.get("columns"),
                      "lp_rate": sched.lp_rate_gbps, "gap_pct": 100 * (1 - sched.rate_gbps / sched.lp_rate_gbps),
                      "warm_mode": st.get("warm_mode"), "status": st.get("status"),
                      "peak_gb": rss_gb()}), flush=True)

small = hpn(1, 2, 8)                             # compiled kernels of the cold and warm
solve_alltoall(FAILURES["fail2"](small), warm=solve_alltoall(small))   # paths, outside the timers
base = hpn(*parse_shape(sys.argv[1]))
c0, t0 = time.process_time(), time.perf_counter()
healthy = solve_alltoall(base)
row("healthy", "cold", healthy, time.perf_counter() - t0, time.process_time() - c0)
repeat, cold_too = int(sys.argv[5]), sys.argv[6] == "1"
for state in sys.argv[2].split(","):
    if state == "healthy":
        continue
    topo = FAILURES[state](base)
    if cold_too:
        c0, t0 = time.process_time(), time.perf_counter()
        cold = solve_alltoall(topo)
        row(state, "cold", cold, time.perf_counter() - t0, time.process_time() - c0)
        del cold
    for _ in range(repeat):     # each from its own copy of the healthy state: a first warm start
        state_copy = dataclasses.replace(healthy.warm_state)
        c0, t0 = time.process_time(), time.perf_counter()
        warm = solve_alltoall(topo, warm=state_copy)
        row(state, "warm", warm, time.perf_counter() - t0, time.process_time() - c0)
        del warm, state_copy
"""


def run_size(shape: str, states: list[str], code: Path, timeout_s: float, mem_gb: float,
             without: Sequence[str] = (), warm_repeat: int = 1, cold: bool = True) -> list[dict]:
    """The rows of one size with the code under ``code`` (a fresh process)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(code), os.environ.get("PYTHONPATH", "")]))
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, shape, ",".join(states), str(mem_gb),
                               ",".join(without), str(warm_repeat), "1" if cold else "0"],
                              capture_output=True, text=True, timeout=timeout_s, env=env,
                              cwd=str(code))
        out, err, failed = proc.stdout, proc.stderr, proc.returncode != 0
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err, failed = f"timed out after {timeout_s:.0f} s", True
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    if failed:
        last = (err.strip().splitlines() or ["?"])[-1]
        rows.append({"state": "-", "mode": "error", "error": last[:100]})
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", default=["1x32x8", "2x32x8", "4x32x8"])
    ap.add_argument("--states", nargs="+", default=list(STATES), choices=STATES)
    ap.add_argument("--base", type=Path, help="another checkout to run the same cases with")
    ap.add_argument("--timeout-s", type=float, default=900.0)
    ap.add_argument("--mem-gb", type=float, default=8.0)
    ap.add_argument("--without", nargs="*", default=[], choices=SWITCHES,
                    help="also run the new code with these switched off (rows 'new-<switch>')")
    ap.add_argument("--json", type=Path, help="write every row here")
    ap.add_argument("--warm-repeat", type=int, default=1,
                    help="warm solves per failure state, each from a fresh copy of the healthy "
                         "schedule's warm state (a first warm start every time)")
    ap.add_argument("--no-cold", action="store_true",
                    help="skip the failed fabrics' cold solves (the healthy one always runs)")
    args = ap.parse_args(argv)
    trees = [("new", ROOT, ())] + [(f"new-{w}", ROOT, (w,)) for w in args.without]
    trees += [("base", args.base.resolve(), ())] if args.base else []
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    print("| code | shape | GPUs | state | mode | s | CPU s | rounds | columns | LP Gbps | gap % "
          "| warm mode | peak GB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    results = []
    for shape in args.sizes:
        gpus = 1
        for part in shape.split("x"):
            gpus *= int(part)
        for name, tree, without in trees:
            for r in run_size(shape, args.states, tree, args.timeout_s, args.mem_gb, without,
                              args.warm_repeat, not args.no_cold):
                r.update(code=name, shape=shape)
                results.append(r)
                if r["mode"] == "error":
                    print(f"| {name} | {shape} | {gpus} | - | error | {r['error']} |")
                    continue
                cpu = r.get("cpu_s")                 # a base tree's bench may not time CPU
                print(f"| {name} | {shape} | {gpus} | {r['state']} | {r['mode']} | {r['seconds']:.2f} "
                      f"| {'-' if cpu is None else f'{cpu:.2f}'} "
                      f"| {r['rounds']} | {r['columns']} | {r['lp_rate']:.6g} | {r['gap_pct']:.3f} "
                      f"| {r['warm_mode']} | {r['peak_gb']:.2f} |", flush=True)
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
