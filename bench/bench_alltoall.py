"""AllToAll synthesis benchmark: cold vs warm column generation vs the compact LP.

For each HPN shape and failure: the compact arc-flow LP (App. G, one commodity per
source -- the smaller of the two equivalent compact models, so the comparison favours
the baseline) solved by the HiGHS backend; a cold ``solve_alltoall`` on the failed
fabric; and a warm one started from the healthy fabric's schedule (the re-synthesis
after a single-link/GPU failure; ``warm_mode``: ``basis`` = old basis reused, ``local`` =
only ``free_pairs`` re-optimised with a global certificate, ``full`` = full warm master).  Each row pairs the times with quality: rounds,
columns, the rounding gap, and that the LP optima agree.

    python bench/bench_alltoall.py --sizes 1x2x8 1x4x8 1x8x8 1x16x8 [--compact-max-gpus 128]
        [--repeat R]

``--repeat R`` times cold and warm as the fastest of R runs, alternating (default 1);
the synthesizers' compiled kernels are loaded before any timing.

Under pytest only a tiny case runs (``--benchmark-disable`` in CI).
"""

from __future__ import annotations

import argparse
import os
import time

from instances import FAILURES, hpn, parse_shape
from mccl_opt.alltoall import solve_alltoall

SIZES = ["1x2x8", "1x4x8", "1x8x8", "1x16x8", "1x32x8", "2x32x8"]


def compact_lp(topo) -> tuple[float, float]:
    """(optimum, seconds) of the compact arc-flow LP with the HiGHS backend."""
    from formulations.compact import build_compact_lp
    from mccl_opt.backends import get_backend

    t0 = time.perf_counter()
    a = topo.arrays
    lp = build_compact_lp(topo.num_nodes, a.tail, a.head, a.capacity, a.is_switch, a.gpu_nodes,
                          commodities="source")
    be = get_backend("highs")
    be.load(lp)
    sol = be.solve()
    return float(sol.objective), time.perf_counter() - t0


def run_case(shape: str, failure: str, compact_max_gpus: int, healthy=None,
             repeat: int = 1) -> dict:
    """One row; ``healthy`` (the healthy fabric's schedule) is solved here if not given;
    cold and warm are each the fastest of ``repeat`` alternating runs."""
    base = hpn(*parse_shape(shape))
    topo = FAILURES[failure](base)
    healthy = solve_alltoall(base) if healthy is None else healthy
    t_cold = t_warm = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        cold = solve_alltoall(topo)
        t_cold = min(t_cold, time.perf_counter() - t0)
        t0 = time.perf_counter()
        warm = solve_alltoall(topo, warm=healthy)
        t_warm = min(t_warm, time.perf_counter() - t0)
    row = {"shape": shape, "failure": failure, "gpus": topo.num_gpus,
           "cold_s": t_cold, "warm_s": t_warm, "warm_speedup": t_cold / t_warm,
           "rounds": cold.stats["rounds"], "warm_rounds": warm.stats["rounds"],
           "warm_basis": warm.stats["warm_basis"], "warm_mode": warm.stats["warm_mode"],
           "free_pairs": warm.stats.get("free_pairs", "-"),
           "columns": cold.stats["columns"], "lp_gbps": cold.lp_rate_gbps,
           "gap_pct": 100 * cold.rounding_gap, "warm_gap_pct": 100 * warm.rounding_gap,
           "compact_s": float("nan"), "compact_speedup": float("nan"), "lp_match": True}
    assert abs(warm.lp_rate_gbps - cold.lp_rate_gbps) <= 1e-6 * cold.lp_rate_gbps
    if topo.num_gpus <= compact_max_gpus:
        z, t = compact_lp(topo)
        row.update(compact_s=t, compact_speedup=t / t_cold,
                   lp_match=abs(z - cold.lp_rate_gbps) <= 1e-6 * z)
    return row


def print_table(rows: list[dict]) -> None:
    cols = ["shape", "failure", "gpus", "compact_s", "cold_s", "warm_s", "compact_speedup",
            "warm_speedup", "rounds", "warm_rounds", "warm_mode", "free_pairs", "columns", "lp_gbps",
            "gap_pct",
            "warm_gap_pct", "lp_match"]
    fmt = {float: lambda v: f"{v:.3g}"}
    cells = [[fmt.get(type(r[c]), str)(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    print("  ".join(c.rjust(w) for c, w in zip(cols, widths)))
    for x in cells:
        print("  ".join(v.rjust(w) for v, w in zip(x, widths)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=SIZES[:4], help="HPN shapes SxHxN")
    ap.add_argument("--failures", nargs="+", default=sorted(FAILURES))
    ap.add_argument("--compact-max-gpus", type=int, default=128,
                    help="skip the compact LP above this many GPUs (it takes minutes)")
    ap.add_argument("--repeat", type=int, default=1, help="fastest of R cold and warm runs")
    args = ap.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    from mccl_runtime.warmup import load_kernels

    load_kernels()
    rows = []
    for shape in args.sizes:
        healthy = solve_alltoall(hpn(*parse_shape(shape)))
        for failure in args.failures:
            rows.append(run_case(shape, failure, args.compact_max_gpus, healthy, args.repeat))
            print(f"done {shape} {failure}", flush=True)
    print_table(rows)
    return 0


def test_bench_alltoall_tiny(benchmark):
    row = benchmark.pedantic(run_case, args=("1x2x4", "fail2", 64), rounds=1, iterations=1)
    assert row["lp_match"] and row["gap_pct"] <= 5.0


if __name__ == "__main__":
    raise SystemExit(main())
