"""Cold vs warm AllToAll CPU time after one NIC event (issue 25 item 2, "warm is never
the slow path"; docs/alltoall.md).

For each fabric and event (GPU0's NIC to 1 %, 10 % or 50 % of nominal, one way or both,
then the repair back to healthy), solves the changed fabric cold and warm from the
previous schedule, alternated, best of ``--repeat`` process-CPU times, and prints one
table row with the warm mode and both LP rates (they must agree).

    python bench/bench_alltoall_warm_events.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import time

from instances import degrade, hpn, irregular
from mccl_opt.alltoall import solve_alltoall


def _cpu(f):
    t = time.process_time()
    out = f()
    return time.process_time() - t, out


def _fabrics():
    for shape in ((1, 2, 8), (1, 8, 8), (2, 4, 8)):
        topo = hpn(*shape)
        g = topo.gpus[0]
        yield "hpn-" + "x".join(map(str, shape)), topo, g, next(
            l.dst for l in topo.links if l.src == g and "tor" in l.dst)
    topo = irregular(2, max_hosts=4, max_gpus_per_host=8)
    link = max((l for l in topo.links if topo.is_gpu(l.src) and not topo.is_gpu(l.dst)),
               key=lambda l: (l.capacity_gbps, l.src, l.dst))
    yield "irregular-2", topo, link.src, link.dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    print("| fabric | event | cold ms | warm ms | warm/cold | warm mode | rates equal |")
    print("|---|---|---|---|---|---|---|")
    for name, base, src, dst in _fabrics():
        healthy = solve_alltoall(base)
        cap = base.link(src, dst).capacity_gbps
        for frac in (0.01, 0.1, 0.5):
            for both in (False, True):
                topo = degrade(base, src, dst, cap * frac, both_directions=both)
                solve_alltoall(topo)
                rows = []
                for label, new, prev in ((f"{frac:.0%} {'two' if both else 'one'}-way", topo, healthy),
                                         ("repair of it", base, None)):
                    prev = prev or solve_alltoall(topo, warm=healthy)
                    cold_s = warm_s = float("inf")
                    for _ in range(args.repeat):
                        tc, cold = _cpu(lambda: solve_alltoall(new))
                        tw, warm = _cpu(lambda: solve_alltoall(new, warm=prev))
                        cold_s, warm_s = min(cold_s, tc), min(warm_s, tw)
                    same = abs(warm.lp_rate_gbps - cold.lp_rate_gbps) <= 1e-6 * cold.lp_rate_gbps
                    rows.append(f"| {name} | {label} | {cold_s * 1e3:.1f} | {warm_s * 1e3:.1f} | "
                                f"{warm_s / cold_s:.2f} | {warm.stats['warm_mode']} | {same} |")
                print("\n".join(rows), flush=True)


if __name__ == "__main__":
    main()
