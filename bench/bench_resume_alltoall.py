"""A controller resumed from its state file, then Fail2: the first AllToAll warm job.

    python bench/bench_resume_alltoall.py --shape 1x64x8 --rounds 2
    python bench/bench_resume_alltoall.py --shape 2x64x8 --rounds 1 --mem-gb 9

The healthy HPN AllToAll schedule (solved once, cached under ``--cache``) is registered
with a thread-synthesis manager (:func:`mccl_runtime.synthesizer.solver_synthesizer`) and
written as a controller state file (:class:`mccl_runtime.state.StateWriter`).  Each round
then, alternating in one process (paired), resumes a fresh manager from that file
(:func:`mccl_runtime.state.load_state` + ``ScheduleManager.restore``), feeds it Fail2
(rank 0's NIC cable 400 -> 50 Gbps) as link telemetry and waits for the published
schedule, once as the controller does it (``restore``: the warm state is rebuilt from the
chunk paths inside the job, docs/runtime.md "Restart") and once with that rebuild turned
off (``none``: the job warm-starts from bare chunk paths).  Rows: resume seconds, the
job's wall and ``synth_s`` (restore + solve + validation), the warm mode, the rate and
the LP rate.  Times are noisy on a shared machine; the load average is printed.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path

import numpy as np


def _samples(healthy, failed, t: float) -> list[dict]:
    """Link telemetry moving the healthy capacities to the failed ones."""
    changed = np.flatnonzero(healthy.arrays.capacity != failed.arrays.capacity)
    return [{"kind": "link", "src": healthy.links[a].src, "dst": healthy.links[a].dst,
             "gbps": float(failed.arrays.capacity[a]), "t": t} for a in changed.tolist()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="1x64x8", help="HPN SxHxN (default 1x64x8: 512 GPUs)")
    ap.add_argument("--rounds", type=int, default=2, help="paired rounds (restore, none) (default 2)")
    ap.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "mccl-bench-resume"),
                    help="folder for the healthy schedule and the state file")
    ap.add_argument("--mem-gb", type=float, default=9.0, help="address-space cap of this process (0: none)")
    args = ap.parse_args(argv)
    if args.mem_gb > 0:
        cap = int(args.mem_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    import mccl_opt as mo
    from instances import fail2, hpn, parse_shape
    from mccl_opt.tables import print_table
    from mccl_runtime.manager import Policy, ScheduleManager
    from mccl_runtime.synthesizer import solver_synthesizer
    from mccl_runtime.state import StateWriter, load_state
    from mccl_runtime.telemetry import MeasurementStore

    healthy = hpn(*parse_shape(args.shape))
    failed = fail2(healthy)
    synth = solver_synthesizer()                      # kernels loaded here, outside the timings
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    sched_path, state_path = cache / f"a2a-{args.shape}.json", cache / f"state-{args.shape}.json"
    if not sched_path.exists():
        mo.solve_alltoall(healthy).save(sched_path)
    policy = Policy(min_dwell_s=0.0, time_limit_s=3600.0)
    store = MeasurementStore(healthy, alpha=1.0)
    mgr = ScheduleManager(store, synth, policy)
    mgr.register("world", "a2a", "alltoall", mo.Schedule.load(sched_path))
    StateWriter(state_path, healthy).write(store, mgr, {})
    mgr.close()

    rows = []
    for _ in range(args.rounds):
        for mode in ("restore", "none"):
            start = time.perf_counter()
            state = load_state(state_path, healthy)
            store = MeasurementStore(healthy, alpha=1.0)
            mgr = ScheduleManager(store, synth, policy)
            store.restore(state["telemetry"])
            mgr.restore(state["manager"])
            resume_s = time.perf_counter() - start
            coll = mgr.get("world", "a2a")
            if mode == "none":
                coll.restore_on = None
            store.ingest(_samples(healthy, failed, 1.0), now=1.0)
            start = time.perf_counter()
            mgr.step(1.0)
            event = mgr.poll(1.0, wait_s=policy.time_limit_s)[-1]
            job_s = time.perf_counter() - start
            rows.append([mode, healthy.num_gpus, round(resume_s, 2), round(job_s, 2),
                         round(float(event.detail.get("synth_s", float("nan"))), 2), event.action,
                         coll.schedule.stats.get("warm_mode"), coll.schedule.rate_gbps,
                         coll.schedule.lp_rate_gbps])
            mgr.close()
    print_table(["mode", "gpus", "resume_s", "job_s", "synth_s", "action", "warm_mode", "rate_gbps",
                 "lp_rate_gbps"], rows)
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
