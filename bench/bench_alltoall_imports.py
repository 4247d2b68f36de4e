"""AllToAll on NCCL-XML imported fabrics against the compact LP (docs/alltoall.md,
*Imported fabrics*).  A script, not a test.

    python bench/bench_alltoall_imports.py [--hosts 1 2 4 8 16] [--compact-max-gpus 64]
                                           [--xml dgx-h100] [--json]

For every host count, the shipped DGX H100 file (or ``--xml``) is imported with
``--network rail``, without and with ``--cpu-paths``, and solved cold
(``solve_alltoall``, ``max_chunks=10``); then one NIC's rail link is cut to half and the
fabric solved warm from the healthy schedule and cold.  Each LP rate is compared with the
compact arc-flow LP (paper App. G, per-source commodities, scipy's HiGHS) up to
``--compact-max-gpus`` GPUs.  Prints one row per fabric state: GPUs, CPU paths, compact
rate and seconds, our LP and rounded rate, seconds, certified bound, relative gap; and
how many Farley bounds column generation computed (``bench/alltoall_bounds.py``; those of
the saturated set's capacity classes apart), none of which may be below the compact
optimum.  Exits 1 when a gap exceeds ``--tol``, a rate exceeds its own certified bound
or a bound is below the compact optimum.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mccl_opt as mo                                            # noqa: E402
from bench.alltoall_bounds import Recorded, recorded_bounds      # noqa: E402
from bench.fuzz_alltoall import compact_optimum                  # noqa: E402


def fabric(xml: str, hosts: int, cpu_paths: bool) -> mo.Topology:
    """``mccl topo nccl XML --hosts H --network rail [--cpu-paths]``."""
    from mccl_opt.cli.topo_import import host_file

    network = "rail" if hosts > 1 else "none"
    return mo.Topology.from_nccl_xml(host_file(xml, ".xml"), hosts=hosts, network=network,
                                     cpu_paths=cpu_paths)


def half_rail(topo: mo.Topology) -> mo.Topology:
    """The first NIC-to-rail link (or, on one host, the first NIC link) at half capacity."""
    link = next((l for l in topo.links if l.dst.startswith("rail")),
                next(l for l in topo.links if "nic" in l.src))
    return topo.with_capacity({(link.src, link.dst): link.capacity_gbps / 2}).renamed(
        topo.name + "-halfrail")


def solved(topo: mo.Topology, warm: mo.Schedule | None = None
           ) -> tuple[mo.Schedule, float, Recorded]:
    """``solve_alltoall(topo, warm=warm)``, its seconds and the bounds it computed."""
    with recorded_bounds() as rec:
        t = time.perf_counter()
        sched = mo.solve_alltoall(topo, warm=warm)
        seconds = time.perf_counter() - t
    return sched, seconds, rec


def row(topo: mo.Topology, cpu: bool, mode: str, run: tuple[mo.Schedule, float, Recorded],
        compact: tuple[float, float] | None) -> dict:
    sched, seconds, rec = run
    z, zs = compact if compact else (None, None)
    bound = sched.stats["lp_bound_gbps"]
    below = [r for r in rec.rates() if z is not None and r < z * (1 - 1e-9)]
    return {"fabric": topo.name, "gpus": topo.num_gpus, "cpu_paths": cpu, "mode": mode,
            "compact_gbps": z, "compact_s": zs, "lp_gbps": sched.lp_rate_gbps,
            "rate_gbps": sched.rate_gbps, "seconds": seconds, "bound_gbps": bound,
            "rounds": sched.stats["rounds"], "warm_mode": sched.stats["warm_mode"],
            "gap": None if z is None else abs(sched.lp_rate_gbps - z) / z,
            "class_bounds": len(rec.rates("class")), "bounds": len(rec.rates()),
            "bounds_below_compact": len(below)}


def timed_compact(topo: mo.Topology, limit: int) -> tuple[float, float] | None:
    if topo.num_gpus > limit:
        return None
    t = time.perf_counter()
    z = compact_optimum(topo)
    return z, time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--compact-max-gpus", type=int, default=64)
    ap.add_argument("--xml", default="dgx-h100", help="host file or shipped sample name")
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = []
    mo.solve_alltoall(fabric(args.xml, 1, True))          # kernels loaded outside the timings
    for hosts in args.hosts:
        for cpu in (False, True):
            topo = fabric(args.xml, hosts, cpu)
            cold = solved(topo)
            rows.append(row(topo, cpu, "cold", cold, timed_compact(topo, args.compact_max_gpus)))
            bad = half_rail(topo)
            compact = timed_compact(bad, args.compact_max_gpus)
            rows.append(row(bad, cpu, "warm", solved(bad, cold[0]), compact))
            rows.append(row(bad, cpu, "cold", solved(bad), compact))
            print(*(f"{k}={v:.6g}" if isinstance(v, float) else f"{k}={v}"
                    for k, v in rows[-3].items()), file=sys.stderr, flush=True)
    fails = [r for r in rows if (r["gap"] is not None and r["gap"] > args.tol)
             or r["lp_gbps"] > r["bound_gbps"] * (1 + 1e-9)
             or r["rate_gbps"] > r["lp_gbps"] * (1 + 1e-9) or r["bounds_below_compact"]]
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print("| fabric | GPUs | CPU paths | mode | compact Gbps (s) | LP Gbps | rounded Gbps | s "
              "| CG rounds | gap | bounds (class) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            comp = "—" if r["compact_gbps"] is None else f"{r['compact_gbps']:.6g} ({r['compact_s']:.2f})"
            gap = "—" if r["gap"] is None else f"{r['gap']:.1e}"
            print(f"| {r['fabric']} | {r['gpus']} | {'yes' if r['cpu_paths'] else 'no'} | "
                  f"{r['mode']} | {comp} | {r['lp_gbps']:.6g} | {r['rate_gbps']:.6g} | "
                  f"{r['seconds']:.3f} | {r['rounds']} | {gap} | {r['bounds']} ({r['class_bounds']}) |")
    gaps = [r["gap"] for r in rows if r["gap"] is not None]
    checked = [r for r in rows if r["gap"] is not None]
    print(f"states compared with the compact LP: {len(gaps)}, worst gap "
          f"{max(gaps, default=0.0):.2e}; bounds checked against it: "
          f"{sum(r['bounds'] for r in checked)} ({sum(r['class_bounds'] for r in checked)} "
          f"of capacity classes), below it: {sum(r['bounds_below_compact'] for r in rows)}; "
          f"failures: {len(fails)}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
