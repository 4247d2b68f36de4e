"""AllGather synthesis benchmark: cold vs warm per phase, k, trees, depth.

Smoke (CI): ``pytest bench/bench_allgather.py --benchmark-disable``.
Table: ``python bench/bench_allgather.py [--repeat R] 1x2x8 1x4x8`` (shapes SxHxN; each
solve timed as the fastest of R runs, default 1, cold and warm runs alternating).
Node-order sweep: ``python bench/bench_allgather.py --orders 2,3,4,5,6,7,8,16,32`` (cold
solves of two-segment HPN 2xHx8 as generated, listed ToRs first / NVSwitch and GPUs per
host / aggregation last, and shuffled with the GPU ranks; rates must agree).
Unbalanced fabrics (general method): ``python bench/bench_allgather.py [--repeat R]
--unbalanced 1x2x8 1x4x8`` (one-direction degradations; cold, warm, gap to the optimum);
``--nic-one-way 1x4x8 1x16x8`` (a NIC degraded one way: the general method with and
without its dual smoothing); ``--restriction 1x16x8 2x16x8`` (the same fault: the chain,
i.e. ForestColl on the best balanced restriction, vs the general method alone, K = 10
and exact).
"""

from __future__ import annotations

import math
import random
import re
import sys
import time

import numpy as np

from instances import fail1, fail2, fail3, hpn
from mccl_opt.allgather import solve_allgather
from mccl_opt.allgather.general.tree_colgen import TreeCGOptions
from mccl_opt.allgather.general.method import solve_general
from mccl_opt.schedule import share_loads
from mccl_opt.topology import Topology

FAILS = {"fail1": fail1, "fail2": fail2, "fail3": fail3}


def drift(topo, sched):
    """The least utilised loaded link of ``sched`` degraded half-way to saturation (a
    telemetry drift the schedule absorbs), or ``None`` if every loaded link is tight."""
    util = share_loads(topo, sched.chunks) * sched.rate_gbps / topo.arrays.capacity
    util[util <= 0] = np.inf
    i = int(np.argmin(util))
    if util[i] > 1 - 1e-6:
        return None
    link = topo.links[i]
    return topo.with_capacity(src=link.src, dst=link.dst,
                              gbps=link.capacity_gbps * (1 + util[i]) / 2)
#: warm stats (x* guess, budget guess) -> table label
GUESS = {("certified by packing", None): "packing", ("rejected", "rejected"): "rejected",
         ("rejected", "certified by packing"): "budget",
         ("certified by rerouting", None): "reroute",
         ("rejected", "certified by rerouting"): "budget+rr",
         ("certified by the previous schedule", None): "kept",
         ("rejected", "certified by the previous schedule"): "kept"}
PHASES = ("phase1_s", "budget_s", "balance_s", "phase2_s", "phase3_s", "mapping_s")


def timed_pair(repeat: int, topo, prev):
    """``((seconds, schedule) cold, (seconds, schedule) warm from prev)``, each the
    fastest of ``repeat`` runs; cold and warm runs alternate, so a change in machine
    speed (the machine is shared) affects both alike."""
    best: list = [None, None]
    for _ in range(repeat):
        for i, warm in enumerate((None, prev)):
            t = time.perf_counter()
            sched = solve_allgather(topo, warm=warm)
            seconds = time.perf_counter() - t
            if best[i] is None or seconds < best[i][0]:
                best[i] = (seconds, sched)
    return best


def run(shape: tuple[int, int, int], repeat: int = 1) -> list[dict]:
    base = hpn(*shape)
    prev = solve_allgather(base)
    rows = []
    cases = [(name, fail(base)) for name, fail in FAILS.items()]
    drifted = drift(base, prev)
    if drifted is not None:
        cases.append(("drift", drifted))
    for name, topo in cases:
        (t_cold, cold), (t_warm, warm) = timed_pair(repeat, topo, prev)
        assert math.isclose(warm.rate_gbps, cold.rate_gbps, rel_tol=1e-9), topo.name
        rows.append({"fabric": topo.name if name != "drift" else f"{base.name}-drift",
                     "gpus": topo.num_gpus, "cold_s": t_cold,
                     "warm_s": t_warm, "speedup": t_cold / t_warm, "k": cold.stats["k"],
                     "reused": warm.stats.get("reused_trees", 0),
                     "moved": warm.stats.get("rerouted_edges", 0),
                     "warm_depth": warm.stats["max_depth"],
                     "guess": GUESS.get((warm.stats.get("phase1_guess"),
                                         warm.stats.get("budget_guess")), "-"),
                     "warm_p1_s": warm.stats.get("phase1_s", 0.0) + warm.stats.get("budget_s", 0.0),
                     "trees": cold.stats["num_trees"], "depth": cold.stats["max_depth"],
                     "gap": cold.rounding_gap,
                     **{p: cold.stats.get(p, 0.0) for p in PHASES}})
    return rows


