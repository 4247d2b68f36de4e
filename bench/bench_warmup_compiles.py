"""Does anything compile after ``mccl warmup``?  Shared aggregation cold, warm and limited.

``python bench/bench_warmup_compiles.py`` (a fresh process): runs the warm-up
(:func:`mccl_runtime.warmup.load_kernels`), then solves shared aggregation 2x8x8 and 2x16x8
at ``K=10`` and ``None``: healthy cold, one NIC uplink halved one way (unbalanced: the
restriction and general method; not 2x16x8 at ``None``, minutes) and both ways, each cold
and warm from the healthy schedule, and healthy under a 0.3 s limit.  Per solve: CPU
seconds and every kernel dispatched with a signature the warm-up did not give it
(compiled or loaded: the hook of ``tests/warmup_paths.py``); last line, JSON: all such
misses and numba's compile events (docs/allgather_history.md, "Sibling pairs last").
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.warmup_paths import _compiles, _misses, _record_new_signatures  # noqa: E402


def main() -> None:
    _record_new_signatures()
    from mccl_runtime.warmup import load_kernels

    start = time.perf_counter()
    load_kernels()
    print(f"warm-up {time.perf_counter() - start:.1f} s wall", file=sys.stderr, flush=True)
    del _misses[:], _compiles[:]
    import mccl_opt as mo
    from instances.aggregation import shared_aggregation

    def timed(label: str, run) -> object:
        seen, t = len(_misses), time.process_time()
        out = run()
        print(f"{label:34s} {time.process_time() - t:6.2f} s CPU  new signatures: "
              f"{_misses[seen:] or 'none'}", flush=True)
        return out

    for hosts in (8, 16):
        fab = shared_aggregation(2, hosts, 8)
        for k in (10, None):
            prev = timed(f"2x{hosts}x8 K={k} cold", lambda: mo.solve_allgather(fab, max_chunks=k))
            for name, both in (("one way", False), ("both ways", True)):
                if hosts == 16 and k is None and not both:
                    continue
                topo = fab.with_capacity(src="s0h1g6", dst="s0tor6", gbps=200.0,
                                         both_directions=both)
                timed(f"2x{hosts}x8 K={k} NIC {name} cold",
                      lambda: mo.solve_allgather(topo, max_chunks=k))
                timed(f"2x{hosts}x8 K={k} NIC {name} warm",
                      lambda: mo.solve_allgather(topo, warm=prev, max_chunks=k))
            timed(f"2x{hosts}x8 K={k} limit 0.3 s",
                  lambda: mo.solve_allgather(fab, max_chunks=k, time_limit=0.3))
    print(json.dumps({"misses": _misses, "compiles": _compiles}))


if __name__ == "__main__":
    main()
