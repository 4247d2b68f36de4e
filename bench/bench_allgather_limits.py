"""``time_limit`` overrun of both collectives and AllGather's first schedule's cost at
80-2048 GPUs (docs/allgather_history.md, "Time limits, warm budgets and the typed report";
docs/alltoall.md, "Time limits").

``python bench/bench_allgather_limits.py [--limits S ...] [--big] [--sizes N ...]
[--collective allgather|alltoall|both] [--exact]``; ``--suite issue25|short|tiny [--only
TEXT ...] [--trace] [--where] [--repeat N]``

Per fabric: AllGather's first schedule's seconds and rate (:func:`mccl_opt.allgather.
first.first_schedule`, cold), then ``solve_<collective>(..., time_limit=S)`` for every
limit: elapsed seconds, the overrun past ``1.2 S + 0.05`` (the issue's bound; 0 when
inside it), how the solve ended, the method returned, its rate and certified bound.
Kernels are compiled first.  ``--big`` adds 1024-GPU fabrics; ``--sizes`` replaces the
fabrics by HPN ``N/128 x 16 x 8`` and, for ``N <= 1024``, two segments of ``N/16``
hosts sharing one aggregation switch; ``--exact`` solves at ``max_chunks=None``
(default 10).

``--suite issue25``: issue 25's matrix of AllGather limits (:data:`SUITE`), each case at
its own chunk budgets and limits: HPN 4x16x8 / 2x32x8 with one NIC at a quarter speed
one way at ``max_chunks=None`` (1, 3, 10 s), shared aggregation 2x16x8 / 2x64x8 at
``K=10`` and ``None``, leaf-spine and SuperPOD at 128 GPUs (0.2 s), and shared
aggregation 2x5x8 scrambled (node order and names, 0.5 s).  Per solve: the limit, wall
and CPU seconds, numba kernels loaded or compiled inside the call (``kern``, s: not the
solve's; ``mccl warmup`` loads them ahead), the overrun ratio ``(wall - kern) / (1.2 S +
0.05)`` (over 1: past the issue's bound, marked ``!``; ``-`` for a solve without a
limit, which a limit of ``none`` runs: the cold solve's own time), ``late``: the solving
thread's CPU ms past the deadline (read by a timer thread at ``S``; on a loaded machine
its wall time is this over the CPU share, so it tells a step no check point reached
from a stall), the status, the rate and its ratio to the best known rate
(:data:`BEST_KNOWN`, docs/allgather.md; else the best rate of the run, marked ``~``).
``--suite short`` (:data:`SHORT`): limits of 0.05, 0.1, 0.3 and 1 s on the largest fabrics
(HPN 4x16x8 / 2x32x8 / 8x16x8 with the one-way NIC, shared aggregation 2x64x8 as built and
with it) at ``K=10`` and ``None``.
``--suite tiny`` (:data:`TINY`): limits of 5, 10 and 20 ms on shared aggregation 2x16x8 /
2x64x8 and HPN 2x32x8 (256-1024 GPUs) at ``K=10`` and ``None``.
``--where`` prints where each limited solve stopped; ``--repeat`` runs the suite N times.
``--only`` keeps the cases whose name contains one of the texts; ``--trace`` prints, per
solve, the project frames a thread sampled every 20 ms once the solve was past ``1.2 S +
0.05`` (the step no check point reached; samples land between compiled calls).  The load average is
printed before and after: on a shared machine compare CPU seconds.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import threading
import time
from typing import Callable

import mccl_opt as mo
from instances import hpn
from instances.aggregation import leaf_spine, scrambled, shared_aggregation, superpod
from mccl_opt.allgather.canonical import canonical
from mccl_opt.allgather.first import first_schedule


def _one_way_nic(topo: mo.Topology) -> mo.Topology:
    """The first GPU's NIC uplink at a quarter of its speed, one direction only."""
    gpu = topo.gpus[0]
    link = next(l for l in topo.links if l.src == gpu and "tor" in l.dst)
    return topo.with_capacity({(link.src, link.dst): link.capacity_gbps / 4})


