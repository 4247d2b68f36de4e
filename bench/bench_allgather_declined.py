"""What a declined warm start costs, per fabric family: every state of the fuzz's event
chains (:mod:`bench.allgather_chains`) solved cold and warm from the chain's previous
warm schedule, best CPU seconds of ``--repeat`` each; a state whose warm route was
declined adds ``warm - cold`` to its family's overhead (docs/allgather_history.md "Tight sets
first"; issue 25 item 2).  Prints one row per state, then per family the declined
count and the median and largest overhead.  Run from a checkout with ``PYTHONPATH`` at it,
so two checkouts are timed back to back::

    PYTHONPATH=$PWD python bench/bench_allgather_declined.py --scramble --seed 3413
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from typing import Callable

import numpy as np

import mccl_opt as mo
from bench.allgather_chains import FAMILIES, events
from instances.aggregation import scrambled
from mccl_runtime.warmup import load_kernels


def _best(solve: Callable[[], mo.Schedule], repeat: int) -> tuple[mo.Schedule, float]:
    """The last schedule and the best CPU seconds of ``repeat`` calls."""
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.process_time()
        out = solve()
        best = min(best, time.process_time() - t)
    assert out is not None
    return out, best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=3413)
    ap.add_argument("--scramble", action="store_true", help="rename and reorder the fabrics")
    ap.add_argument("--max-gpus", type=int, default=64, help="larger fabrics are skipped")
    ap.add_argument("--repeat", type=int, default=2, help="solves timed per state and route")
    ap.add_argument("--families", nargs="*", default=None, help="default: all")
    args = ap.parse_args(argv)
    load_kernels(collectives=("allgather",))
    rng = np.random.default_rng(args.seed)          # the fuzz's draws, in its order
    overhead: dict[str, list[float]] = defaultdict(list)
    for family, makers in FAMILIES.items():
        for make in makers:
            base = make()
            if args.scramble:
                base = scrambled(base, int(rng.integers(1 << 30)))
            for budget in (10, None):
                chain = list(events(base, rng, 3))
                if base.num_gpus > args.max_gpus or (args.families and family not in args.families):
                    continue
                prev = mo.solve_allgather(base, max_chunks=budget)
                for step, (kind, topo) in enumerate(chain):
                    _, cold = _best(lambda: mo.solve_allgather(topo, max_chunks=budget), args.repeat)
                    warm, tw = _best(lambda: mo.solve_allgather(topo, warm=prev, max_chunks=budget),
                                     args.repeat)
                    route = str(warm.stats.get("warm_route"))
                    if route == "declined":
                        overhead[family].append(tw - cold)
                    print(f"{family:12} {base.num_gpus:4} K={budget!s:4} step {step} {kind:8} "
                          f"{route:8} cold {cold:.4f} warm {tw:.4f} "
                          f"{warm.stats.get('warm_declined', '') if route == 'declined' else ''}",
                          flush=True)
                    prev = warm
    print(f"\n{'family':12} {'declined':>8} {'median ms':>10} {'max ms':>8}")
    for family, values in overhead.items():
        print(f"{family:12} {len(values):8} {1000 * statistics.median(values):+10.1f} "
              f"{1000 * max(values):+8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
