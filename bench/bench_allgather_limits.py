"""AllGather ``time_limit`` overrun and the first schedule's cost at 128-1024 GPUs
(docs/allgather.md, "Time limits, warm budgets and the typed report").

``python bench/bench_allgather_limits.py [--limits S ...] [--big] [--exact]``

Per fabric: the first schedule's seconds and rate (:func:`mccl_opt.allgather.first.
first_schedule`, cold), then ``solve_allgather(..., time_limit=S)`` for every limit:
elapsed seconds, the overrun past ``1.2 S + 0.05`` (the issue's bound; 0 when inside it),
how the solve ended, the method returned and its rate.  Kernels are compiled first.
``--big`` adds 1024-GPU fabrics; ``--exact`` solves at ``max_chunks=None`` (default 10).
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
    ap.add_argument("--exact", action="store_true")
    args = ap.parse_args(argv)
    budget = None if args.exact else 10
    mo.solve_allgather(hpn(1, 2, 8), time_limit=5.0)              # compile the kernels
    print(f"max_chunks={budget}")
    print(f"{'fabric':26} {'GPUs':>5} {'first s':>8} {'first Gbps':>10} {'limit':>6} "
          f"{'elapsed':>8} {'over':>6} {'ended':>10} {'method':>32} {'rate':>9}")
    for name, make in CASES + (BIG if args.big else []):
        topo = make()
        t = time.perf_counter()
        first = first_schedule(canonical(topo), None, budget)
        tf = time.perf_counter() - t
        for limit in args.limits:
            t = time.perf_counter()
            s = mo.solve_allgather(topo, max_chunks=budget, time_limit=limit)
            el = time.perf_counter() - t
            mo.validate(topo, s)
            over = max(0.0, el - (1.2 * limit + 0.05))
            print(f"{name:26} {topo.num_gpus:>5} {tf:>8.3f} {first.rate_gbps:>10.4g} {limit:>6.2f} "
                  f"{el:>8.3f} {over:>6.3f} {s.report.termination.value:>10} "
                  f"{s.report.method.value:>32} {s.rate_gbps:>9.4g}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