CASES: list[tuple[str, Callable[[], mo.Topology]]] = [
    ("hpn-2x8x8", lambda: hpn(2, 8, 8)),
    ("sharedagg-2x8x8-nic1way", lambda: _one_way_nic(shared_aggregation(2, 8, 8))),
    ("sharedagg-2x16x8", lambda: shared_aggregation(2, 16, 8)),
    ("hpn-4x16x8-nic1way", lambda: _one_way_nic(hpn(4, 16, 8))),
]
BIG: list[tuple[str, Callable[[], mo.Topology]]] = [
    ("hpn-8x16x8", lambda: hpn(8, 16, 8)),
    ("sharedagg-2x64x8", lambda: shared_aggregation(2, 64, 8)),
]

#: (name, fabric, chunk budgets, limits in s) of ``--suite issue25``
SUITE: list[tuple[str, Callable[[], mo.Topology], list[int | None], list[float | None]]] = [
    ("leafspine-8x2x8", lambda: leaf_spine(8, 2, 8), [10, None], [0.2]),
    ("superpod-4x4x8", lambda: superpod(4, 4, 8), [10, None], [0.2]),
    ("sharedagg-2x5x8-scrambled7", lambda: scrambled(shared_aggregation(2, 5, 8), 7),
     [10, None], [0.5, None]),
    ("sharedagg-2x16x8", lambda: shared_aggregation(2, 16, 8), [10, None], [0.5, 2.0, None]),
    ("hpn-4x16x8-nic1way", lambda: _one_way_nic(hpn(4, 16, 8)), [None], [1.0, 3.0, 10.0]),
    ("hpn-2x32x8-nic1way", lambda: _one_way_nic(hpn(2, 32, 8)), [None], [1.0, 3.0, 10.0]),
    ("sharedagg-2x64x8", lambda: shared_aggregation(2, 64, 8), [10, None], [1.0, 5.0, 20.0, None]),
]

#: ``--suite short``: limits of 50 ms to 1 s on the largest fabrics (512-1024 GPUs, one-way
#: NIC faults), at the default budget and at ``max_chunks=None``
SHORT_LIMITS: list[float | None] = [0.05, 0.1, 0.3, 1.0]
SHORT: list[tuple[str, Callable[[], mo.Topology], list[int | None], list[float | None]]] = [
    ("hpn-4x16x8-nic1way", lambda: _one_way_nic(hpn(4, 16, 8)), [10, None], SHORT_LIMITS),
    ("hpn-2x32x8-nic1way", lambda: _one_way_nic(hpn(2, 32, 8)), [10, None], SHORT_LIMITS),
    ("sharedagg-2x64x8", lambda: shared_aggregation(2, 64, 8), [10, None], SHORT_LIMITS),
    ("sharedagg-2x64x8-nic1way", lambda: _one_way_nic(shared_aggregation(2, 64, 8)), [10, None],
     SHORT_LIMITS),
    ("hpn-8x16x8-nic1way", lambda: _one_way_nic(hpn(8, 16, 8)), [10, None], SHORT_LIMITS),
]
#: ``--suite tiny``: limits of 5-20 ms on 256-1024 GPU fabrics, where every step that
#: runs past a deadline without a check shows (docs/allgather.md, "The leftovers past the
#: deadline")
TINY_LIMITS: list[float | None] = [0.005, 0.01, 0.02]
TINY: list[tuple[str, Callable[[], mo.Topology], list[int | None], list[float | None]]] = [
    ("sharedagg-2x16x8", lambda: shared_aggregation(2, 16, 8), [10, None], TINY_LIMITS),
    ("hpn-2x32x8", lambda: hpn(2, 32, 8), [10, None], TINY_LIMITS),
    ("sharedagg-2x64x8", lambda: shared_aggregation(2, 64, 8), [10, None], TINY_LIMITS),
]
SUITES = {"issue25": SUITE, "short": SHORT, "tiny": TINY}

