"""The cost curve: synthesis time and peak memory against GPU count, fitted and plotted.

    python bench/bench_scale.py                                   # the full curve (slow)
    python bench/bench_scale.py --collectives allgather --sizes 64,128,256 --out /tmp/scale
    python bench/bench_scale.py --timeout-s 300 --mem-gb 8 --out docs

For each collective (AllGather, AllToAll) and HPN size (GPUs: 64 = 1x8x8, 128 = 1x16x8,
256 = 1x32x8, 512 = 2x32x8, 1024 = 2x64x8 for AllGather and 4x32x8 for AllToAll, as in
the scale measurements of docs/scale.md, 2048 = 4x64x8, 4096 = 8x64x8) three cases run,
each in its own Python process (kernels loaded first, outside the timer):

* ``healthy_cold``: ``solve_*`` on the healthy fabric, no warm start; the schedule is
  saved for the next case;
* ``fail2_cold``: Fail2 (rank 0's NIC cable 400 -> 50 Gbps), no warm start;
* ``fail2_warm``: Fail2 from the healthy schedule solved in the same process (outside the
  timer), warm state in memory: what the controller pays after a failure (paper §3.1);
* ``fail2_warm_file``: Fail2 from the healthy schedule loaded from its file (AllGather's
  warm state restored outside the timer; AllToAll rebuilds its LP columns inside it): a
  controller restarted from its state file.

A process gets ``--timeout-s`` of wall time and ``--mem-gb`` of resident memory (polled
from ``/proc`` every 0.2 s and killed above it).  Once a case of a curve times out, runs
out of memory or fails, its larger sizes are skipped (``skipped``); with ``--budget-s``,
a case gets at most the budget left (``cut (budget)`` if that ends it) and none starts
after it is spent (``skipped (budget)``).  Each row records the solve seconds, the
process's peak resident memory (``ru_maxrss``) and its resident memory just before the
solve (``base_mb``: interpreter, kernels, inputs), the rate and the status.  The fit is
least squares on ``log t = log a + b log N`` over the points that ran at 128 GPUs or more
(smaller solves are dominated by fixed costs); the exponent ``b`` is printed per curve
(for memory, of the growth over ``base_mb``), and a PNG plots the curves (log-log).

Results go to ``--out`` (default ``docs``): ``scale_curve.json`` (every row, the fits,
the machine load) and ``scale_curve.png``; docs/scale.md discusses them.  ``--merge``
combines the rows of earlier runs (one per collective, say).  On a shared machine the
times are noisy; the load average is recorded.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = {
    "allgather": {64: "1x8x8", 128: "1x16x8", 256: "1x32x8", 512: "2x32x8", 1024: "2x64x8",
                  2048: "4x64x8", 4096: "8x64x8"},
    "alltoall": {64: "1x8x8", 128: "1x16x8", 256: "1x32x8", 512: "2x32x8", 1024: "4x32x8",
                 2048: "4x64x8", 4096: "8x64x8"},
}
DEFAULT_SIZES = {"allgather": (64, 128, 256, 512, 1024, 2048, 4096),
                 "alltoall": (64, 128, 256, 512, 1024, 2048)}
CASES = ("healthy_cold", "fail2_cold", "fail2_warm", "fail2_warm_file")
FIT_MIN_GPUS = 128

# One case in a fresh process: argv = collective shape case schedule_file
CHILD = r"""
import json, resource, sys, time
from instances import fail2, hpn, parse_shape
import mccl_opt as mo
from mccl_runtime.warmup import load_kernels
coll, shape, case, path = sys.argv[1:5]
load_kernels(collectives=(coll,))
solve = mo.solve_allgather if coll == "allgather" else mo.solve_alltoall
healthy = hpn(*parse_shape(shape))
topo, warm = (healthy, None) if case == "healthy_cold" else (fail2(healthy), None)
if case == "fail2_warm":
    warm = solve(healthy)
if case == "fail2_warm_file":
    import os
    if not os.path.exists(path):
        solve(healthy).save(path)
    warm = mo.Schedule.load(path)
    from mccl_opt import restore_warm_state
    warm = restore_warm_state(warm, healthy)
def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) / 1024
base_mb = rss_mb()
t0 = time.perf_counter()
s = solve(topo, warm=warm)
seconds = time.perf_counter() - t0
if case == "healthy_cold":
    s.save(path)
