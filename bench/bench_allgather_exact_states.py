"""Cold AllGather seconds at ``max_chunks=None`` on the family-chain states, by name.

The states are those of ``python bench/fuzz_allgather.py --random 0 --chains 0 --families
F... --family-chains 1 --steps S --budgets B...`` (same seed, same events,
:mod:`bench.allgather_chains`), so a slow state the fuzz reports can be timed alone and
the same states compared between two checkouts (run this script in each, alternating;
docs/allgather_history.md "Exact rate with many trees per root")::

    python bench/bench_allgather_exact_states.py --families shared-agg multi-spine \\
        leaf-spine host-torus --states sharedagg-2x5x8:0 leafspine2-4x2x8-o2:1

prints one line ``STATE=SECONDS`` (fastest of ``--repeat`` cold solves after the kernels
are loaded; ``inf`` past ``--timeout``) with the method and ``k`` that solved it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mccl_opt as mo                                                # noqa: E402
from bench.allgather_chains import FAMILIES, events                 # noqa: E402
from bench.timeouts import SolveTimeout, time_out                   # noqa: E402
from instances import hpn                                           # noqa: E402
from instances.aggregation import scrambled                         # noqa: E402


def states(families: list[str], steps: int, seed: int, budgets: list[str],
           scramble: bool = False, failed: tuple[str, ...] = ()) -> dict[str, mo.Topology]:
    """``NAME:STEP`` (``NAME:K:STEP`` with several budgets) -> topology, drawn as the
    family chains draw them (one chain per budget); ``failed``: the states where the
    fuzz's chain stopped (a failure or time-out ends a chain there, so its later steps
    draw nothing and every later chain's draws shift)."""
    rng = np.random.default_rng(seed)
    out = {}
    for family in families:
        for make in FAMILIES[family]:
            base = make()
            if scramble:                      # as the fuzz's --scramble draws it
                base = scrambled(base, int(rng.integers(1 << 30)))
            for budget in budgets:
                for step, (_, topo) in enumerate(events(base, rng, steps)):
                    key = [base.name] + ([budget] if len(budgets) > 1 else []) + [str(step)]
                    out[":".join(key)] = topo
                    if ":".join(key) in failed:
                        break
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", nargs="+", required=True, choices=sorted(FAMILIES))
    ap.add_argument("--states", nargs="+", required=True, metavar="NAME:STEP")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--budgets", nargs="+", default=["None"],
                    help="the fuzz's --budgets (the states drawn depend on them)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--scramble", action="store_true", help="the fuzz's --scramble")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--failed", nargs="*", default=[], metavar="NAME:STEP",
                    help="states where the fuzz's chain failed or timed out (its chain "
                         "stopped there, shifting the later draws)")
    args = ap.parse_args()
    table = states(args.families, args.steps, args.seed, args.budgets, args.scramble,
                   tuple(args.failed))
    unknown = [s for s in args.states if s not in table]
    if unknown:
        ap.error(f"unknown states {unknown}; known: {sorted(table)}")
    mo.solve_allgather(hpn(1, 2, 4), max_chunks=None)               # kernels loaded
    out = []
    for name in args.states:
        best, how = float("inf"), "time-out"
        for _ in range(args.repeat):
            t = time.perf_counter()
            try:
                with time_out(args.timeout):
                    sched = mo.solve_allgather(table[name], max_chunks=None)
            except SolveTimeout:
                break
            best = min(best, time.perf_counter() - t)
            how = f"{sched.report.method.value} k={sched.stats.get('k')}"
        out.append(f"{name}={best:.3f} ({how})")
    print("  ".join(out), flush=True)


if __name__ == "__main__":
    main()
