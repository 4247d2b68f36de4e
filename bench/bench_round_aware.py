"""CPU of the round-aware AllToAll re-synthesis (``solver_synthesizer(shallow=True)``,
docs/executor.md "The round-aware pick under load"): HPN 1x2x4, GPU0 <-> its ToR at each
``--gbps``, 10 % of the other links 0-15 % low (as loaded gloo ranks read them), warm from
the healthy schedule; CPU ms per re-synthesis (``time.process_time``, after one warm-up
call) and the picks' mean round time in the round model.

    python bench/bench_round_aware.py [--gbps 4,50] [--fabrics 10]

Run it on main and on a branch back to back to compare.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from instances import hpn  # noqa: E402
from mccl_opt.lowering.rounds import round_time  # noqa: E402
from mccl_runtime.synthesizer import solver_synthesizer  # noqa: E402

TOPO = hpn(1, 2, 4)
NIC = ("s0h0g0", "s0tor0")


def measured(gbps: float, seed: int) -> np.ndarray:
    """The NIC cable at ``gbps``; 10 % of the links read 0-15 % low."""
    cap = TOPO.arrays.capacity.astype(float).copy()
    for a, b in (NIC, NIC[::-1]):
        cap[TOPO.link_index(a, b)] = gbps
    rng = np.random.default_rng(seed)
    hit = rng.random(cap.size) < 0.1
    return np.where(hit, cap * rng.uniform(0.85, 1.0, cap.size), cap)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gbps", default="4,50")
    ap.add_argument("--fabrics", type=int, default=10)
    args = ap.parse_args()
    synth = solver_synthesizer("highs", shallow=True)
    healthy = synth("alltoall", TOPO, None, None)
    print(f"{'NIC Gbps':>9}{'CPU ms':>9}{'mean round time (1e-10 s/B)':>30}")
    for gbps in (float(g) for g in args.gbps.split(",")):
        fabrics = [TOPO.with_capacities(measured(gbps, s)) for s in range(args.fabrics)]
        synth("alltoall", fabrics[0], healthy, 30.0)
        t0 = time.process_time()
        picks = [synth("alltoall", f, healthy, 30.0) for f in fabrics]
        cpu = (time.process_time() - t0) / len(fabrics)
        rt = np.mean([round_time(p, f) for p, f in zip(picks, fabrics)])
        print(f"{gbps:>9g}{1e3 * cpu:>9.1f}{1e10 * rt:>30.3f}")


if __name__ == "__main__":
    main()
