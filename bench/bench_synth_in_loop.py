"""Synthesis inside the real-rank loop against the same jobs run alone (issue 26; docs/executor.md,
"Synthesis inside the loop").

    python bench/bench_synth_in_loop.py [--collective alltoall] [--cls ramp] [--runs 2] [--reps 3]

Each run is one ``bench_executor_loop.py`` class run (8 gloo ranks, HPN 1x2x4).  The
controller it starts (and its synthesis workers) import a ``sitecustomize`` written here
that wraps :func:`mccl_runtime.pool.run_job`: every job records its wall time, the CPU
time of the thread that ran it, that thread's run-queue wait (``/proc/thread-self/schedstat``:
runnable but not running) and its inputs.  Wall minus CPU minus run-queue wait is the time
the thread was blocked (the GIL, a lock, I/O).  Right after the run the same jobs are
replayed ``--reps`` times in a fresh process in its own session ("alone": same machine,
same code, no loop running); the table compares each job's wall time in the loop with the
median alone.  Product code is not changed.
"""

from __future__ import annotations

import argparse
import glob
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: imported by every Python process the loop starts (the controller, its pool workers)
SITECUSTOMIZE = textwrap.dedent('''
    import os, pickle, time
    import mccl_runtime.pool as _pool

    _inner = _pool.run_job

    def _sched():
        try:
            with open("/proc/thread-self/schedstat") as f:
                cpu, wait, _ = f.read().split()
            return int(cpu) / 1e9, int(wait) / 1e9
        except OSError:
            return float("nan"), float("nan")

    def run_job(topo, synthesize, kind, warm, time_limit_s, warm_fabric=None, clock=time.perf_counter):
        inputs = (kind, topo, warm, time_limit_s, warm_fabric)
        w0, c0, s0 = time.perf_counter(), time.thread_time(), _sched()
        out = _inner(topo, synthesize, kind, warm, time_limit_s, warm_fabric, clock)
        s1 = _sched()
        rec = {"wall": time.perf_counter() - w0, "cpu": time.thread_time() - c0, "runq": s1[1] - s0[1],
               "rate": out[0].rate_gbps}
        with open(os.path.join(os.environ["MCCL_BENCH_JOBS"], f"job-{time.time_ns()}.pkl"), "wb") as f:
            pickle.dump((rec, inputs), f)
        return out

    import mccl_runtime.manager as _manager      # it imported the original by name

    _pool.run_job = _manager.run_job = run_job
''')

#: run in a fresh session after the loop: each warm job ``reps`` times, medians
ALONE = textwrap.dedent('''
    import glob, pickle, statistics, sys, time
    from mccl_runtime.synthesizer import solver_synthesizer
    from mccl_runtime.pool import run_job
    synth = solver_synthesizer("highs", shallow=True)
    jobs = [pickle.load(open(f, "rb"))[1] for f in sorted(glob.glob(sys.argv[1] + "/*.pkl"))]
    for kind, topo, warm, tl, wf in jobs:                   # first use in this process, untimed
        run_job(topo, synth, kind, warm, tl, wf)
    for kind, topo, warm, tl, wf in jobs:
        walls, cpus = [], []
        for _ in range(int(sys.argv[2])):
            w0, c0 = time.perf_counter(), time.thread_time()
            run_job(topo, synth, kind, warm, tl, wf)
            walls.append(time.perf_counter() - w0); cpus.append(time.thread_time() - c0)
        print(statistics.median(walls), statistics.median(cpus))
''')


def one_run(collective: str, cls: str, reps: int, workers: int, tree: Path) -> list[tuple[dict, float, float]]:
    """One loop run of the code in ``tree``; per warm job ``(loop record, alone wall, alone cpu)``."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "sitecustomize.py").write_text(SITECUSTOMIZE)
        jobs = Path(tmp, "jobs")
        jobs.mkdir()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([tmp, str(tree), os.environ.get("PYTHONPATH", "")]),
                   MCCL_BENCH_JOBS=str(jobs))
        cmd = [sys.executable, str(tree / "bench/bench_executor_loop.py"), "--collectives", collective,
               "--classes", cls, "--json", "--workers", str(workers)]
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=600)
        recs = []
        for f in sorted(glob.glob(f"{jobs}/*.pkl")):
            with open(f, "rb") as fh:
                rec, inputs = pickle.load(fh)
            if inputs[2] is None:                            # the first schedule (cold): not a re-synthesis
                os.remove(f)
                continue
            recs.append(rec)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")]))
        out = subprocess.run([sys.executable, "-c", ALONE, str(jobs), str(reps)], env=env, check=True,
                             capture_output=True, text=True, start_new_session=True, timeout=600).stdout
        alone = [tuple(map(float, line.split())) for line in out.splitlines() if line.strip()]
    return [(rec, w, c) for rec, (w, c) in zip(recs, alone)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--collective", default="alltoall")
    ap.add_argument("--cls", default="ramp", help="scenario class (bench_executor_loop.py --classes)")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3, help="alone repetitions per job (median)")
    ap.add_argument("--workers", type=int, default=0, help="the controller's --workers (0: a thread)")
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose code runs (default: this one)")
    args = ap.parse_args()
    print(f"{args.collective} {args.cls}, 8 gloo ranks; ms per re-synthesis job: in the loop "
          f"(wall, thread CPU, run-queue wait, blocked) and alone (wall, CPU; median of {args.reps})")
    print(f"{'run':>4}{'load':>6}{'wall':>7}{'cpu':>6}{'runq':>6}{'blocked':>8}{'alone':>7}{'cpu':>6}{'ratio':>7}")
    ratios = []
    for run in range(args.runs):
        load = os.getloadavg()[0]
        for rec, w, c in one_run(args.collective, args.cls, args.reps, args.workers, args.tree.resolve()):
            ratios.append(rec["wall"] / w)
            print(f"{run:>4}{load:>6.1f}{1e3 * rec['wall']:>7.0f}{1e3 * rec['cpu']:>6.0f}{1e3 * rec['runq']:>6.0f}"
                  f"{1e3 * (rec['wall'] - rec['cpu'] - rec['runq']):>8.0f}{1e3 * w:>7.0f}{1e3 * c:>6.0f}"
                  f"{rec['wall'] / w:>7.2f}", flush=True)
    if ratios:
        print(f"in the loop / alone, wall: median {statistics.median(ratios):.2f}, "
              f"range {min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} jobs")


if __name__ == "__main__":
    main()
