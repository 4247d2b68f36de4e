"""Synthesis inside the real-rank loop against the same jobs run alone (issue 26; docs/executor.md,
"Synthesis inside the loop").

    python bench/bench_synth_in_loop.py [--collective alltoall] [--cls ramp] [--runs 2] [--reps 3]
                                        [--rank-nice N] [--tree DIR]

Each run is one ``bench_executor_loop.py`` class run (8 gloo ranks, HPN 1x2x4).  The
controller it starts (and its synthesis workers) import a ``sitecustomize`` written here
that wraps :func:`mccl_runtime.pool.run_job`: every job records its wall time, the CPU
time of the thread that ran it, that thread's run-queue wait (``/proc/thread-self/schedstat``:
runnable but not running), its garbage collections, its context switches, the CPU the
controller's other threads took meanwhile, and its inputs.  Wall minus CPU minus run-queue
wait is the time the thread was blocked (the GIL, a lock, I/O).  Right after the run the same jobs are
replayed ``--reps`` times in a fresh process in its own session ("alone": same machine,
same code, no loop running), then in this process's session ("here": the scheduling group,
under autogroup, of the ranks, and of a controller that shares their session); the table
compares each job's wall time in the loop with the median alone.  Product code is not changed.
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
    import gc, os, pickle, resource, threading, time
    import mccl_runtime.pool as _pool

    _inner = _pool.run_job
    _gc = {"thread": None, "t0": 0.0, "cpu": 0.0, "n": 0}

    def _on_gc(phase, info):                     # collections run by the job's thread, CPU
        if threading.get_ident() != _gc["thread"]:
            return
        if phase == "start":
            _gc["t0"] = time.thread_time()
        else:
            _gc["cpu"] += time.thread_time() - _gc["t0"]
            _gc["n"] += 1

    gc.callbacks.append(_on_gc)

    def _sched():
        try:
            with open("/proc/thread-self/schedstat") as f:
                cpu, wait, _ = f.read().split()
            return int(cpu) / 1e9, int(wait) / 1e9
        except OSError:
            return float("nan"), float("nan")

    def run_job(topo, synthesize, kind, warm, time_limit_s, warm_fabric=None, clock=time.perf_counter):
        inputs = (kind, topo, warm, time_limit_s, warm_fabric)
        _gc.update(thread=threading.get_ident(), cpu=0.0, n=0)
        r0 = resource.getrusage(resource.RUSAGE_THREAD)
        w0, c0, p0, s0 = time.perf_counter(), time.thread_time(), time.process_time(), _sched()
        out = _inner(topo, synthesize, kind, warm, time_limit_s, warm_fabric, clock)
        s1, r1 = _sched(), resource.getrusage(resource.RUSAGE_THREAD)
        cpu = time.thread_time() - c0
        rec = {"wall": time.perf_counter() - w0, "cpu": cpu, "runq": s1[1] - s0[1],
               "rate": out[0].rate_gbps, "gc": _gc["cpu"], "gcn": _gc["n"],
               "others": time.process_time() - p0 - cpu, "vcsw": r1.ru_nvcsw - r0.ru_nvcsw,
               "ivcsw": r1.ru_nivcsw - r0.ru_nivcsw, "threads": len(os.listdir("/proc/self/task"))}
        _gc["thread"] = None
        with open(os.path.join(os.environ["MCCL_BENCH_JOBS"], f"job-{time.time_ns()}.pkl"), "wb") as f:
            pickle.dump((rec, inputs), f)
        return out

    import mccl_runtime.manager as _manager      # it imported the original by name

    _pool.run_job = _manager.run_job = run_job
''')

#: run in a fresh session after the loop: each warm job ``reps`` times, medians
ALONE = textwrap.dedent('''
    import glob, pickle, resource, statistics, sys, time
    from mccl_runtime.synthesizer import solver_synthesizer
    from mccl_runtime.pool import run_job
    synth = solver_synthesizer("highs", shallow=True)
    jobs = [pickle.load(open(f, "rb"))[1] for f in sorted(glob.glob(sys.argv[1] + "/*.pkl"))]
    for kind, topo, warm, tl, wf in jobs:                   # first use in this process, untimed
        run_job(topo, synth, kind, warm, tl, wf)
    for kind, topo, warm, tl, wf in jobs:
        walls, cpus, csw = [], [], []
        for _ in range(int(sys.argv[2])):
            r0 = resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw
            w0, c0 = time.perf_counter(), time.thread_time()
            run_job(topo, synth, kind, warm, tl, wf)
            walls.append(time.perf_counter() - w0); cpus.append(time.thread_time() - c0)
            csw.append(resource.getrusage(resource.RUSAGE_THREAD).ru_nivcsw - r0)
        print(statistics.median(walls), statistics.median(cpus), statistics.median(csw))
''')


def one_run(collective: str, cls: str, reps: int, workers: int, tree: Path,
            extra: list[str]) -> list[tuple[dict, float, float, float, float]]:
    """One loop run of the code in ``tree``; per warm job ``(loop record, alone wall, alone cpu,
    alone involuntary context switches, alone wall in this process's session)``."""
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "sitecustomize.py").write_text(SITECUSTOMIZE)
        jobs = Path(tmp, "jobs")
        jobs.mkdir()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([tmp, str(tree), os.environ.get("PYTHONPATH", "")]),
                   MCCL_BENCH_JOBS=str(jobs))
        cmd = [sys.executable, str(tree / "bench/bench_executor_loop.py"), "--collectives", collective,
               "--classes", cls, "--json", "--workers", str(workers), *extra]
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
        alone = []
        for own_session in (True, False):
            out = subprocess.run([sys.executable, "-c", ALONE, str(jobs), str(reps)], env=env, check=True,
                                 capture_output=True, text=True, start_new_session=own_session, timeout=600).stdout
            alone.append([tuple(map(float, line.split())) for line in out.splitlines() if line.strip()])
    return [(rec, w, c, n, here[0]) for rec, (w, c, n), here in zip(recs, *alone)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--collective", default="alltoall")
    ap.add_argument("--cls", default="ramp", help="scenario class (bench_executor_loop.py --classes)")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3, help="alone repetitions per job (median)")
    ap.add_argument("--workers", type=int, default=0, help="the controller's --workers (0: a thread)")
    ap.add_argument("--rank-nice", type=int, help="bench_executor_loop.py --rank-nice (0: as before; this tree only)")
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose code runs (default: this one)")
    args = ap.parse_args()
    print(f"{args.collective} {args.cls}, 8 gloo ranks; ms per re-synthesis job: in the loop "
          f"(wall, thread CPU, run-queue wait, blocked) and alone (wall, CPU; median of {args.reps})")
    print("gc: the job thread's CPU in garbage collections (count); others: CPU of the controller's other "
          "threads meanwhile; csw: the job thread's voluntary / involuntary context switches "
          "(alone: involuntary); here: alone in this session, wall")
    print(f"{'run':>4}{'load':>6}{'wall':>7}{'cpu':>6}{'runq':>6}{'blocked':>8}{'alone':>7}{'cpu':>6}{'ratio':>7}"
          f"{'cpu x':>7}{'gc':>9}{'others':>7}{'csw':>10}{'alone':>6}{'here':>6}{'ratio':>7}")
    ratios, cpu_ratios, here_ratios = [], [], []
    for run in range(args.runs):
        load = os.getloadavg()[0]
        for rec, w, c, n, h in one_run(args.collective, args.cls, args.reps, args.workers, args.tree.resolve(),
                                      [] if args.rank_nice is None else ["--rank-nice", str(args.rank_nice)]):
            ratios.append(rec["wall"] / w)
            print(f"{run:>4}{load:>6.1f}{1e3 * rec['wall']:>7.0f}{1e3 * rec['cpu']:>6.0f}{1e3 * rec['runq']:>6.0f}"
                  f"{1e3 * (rec['wall'] - rec['cpu'] - rec['runq']):>8.0f}{1e3 * w:>7.0f}{1e3 * c:>6.0f}"
                  f"{rec['wall'] / w:>7.2f}{rec['cpu'] / c:>7.2f}{1e3 * rec['gc']:>6.0f}({rec['gcn']})"
                  f"{1e3 * rec['others']:>7.0f}{rec['vcsw']:>5}/{rec['ivcsw']:<4}{n:>6.0f}{1e3 * h:>6.0f}"
                  f"{rec['wall'] / h:>7.2f}", flush=True)
            cpu_ratios.append(rec["cpu"] / c)
            here_ratios.append(rec["wall"] / h)
    if ratios:
        print(f"in the loop / alone, wall: median {statistics.median(ratios):.2f}, "
              f"range {min(ratios):.2f}-{max(ratios):.2f} over {len(ratios)} jobs; CPU: median "
              f"{statistics.median(cpu_ratios):.2f}, range {min(cpu_ratios):.2f}-{max(cpu_ratios):.2f}; "
              f"wall against alone here: median {statistics.median(here_ratios):.2f}, "
              f"range {min(here_ratios):.2f}-{max(here_ratios):.2f}")


if __name__ == "__main__":
    main()