#: best known rates (Gbps) at ``max_chunks=None``, docs/allgather.md ("Above the tree
#: limit", "Unbalanced fabrics at 512 GPUs"): the one-way NIC at 100 Gbps
BEST_KNOWN: dict[tuple[str, int | None], float] = {
    ("hpn-4x16x8-nic1way", None): 6.339905754,
    ("hpn-2x32x8-nic1way", None): 6.339905754,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limits", nargs="+", type=float, default=[0.2, 1.0])
    ap.add_argument("--big", action="store_true")
    ap.add_argument("--sizes", nargs="+", type=int, default=None,
                    help="GPU counts (multiples of 128): HPN and shared-aggregation fabrics")
    ap.add_argument("--collective", choices=["allgather", "alltoall", "both"],
                    default="allgather")
    ap.add_argument("--exact", action="store_true")
    ap.add_argument("--suite", choices=sorted(SUITES), default=None)
    ap.add_argument("--only", nargs="+", default=None, help="--suite: cases whose name has one")
    ap.add_argument("--where", action="store_true",
                    help="--suite: print where each limited solve stopped")
    ap.add_argument("--repeat", type=int, default=1, help="--suite: run it this many times")
    ap.add_argument("--trace", action="store_true",
                    help="--suite: name the code a solve runs past 1.2 S + 0.05 (stack samples)")
    args = ap.parse_args(argv)
    if args.suite:
        for _ in range(args.repeat):
            _suite(SUITES[args.suite], args.only, args.trace, args.where)
        return 0
    budget = None if args.exact else 10
    colls = ["allgather", "alltoall"] if args.collective == "both" else [args.collective]
    solvers = {"allgather": mo.solve_allgather, "alltoall": mo.solve_alltoall}
    for c in colls:
        solvers[c](hpn(1, 2, 8), time_limit=5.0)                   # compile the kernels
    if args.sizes:
        cases = _sized(args.sizes)
    else:
        cases = CASES + (BIG if args.big else [])
    print(f"max_chunks={budget}")
    print(f"{'fabric':26} {'GPUs':>5} {'coll':>9} {'first s':>8} {'first Gbps':>10} "
          f"{'limit':>6} {'elapsed':>8} {'over':>6} {'ended':>10} {'method':>24} "
          f"{'rate':>9} {'bound':>9}")
    for name, make in cases:
        topo = make()
        t = time.perf_counter()
        first = first_schedule(canonical(topo), None, budget)
        tf = time.perf_counter() - t
        for coll in colls:
            for limit in args.limits:
                t = time.perf_counter()
                s = solvers[coll](topo, max_chunks=budget, time_limit=limit)
                el = time.perf_counter() - t
                mo.validate(topo, s)
                over = max(0.0, el - (1.2 * limit + 0.05))
                bound = s.report.bound_gbps if s.report is not None else None
                print(f"{name:26} {topo.num_gpus:>5} {coll:>9} {tf:>8.3f} "
                      f"{first.rate_gbps:>10.4g} {limit:>6.2f} {el:>8.3f} {over:>6.3f} "
                      f"{_ended(s):>10} {str(s.stats.get('method', '-')):>24} "
                      f"{s.rate_gbps:>9.4g} {bound if bound is None else f'{bound:.4g}':>9}",
                      flush=True)
    return 0


def _suite(suite: list, only: list[str] | None, trace: bool, where: bool = False) -> None:
    """``--suite`` (module docstring): one row per case, chunk budget and limit."""
    mo.solve_allgather(hpn(1, 2, 8), time_limit=5.0)              # compile the kernels
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'fabric':28} {'GPUs':>5} {'K':>4} {'limit':>6} {'wall':>8} {'cpu':>8} "
          f"{'kern':>6} {'late':>6} {'over':>6} {'status':>10} {'method':>24} {'rate':>11} {'/best':>8} {'bound':>11}")
    worst = worst_late = 0.0
    for name, make, budgets, limits in suite:
        if only and not any(o in name for o in only):
            continue
        topo = make()
        for k in budgets:
            rows = []
            for limit in limits:
                sampler = _Sampler(limit) if trace and limit is not None else None
                late = _LateCpu(limit) if limit is not None else None
                t, c = time.perf_counter(), time.process_time()
                s = mo.solve_allgather(topo, max_chunks=k, time_limit=limit)
                wall, cpu = time.perf_counter() - t, time.process_time() - c
                late_ms = late.past() if late is not None else None
                if sampler is not None:
                    sampler.report(name, k)
                mo.validate(topo, s)
                rows.append((limit, wall, cpu, late_ms, s))
            best = BEST_KNOWN.get((name, k))
            mark = " " if best is not None else "~"
            best = best or max(s.rate_gbps for *_, s in rows)
            for limit, wall, cpu, late_ms, s in rows:
                kern = float(s.stats.get("kernel_load_s", 0.0))
                over = None if limit is None else (wall - kern) / (1.2 * limit + 0.05)
                worst = max(worst, over or 0.0)
                bound = s.report.bound_gbps if s.report is not None else None
                worst_late = max(worst_late, late_ms or 0.0)
                print(f"{name:28} {topo.num_gpus:>5} {str(k):>4} {str(limit):>6} {wall:>8.3f} "
                      f"{cpu:>8.3f} {kern:>6.2f} {'-' if late_ms is None else f'{late_ms:.1f}':>6} "
                      f"{'-' if over is None else f'{over:.2f}':>5}{'!' if (over or 0) > 1 else ' '} "
                      f"{_ended(s):>10} "
                      f"{str(s.stats.get('method', '-')):>24} {s.rate_gbps:>11.7g} "
                      f"{s.rate_gbps / best:>7.4f}{mark} "
                      f"{bound if bound is None else f'{bound:.7g}':>11}", flush=True)
                if where and limit is not None and s.report is not None and s.report.attempts:
                    print(f"  where: {s.report.attempts[-1].outcome}", flush=True)
    print(f"worst overrun ratio: {worst:.2f}; most CPU past a deadline: {worst_late:.1f} ms; "
          f"load average after: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")


