"""Cold AllGather solves on the fuzz's event-chain states, with the switch balancing's share.

``python bench/bench_allgather_balancing.py [--seed 3413] [--families leaf-spine,...]
[--repeat 2]``: the states ``bench/fuzz_allgather.py --families --family-chains 1
--steps 3 --scramble`` solves (each family size scrambled, 3 events per budget
``K=10`` / ``None``, the same random stream), each solved cold ``--repeat`` times; per
state the fastest CPU seconds of the solve and of :func:`~mccl_opt.allgather.forestcoll.
removal.balancing.balance_switches` inside it, whether each balancing was exact
(``T``/``F`` per call) and the rate.  Run it from two worktrees back to back to compare
(docs/allgather_history.md, "Switch balancing as one flow").
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import mccl_opt as mo
from bench.allgather_chains import FAMILIES, events
from instances.aggregation import scrambled
from mccl_opt.allgather.forestcoll import pipeline


def states(seed: int) -> list[tuple[str, int | None, int, str, mo.Topology]]:
    """``(fabric, budget, step, event, topology)`` in the fuzz's order and random stream."""
    rng = np.random.default_rng(seed)
    out = []
    for makers in FAMILIES.values():
        for make in makers:
            base = scrambled(make(), int(rng.integers(1 << 30)))
            for budget in (10, None):
                for step, (kind, topo) in enumerate(events(base, rng, 3)):
                    out.append((base.name, budget, step, kind, topo))
    return out


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=3413)
    ap.add_argument("--families", default="leaf-spine,shared-agg,multi-spine,superpod",
                    help="comma-separated names of bench.allgather_chains.FAMILIES, or all")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args(argv)
    prefixes = tuple(f.replace("-", "") for f in args.families.split(","))
    calls: list[tuple[bool, float]] = []
    balance = pipeline.balance_switches

    def timed(g):
        start = time.process_time()
        exact = balance(g)
        calls.append((exact, time.process_time() - start))
        return exact

    pipeline.balance_switches = timed
    todo = [s for s in states(args.seed)
            if args.families == "all" or s[0].replace("-", "").startswith(prefixes)]
    mo.solve_allgather(todo[0][4], max_chunks=10)          # kernels loaded off the clock
    total = total_balance = 0.0
    for name, budget, step, kind, topo in todo:
        best = best_balance = float("inf")
        for _ in range(args.repeat):
            calls.clear()
            start = time.process_time()
            s = mo.solve_allgather(topo, max_chunks=budget)
            best = min(best, time.process_time() - start)
            best_balance = min(best_balance, sum(t for _, t in calls))
        total, total_balance = total + best, total_balance + best_balance
        flags = "".join("T" if exact else "F" for exact, _ in calls) or "-"
        print(f"{name[:32]:32s} K={str(budget):4s} step {step} {kind:8s} cpu {best:6.3f} "
              f"balancing {best_balance:6.3f} {flags:8s} rate {s.rate_gbps:.6f}", flush=True)
    print(f"{len(todo)} states: cpu {total:.2f} s, balancing {total_balance:.3f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
