"""Unbalanced fabrics at ``max_chunks=None``: CPU seconds of a cold solve, by family
(issue 25; docs/allgather_history.md "Symmetric quotient").

``python bench/bench_allgather_quotient.py [--timeout S] FAMILY:SHAPE:GBPS ...``

``FAMILY`` is ``shared-agg``, ``hpn``, ``superpod``, ``leaf-spine`` or ``multi-spine``;
``SHAPE`` ``SxHxG``; GPU 0's NIC uplink (its link to its ToR / leaf) is set to ``GBPS`` one
way, and each further ``:SRC>DST@GBPS`` sets that link one way (several faults).  Each state is solved once after a kernel warm-up solve (and the quotient's pricing kernel loaded), in a child process killed
after ``--timeout`` seconds (default 120); one line per state: CPU and wall seconds, the
path (``seed``: ``symmetric quotient`` when the quotient answered), rate and LP rate.  The
script imports the package of the checkout it sits in, so compare two checkouts by
running each one's own copy.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from instances import hpn                                               # noqa: E402
from instances.aggregation import leaf_spine, multi_spine, shared_aggregation, superpod  # noqa: E402
import numpy as np                                                      # noqa: E402

from mccl_opt.allgather import solve_allgather                          # noqa: E402
from mccl_opt.allgather.general.sparse_arborescence import min_arborescences_sparse  # noqa: E402
from mccl_opt.topology import Topology                                  # noqa: E402

FAMILIES = {
    "shared-agg": (shared_aggregation, "s0h0g0", "s0tor0"),
    "hpn": (hpn, "s0h0g0", "s0tor0"),
    "multi-spine": (multi_spine, "s0h0g0", "s0tor0"),
    "superpod": (superpod, "u0h0g0", "u0leaf0"),
    "leaf-spine": (leaf_spine, "u0h0g0", "u0leaf0"),
}


def fabric(spec: str) -> Topology:
    """``FAMILY:SxHxG:GBPS[:SRC>DST@GBPS...]`` with GPU 0's NIC uplink at ``GBPS`` one
    way, and each further link ``SRC -> DST`` at its ``GBPS`` one way."""
    family, shape, gbps, *more = spec.split(":")
    make, src, dst = FAMILIES[family]
    s, h, g = (int(v) for v in shape.split("x"))
    topo = make(s, h, g).with_capacity(src=src, dst=dst, gbps=float(gbps), both_directions=False)
    for link in more:
        ends, speed = link.split("@")
        a, b = ends.split(">")
        topo = topo.with_capacity(src=a, dst=b, gbps=float(speed), both_directions=False)
    return topo


def _child(spec: str, out: mp.Queue) -> None:
    solve_allgather(fabric("shared-agg:2x2x8:200"), max_chunks=None)      # kernels
    min_arborescences_sparse(np.ones((4, 4)), np.arange(2), 1)           # the quotient's
    topo = fabric(spec)
    t, c = time.perf_counter(), time.process_time()
    s = solve_allgather(topo, max_chunks=None)
    out.put(f"{spec:48s} gpus={topo.num_gpus:4d} cpu={time.process_time() - c:7.2f} "
            f"wall={time.perf_counter() - t:7.2f} seed={s.stats.get('seed')} "
            f"method={s.stats.get('method')} rate={s.rate_gbps:.10g} lp={s.lp_rate_gbps:.10g} "
            f"termination={s.report.termination.value}")


def main(argv: list[str]) -> None:
    timeout, specs = 120.0, []
    it = iter(argv)
    for a in it:
        if a == "--timeout":
            timeout = float(next(it))
        else:
            specs.append(a)
    for spec in specs or ["shared-agg:2x8x8:200", "shared-agg:2x8x8:150.8"]:
        out: mp.Queue = mp.Queue()
        p = mp.Process(target=_child, args=(spec, out))
        p.start()
        p.join(timeout)
        if p.is_alive():
            p.kill()
            p.join()
            print(f"{spec:48s} not done within {timeout:.0f} s wall", flush=True)
        else:
            print(out.get() if not out.empty() else f"{spec:48s} failed (exit {p.exitcode})",
                  flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
