"""AllGather fuzz driver: ``solve_allgather`` on hundreds of fabrics against the
independent oracle of ``tests/oracle_allgather.py`` (forwarding-only optimum, cut bound,
schedule checker).  A script, not a test (pytest collects ``bench_*.py`` only).

    python bench/fuzz_allgather.py [--random 200] [--chains 4] [--steps 6] [--seed 0]
                                   [--exact-gpus 6] [--timeout 60] [--entry MODULE:FUNCTION]

Fabrics: seeded random ones (2-10 GPUs, up to 4 switches, asymmetric cables, one-direction
links, odd capacities) and chains of one-direction degradations, two-direction
degradations and repairs on HPN 1x2x4, 1x2x8 and 2x2x4 (each step solved cold and warm
from the previous step).  Every fabric is also solved with nodes and links shuffled.
Prints failures by mode and exception type, the worst gaps of ``lp_rate_gbps`` and
``rate_gbps`` to the oracle, order dependence and solve times.  ``--entry`` judges
another function with ``solve_allgather``'s signature (default
``mccl_opt:solve_allgather``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # the tests package

import mccl_opt as mo                                            # noqa: E402
from instances import hpn                                        # noqa: E402
from mccl_runtime.warmup import load_kernels                     # noqa: E402
from bench.timeouts import SolveTimeout, time_out                # noqa: E402
from tests.oracle_allgather import (check_schedule, cut_bound,   # noqa: E402
                                    forwarding_optimum, topology_dict)

REL = 1e-6
ODD = [18.0, 50.0, 100.0, 200.0, 400.0, 445.565, 594.087, 800.0, 1237.5, 2880.0]


def _cap(rng: np.random.Generator) -> float:
    return float(rng.choice(ODD)) if rng.random() < 0.6 else round(float(rng.uniform(1, 3200)), 3)


def random_fabric(rng: np.random.Generator, max_gpus: int, index: int) -> mo.Topology:
    """GPUs on 1-2 switches of a switch tree, extra cables, asymmetric and one-direction links."""
    n = int(rng.integers(2, max_gpus + 1))
    m = int(rng.integers(0 if n <= 4 else 1, 5))
    gpus, sws = [f"g{i}" for i in range(n)], [f"s{j}" for j in range(m)]
    links: dict[tuple[str, str], float] = {}

    def cable(a: str, b: str) -> None:
        if a == b or (a, b) in links or (b, a) in links:
            return
        links[a, b] = links[b, a] = _cap(rng)
        if rng.random() < 0.5:
            key = (a, b) if rng.random() < 0.5 else (b, a)
            links[key] *= float(rng.choice([0.05, 0.125, 0.25, 0.5, 0.9]))

    for j in range(1, m):
        cable(sws[int(rng.integers(j))], sws[j])
    for i, g in enumerate(gpus):
        if m == 0:
            if i:
                cable(gpus[int(rng.integers(i))], g)
            continue
        for s in rng.choice(sws, size=int(rng.integers(1, min(2, m) + 1)), replace=False):
            cable(g, str(s))
    names = gpus + sws
    for _ in range(int(rng.integers(0, 5))):
        cable(str(rng.choice(names)), str(rng.choice(names)))
    for _ in range(int(rng.integers(0, 4))):
        a, b = str(rng.choice(names)), str(rng.choice(names))
        if a != b and (a, b) not in links:
            links[a, b] = _cap(rng)                               # one-direction link
    nodes = [(g, "gpu") for g in gpus] + [(s, "switch") for s in sws]
    return mo.Topology.from_dict(topology_dict(nodes, [(a, b, c) for (a, b), c in links.items()],
                                               f"random{index}-{n}g{m}s"))


def hpn_chain(rng: np.random.Generator, shape: tuple[int, int, int], steps: int,
              chain: int) -> Iterator[mo.Topology]:
    """Degradations (one or both directions) and repairs of random cables of an HPN fabric."""
    base = hpn(*shape)
    healthy = {(l.src, l.dst): l.capacity_gbps for l in base.links}
    topo = base
    for step in range(steps):
        link = base.links[int(rng.integers(base.num_links))]
        kind = rng.choice(["one-way", "one-way", "both", "repair"])
        if kind == "repair":
            changes = {(link.src, link.dst): healthy[link.src, link.dst],
                       (link.dst, link.src): healthy[link.dst, link.src]}
        else:
            gbps = link.capacity_gbps * float(rng.choice([0.05, 0.125, 0.25, 0.5, 0.9]))
            changes = {(link.src, link.dst): gbps}
            if kind == "both":
                changes[link.dst, link.src] = gbps
        name = f"hpn-{'x'.join(map(str, shape))}-c{chain}s{step}-{kind}"
        topo = topo.with_capacity(changes).renamed(name)
        yield topo


def shuffled(topo: mo.Topology, rng: np.random.Generator) -> mo.Topology:
    d = topo.to_dict()
    d["nodes"] = [d["nodes"][i] for i in rng.permutation(len(d["nodes"]))]
    d["links"] = [d["links"][i] for i in rng.permutation(len(d["links"]))]
    return mo.Topology.from_dict(d)


class Tally:
    """Failures, gaps, order dependence and times of all solves."""

    def __init__(self) -> None:
        self.runs: Counter = Counter()
        self.fails: Counter = Counter()
        self.example: dict[tuple[str, str], str] = {}
        self.gaps: list[tuple[float, float, str, str]] = []
        self.order: list[str] = []
        self.times: dict[str, list[tuple[float, str]]] = defaultdict(list)
        self.cut_reported = [0, 0]          # fabrics with cut > optimum: [reported, all]

    def solve(self, mode: str, topo: mo.Topology, opt: float, timeout: float,
              call: Callable[[], mo.Schedule], max_chunks: int | None) -> mo.Schedule | None:
        self.runs[mode] += 1
        t0 = time.perf_counter()
        try:
            with time_out(timeout):
                sched = call()
            self.times[mode].append((time.perf_counter() - t0, topo.name))
            problem = self._judge(topo, sched, opt, max_chunks)
        except SolveTimeout:
            problem = ("Timeout", f"over {timeout:.0f} s")
            sched = None
        except Exception as exc:                                 # noqa: BLE001 - tallied
            problem = (type(exc).__name__, str(exc).splitlines()[0][:90] if str(exc) else "")
            sched = None
        if problem is not None:
            self.fails[mode, problem[0]] += 1
            self.example.setdefault((mode, problem[0]), f"{topo.name}: {problem[1]}")
            return None
        return sched

    def _judge(self, topo: mo.Topology, sched: mo.Schedule, opt: float,
               max_chunks: int | None) -> tuple[str, str] | None:
        self.gaps.append((1 - sched.lp_rate_gbps / opt, 1 - sched.rate_gbps / opt, topo.name,
                          f"K={max_chunks}"))
        try:
            check_schedule(topo, sched, max_chunks)
        except AssertionError as exc:
            return "checker", str(exc)[:90]
        try:
            mo.validate(topo, sched)
        except mo.MCCLError as exc:
            return "validate", str(exc).splitlines()[-1][:90]
        if abs(sched.lp_rate_gbps - opt) > REL * opt:
            return "lp!=oracle", f"lp {sched.lp_rate_gbps:.6g} vs oracle {opt:.6g}"
        if sched.rate_gbps > sched.lp_rate_gbps * (1 + REL):
            return "rate>lp", f"rate {sched.rate_gbps:.9g} > lp {sched.lp_rate_gbps:.9g}"
        if max_chunks is None and abs(sched.rate_gbps - opt) > REL * opt:
            return "exact<oracle", f"K=None rate {sched.rate_gbps:.6g} vs oracle {opt:.6g}"
        return None


def fuzz(args: argparse.Namespace, solve: Callable[..., mo.Schedule]) -> Tally:
    rng = np.random.default_rng(args.seed)
    tally = Tally()
    fabrics: list[tuple[str, mo.Topology]] = [("random", random_fabric(rng, 10, i))
                                              for i in range(args.random)]
    for shape in [(1, 2, 4), (1, 2, 8), (2, 2, 4)]:
        for chain in range(args.chains):
            fabrics += [("hpn", t) for t in hpn_chain(rng, shape, args.steps, chain)]
    previous: mo.Schedule | None = None
    for i, (family, topo) in enumerate(fabrics):
        opt = forwarding_optimum(topo).rate_gbps
        cut = cut_bound(topo)
        cold = tally.solve("cold", topo, opt, args.timeout, lambda: solve(topo), 10)
        if cut > opt * (1 + REL):
            tally.cut_reported[1] += 1
            tally.cut_reported[0] += cold is not None and "cut_bound_gbps" in cold.stats
        other = shuffled(topo, rng)
        moved = tally.solve("shuffled", other, opt, args.timeout,
                            lambda: solve(other), 10)
        rates = [None if s is None else s.lp_rate_gbps for s in (cold, moved)]
        if (None in rates and rates != [None, None]) or \
                (None not in rates and abs(rates[0] - rates[1]) > REL * rates[0]):
            tally.order.append(f"{topo.name}: lp_rate {rates[0]} as listed, {rates[1]} shuffled")
        if family == "hpn" and previous is not None and "s0-" not in topo.name:
            warm_from = previous
            tally.solve("warm", topo, opt, args.timeout,
                        lambda: solve(topo, warm=warm_from), 10)
        if topo.num_gpus <= args.exact_gpus:
            tally.solve("exact", topo, opt, args.timeout,
                        lambda: solve(topo, max_chunks=None), None)
        previous = cold
        if (i + 1) % 50 == 0:
            print(f"... {i + 1}/{len(fabrics)} fabrics", file=sys.stderr, flush=True)
    return tally


def report(tally: Tally, seconds: float) -> None:
    print(f"solves per mode: {dict(tally.runs)}  ({seconds:.0f} s)")
    print("\nfailures by mode and type (first example)")
    print(f"{'mode':9} {'type':14} {'count':>5}  example")
    for (mode, kind), count in sorted(tally.fails.items()):
        print(f"{mode:9} {kind:14} {count:5d}  {tally.example[mode, kind]}")
    if not tally.fails:
        print("  none")
    print("\nworst gaps to the oracle (1 - value/optimum; < 0: above the optimum)")
    for label, idx in (("lp_rate", 0), ("rate", 1)):
        for row in sorted(tally.gaps, key=lambda r: -abs(r[idx]))[:3]:
            print(f"  {label:8} {row[idx]:+.3e}  {row[2]} {row[3]}")
    rates = np.array([g[1] for g in tally.gaps if g[3] == "K=10"])
    if rates.size:
        print(f"  K=10 rounding gap to the optimum: median {np.median(rates):.2%}, "
              f"max {rates.max():.2%}")
    print(f"\norder dependence (lp_rate differs, or only one order fails, when nodes and "
          f"links are shuffled): {len(tally.order)}")
    for row in tally.order[:5]:
        print(f"  {row}")
    print(f"fabrics whose cut bound is above the forwarding-only optimum: {tally.cut_reported[1]}; "
          f"stats['cut_bound_gbps'] reported by the cold solve on {tally.cut_reported[0]}")
    print("\nsolve seconds per mode: median / max (slowest fabric)")
    for mode, ts in sorted(tally.times.items()):
        worst = max(ts)
        print(f"  {mode:9} {np.median([t for t, _ in ts]):.3f} / {worst[0]:.3f} ({worst[1]})")


def tally_failed(tally: Tally) -> bool:
    """Whether any solve of the fuzz failed or depended on the node order."""
    return bool(sum(tally.fails.values()) or tally.order)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--random", type=int, default=200, help="random fabrics (default 200)")
    ap.add_argument("--chains", type=int, default=4, help="degradation chains per HPN shape")
    ap.add_argument("--steps", type=int, default=6, help="steps per chain")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--exact-gpus", type=int, default=6,
                    help="also solve max_chunks=None on fabrics with at most this many GPUs")
    ap.add_argument("--timeout", type=float, default=60, help="seconds per solve")
    ap.add_argument("--families", nargs="*", default=None, metavar="FAMILY",
                    help="also run event chains over fabric families (all when none named: "
                         "hpn shared-agg multi-spine leaf-spine superpod host-ring host-torus "
                         "mixed-hosts shared-nic mixed-nics fat-tree dragonfly rail-missing "
                         "half-uplinks multi-plane nvl-islands gpu-mesh), "
                         "cold and warm, with time percentiles")
    ap.add_argument("--family-chains", type=int, default=2, help="chains per family fabric and budget")
    ap.add_argument("--scramble", action="store_true", help="rename and reorder the family fabrics")
    ap.add_argument("--order-check", action="store_true",
                    help="also solve every family state renamed and relisted, cold: its rates must not change")
    ap.add_argument("--budgets", nargs="+", default=["10", "None"], metavar="K",
                    help="chunk budgets of the family chains (default: 10 None)")
    ap.add_argument("--entry", default="mccl_opt:solve_allgather",
                    help="the solver to judge, MODULE:FUNCTION (default mccl_opt:solve_allgather)")
    args = ap.parse_args(argv)
    module, _, name = args.entry.partition(":")
    solve = getattr(importlib.import_module(module), name)
    load_kernels(collectives=("allgather",))   # as after `mccl warmup`: no timed solve loads a kernel
    first = solve(hpn(1, 2, 8))
    for both in (False, True):                                # general / ForestColl warm paths
        solve(hpn(1, 2, 8).with_capacity(src="s0h1g7", dst="s0h1nvs", gbps=1440.0,
                                         both_directions=both), warm=first)
    solve(hpn(1, 2, 2), max_chunks=None)
    print(f"judging {args.entry}")
    t0 = time.perf_counter()
    tally = fuzz(args, solve)
    report(tally, time.perf_counter() - t0)
    if args.families is not None:
        from bench.allgather_chains import FAMILIES, print_chains, run_chains

        t0 = time.perf_counter()
        budgets = tuple(None if b == "None" else int(b) for b in args.budgets)
        chains = run_chains(args.family_chains, args.steps, args.seed, budgets,
                            args.families or list(FAMILIES), args.scramble, cut_bound,
                            args.timeout, args.order_check)
        print_chains(chains, time.perf_counter() - t0)
        return 1 if chains.failures or tally_failed(tally) else 0
    return 1 if tally_failed(tally) else 0


if __name__ == "__main__":
    raise SystemExit(main())