def tors_first(topo: Topology) -> Topology:
    """HPN ``topo`` listed ToRs first, then every host's NVSwitch and GPUs, aggregation
    switches last (the listing that once took 60-106 s cold at 80-112 GPUs)."""
    d = topo.to_dict()
    hosts: dict[str, list] = {}
    for n in d["nodes"]:
        m = re.match(r"(s\d+h\d+)", n["id"])
        if m:
            hosts.setdefault(m.group(1), []).append(n)
    per_host = [n for ns in hosts.values() for n in sorted(ns, key=lambda n: n["kind"] == "gpu")]
    d["nodes"] = ([n for n in d["nodes"] if "tor" in n["id"]] + per_host
                  + [n for n in d["nodes"] if n["id"].startswith("agg")])
    return Topology.from_dict(d)


def shuffled(topo: Topology, seed: int) -> Topology:
    """``topo`` with nodes (GPU ranks included) and links in a random order."""
    d = topo.to_dict()
    rng = random.Random(seed)
    rng.shuffle(d["nodes"])
    rng.shuffle(d["links"])
    return Topology.from_dict(d)


def order_sweep(hosts: list[int], repeat: int = 1) -> list[dict]:
    """Cold seconds (fastest of ``repeat``) of 2xHx8 in three listings; rates must agree."""
    rows = []
    for h in hosts:
        base = hpn(2, h, 8)
        listings = {"generated": base, "tors-first": tors_first(base), "shuffled": shuffled(base, h)}
        row: dict = {"fabric": base.name, "gpus": base.num_gpus}
        rates = []
        for name, topo in listings.items():
            best = math.inf
            for _ in range(repeat):
                t = time.perf_counter()
                sched = solve_allgather(topo)
                best = min(best, time.perf_counter() - t)
            rates.append(sched.rate_gbps)
            row[f"{name}_s"] = best
        assert max(rates) - min(rates) <= 1e-9 * max(rates), (base.name, rates)
        row["rate"] = rates[0]
        rows.append(row)
    return rows


def unbalanced(shape: tuple[int, int, int], repeat: int = 1) -> dict:
    """One-direction degradations (the general method): GPU1's NVSwitch uplink at 360 of
    2880 Gbps, then also GPU2's NIC uplink at 200 of 400 Gbps solved cold and warm from
    the first schedule (fastest of ``repeat``, alternating); ``gap`` is the rounding gap
    at 10 chunks, ``cg_gap`` the certified gap of the column generation."""
    before = hpn(*shape).with_capacity({("s0h0g1", "s0h0nvs"): 360.0})
    after = before.with_capacity({("s0h0g2", "s0tor2"): 200.0})
    prev = solve_allgather(before)
    (t_cold, cold), (t_warm, warm) = timed_pair(repeat, after, prev)
    assert cold.stats["method"] in ("general", "forestcoll-balanced-restriction")
    assert math.isclose(warm.lp_rate_gbps, cold.lp_rate_gbps, rel_tol=1e-7)
    return {"fabric": f"{before.name}-1dir", "gpus": after.num_gpus, "cold_s": t_cold,
            "warm_s": t_warm, "speedup": t_cold / t_warm, "lp": cold.lp_rate_gbps,
            "cut": cold.stats.get("cut_bound_gbps", cold.lp_rate_gbps), "rate": cold.rate_gbps,
            "gap": cold.rounding_gap,
            "cg_gap": max(cold.stats.get("cg_gap", 0.0), warm.stats.get("cg_gap", 0.0)),
            "rounds": f"{_rounds(cold)}/{_rounds(warm)}", "depth": cold.stats.get("max_depth")}


def _rounds(sched) -> int:
    """Column generation or cutting-plane rounds of an unbalanced-fabric solve."""
    return sched.stats.get("cg_rounds", sched.stats.get("cut_rounds", 0))


def restriction(shape: tuple[int, int, int], max_chunks: int | None) -> dict:
    """GPU0's NIC uplink at 100 of 400 Gbps one way, cold: the chain (ForestColl on the
    best balanced restriction) and the general method alone, in one run, same optimum."""
    topo = hpn(*shape).with_capacity(src="s0h0g0", dst="s0tor0", gbps=100.0,
                                     both_directions=False)
    t = time.perf_counter()
    chain = solve_allgather(topo, max_chunks=max_chunks)
    t_chain = time.perf_counter() - t
    t = time.perf_counter()
    general = solve_general(topo, max_chunks=max_chunks)
    t_general = time.perf_counter() - t
    assert math.isclose(chain.lp_rate_gbps, general.lp_rate_gbps, rel_tol=1e-9)
    return {"fabric": f"{topo.name}-nic-1way", "gpus": topo.num_gpus, "K": str(max_chunks),
            "chain_s": t_chain, "general_s": t_general, "speedup": t_general / t_chain,
            "method": chain.stats["method"], "rounds": f"{_rounds(chain)}/{_rounds(general)}",
            "lp": chain.lp_rate_gbps, "rate": chain.rate_gbps, "general_rate": general.rate_gbps}