print(json.dumps({"seconds": seconds, "rate_gbps": s.rate_gbps, "lp_rate_gbps": s.lp_rate_gbps,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "base_mb": base_mb}))
"""


def _rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` in MB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run_case(collective: str, shape: str, case: str, schedule_file: str, *,
             timeout_s: float, mem_gb: float) -> dict[str, Any]:
    """One case in its own process, killed past ``timeout_s`` or ``mem_gb`` resident."""
    proc = subprocess.Popen([sys.executable, "-c", CHILD, collective, shape, case, schedule_file],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    start, peak, status = time.monotonic(), 0.0, None
    while proc.poll() is None:
        peak = max(peak, _rss_mb(proc.pid))
        if peak > mem_gb * 1024:
            status = "memory"
        elif time.monotonic() - start > timeout_s:
            status = "timeout"
        if status:
            proc.kill()
            break
        time.sleep(0.2)
    out, err = proc.communicate()
    row: dict[str, Any] = {"collective": collective, "shape": shape, "case": case,
                           "wall_s": time.monotonic() - start, "peak_mb": peak}
    if status:
        return {**row, "status": status}
    if proc.returncode != 0:
        return {**row, "status": "error", "error": err.strip().splitlines()[-1:] or [f"exit {proc.returncode}"]}
    row.update(json.loads(out.strip().splitlines()[-1]), status="ok")
    row["peak_mb"] = max(row["peak_mb"], peak)
    return row


def fit_power(points: Sequence[tuple[float, float]]) -> dict[str, float] | None:
    """Least squares of ``log y = log a + b log x``: ``{"a", "b"}``, or None with < 2 points."""
    pts = [(math.log(x), math.log(y)) for x, y in points if x > 0 and y > 0]
    if len({x for x, _ in pts}) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    b = sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts)
    return {"a": math.exp(my - b * mx), "b": b}


def run_curves(collectives: Sequence[str], sizes: dict[str, Sequence[int]], *, timeout_s: float,
               mem_gb: float, budget_s: float = math.inf, cases: Sequence[str] = CASES,
               log=print) -> list[dict[str, Any]]:
    """Every (collective, case, size) row; larger sizes of a curve are skipped after a failure,
    and every case once ``budget_s`` of wall time has passed (a case gets at most what is left)."""
    rows = []
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mccl-scale-") as tmp:
        for coll in collectives:
            stopped: set[str] = set()
            for gpus in sizes[coll]:
                shape = SHAPES[coll][gpus]
                path = str(Path(tmp) / f"{coll}-{gpus}.json")
                for case in CASES:
                    if case not in cases:
                        continue
                    blocked = case in stopped or (case.startswith("fail2_warm") and "healthy_cold" in stopped)
                    left = budget_s - (time.monotonic() - start)
                    if blocked or left <= 0:
                        row = {"collective": coll, "shape": shape, "case": case,
                               "status": "skipped" if blocked else "skipped (budget)"}
                    else:
                        row = run_case(coll, shape, case, path, timeout_s=min(timeout_s, left), mem_gb=mem_gb)
                        if row["status"] == "timeout" and left < timeout_s:
                            row["status"] = "cut (budget)"
                    row["gpus"] = gpus
                    rows.append(row)
                    if row["status"] != "ok":
                        stopped.add(case)
                    log(f"{coll:9s} {gpus:5d} {case:12s} {row['status']:8s} "
                        f"{row.get('seconds', float('nan')):9.3f} s {row.get('peak_mb', 0.0):7.0f} MB",
                        flush=True)
    return rows


def fits(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The exponent of time and of peak memory per (collective, case) curve."""
    out = []
    for coll in SHAPES:
        for case in CASES:
            ok = [r for r in rows if r["collective"] == coll and r["case"] == case and r["status"] == "ok"
                  and r["gpus"] >= FIT_MIN_GPUS]
            t = fit_power([(r["gpus"], r["seconds"]) for r in ok])
            m = fit_power([(r["gpus"], r["peak_mb"] - r["base_mb"]) for r in ok])
            if t:
                out.append({"collective": coll, "case": case, "points": len(ok),
                            "gpus": [r["gpus"] for r in ok], "time_exponent": t["b"],
                            "memory_exponent": m["b"] if m else None})
    return out


def markdown(rows: Sequence[dict[str, Any]], fitted: Sequence[dict[str, Any]]) -> str:
    """The rows as one markdown table (seconds per case, peak GB) and the fitted exponents."""
    def cell(r: dict[str, Any] | None) -> str:
        if r is None:
            return ""
        if r["status"] != "ok":
            return r["status"]
        return f"{r['seconds']:.3g} s, {r['peak_mb'] / 1024:.2g} GB"

    lines = ["| collective | GPUs | " + " | ".join(c.replace("_", " ") for c in CASES) + " |",
             "|---|---|" + "---|" * len(CASES)]
    for coll in SHAPES:
        for gpus in sorted({r["gpus"] for r in rows if r["collective"] == coll}):
            got = {r["case"]: r for r in rows if r["collective"] == coll and r["gpus"] == gpus}
            shape = next(iter(got.values()))["shape"]
            lines.append(f"| {coll} | {gpus} ({shape}) | " + " | ".join(cell(got.get(c)) for c in CASES) + " |")
    lines += ["", "| collective | case | GPUs fitted | time exponent | memory exponent (over base) |",
              "|---|---|---|---|---|"]
    for f in fitted:
        mem = "-" if f["memory_exponent"] is None else f"{f['memory_exponent']:.2f}"
        lines.append(f"| {f['collective']} | {f['case'].replace('_', ' ')} | "
                     f"{','.join(map(str, f['gpus']))} | {f['time_exponent']:.2f} | {mem} |")
    return "\n".join(lines)


