"""Leaf-spine fabrics with narrow NIC links: CPU seconds of a cold AllGather solve
(docs/allgather_history.md "Narrow NIC links: the few-trees packing").

For each state and chunk budget: the best CPU time of ``--repeat`` cold solves after a
warm-up solve (kernels loaded), the rate, the schedule's optimum, the oracle's cut bound
(``tests/oracle_allgather.py``), which
method answered and how it packed.  Run from a checkout with ``PYTHONPATH`` at it, so the
same script times two checkouts back to back (``--only`` keeps the states whose name
contains one of the words given)::

    PYTHONPATH=$PWD python bench/bench_allgather_narrow.py
    PYTHONPATH=$PWD python bench/bench_allgather_narrow.py --only dragonfly fat-tree
"""

from __future__ import annotations

import argparse
import time
from typing import Callable

import mccl_opt as mo
from instances.aggregation import leaf_spine, scrambled, superpod
from instances.designs import dragonfly, fat_tree
from mccl_runtime.warmup import load_kernels
from tests.oracle_allgather import cut_bound

STATES: dict[str, Callable[[], mo.Topology]] = {
    "leaf-spine 8x2x4, 4 spines": lambda: leaf_spine(8, 2, 4, spines=4),
    "leaf-spine 4x2x8, NIC u0h0g0->u0leaf0 360 one way": lambda: leaf_spine(4, 2, 8).with_capacity(
        src="u0h0g0", dst="u0leaf0", gbps=360.0, both_directions=False),
    "leaf-spine 4x2x8, spine1-u0leaf0 80 both ways": lambda: leaf_spine(4, 2, 8).with_capacity(
        {("spine1", "u0leaf0"): 80.0, ("u0leaf0", "spine1"): 80.0}),
    "leaf-spine 8x2x8, 4 spines": lambda: leaf_spine(8, 2, 8, spines=4),
    # the same fabric in other listings (docs/allgather_history.md "Leaf-spine 8x2x8 in any listing")
    "leaf-spine 8x2x8, 4 spines, scrambled(56718613)":
        lambda: scrambled(leaf_spine(8, 2, 8, spines=4), 56718613),
    "leaf-spine 8x2x8, 4 spines, scrambled(1)": lambda: scrambled(leaf_spine(8, 2, 8, spines=4), 1),
    # fuzz seed 3413's state (docs/allgather_history.md "Repair or few-trees: a forecast")
    "SuperPOD 2x4x8, scrambled(56718613)": lambda: scrambled(superpod(2, 4, 8), 56718613),
    "leaf-spine 4x2x8": lambda: leaf_spine(4, 2, 8),
    # 128-GPU cliffs (docs/allgather_history.md "Few-trees cliffs at 128 GPUs")
    "dragonfly 4x4x1x8": lambda: dragonfly(4, 4, 1, 8),
    "fat-tree 4x2x2x8, 4 cores": lambda: fat_tree(4, 2, 2, 8, cores=4),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2, help="cold solves timed per state")
    ap.add_argument("--only", nargs="*", default=None, help="states whose name contains one")
    args = ap.parse_args(argv)
    load_kernels()
    print(f"{'state':52} {'K':>4} {'cpu s':>7} {'rate':>11} {'lp':>11} {'cut':>11}"
          "  method / packing")
    for name, build in STATES.items():
        if args.only is not None and not any(word in name for word in args.only):
            continue
        topo = build()
        bound = cut_bound(topo)                                   # the independent oracle's
        for k in (10, None):
            mo.solve_allgather(topo, max_chunks=k)                 # warm-up
            best, sched = float("inf"), None
            for _ in range(args.repeat):
                t0 = time.process_time()
                sched = mo.solve_allgather(topo, max_chunks=k)
                best = min(best, time.process_time() - t0)
            mo.validate(topo, sched)
            print(f"{name:52} {str(k):>4} {best:7.3f} {sched.rate_gbps:11.6f} "
                  f"{sched.lp_rate_gbps:11.6f} {bound:11.6f}  {sched.report.method.value} / "
                  f"{sched.stats.get('packing', '-')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
