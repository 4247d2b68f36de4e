"""AllGather cold solves on the aggregation families (:mod:`instances.aggregation`), old path vs
new in one run (docs/allgather_history.md, "Structure-independent packing").

``python bench/bench_allgather_families.py [--old-timeout S] [--new-timeout S] [--big] [--repeat R]
[--scrambles N] [--exact]``

Every case is solved cold (``max_chunks=10``, and ``None`` with ``--exact``) twice per
repeat, alternating: *new* is the solver as shipped (spread split guarded against the rooted
cut condition, :mod:`mccl_opt.allgather.forestcoll.removal.guarded_spread`); *old* is the same solver without
the guard (the path before it: a failed rooted test sends it to the exact split and
Lovász's exact packing), cut off after ``--old-timeout`` seconds.  Kernels are
compiled before any timing.  A case also solved with its nodes renamed and relisted
(``scrambled``) must give the same rate.  ``--big`` adds shared aggregation 2x16x8 and
2x64x8 (256 and 1024 GPUs); ``--scrambles N`` solves shared aggregation 2x5x8 under N
renamings and relistings (median and max seconds, the rates must agree).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Any, Callable

import mccl_opt as mo
from instances.aggregation import (host_ring, host_torus, leaf_spine, multi_spine, scrambled,
                                   shared_aggregation, superpod)
from mccl_opt.allgather.forestcoll import pack_steps

CASES: list[Callable[[], mo.Topology]] = [
    lambda: shared_aggregation(2, 2, 8),
    lambda: shared_aggregation(2, 5, 8),
    lambda: scrambled(shared_aggregation(2, 5, 8), 7),
    lambda: shared_aggregation(2, 8, 8),
    lambda: shared_aggregation(4, 4, 8),
    lambda: shared_aggregation(2, [3, 5], 8, oversubscription=2.0),
    lambda: multi_spine(2, 4, 8, spines=4),
    lambda: multi_spine(4, 4, 8, spines=2, oversubscription=2.0),
    lambda: leaf_spine(4, 2, 8),
    lambda: leaf_spine(4, 4, 8, oversubscription=1.0),
    lambda: leaf_spine(8, [1, 2, 1, 2, 1, 2, 3, 4], 8, spines=4),
    lambda: superpod(2, 4, 8),
    lambda: superpod(4, 4, 8, rails_per_leaf=1, spines=4),
    lambda: scrambled(superpod(4, 4, 8, rails_per_leaf=1, spines=4), 3),
    lambda: host_ring(16, 8),
    lambda: host_torus(4, 4, 8),
    lambda: host_torus(4, 4, 8, weak_link_gbps=100.0),
]
BIG: list[Callable[[], mo.Topology]] = [
    lambda: shared_aggregation(2, 16, 8),
    lambda: shared_aggregation(2, 64, 8),
]

GUARDED = pack_steps.guarded_spread


def _no_guard(g: Any, rank_of: Any, failed: Any) -> None:
    return None


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout


def solve(topo: mo.Topology, old: bool, max_chunks: int | None, timeout: float
          ) -> tuple[float, float | None, str]:
    """Seconds, rate (``None`` on time-out) and ``split/packing`` of one cold solve."""
    pack_steps.guarded_spread = _no_guard if old else GUARDED
    signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout)
    t = time.perf_counter()
    try:
        s = mo.solve_allgather(topo, max_chunks=max_chunks)
    except (_Timeout, SystemError) as e:    # an alarm inside a compiled kernel: SystemError
        if not isinstance(e, _Timeout) and not isinstance(e.__cause__ or e.__context__, _Timeout):
            raise
        return time.perf_counter() - t, None, "timeout"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        pack_steps.guarded_spread = GUARDED
    return time.perf_counter() - t, s.rate_gbps, f"{s.stats.get('split')}/{s.stats.get('packing')}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-timeout", type=float, default=20.0)
    ap.add_argument("--new-timeout", type=float, default=120.0)
    ap.add_argument("--big", action="store_true")
    ap.add_argument("--exact", action="store_true", help="max_chunks=None instead of 10")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--scrambles", type=int, default=0,
                    help="also solve shared aggregation 2x5x8 under this many renamings")
    args = ap.parse_args(argv)
    max_chunks = None if args.exact else 10
    for topo in (shared_aggregation(2, 2, 4), host_ring(3, 2)):       # compile the kernels
        solve(topo, False, max_chunks, 600.0)
        solve(topo, True, max_chunks, 600.0)
    print(f"{'fabric':38s} {'GPUs':>5s} {'new s':>8s} {'old s':>8s} {'new path':16s} "
          f"{'old path':16s} rates")
    bad = 0
    for make in CASES + (BIG if args.big else []):
        topo = make()
        new_t = old_t = float("inf")
        for _ in range(args.repeat):
            t, rate_new, path_new = solve(topo, False, max_chunks, args.new_timeout)
            new_t = min(new_t, t)
            t, rate_old, path_old = solve(topo, True, max_chunks, args.old_timeout)
            old_t = min(old_t, t)
        same = None in (rate_old, rate_new) or abs(rate_old - rate_new) <= 1e-9 * rate_new
        bad += not same or rate_new is None
        old_s = f">{args.old_timeout:g}" if rate_old is None else f"{old_t:.3f}"
        new_s = f">{args.new_timeout:g}" if rate_new is None else f"{new_t:.3f}"
        print(f"{topo.name:38s} {topo.num_gpus:5d} {new_s:>8s} {old_s:>8s} {path_new:16s} "
              f"{path_old:16s} {rate_new or float('nan'):.4f}{'' if same else f' != old {rate_old:.4f}'}",
              flush=True)
    if args.scrambles:
        bad += _scrambles(args.scrambles, max_chunks)
    return 1 if bad else 0


def _scrambles(count: int, max_chunks: int | None) -> int:
    """Shared aggregation 2x5x8 renamed and relisted ``count`` times: cold seconds
    (median, max) and the distinct rates (one expected); returns 1 if they differ."""
    times, rates = [], set()
    for seed in range(count):
        t, rate, _ = solve(scrambled(shared_aggregation(2, 5, 8), seed), False, max_chunks, 600.0)
        times.append(t)
        rates.add(round(rate, 9))
    times.sort()
    print(f"sharedagg-2x5x8 under {count} renamings: median {times[count // 2]:.3f} s, "
          f"max {times[-1]:.3f} s, rates {sorted(rates)}")
    return int(len(rates) != 1)


if __name__ == "__main__":
    sys.exit(main())
