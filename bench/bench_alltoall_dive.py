"""Warm AllToAll re-synthesis on HPN 2x4x8 along random degradation chains: CPU seconds,
rounded rate and how the deep dive ended per step (docs/alltoall.md, *The dive's budget*).

    PYTHONPATH=$PWD python bench/bench_alltoall_dive.py [--seed 2] [--chains 6] [--steps 5]

Each chain starts healthy; a step degrades a random link (one or both directions) to
3-90 % of its capacity, or with probability 0.3 first returns to the healthy fabric,
and solves warm from the previous step.  Run it on two checkouts back to back to
compare (the sum of rates must match; CPU is ``time.process_time``).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from instances import degrade, hpn
from mccl_opt.alltoall import solve_alltoall

FRACTIONS = (0.03, 0.05, 0.1, 0.2, 0.33, 0.5, 0.7, 0.9)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--chains", type=int, default=6)
    ap.add_argument("--steps", type=int, default=5)
    args = ap.parse_args()
    base = hpn(2, 4, 8)
    solve_alltoall(base)                            # load the kernels outside the timings
    rng = random.Random(args.seed)
    links = list(base.links)
    print("| chain | step | CPU s | rate | LP rate | warm mode | rounding | dive steps | stopped by |")
    print("|---|---|---|---|---|---|---|---|---|")
    cpus, rates = [], []
    for c in range(args.chains):
        topo = base
        prev = solve_alltoall(topo)
        for s in range(args.steps):
            if rng.random() < 0.3:
                topo = base
            link = rng.choice(links)
            cur = topo.link(link.src, link.dst).capacity_gbps
            topo = degrade(topo, link.src, link.dst, cur * rng.choice(FRACTIONS),
                           both_directions=rng.random() < 0.5)
            t = time.process_time()
            sched = solve_alltoall(topo, warm=prev)
            cpu = time.process_time() - t
            st = sched.stats
            print(f"| {c} | {s} | {cpu:.3f} | {sched.rate_gbps:.4f} | {sched.lp_rate_gbps:.4f} | "
                  f"{st.get('warm_mode')} | {st.get('rounding')} | {st.get('dive_steps', '-')} | "
                  f"{st.get('stopped_by', '-')} |")
            cpus.append(cpu)
            rates.append(sched.rate_gbps)
            prev = sched
    print(f"\nCPU s: sum {sum(cpus):.2f}, p50 {statistics.median(cpus):.3f}, max {max(cpus):.3f}; "
          f"sum of rates {sum(rates):.4f}")


if __name__ == "__main__":
    main()
