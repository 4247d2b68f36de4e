"""Every ``None`` state of the fresh families' chains solved cold: the method, its
termination, ``1 - rate / lp_rate`` and ``1 - rate / bound`` and the CPU s; flags a
state reported optimal whose schedule's rate is below its ``lp_rate_gbps`` or
certified bound by more than 1e-9 relative (docs/allgather.md "The tree master's
certificate, exact").

    PYTHONPATH=$PWD python bench/check_general_certificates.py --seed 3530 3531 \\
        [--families multi-plane nvl-islands gpu-mesh] [--steps 2] [--scramble]
"""

from __future__ import annotations

import argparse
import time

import mccl_opt as mo
from bench.allgather_chains import FAMILIES
from bench.replay_allgather_state import draw_chains
from instances import hpn
from mccl_runtime.warmup import load_kernels


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, nargs="+", required=True)
    ap.add_argument("--scramble", action="store_true")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--families", nargs="+", choices=list(FAMILIES),
                    default=["multi-plane", "nvl-islands", "gpu-mesh"])
    a = ap.parse_args()
    load_kernels(collectives=("allgather",))
    mo.solve_allgather(hpn(1, 2, 4), max_chunks=None)
    flagged = total_s = 0.0
    for seed in a.seed:
        chains = draw_chains(seed, a.scramble, a.steps, ["None"], a.families)
        for (name, _), (base, states) in chains.items():
            for step, topo in enumerate([base] + [t for _, t in states]):
                t0 = time.process_time()
                s = mo.solve_allgather(topo, max_chunks=None)
                cpu = time.process_time() - t0
                total_s += cpu
                bound = s.report.bound_gbps or s.lp_rate_gbps
                lp_gap, gap = 1 - s.rate_gbps / s.lp_rate_gbps, 1 - s.rate_gbps / bound
                bad = s.report.termination.value == "optimal" and max(lp_gap, gap) > 1e-9
                flagged += bad
                print(f"{seed} {name[:40]:40s} {step} {s.report.method.value:10s} "
                      f"{s.report.termination.value:8s} lp {lp_gap:9.2e} bound {gap:9.2e} "
                      f"cpu {cpu:6.3f}{'  FLAGGED' if bad else ''}", flush=True)
    print(f"flagged {int(flagged)}; CPU sum {total_s:.2f} s")


if __name__ == "__main__":
    main()