def plot(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Time and peak memory against GPUs, log-log, one line per curve."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(11, 4.2))
    for coll, marker in (("allgather", "o"), ("alltoall", "s")):
        for case, style in zip(CASES, ("-", "--", ":", "-.")):
            ok = [r for r in rows if r["collective"] == coll and r["case"] == case and r["status"] == "ok"]
            if not ok:
                continue
            n = [r["gpus"] for r in ok]
            label = f"{coll} {case.replace('_', ' ')}"
            ax_t.plot(n, [r["seconds"] for r in ok], style, marker=marker, label=label)
            ax_m.plot(n, [r["peak_mb"] / 1024 for r in ok], style, marker=marker, label=label)
    for ax, ylabel in ((ax_t, "synthesis time (s)"), (ax_m, "peak resident memory (GB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("GPUs (HPN)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax_t.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from mccl_opt.tables import print_table

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--collectives", default="allgather,alltoall")
    p.add_argument("--sizes", default=None, help="GPU counts, comma separated (default: per collective)")
    p.add_argument("--max-gpus", type=int, default=None, help="per collective, only sizes up to this")
    p.add_argument("--timeout-s", type=float, default=300.0)
    p.add_argument("--mem-gb", type=float, default=8.0)
    p.add_argument("--budget-s", type=float, default=math.inf, help="wall time for the whole run")
    p.add_argument("--out", default="docs", help="folder for scale_curve.json and scale_curve.png")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma separated, from {', '.join(CASES)}")
    p.add_argument("--merge", nargs="+", metavar="JSON",
                   help="run nothing: combine the rows of earlier runs' scale_curve.json files")
    a = p.parse_args(argv)
    collectives = [c for c in a.collectives.split(",") if c]
    cases = [c for c in a.cases.split(",") if c]
    if set(cases) - set(CASES):
        p.error(f"unknown case(s) {sorted(set(cases) - set(CASES))}; choose from {', '.join(CASES)}")
    unknown = [c for c in collectives if c not in SHAPES]
    if unknown:
        p.error(f"unknown collective(s) {unknown}; choose from {sorted(SHAPES)}")
    sizes = {c: DEFAULT_SIZES[c] for c in collectives}
    if a.sizes:
        wanted = [int(x) for x in a.sizes.split(",")]
        bad = [n for n in wanted if n not in SHAPES["allgather"]]
        if bad:
            p.error(f"no HPN shape for {bad} GPUs; choose from {sorted(SHAPES['allgather'])}")
        sizes = {c: wanted for c in collectives}
    if a.max_gpus:
        sizes = {c: [n for n in sizes[c] if n <= a.max_gpus] for c in collectives}
    if a.merge:
        runs = [json.loads(Path(f).read_text()) for f in a.merge]
        rows = [r for run in runs for r in run["rows"]]
        load_before, load_after = runs[0]["load_before"], runs[-1]["load_after"]
        extra = {"runs": [{k: v for k, v in run.items() if k not in ("rows", "fits")} for run in runs]}
    else:
        load_before = os.getloadavg()
        rows = run_curves(collectives, sizes, timeout_s=a.timeout_s, mem_gb=a.mem_gb, budget_s=a.budget_s,
                          cases=cases)
        load_after = os.getloadavg()
        extra = {"timeout_s": a.timeout_s, "mem_gb": a.mem_gb, "cpus": os.cpu_count(),
                 "budget_s": None if math.isinf(a.budget_s) else a.budget_s,
                 "bench_peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    fitted = fits(rows)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"rows": rows, "fits": fitted, "load_before": load_before, "load_after": load_after, **extra}
    (out / "scale_curve.json").write_text(json.dumps(result, indent=1))
    plot(rows, out / "scale_curve.png")
    print_table(["collective", "GPUs", "case", "status", "seconds", "peak GB", "rate Gbps"],
                [[r["collective"], r["gpus"], r["case"], r["status"], r.get("seconds", "-"),
                  r["peak_mb"] / 1024 if "peak_mb" in r else "-", r.get("rate_gbps", "-")] for r in rows])
    print()
    print_table(["collective", "case", "points", "GPUs fitted", "time exponent", "memory exponent"],
                [[f["collective"], f["case"], f["points"], ",".join(map(str, f["gpus"])), f["time_exponent"],
                  f["memory_exponent"] if f["memory_exponent"] is not None else "-"] for f in fitted])
    print()
    print(markdown(rows, fitted))
    print(f"\nload average before {load_before}, after {result['load_after']}; results in {out}")
    return result


if __name__ == "__main__":
    main()
