"""AllGather synthesis at scale: cold and warm time per phase and peak memory per size.

``python bench/bench_allgather_scale.py [--states healthy,fail1,fail2,fail3,oneway]
[--exact] [--timeout S] [--mem-gb G] 2x64x8 4x64x8 8x64x8``

``oneway``: rank 0's NIC uplink at a quarter of its speed in one direction only
(unbalanced ToR: the balanced restriction, then the general method); ``--exact`` solves
with ``max_chunks=None`` (e.g. ``--states oneway --exact 4x16x8 2x32x8``, issue 25's
512-GPU case).

Each (shape, state) runs in its own subprocess (its peak RSS is its own; a memory cap of
``--mem-gb`` on its address space and a timeout of ``--timeout`` seconds).  The child
loads the compiled kernels first (a 16-GPU solve, outside the timings), then solves the
healthy fabric cold and, for a failure, the failed fabric cold and warm from the healthy
schedule (for ``healthy``, warm re-solves it from its own schedule).  Phase times are
those the schedule's ``stats`` report (``phase1_s``: exact optimum, ``budget_s``: chunk
budget, ``balance_s``, ``phase2_s``: switch removal, ``phase3_s``: tree packing,
``mapping_s``: logical to physical trees).  ``lp`` (Gbps) is the optimum; cold and warm
must agree in rate.  The machine may be shared: the load average is printed with the
table, ``cold_cpu_s`` and ``warm_cpu_s`` are the solves' CPU times (what contention
inflates least), and single runs are noisy (compare ratios within one run).
"""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
import time

PHASES = ("phase1_s", "budget_s", "balance_s", "phase2_s", "phase3_s", "mapping_s")
COLUMNS = ("fabric", "gpus", "cold_s", "cold_cpu_s", "warm_s", "warm_cpu_s", *PHASES, "k", "packing",
           "depth", "lp", "rss_gb")


def _oneway(topo):
    """Rank 0's NIC uplink (``s0h0g0 -> s0tor0``) at a quarter of its speed, one way."""
    from instances.hpn import NIC_GBPS, gpu_id, tor_id

    return topo.with_capacity(src=gpu_id(0, 0, 0), dst=tor_id(0, 0), gbps=NIC_GBPS / 4,
                              both_directions=False).renamed(f"{topo.name}-oneway")


def one(shape: str, state: str, exact: bool = False) -> dict:
    """Solve ``hpn-<shape>`` in ``state`` cold and warm (in this process);
    ``exact``: ``max_chunks=None``."""
    from functools import partial

    from instances import fail1, fail2, fail3, hpn, parse_shape
    from mccl_opt.allgather import solve_allgather as solve_k

    solve_allgather = partial(solve_k, max_chunks=None) if exact else solve_k

    solve_allgather(fail2(hpn(1, 2, 8)), warm=solve_allgather(hpn(1, 2, 8)))   # kernels
    base = hpn(*parse_shape(shape))
    t, c = time.perf_counter(), time.process_time()
    healthy = solve_allgather(base)
    healthy_s, cpu = time.perf_counter() - t, time.process_time() - c
    fails = {"fail1": fail1, "fail2": fail2, "fail3": fail3, "oneway": _oneway}
    if state == "healthy":
        topo, cold, cold_s = base, healthy, healthy_s
        cold_cpu = cpu
    else:
        topo = fails[state](base)
        t, c = time.perf_counter(), time.process_time()
        cold = solve_allgather(topo)
        cold_s, cold_cpu = time.perf_counter() - t, time.process_time() - c
    t, c = time.perf_counter(), time.process_time()
    warm = solve_allgather(topo, warm=healthy)
    warm_s, warm_cpu = time.perf_counter() - t, time.process_time() - c
    if not math.isclose(warm.rate_gbps, cold.rate_gbps, rel_tol=1e-9):
        raise SystemExit(f"{topo.name}: warm rate {warm.rate_gbps} != cold {cold.rate_gbps}")
    return {"fabric": topo.name, "gpus": topo.num_gpus, "cold_s": cold_s, "cold_cpu_s": cold_cpu,
            "warm_s": warm_s, "warm_cpu_s": warm_cpu,
            **{p: float(cold.stats.get(p, 0.0)) for p in PHASES},
            "k": cold.stats.get("k", "-"), "packing": cold.stats.get("packing", "-"),
            "depth": cold.stats.get("max_depth", "-"), "lp": cold.lp_rate_gbps,
            "rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def run(shape: str, state: str, timeout: float, mem_gb: float, exact: bool = False) -> dict:
    """:func:`one` in a subprocess with a memory cap and a timeout; a row either way."""
    def cap() -> None:
        limit = int(mem_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    try:
        out = subprocess.run([sys.executable, __file__, "--one", shape, state,
                              *(["--exact"] if exact else [])], check=False,
                             capture_output=True, text=True, timeout=timeout, preexec_fn=cap)
    except subprocess.TimeoutExpired:
        return {"fabric": f"hpn-{shape}-{state}", "cold_s": f">{timeout:g}"}
    if out.returncode != 0:
        tail = (out.stderr.strip().splitlines() or ["?"])[-1]
        return {"fabric": f"hpn-{shape}-{state}", "cold_s": f"failed: {tail}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> None:
    if argv[:1] == ["--one"]:
        print(json.dumps(one(argv[1], argv[2], "--exact" in argv[3:])))
        return
    states, timeout, mem_gb, shapes = ["healthy", "fail1", "fail2", "fail3"], 900.0, 8.0, []
    exact = False
    it = iter(argv)
    for a in it:
        if a == "--states":
            states = next(it).split(",")
        elif a == "--timeout":
            timeout = float(next(it))
        elif a == "--exact":
            exact = True
        elif a == "--mem-gb":
            mem_gb = float(next(it))
        else:
            shapes.append(a)
    from mccl_opt.tables import print_table

    rows = []
    for shape in shapes or ["2x64x8", "4x64x8"]:
        for state in states:
            rows.append(run(shape, state, timeout, mem_gb, exact))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(f"load average (1 min) after the runs: {os.getloadavg()[0]:.2f}")
    print_table(COLUMNS, [[r.get(c, "") for c in COLUMNS] for r in rows])


if __name__ == "__main__":
    main(sys.argv[1:])
