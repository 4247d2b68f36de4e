"""AllToAll oracle fuzz: ``solve_alltoall``'s LP optimum against the compact arc-flow LP
(paper App. G, per-source commodities, solved by scipy's HiGHS: independent of the
package's backends and of column generation), cold and warm, on seeded irregular fabrics.

    python bench/fuzz_alltoall.py [--fabrics 24] [--steps 4] [--seed 0] [--max-gpus 4]
                                  [--shuffle] [--families [FAMILY ...]] [--family-max-gpus 32]

Each fabric is ``instances.irregular(seed)`` with odd float capacities (every cable's two
directions scaled by different odd factors), then a chain of ``--steps`` one-way
degradations (a random link to 5-90 % of its capacity, odd factors) with an occasional
repair.  Every step is solved cold, warm from the previous step's schedule (the chain a
controller follows), warm from the previous step's schedule written to JSON, read back
and restored (``restore_warm_state``: a restarted controller) and warm from the first
step's schedule, with 10 chunks and
fractional (``max_chunks=None``).  Each schedule is validated (``mccl_opt.validate``: every
block delivered, loads and rate recomputed) and its ``lp_rate_gbps`` compared with the
compact optimum; at 10 chunks the best rate of every mode on a state must not exceed the
whole-chunk cut bound (``chunk_bound.chunk_bound_gbps``, an upper bound);
``--dive-past-bound`` also re-solves cold every state whose bound is below its LP rate
with the bound switched off in the rounding (the repair and the dive then run to the LP),
so a bound set too low cannot hide behind the dive it skips.  Every solve's
process CPU time is kept: the table gives p50/p95/max per mode, and a warm solve slower
than ``max(1.5 x cold, 20 ms)`` is listed (not a failure: CPU time is noisy).
``--time-limits S ...`` re-solves the ``--limit-states`` largest states cold and warm
under ``time_limit=S``: a return after more than ``1.2 S + 0.05`` s CPU, or a schedule
that does not validate, is a failure.  ``--shuffle`` also solves every state cold with its nodes and links
listed in a random order; ``--families`` adds the event chains (``--steps`` events:
one-way and two-way degradations, repairs) over the fabric families of
``bench/allgather_chains.py`` up to ``--family-max-gpus`` GPUs.  Every Farley bound column
generation computes (vertex duals, saturated-set cut, its capacity classes:
``bench/alltoall_bounds.py``) must be at least the compact optimum.  Prints the worst
relative gap per mode, the warm paths taken, the bounds checked and every failure; exits
1 on a failure or a gap above ``--tol`` (default 1e-6).
"""

from __future__ import annotations

import argparse
import sys
import time
from unittest import mock
from collections import Counter, defaultdict
from pathlib import Path
from typing import Iterator

import numpy as np
from scipy.optimize import linprog

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mccl_opt as mo                                            # noqa: E402
from bench.alltoall_bounds import Recorded, recorded_bounds      # noqa: E402
from formulations.compact import build_compact_lp                # noqa: E402
from instances import irregular                                  # noqa: E402
from mccl_opt import restore_warm_state                          # noqa: E402
from mccl_opt.alltoall.chunk_bound import chunk_bound_gbps                 # noqa: E402

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


def shuffled(topo: mo.Topology, rng: np.random.Generator) -> mo.Topology:
    """``topo`` with its nodes and links listed in a random order (same names)."""
    d = topo.to_dict()
    d["nodes"] = [d["nodes"][i] for i in rng.permutation(len(d["nodes"]))]
    d["links"] = [d["links"][i] for i in rng.permutation(len(d["links"]))]
    return mo.Topology.from_dict(d).renamed(topo.name + "-shuffled")


def family_chains(families: list[str], steps: int, max_gpus: int,
                  rng: np.random.Generator) -> Iterator[list[mo.Topology]]:
    """Per family fabric of at most ``max_gpus`` GPUs (``bench/allgather_chains.py``),
    the healthy fabric then ``steps`` events (one-way and two-way degradations, repairs)."""
    from bench.allgather_chains import FAMILIES, events

    for family in families:
        for make in FAMILIES[family]:
            base = make()
            if base.num_gpus > max_gpus:
                continue
            states = [base]
            for step, (kind, topo) in enumerate(events(base, rng, steps)):
                states.append(topo.renamed(f"{base.name}-s{step + 1}-{kind}"))
            yield states


