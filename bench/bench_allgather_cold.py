"""Cold AllGather solves on the shared-aggregation cases of issue 25 and their neighbours.

``python bench/bench_allgather_cold.py NAMES K[,K...] [REPEAT]`` (``NAMES``: comma-separated
keys of :data:`CASES`; ``K``: chunk budgets, ``None`` for exact): per case and budget the
fastest CPU seconds (``time.process_time``) of ``REPEAT`` cold solves, the rate, the LP
rate, the validator's rate, the split and packing used, trees and depth.  Run it from two
worktrees back to back to compare (docs/allgather_history.md, "Sibling pairs last").
"""

from __future__ import annotations

import sys
import time
from typing import Callable

import mccl_opt as mo
from instances import hpn
from instances.aggregation import leaf_spine, multi_spine, scrambled, shared_aggregation, superpod

CASES: dict[str, Callable[[], mo.Topology]] = {
    "sharedagg-2x16x8": lambda: shared_aggregation(2, 16, 8),
    "sharedagg-2x64x8": lambda: shared_aggregation(2, 64, 8),
    "sharedagg-2x8x8": lambda: shared_aggregation(2, 8, 8),
    "sharedagg-2x5x8-scr7": lambda: scrambled(shared_aggregation(2, 5, 8), 7),
    "hpn-2x16x8": lambda: hpn(2, 16, 8),
    "hpn-1x16x8": lambda: hpn(1, 16, 8),
    "hpn-4x16x8": lambda: hpn(4, 16, 8),
    "multispine-2x8x8": lambda: multi_spine(2, 8, 8),
    "multispine-2x4x8": lambda: multi_spine(2, 4, 8),
    "leafspine-8x2x8": lambda: leaf_spine(8, 2, 8),
    "superpod-4x4x8": lambda: superpod(4, 4, 8),
    "superpod-2x4x8": lambda: superpod(2, 4, 8),
}


def main(argv: list[str]) -> None:
    names = argv[0].split(",")
    budgets = [None if k == "None" else int(k) for k in argv[1].split(",")]
    repeat = int(argv[2]) if len(argv) > 2 else 1
    mo.solve_allgather(hpn(1, 2, 8))                       # kernels loaded off the clock
    mo.solve_allgather(shared_aggregation(2, 2, 8), max_chunks=None)
    for name in names:
        topo = CASES[name]()
        for k in budgets:
            best = float("inf")
            for _ in range(repeat):
                start = time.process_time()
                s = mo.solve_allgather(topo, max_chunks=k)
                best = min(best, time.process_time() - start)
            checked = mo.validate(topo, s)
            print(f"{name:22s} K={str(k):4s} cpu {best:6.2f}  rate {s.rate_gbps!r} "
                  f"lp {s.lp_rate_gbps!r} valid {checked.rate_gbps:.6f} split "
                  f"{s.stats.get('split')} pack {s.stats.get('packing')} trees "
                  f"{s.stats.get('num_trees')} depth {s.stats.get('max_depth')}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
