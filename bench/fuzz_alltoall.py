"""AllToAll oracle fuzz: ``solve_alltoall``'s LP optimum against the compact arc-flow LP
(paper App. G, per-source commodities, solved by scipy's HiGHS: independent of the
package's backends and of column generation), cold and warm, on seeded irregular fabrics.

    python bench/fuzz_alltoall.py [--fabrics 24] [--steps 4] [--seed 0] [--max-gpus 4]

Each fabric is ``instances.irregular(seed)`` with odd float capacities (every cable's two
directions scaled by different odd factors), then a chain of ``--steps`` one-way
degradations (a random link to 5-90 % of its capacity, odd factors) with an occasional
repair.  Every step is solved cold, warm from the previous step's schedule (the chain a
controller follows), warm from the previous step's schedule written to JSON, read back
and restored (``restore_warm_state``: a restarted controller) and warm from the first
step's schedule, with 10 chunks and
fractional (``max_chunks=None``).  Each schedule is validated (``mccl_opt.validate``: every
block delivered, loads and rate recomputed) and its ``lp_rate_gbps`` compared with the
compact optimum.  Prints the worst relative gap per mode, the warm paths taken and every
failure; exits 1 on a failure or a gap above ``--tol`` (default 1e-6).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
from scipy.optimize import linprog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mccl_opt as mo                                            # noqa: E402
from formulations.compact import build_compact_lp                # noqa: E402
from instances import irregular                                  # noqa: E402
from mccl_opt import restore_warm_state                          # noqa: E402

ODD = (0.9137, 0.7, 0.4452, 0.333, 1.0, 1.618, 0.5, 0.1234)


def compact_optimum(topo: mo.Topology) -> float:
    """The compact arc-flow LP optimum (Gbps), solved by scipy's HiGHS."""
    a = topo.arrays
    lp = build_compact_lp(topo.num_nodes, a.tail, a.head, a.capacity, a.is_switch,
                          a.gpu_nodes, commodities="source")
    eq = lp.row_lo == lp.row_hi
    res = linprog(-lp.c, bounds=list(zip(lp.col_lo, lp.col_hi)), method="highs",
                  A_eq=lp.A[eq], b_eq=lp.row_lo[eq], A_ub=lp.A[~eq], b_ub=lp.row_hi[~eq])
    if res.status != 0:
        raise RuntimeError(f"{topo.name}: compact LP status {res.status}: {res.message}")
    return float(-res.fun)


def odd_capacities(topo: mo.Topology, rng: np.random.Generator) -> mo.Topology:
    """Each link scaled by its own odd factor (the two directions of a cable differ)."""
    return topo.with_capacity({(l.src, l.dst): round(l.capacity_gbps * float(rng.choice(ODD)), 4)
                               for l in topo.links})


def chain(seed: int, steps: int, max_gpus: int, rng: np.random.Generator) -> list[mo.Topology]:
    """The fabric of ``seed`` with odd capacities, then one-way degradations and repairs."""
    first = odd_capacities(irregular(seed, max_gpus_per_host=max_gpus), rng).renamed(f"irr{seed}")
    out, topo = [first], first
    for step in range(steps):
        link = topo.links[int(rng.integers(topo.num_links))]
        if step and rng.random() < 0.25:
            orig = next(l for l in first.links if (l.src, l.dst) == (link.src, link.dst))
            gbps, kind = orig.capacity_gbps, "repair"
        else:
            gbps = round(link.capacity_gbps * float(rng.uniform(0.05, 0.9)), 4)
            kind = "one-way"
        topo = topo.with_capacity({(link.src, link.dst): gbps}).renamed(
            f"irr{seed}-s{step + 1}-{kind}")
        out.append(topo)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fabrics", type=int, default=24)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-gpus", type=int, default=4, help="GPUs per host, at most")
    ap.add_argument("--tol", type=float, default=1e-6)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    worst: dict[str, tuple[float, str]] = defaultdict(lambda: (0.0, ""))
    paths: Counter = Counter()
    failures: list[str] = []
    t0 = time.perf_counter()
    solves = 0
    for f in range(args.fabrics):
        fabrics = chain(args.seed * 1000 + f, args.steps, args.max_gpus, rng)
        for k in (10, None):
            first = prev = prev_topo = None
            for topo in fabrics:
                z = compact_optimum(topo)
                runs = [("cold", None)]
                if prev is not None:
                    from_file = restore_warm_state(mo.Schedule.from_dict(prev.to_dict()), prev_topo)
                    runs += [("warm-chain", prev), ("warm-first", first), ("warm-file", from_file)]
                done: dict[str, mo.Schedule] = {}
                for mode, warm in runs:
                    label = f"{mode} K={k}"
                    solves += 1
                    try:
                        sched = mo.solve_alltoall(topo, warm=warm, max_chunks=k)
                        rep = mo.validate(topo, sched)
                    except Exception as exc:                     # noqa: BLE001 - reported
                        failures.append(f"{topo.name} {label}: {type(exc).__name__}: {exc}")
                        continue
                    done[mode] = sched
                    gap = abs(sched.lp_rate_gbps - z) / z
                    if gap >= worst[label][0]:
                        worst[label] = (gap, topo.name)
                    if gap > args.tol:
                        failures.append(f"{topo.name} {label}: lp {sched.lp_rate_gbps!r} vs "
                                        f"compact {z!r} (gap {gap:.2e})")
                    if abs(rep.rate_gbps - sched.rate_gbps) > 1e-9 * sched.rate_gbps or \
                            sched.rate_gbps > sched.lp_rate_gbps * (1 + 1e-9):
                        failures.append(f"{topo.name} {label}: rate {sched.rate_gbps!r}, "
                                        f"validated {rep.rate_gbps!r}, lp {sched.lp_rate_gbps!r}")
                    if mode != "cold":
                        paths[mode, sched.stats["warm_mode"]] += 1
                first = first or done.get("cold")
                prev, prev_topo = done.get("warm-chain", done.get("cold")), topo
    print(f"{args.fabrics} fabrics x {args.steps + 1} states, {solves} solves in "
          f"{time.perf_counter() - t0:.1f} s")
    print("| mode | worst relative gap to the compact LP | fabric |")
    print("|---|---|---|")
    for label, (gap, name) in sorted(worst.items()):
        print(f"| {label} | {gap:.2e} | {name} |")
    print("warm paths:", ", ".join(f"{m} {w}: {n}" for (m, w), n in sorted(paths.items())))
    print(f"failures: {len(failures)}")
    for line in failures[:30]:
        print("  " + line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
