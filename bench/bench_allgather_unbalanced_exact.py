"""Unbalanced HPN at ``max_chunks=None``: cold seconds per phase of the chain and of the
general method (issue 25's 512-GPU target; docs/allgather_history.md "Restriction seed").

``python bench/bench_allgather_unbalanced_exact.py [--repeat R] [--gbps G] 4x8x8 4x16x8``

The fabric is ``hpn(S, H, N)`` with rank 0's NIC uplink (``s0h0g0 -> s0tor0``) at a
quarter of its speed one way (``--gbps``: at ``G`` Gbps instead, e.g. 176.76).  After a kernel warm-up solve each shape is solved cold
``--repeat`` times (in this process); one line per solve: wall and CPU seconds, every
attempt of the chain (``report.attempts``), the general method's phases (``seed_s``,
``lp_s``: every master solve, ``first_lp_s``: the first one, ``pricing_s``), its rounds
and seed columns, the link rows its master held (``link_rows``: fewer than the links
when lazy rows left some out; none of these from 256 GPUs, where ForestColl on the
restriction answers by the scaled packing, docs "Scaled packing on the restriction"),
and the rates (``rate``, ``lp``, the certified ``bound``), which must agree with the
restriction's certified optimum.  Note: the script imports the package of the checkout
it sits in (its first ``sys.path`` entry), so compare two checkouts by running each
one's own copy.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from instances import hpn, parse_shape                                # noqa: E402
from instances.hpn import NIC_GBPS, gpu_id, tor_id                    # noqa: E402
from mccl_opt.allgather import solve_allgather                        # noqa: E402
from mccl_opt.topology import Topology                                # noqa: E402

GENERAL = ("seed_columns", "seed_s", "first_lp_s", "lp_s", "pricing_s", "cg_rounds", "cg_gap",
           "link_rows")


def fabric(shape: str, gbps: float = NIC_GBPS / 4) -> Topology:
    """``hpn-<shape>`` with rank 0's NIC uplink at ``gbps`` (a quarter of its speed), one
    way."""
    topo = hpn(*parse_shape(shape))
    return topo.with_capacity(src=gpu_id(0, 0, 0), dst=tor_id(0, 0), gbps=gbps,
                              both_directions=False).renamed(f"{topo.name}-oneway")


def solve_once(topo: Topology) -> str:
    """One cold exact solve, as one line."""
    t, c = time.perf_counter(), time.process_time()
    s = solve_allgather(topo, max_chunks=None)
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    tries = " ".join(f"{a.method.value}={a.seconds:.2f}" for a in s.report.attempts)
    general = " ".join(f"{k}={s.stats[k]:.3g}" if isinstance(s.stats[k], float)
                       else f"{k}={s.stats[k]}" for k in GENERAL if k in s.stats)
    return (f"{topo.name} gpus={topo.num_gpus} wall={wall:.2f} cpu={cpu:.2f} "
            f"method={s.stats.get('method')} [{tries}] {general} rate={s.rate_gbps:.10g} "
            f"lp={s.lp_rate_gbps:.10g} bound={s.report.bound_gbps:.10g} "
            f"termination={s.report.termination.value}")


def main(argv: list[str]) -> None:
    repeat, gbps, shapes = 1, NIC_GBPS / 4, []
    it = iter(argv)
    for a in it:
        if a == "--repeat":
            repeat = int(next(it))
        elif a == "--gbps":
            gbps = float(next(it))
        else:
            shapes.append(a)
    solve_allgather(fabric("1x2x8"), max_chunks=None)            # kernels, outside the timings
    for shape in shapes or ["4x8x8"]:
        topo = fabric(shape, gbps)
        for _ in range(repeat):
            print(solve_once(topo), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