class Fuzz:
    """Gaps, bound checks and failures of every solve (see the module doc)."""

    def __init__(self, tol: float, shuffle: bool, rng: np.random.Generator,
                 dive_past_bound: bool = False) -> None:
        self.tol, self.shuffle, self.rng = tol, shuffle, rng
        self.dive_past_bound = dive_past_bound
        self.worst: dict[str, tuple[float, str]] = defaultdict(lambda: (0.0, ""))
        self.paths: Counter = Counter()
        self.failures: list[str] = []
        self.solves = self.states = 0
        self.bounds = Counter()          # bounds checked against the compact LP, by kind
        self.certified = Counter()       # ... and those equal to it (within tol)
        self.cpu: dict[str, list[float]] = defaultdict(list)     # CPU s per mode label
        self.slow_warm: list[str] = []   # warm solves above max(1.5 x cold, 20 ms)
        self.chunk_checks = [0, 0]       # chunk bounds checked, ... equal to the best rate
        self.largest: list[tuple[int, str, mo.Topology, mo.Schedule | None]] = []

    def judge(self, topo: mo.Topology, label: str, z: float, sched: mo.Schedule,
              rec: Recorded) -> None:
        rep = mo.validate(topo, sched)
        gap = abs(sched.lp_rate_gbps - z) / z
        if gap >= self.worst[label][0]:
            self.worst[label] = (gap, topo.name)
        if gap > self.tol:
            self.failures.append(f"{topo.name} {label}: lp {sched.lp_rate_gbps!r} vs "
                                 f"compact {z!r} (gap {gap:.2e})")
        if abs(rep.rate_gbps - sched.rate_gbps) > 1e-9 * sched.rate_gbps or \
                sched.rate_gbps > sched.lp_rate_gbps * (1 + 1e-9):
            self.failures.append(f"{topo.name} {label}: rate {sched.rate_gbps!r}, "
                                 f"validated {rep.rate_gbps!r}, lp {sched.lp_rate_gbps!r}")
        for kind in ("class", "other"):
            for r in rec.rates(kind):
                self.bounds[kind] += 1
                self.certified[kind] += abs(r - z) <= self.tol * z
                if r < z * (1 - self.tol):
                    self.failures.append(f"{topo.name} {label}: {kind} cut bound {r!r} below "
                                         f"the compact optimum {z!r}")

    def run_chain(self, fabrics: list[mo.Topology], budgets: tuple[int | None, ...]) -> None:
        """Solve every state of one chain cold and warm (module doc), and shuffled."""
        for k in budgets:
            first = prev = prev_topo = None
            for topo in fabrics:
                z = compact_optimum(topo)
                self.states += 1
                runs = [("cold", topo, None)]
                if self.shuffle:
                    runs.append(("shuffled", shuffled(topo, self.rng), None))
                if prev is not None:
                    from_file = restore_warm_state(mo.Schedule.from_dict(prev.to_dict()), prev_topo)
                    runs += [("warm-chain", topo, prev), ("warm-first", topo, first),
                             ("warm-file", topo, from_file)]
                done: dict[str, mo.Schedule] = {}
                for mode, fab, warm in runs:
                    label = f"{mode} K={k}"
                    self.solves += 1
                    try:
                        with recorded_bounds() as rec:
                            t = time.process_time()
                            sched = mo.solve_alltoall(fab, warm=warm, max_chunks=k)
                            self.cpu[label].append(time.process_time() - t)
                        self.judge(fab, label, z, sched, rec)
                    except Exception as exc:                     # noqa: BLE001 - reported
                        self.failures.append(f"{fab.name} {label}: {type(exc).__name__}: {exc}")
                        continue
                    done[mode] = sched
                    if mode.startswith("warm"):
                        self.paths[mode, sched.stats["warm_mode"]] += 1
                        self.check_warm_time(topo.name, label, f"cold K={k}")
                if k is not None and done:
                    self.check_chunk_bound(topo, k, done)
                if k == 10:
                    self.largest.append((topo.num_gpus, topo.name, topo, prev))
                first = first or done.get("cold")
                prev, prev_topo = done.get("warm-chain", done.get("cold")), topo

    def check_warm_time(self, name: str, label: str, cold_label: str) -> None:
        """Lists the last warm solve if slower than ``max(1.5 x cold, 20 ms)`` CPU."""
        warm_s, cold_s = self.cpu[label][-1], self.cpu[cold_label][-1]
        if warm_s > max(1.5 * cold_s, 0.02):
            self.slow_warm.append(f"{name} {label}: {warm_s * 1e3:.1f} ms vs cold "
                                  f"{cold_s * 1e3:.1f} ms")

    def check_chunk_bound(self, topo: mo.Topology, k: int, done: dict[str, mo.Schedule]) -> None:
        """No schedule of ``k`` chunks per pair beats the whole-chunk cut bound."""
        bound = chunk_bound_gbps(topo, k)
        if self.dive_past_bound and "cold" in done and bound < done["cold"].lp_rate_gbps:
            with mock.patch("mccl_opt.alltoall.rounding.chunk_bound_gbps",
                            lambda *_: float("inf")):
                t = time.process_time()
                done["cold-nobound"] = mo.solve_alltoall(topo, max_chunks=k)
                self.cpu[f"cold-nobound K={k}"].append(time.process_time() - t)
        best_mode, best = max(((m, s.rate_gbps) for m, s in done.items()), key=lambda x: x[1])
        self.chunk_checks[0] += 1
        self.chunk_checks[1] += abs(bound - best) <= 1e-9 * best
        if best > bound * (1 + 1e-9):
            self.failures.append(f"{topo.name} K={k}: {best_mode} rate {best!r} above the "
                                 f"whole-chunk bound {bound!r}")

    def run_limits(self, limits: list[float], count: int) -> None:
        """The ``count`` largest K=10 states cold and warm-chain under each time limit:
        CPU at most ``1.2 S + 0.05`` s and a valid schedule."""
        for _, name, topo, prev in sorted(self.largest, key=lambda x: (-x[0], x[1]))[:count]:
            for s in limits:
                for mode, warm in (("cold", None), ("warm-chain", prev)):
                    if mode == "warm-chain" and warm is None:
                        continue
                    label = f"limit {s:g} {mode}"
                    t = time.process_time()
                    try:
                        sched = mo.solve_alltoall(topo, warm=warm, max_chunks=10, time_limit=s)
                        spent = time.process_time() - t
                        mo.validate(topo, sched)
                    except Exception as exc:                     # noqa: BLE001 - reported
                        self.failures.append(f"{name} {label}: {type(exc).__name__}: {exc}")
                        continue
                    self.cpu[label].append(spent)
                    self.paths[label, sched.stats["status"]] += 1
                    if spent > 1.2 * s + 0.05:
                        self.failures.append(f"{name} ({topo.num_gpus} GPUs) {label}: "
                                             f"{spent:.3f} s CPU, status {sched.stats['status']}")

    def report(self, seconds: float) -> None:
        print(f"{self.states} fabric states, {self.solves} solves in {seconds:.1f} s")
        print("| mode | worst relative gap to the compact LP | fabric |")
        print("|---|---|---|")
        for label, (gap, name) in sorted(self.worst.items()):
            print(f"| {label} | {gap:.2e} | {name} |")
        print("warm paths:", ", ".join(f"{m} {w}: {n}" for (m, w), n in sorted(self.paths.items())))
        print("bounds checked against the compact LP (never below it): " + ", ".join(
            f"{kind} {self.bounds[kind]} ({self.certified[kind]} equal to it)"
            for kind in ("class", "other")))
        print(f"whole-chunk bounds checked (never below the best K=10 rate): "
              f"{self.chunk_checks[0]} ({self.chunk_checks[1]} equal to it)")
        print("| mode | solves | CPU ms p50 | p95 | max |")
        print("|---|---|---|---|---|")
        for label, ts in sorted(self.cpu.items()):
            p50, p95, top = np.percentile(np.array(ts) * 1e3, [50, 95, 100])
            print(f"| {label} | {len(ts)} | {p50:.1f} | {p95:.1f} | {top:.1f} |")
        print(f"warm slower than max(1.5 x cold, 20 ms): {len(self.slow_warm)}")
        for line in self.slow_warm[:30]:
            print("  " + line)
        print(f"failures: {len(self.failures)}")
        for line in self.failures[:30]:
            print("  " + line)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fabrics", type=int, default=24)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-gpus", type=int, default=4, help="GPUs per host, at most")
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--shuffle", action="store_true",
                    help="also solve every state with nodes and links listed in a random order")
    ap.add_argument("--families", nargs="*", default=None, metavar="FAMILY",
                    help="also run event chains over the fabric families of "
                         "bench/allgather_chains.py (all when none named)")
    ap.add_argument("--family-max-gpus", type=int, default=32,
                    help="family fabrics above this many GPUs are skipped (compact LP size)")
    ap.add_argument("--dive-past-bound", action="store_true",
                    help="re-solve cold with the whole-chunk bound off where it is below the LP")
    ap.add_argument("--time-limits", type=float, nargs="*", default=[], metavar="S",
                    help="re-solve the largest states under these time limits (s)")
    ap.add_argument("--limit-states", type=int, default=6,
                    help="how many of the largest states --time-limits re-solves")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    fuzz = Fuzz(args.tol, args.shuffle, rng, args.dive_past_bound)
    mo.solve_alltoall(irregular(0))           # numba kernels loaded before any timed solve
    t0 = time.perf_counter()
    for f in range(args.fabrics):
        fuzz.run_chain(chain(args.seed * 1000 + f, args.steps, args.max_gpus, rng), (10, None))
    if args.families is not None:
        from bench.allgather_chains import FAMILIES

        for states in family_chains(args.families or list(FAMILIES), args.steps,
                                    args.family_max_gpus, rng):
            fuzz.run_chain(states, (10, None))
    fuzz.run_limits(args.time_limits, args.limit_states)
    fuzz.report(time.perf_counter() - t0)
    return 1 if fuzz.failures else 0


if __name__ == "__main__":
    sys.exit(main())
