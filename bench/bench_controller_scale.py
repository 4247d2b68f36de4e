"""One controller decision at cluster scale: ingest a telemetry batch, Algorithm 1 on all.

    python bench/bench_controller_scale.py                          # 512 and 2048 GPUs
    python bench/bench_controller_scale.py --gpus 512 --copies 16 --estimators level

A *decision* (paper §3.2, Algorithm 1; docs/runtime.md "Schedule manager") is what the
controller does per telemetry batch: :meth:`MeasurementStore.ingest` of a batch that
covers every link of the fabric once (``link`` samples at 1 % noise around nominal),
then :meth:`ScheduleManager.check` (the estimator's ``M``, Algorithm 1 and the
capacity-gained test on every registered collective).  The collectives are the ring
AllGather of the fabric (the NCCL-style baseline: every link used, a cut of one link per
GPU), registered under ``--copies`` communicators, so the check's cost per collective
shows.  ``--pairs`` adds one ``pair`` sample per same-rail GPU pair of a segment (what
executors report for inter-node traffic).  Both estimators: the paper's EWMA and the
change-point level estimator (:mod:`mccl_runtime.level`).

Per row: the median and the worst of ``--rounds`` decisions after one warm-up batch
(channels and pair paths resolved), split into ingest and check.  One process on a
shared machine: the load average is printed; compare rows of one run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from instances import hpn  # noqa: E402
from mccl_opt.baselines import ring_allgather  # noqa: E402
from mccl_runtime.manager import Policy, ScheduleManager  # noqa: E402
from mccl_runtime.telemetry import MeasurementStore  # noqa: E402

SHAPES = {128: (1, 16, 8), 512: (2, 32, 8), 1024: (2, 64, 8), 2048: (4, 64, 8), 4096: (8, 64, 8)}


def _no_synthesis(kind, topo, warm, time_limit_s):
    raise RuntimeError("the decision benchmark must not re-synthesize")


def same_rail_pairs(topo) -> list[tuple[str, str]]:
    """Ordered GPU pairs on one rail of one segment (a switch-only path through one ToR)."""
    groups: dict[tuple[str, str], list[str]] = {}
    for g in topo.gpus:
        groups.setdefault((g.split("h")[0], g[g.rindex("g"):]), []).append(g)
    return [(u, v) for members in groups.values() for u in members for v in members if u != v]


def setup(gpus: int, copies: int, schedule=None):
    """The fabric, its ring AllGather and a batch maker (every link once, 1 % noise)."""
    topo = hpn(*SHAPES[gpus])
    return topo, schedule or ring_allgather(topo)


def make_batches(topo, rounds: int, pairs: bool, seed: int = 0) -> list[list[dict]]:
    rng = np.random.default_rng(seed)
    cap = topo.arrays.capacity
    ends = [(l.src, l.dst) for l in topo.links]
    prs = same_rail_pairs(topo) if pairs else []
    out = []
    for i in range(rounds + 1):
        t = 1e-3 * (i + 1)
        noise = 1.0 + 0.01 * rng.standard_normal(len(ends) + len(prs))
        batch = [{"kind": "link", "src": s, "dst": d, "gbps": float(cap[a] * noise[a]), "t": t}
                 for a, (s, d) in enumerate(ends)]
        batch += [{"kind": "pair", "src": u, "dst": v, "gbps": float(400.0 * noise[len(ends) + j]), "t": t}
                  for j, (u, v) in enumerate(prs)]
        out.append(batch)
    return out


def measure(topo, schedule, estimator: str, copies: int, batches: list[list[dict]]) -> dict:
    store = MeasurementStore(topo, alpha=0.012, estimator=estimator, clock=lambda: 1e9)
    mgr = ScheduleManager(store, _no_synthesis, Policy(gamma=0.1, min_dwell_s=0.0))
    for c in range(copies):
        mgr.register(f"comm{c}", "ag", "allgather", schedule)
    ingest_ms, check_ms = [], []
    for i, batch in enumerate(batches):
        now = batch[0]["t"]
        t0 = time.perf_counter()
        store.ingest(batch, now=now)
        t1 = time.perf_counter()
        flagged = mgr.check(now)
        t2 = time.perf_counter()
        if flagged:
            raise RuntimeError(f"1 % noise flagged {len(flagged)} collectives at round {i}")
        if i:
            ingest_ms.append(1e3 * (t1 - t0))
            check_ms.append(1e3 * (t2 - t1))
    mgr.close()
    total = np.add(ingest_ms, check_ms)
    return {"gpus": topo.num_gpus, "links": topo.num_links, "samples": len(batches[0]), "estimator": estimator,
            "collectives": copies, "ingest_ms": float(np.median(ingest_ms)), "check_ms": float(np.median(check_ms)),
            "decision_ms": float(np.median(total)), "worst_ms": float(np.max(total))}


def main(argv: list[str] | None = None) -> list[dict]:
    from mccl_opt.tables import print_table

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", default="512,2048", help=f"comma separated, from {sorted(SHAPES)}")
    p.add_argument("--copies", type=int, default=1, help="communicators the ring AllGather is registered under")
    p.add_argument("--estimators", default="ewma,level")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--pairs", action="store_true", help="add one pair sample per same-rail GPU pair")
    a = p.parse_args(argv)
    rows = []
    for gpus in (int(x) for x in a.gpus.split(",")):
        if gpus not in SHAPES:
            p.error(f"no HPN shape for {gpus} GPUs; choose from {sorted(SHAPES)}")
        topo, schedule = setup(gpus, a.copies)
        batches = make_batches(topo, a.rounds, a.pairs)
        for est in a.estimators.split(","):
            rows.append(measure(topo, schedule, est, a.copies, batches))
            print(rows[-1], flush=True)
    print_table(["GPUs", "links", "samples", "estimator", "collectives", "ingest ms", "check ms",
                 "decision ms (median)", "worst ms"],
                [[r["gpus"], r["links"], r["samples"], r["estimator"], r["collectives"], r["ingest_ms"],
                  r["check_ms"], r["decision_ms"], r["worst_ms"]] for r in rows])
    print(f"load average {os.getloadavg()}")
    return rows


if __name__ == "__main__":
    main()
