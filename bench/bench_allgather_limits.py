"""``time_limit`` overrun of both collectives and AllGather's first schedule's cost at
80-2048 GPUs (docs/allgather.md, "Time limits, warm budgets and the typed report";
docs/alltoall.md, "Time limits").

``python bench/bench_allgather_limits.py [--limits S ...] [--big] [--sizes N ...]
[--collective allgather|alltoall|both] [--exact]``

Per fabric: AllGather's first schedule's seconds and rate (:func:`mccl_opt.allgather.
first.first_schedule`, cold), then ``solve_<collective>(..., time_limit=S)`` for every
limit: elapsed seconds, the overrun past ``1.2 S + 0.05`` (the issue's bound; 0 when
inside it), how the solve ended, the method returned, its rate and certified bound.
Kernels are compiled first.  ``--big`` adds 1024-GPU fabrics; ``--sizes`` replaces the
fabrics by HPN ``N/128 x 16 x 8`` and, for ``N <= 1024``, two segments of ``N/16``
hosts sharing one aggregation switch; ``--exact`` solves at ``max_chunks=None``
(default 10).
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import mccl_opt as mo
from instances import hpn
from instances.aggregation import shared_aggregation
from mccl_opt.allgather.canonical import canonical
from mccl_opt.allgather.first import first_schedule


def _one_way_nic(topo: mo.Topology) -> mo.Topology:
    """The first GPU's NIC uplink at a quarter of its speed, one direction only."""
    gpu = topo.gpus[0]
    link = next(l for l in topo.links if l.src == gpu and "tor" in l.dst)
    return topo.with_capacity({(link.src, link.dst): link.capacity_gbps / 4})


CASES: list[tuple[str, Callable[[], mo.Topology]]] = [
    ("hpn-2x8x8", lambda: hpn(2, 8, 8)),
    ("sharedagg-2x8x8-nic1way", lambda: _one_way_nic(shared_aggregation(2, 8, 8))),
    ("sharedagg-2x16x8", lambda: shared_aggregation(2, 16, 8)),
    ("hpn-4x16x8-nic1way", lambda: _one_way_nic(hpn(4, 16, 8))),
]
BIG: list[tuple[str, Callable[[], mo.Topology]]] = [
    ("hpn-8x16x8", lambda: hpn(8, 16, 8)),
    ("sharedagg-2x64x8", lambda: shared_aggregation(2, 64, 8)),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limits", nargs="+", type=float, default=[0.2, 1.0])
    ap.add_argument("--big", action="store_true")
    ap.add_argument("--sizes", nargs="+", type=int, default=None,
                    help="GPU counts (multiples of 128): HPN and shared-aggregation fabrics")
    ap.add_argument("--collective", choices=["allgather", "alltoall", "both"],
                    default="allgather")
    ap.add_argument("--exact", action="store_true")
    args = ap.parse_args(argv)
    budget = None if args.exact else 10
    colls = ["allgather", "alltoall"] if args.collective == "both" else [args.collective]
    solvers = {"allgather": mo.solve_allgather, "alltoall": mo.solve_alltoall}
    for c in colls:
        solvers[c](hpn(1, 2, 8), time_limit=5.0)                   # compile the kernels
    if args.sizes:
        cases = _sized(args.sizes)
    else:
        cases = CASES + (BIG if args.big else [])
    print(f"max_chunks={budget}")
    print(f"{'fabric':26} {'GPUs':>5} {'coll':>9} {'first s':>8} {'first Gbps':>10} "
          f"{'limit':>6} {'elapsed':>8} {'over':>6} {'ended':>10} {'method':>24} "
          f"{'rate':>9} {'bound':>9}")
    for name, make in cases:
        topo = make()
        t = time.perf_counter()
        first = first_schedule(canonical(topo), None, budget)
        tf = time.perf_counter() - t
        for coll in colls:
            for limit in args.limits:
                t = time.perf_counter()
                s = solvers[coll](topo, max_chunks=budget, time_limit=limit)
                el = time.perf_counter() - t
                mo.validate(topo, s)
                over = max(0.0, el - (1.2 * limit + 0.05))
                bound = s.report.bound_gbps if s.report is not None else None
                print(f"{name:26} {topo.num_gpus:>5} {coll:>9} {tf:>8.3f} "
                      f"{first.rate_gbps:>10.4g} {limit:>6.2f} {el:>8.3f} {over:>6.3f} "
                      f"{_ended(s):>10} {str(s.stats.get('method', '-')):>24} "
                      f"{s.rate_gbps:>9.4g} {bound if bound is None else f'{bound:.4g}':>9}",
                      flush=True)
    return 0


def _ended(s: mo.Schedule) -> str:
    """How the solve ended: the report's termination, else the stats' status."""
    return s.report.termination.value if s.report is not None else str(s.stats.get("status"))


def _sized(sizes: list[int]) -> list[tuple[str, Callable[[], mo.Topology]]]:
    """HPN ``N/128 x 16 x 8`` per size, and two shared-aggregation segments up to 1024."""
    out: list[tuple[str, Callable[[], mo.Topology]]] = []
    for n in sizes:
        if n < 128 or n % 128:
            raise SystemExit(f"--sizes: {n} is not a multiple of 128")
        out.append((f"hpn-{n // 128}x16x8", lambda n=n: hpn(n // 128, 16, 8)))
        if n <= 1024:
            out.append((f"sharedagg-2x{n // 16}x8", lambda n=n: shared_aggregation(2, n // 16, 8)))
    return out


if __name__ == "__main__":
    raise SystemExit(main())