class _LateCpu(threading.Thread):
    """Reads the calling thread's CPU clock when ``limit`` seconds have passed; :meth:`past`
    (called right after the solve) is the thread's CPU ms since then, 0 when the solve
    ended first (a deadline overrun without the load's share of it)."""

    def __init__(self, limit: float) -> None:
        super().__init__(daemon=True)
        self.clock = time.pthread_getcpuclockid(threading.get_ident())
        self.at = time.perf_counter() + limit
        self.cpu: float | None = None
        self.done = threading.Event()
        self.start()

    def run(self) -> None:
        if not self.done.wait(max(0.0, self.at - time.perf_counter())):
            self.cpu = time.clock_gettime(self.clock)

    def past(self) -> float:
        end = time.clock_gettime(self.clock)
        self.done.set()
        self.join()
        return 0.0 if self.cpu is None else max(0.0, end - self.cpu) * 1e3


class _Sampler(threading.Thread):
    """Samples the solving thread's innermost project frames every 20 ms once the solve
    is past ``1.2 S + 0.05`` (``--trace``): the calls that no check point reaches."""

    def __init__(self, limit: float) -> None:
        super().__init__(daemon=True)
        self.target, self.after = threading.get_ident(), time.perf_counter() + 1.2 * limit + 0.05
        self.samples: collections.Counter[str] = collections.Counter()
        self.done = threading.Event()
        self.start()

    def run(self) -> None:
        while not self.done.wait(0.02):
            if time.perf_counter() < self.after:
                continue
            frame = sys._current_frames().get(self.target)
            names = []
            while frame is not None and len(names) < 4:
                code = frame.f_code
                if "mccl_opt" in code.co_filename:
                    names.append(f"{code.co_filename.split('mccl_opt/')[-1]}:"
                                 f"{code.co_name}:{frame.f_lineno}")
                frame = frame.f_back
            self.samples[" < ".join(names)] += 1

    def report(self, name: str, k: int | None) -> None:
        self.done.set()
        self.join()
        for stack, n in self.samples.most_common(3):
            print(f"  trace {name} K={k}: {n * 0.02:.2f} s in {stack}", flush=True)


def _ended(s: mo.Schedule) -> str:
    """How the solve ended: the report's termination, else the stats' status."""
    return s.report.termination.value if s.report is not None else str(s.stats.get("status"))


def _sized(sizes: list[int]) -> list[tuple[str, Callable[[], mo.Topology]]]:
    """HPN ``N/128 x 16 x 8`` per size, and two shared-aggregation segments up to 1024."""
    out: list[tuple[str, Callable[[], mo.Topology]]] = []
    for n in sizes:
        if n < 128 or n % 128:
            raise SystemExit(f"--sizes: {n} is not a multiple of 128")
        out.append((f"hpn-{n // 128}x16x8", lambda n=n: hpn(n // 128, 16, 8)))
        if n <= 1024:
            out.append((f"sharedagg-2x{n // 16}x8", lambda n=n: shared_aggregation(2, n // 16, 8)))
    return out


if __name__ == "__main__":
    raise SystemExit(main())
