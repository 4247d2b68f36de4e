"""The Figure 14 sweep and the joint re-synthesis target (docs/training.md "Measured").

    python bench/bench_train.py                         # both models, 128-2048 GPUs, healthy + Fail1/2/3
    python bench/bench_train.py --gpus 128,256 --relay host --reduce-scatter mccl
    python bench/bench_train.py --joint-only --gpus 1024   # joint vs independent, DeepSeek Fail2

Prints one table per relay policy (iteration times, speedup of MCCL over static NCCL,
the paper's 2.85x / 4.99x next to Fail2) and the sweep's synthesis and wall time.
"""

from __future__ import annotations

import argparse
import time

from instances import FAILURES, hpn
from mccl_opt.tables import print_table
from mccl_opt.training.builtin import builtin_workload
from mccl_opt.training.comms import LoadCache
from mccl_opt.training.figure import timed_sweep
from mccl_opt.training.iteration import fabric_state
from mccl_opt.training.joint import joint_resynthesis

PAPER_FAIL2 = {"llama3-405b": 2.85, "deepseek-v3": 4.99}


def fabric(n: int):
    return hpn(1, n // 8, 8) if n <= 128 else hpn(n // 128, 16, 8)


def sweep(gpus: list[int], relay: str, reduce_scatter: str) -> None:
    models = {m: (lambda n, m=m: builtin_workload(m, n)) for m in ("llama3-405b", "deepseek-v3")}
    out = timed_sweep(models, gpus, fabric, FAILURES, relay=relay, reduce_scatter=reduce_scatter)
    rows = [(r["model"], r["gpus"], r["state"], r["iteration_s_healthy"], r["iteration_s_healthy_mccl"],
             r["iteration_s_static"], r["iteration_s_mccl"], r["speedup"],
             PAPER_FAIL2[r["model"]] if r["state"] == "fail2" else "", r["collective_share_healthy"])
            for r in out["rows"]]
    print(f"\nrelay = {relay}, reduce-scatter = {reduce_scatter}")
    print_table(["model", "gpus", "state", "healthy_nccl_s", "healthy_mccl_s", "static_s", "mccl_s",
                 "speedup", "paper", "comm_share"], rows)
    s = out["synthesis"]
    print(f"synthesis {s['synthesis_s']:.1f} s ({s['syntheses']} schedules, {s['reused']} reused), "
          f"baselines {s['baseline_s']:.1f} s, sweep wall {s['wall_s']:.1f} s")


def joint(gpus: list[int], relays: list[str], models: list[str], failure: str, reduce_scatter: str) -> None:
    rows = []
    for model in models:
        for n in gpus:
            healthy = fabric(n)
            w = builtin_workload(model, n)
            for relay in relays:
                start = time.perf_counter()
                res = joint_resynthesis(w, fabric_state(FAILURES[failure](healthy), w, relay), healthy,
                                        LoadCache(reduce_scatter=reduce_scatter))
                rows.append((model, n, relay, failure, res.independent_s, res.seconds,
                             1 - res.seconds / res.independent_s, res.best, len(res.candidates),
                             time.perf_counter() - start))
    print_table(["model", "gpus", "relay", "state", "independent_s", "joint_s", "gain", "best", "candidates",
                 "wall_s"], rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", default="128,256,512,1024,2048")
    p.add_argument("--relay", default="members,host", help="comma-separated relay policies")
    p.add_argument("--reduce-scatter", default="ring", choices=("ring", "mccl"))
    p.add_argument("--joint-only", action="store_true")
    p.add_argument("--models", default="deepseek-v3", help="models of the joint table")
    p.add_argument("--failure", default="fail2", help="state of the joint table")
    args = p.parse_args()
    gpus = [int(x) for x in args.gpus.split(",")]
    relays = args.relay.split(",")
    if not args.joint_only:
        for relay in relays:
            sweep(gpus, relay, args.reduce_scatter)
    joint(gpus if args.joint_only else [min(gpus)], relays, args.models.split(","), args.failure,
          args.reduce_scatter)


if __name__ == "__main__":
    main()