def nic_one_way(shape: tuple[int, int, int]) -> dict:
    """GPU0's NIC uplink at 100 of 400 Gbps in one direction only (the general method,
    cold), solved with the column generation's dual smoothing (the default) and without
    it (``TreeCGOptions(smoothing=0)``) in one run: same certified optimum, rounds and seconds
    of each."""
    topo = hpn(*shape).with_capacity(src="s0h0g0", dst="s0tor0", gbps=100.0,
                                     both_directions=False)
    row: dict = {"fabric": f"{topo.name}-nic-1way", "gpus": topo.num_gpus}
    for name, alpha in (("smoothed", TreeCGOptions().smoothing), ("plain", 0.0)):
        t = time.perf_counter()
        sched = solve_general(topo, options=TreeCGOptions(smoothing=alpha))
        row[f"{name}_s"] = time.perf_counter() - t
        row[f"{name}_rounds"] = sched.stats["cg_rounds"]
        row[f"{name}_lp"] = sched.lp_rate_gbps
        assert sched.stats["cg_status"] == "optimal", sched.stats["cg_status"]
    assert math.isclose(row["smoothed_lp"], row["plain_lp"], rel_tol=1e-9)
    row["speedup"] = row["plain_s"] / row["smoothed_s"]
    return row


def test_smoke_unbalanced():
    row = unbalanced((1, 2, 4))
    assert row["cg_gap"] < 1e-7 and row["rate"] <= row["lp"] * (1 + 1e-12) <= row["cut"] * 1.001


def test_smoke_restriction():
    row = restriction((1, 4, 8), None)
    assert row["method"] == "forestcoll-balanced-restriction"
    assert math.isclose(row["rate"], row["lp"], rel_tol=1e-9)


def test_smoke_order_sweep():
    assert order_sweep([2])[0]["rate"] > 0


def test_smoke_tiny(benchmark):
    sched = benchmark(solve_allgather, fail2(hpn(1, 2, 4)))
    assert sched.rate_gbps > 0


if __name__ == "__main__":
    args = sys.argv[1:]
    repeat = 1
    if args[:1] == ["--repeat"]:
        repeat, args = int(args[1]), args[2:]
    # load the numba kernels of the cold and the warm paths outside the timings
    solve_allgather(fail2(hpn(1, 2, 4)), warm=solve_allgather(hpn(1, 2, 4)))
    if args[:1] == ["--unbalanced"]:
        cols = ["fabric", "gpus", "cold_s", "warm_s", "speedup", "lp", "cut", "rate", "gap",
                "cg_gap", "rounds", "depth"]
        print(" ".join(f"{c:>13s}" for c in cols))
        for shape in args[1:]:
            r = unbalanced(tuple(int(x) for x in shape.split("x")), repeat)
            print(" ".join(f"{r[c]:>13.4g}" if isinstance(r[c], float) else f"{r[c]!s:>13s}"
                           for c in cols))
        sys.exit(0)
    if args[:1] == ["--nic-one-way"]:
        cols = ["fabric", "gpus", "smoothed_s", "plain_s", "speedup", "smoothed_rounds",
                "plain_rounds", "smoothed_lp"]
        print(" ".join(f"{c:>15s}" for c in cols))
        for shape in args[1:]:
            r = nic_one_way(tuple(int(x) for x in shape.split("x")))
            print(" ".join(f"{r[c]:>15.4g}" if isinstance(r[c], float) else f"{r[c]!s:>15s}"
                           for c in cols))
        sys.exit(0)
    if args[:1] == ["--restriction"]:
        cols = ["fabric", "gpus", "K", "chain_s", "general_s", "speedup", "method", "rounds",
                "lp", "rate", "general_rate"]
        print(" ".join(f"{c:>15s}" for c in cols))
        for shape in args[1:]:
            for k in (10, None):
                r = restriction(tuple(int(x) for x in shape.split("x")), k)
                print(" ".join(f"{r[c]:>15.8g}" if isinstance(r[c], float) else f"{r[c]!s:>15s}"
                               for c in cols), flush=True)
        sys.exit(0)
    if args[:1] == ["--orders"]:
        cols = ["fabric", "gpus", "generated_s", "tors-first_s", "shuffled_s", "rate"]
        print(" ".join(f"{c:>13s}" for c in cols))
        for r in order_sweep([int(h) for h in args[1].split(",")], repeat):
            print(" ".join(f"{r[c]:>13.4f}" if isinstance(r[c], float) else f"{r[c]!s:>13s}"
                           for c in cols))
        sys.exit(0)
    shapes = [tuple(int(x) for x in s.split("x")) for s in (args or ["1x2x4", "1x2x8"])]
    cols = ["fabric", "gpus", "cold_s", "warm_s", "speedup", "k", "reused", "moved", "guess",
            "warm_p1_s", "trees", "depth", "warm_depth", "gap", *PHASES]
    print(" ".join(f"{c:>10s}" for c in cols))
    for shape in shapes:
        for r in run(shape, repeat):
            print(" ".join(f"{r[c]:>10.4f}" if isinstance(r[c], float) else f"{r[c]!s:>10s}"
                           for c in cols))
