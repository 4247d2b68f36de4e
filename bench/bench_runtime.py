"""Controller benchmarks: decision latency per telemetry batch at 128 and 512 GPUs, and
the closed loop (paper §6.2, Fig. 13) over scenario classes x sizes x collectives.

    python bench/bench_runtime.py                 # decision latency + closed-loop table
    python bench/bench_runtime.py --loop-only --sizes 1x2x4 --classes fail2,dip
    python bench/bench_runtime.py --tradeoff      # estimator: detection delay vs false swaps
    python bench/bench_runtime.py --probe-cost    # algbw cost of probes while a failure lasts
    pytest bench/bench_runtime.py --benchmark-enable

Closed-loop classes (all on rank 0 of host 0 unless said): ``fail1`` (NVSwitch cable
2880 -> 800), ``fail2`` (NIC cable 400 -> 50), ``nic1dir`` (GPU -> ToR only, 400 -> 100),
``two`` (Fail2 on host 0 GPU 0 and the NIC cable of host 1 GPU 1 to 100, at once),
``dip`` (NIC cable to 10 % for 5 ms), ``noise1`` / ``noise5`` (healthy, 1 % / 5 %
telemetry noise), ``clear`` (Fail2 at 20 ms, cleared at 120 / 260 / 860 ms on 8 / 16 / 64
GPUs).  Runs last 160 / 300 / 900 ms (noise: 5 s on 8 GPUs, 1 s on 16).  AllGather moves 16 MiB
per GPU; AllToAll a 128 MiB send buffer per rank (``128 MiB / N`` per pair).

A *decision* is what the controller does per telemetry batch: ingest the batch into the
EWMA store (one sample per link the active schedules use, plus one pair sample per
same-rail inter-host GPU pair) and run Algorithm 1 on every registered collective.  The
AllGather under test is the NCCL-style ring (the decision cost depends on link and cut
counts, not on schedule quality); an AllToAll with direct paths adds a dense ``n``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from instances import hpn  # noqa: E402
from mccl_opt.baselines import direct_alltoall, ring_allgather  # noqa: E402
from mccl_runtime.manager import Policy, ScheduleManager  # noqa: E402
from mccl_runtime.telemetry import MeasurementStore  # noqa: E402

SHAPES = {128: (1, 16, 8), 512: (2, 32, 8)}


def _no_synthesis(kind, topo, warm, time_limit_s):
    raise AssertionError("the decision benchmark must not re-synthesize")


def decision_setup(gpus: int):
    topo = hpn(*SHAPES[gpus])
    store = MeasurementStore(topo, alpha=0.012)
    mgr = ScheduleManager(store, _no_synthesis, Policy(gamma=0.1, min_dwell_s=0.0))
    mgr.register("world", "ag", "allgather", ring_allgather(topo))
    mgr.register("world", "a2a", "alltoall", direct_alltoall(topo))
    rng = np.random.default_rng(0)
    used = np.flatnonzero(sum(c.profile.n for c in mgr.collectives()) > 0)
    cap = topo.arrays.capacity
    pairs = [(u, v) for u in topo.gpus for v in topo.gpus
             if u != v and u.split("h")[0] == v.split("h")[0] and u[u.index("g"):] == v[v.index("g"):]]

    def batch(t: float) -> list[dict]:
        noise = 1.0 + 0.01 * rng.standard_normal(len(used) + len(pairs))
        out = [{"kind": "link", "src": topo.links[a].src, "dst": topo.links[a].dst,
                "gbps": float(cap[a] * noise[i]), "t": t} for i, a in enumerate(used)]
        out += [{"kind": "pair", "src": u, "dst": v, "gbps": float(400.0 * noise[len(used) + i]), "t": t}
                for i, (u, v) in enumerate(pairs)]
        return out

    return store, mgr, batch


def decide(store, mgr, samples, t):
    store.ingest(samples, now=t)
    return mgr.check(t)


def measure_decision(gpus: int, rounds: int = 20) -> dict:
    store, mgr, batch = decision_setup(gpus)
    batches = [batch(float(i)) for i in range(rounds + 1)]
    decide(store, mgr, batches[0], 0.0)                       # warm caches (pair paths)
    times = []
    for i in range(1, rounds + 1):
        t0 = time.perf_counter()
        flagged = decide(store, mgr, batches[i], float(i))
        times.append(time.perf_counter() - t0)
        assert flagged == []                                   # 1 % noise must not flag
    mgr.close()
    return {"gpus": gpus, "links": store.topo.num_links, "samples": len(batches[1]),
            "median_ms": 1e3 * float(np.median(times)), "max_ms": 1e3 * float(np.max(times))}


CLASSES = ("fail1", "fail2", "nic1dir", "two", "dip", "noise1", "noise5", "clear")


def _cable(src: str, dst: str, gbps: float, both: bool = True) -> dict:
    return {"src": src, "dst": dst, "capacity_gbps": gbps, "both_directions": both}


def loop_scenario(cls: str, shape: str, collective: str, noise_ms: float = 5000.0) -> dict:
    """The ``mccl-scenario/1`` dictionary of one benchmark case (module docstring)."""
    n = 1
    for x in shape.split("x"):
        n *= int(x)
    size = 16 * 2**20 if collective == "allgather" else 128 * 2**20 / n
    nic = _cable("s0h0g0", "s0tor0", 50.0)
    events = {
        "fail1": [{"t_ms": 20, "links": [_cable("s0h0g0", "s0h0nvs", 800.0)]}],
        "fail2": [{"t_ms": 20, "links": [nic]}],
        "nic1dir": [{"t_ms": 20, "links": [_cable("s0h0g0", "s0tor0", 100.0, both=False)]}],
        "two": [{"t_ms": 20, "links": [nic, _cable("s0h1g1", "s0tor1", 100.0)]}],
        "dip": [{"t_ms": 20, "links": [_cable("s0h0g0", "s0tor0", 40.0)], "duration_ms": 5}],
        "noise1": [], "noise5": [],
        "clear": [{"t_ms": 20, "links": [nic]}, {"t_ms": 120, "clear": True}],
    }[cls]
    span = {8: 160.0, 16: 300.0}.get(n, 900.0)             # degraded collectives and swaps grow with N
    if cls == "clear":
        events[1]["t_ms"] = span - 40.0
    duration = noise_ms if cls.startswith("noise") else (2 * span - 40.0 if cls == "clear" else span)
    return {"format": "mccl-scenario/1", "topology": f"hpn {shape}", "collective": collective,
            "message_bytes": size, "duration_ms": duration,
            "noise": {"noise1": 0.01, "noise5": 0.05}.get(cls, 0.01), "events": events}


def measure_loop(cls: str, shape: str, collective: str, **cfg) -> dict:
    """Run one closed-loop case; one row of the table (figures of its events)."""
    from mccl_runtime.loop import LoopConfig, run_loop
    from mccl_runtime.scenario import parse_scenario

    wall = time.perf_counter()
    noise_ms = 5000.0 if shape == "1x2x4" else 1000.0
    res = run_loop(LoopConfig(**cfg), scenario=parse_scenario(loop_scenario(cls, shape, collective, noise_ms)))
    s = res.summary
    ev = s["events"][0] if s["events"] else {}
    row = {"class": cls, "shape": shape, "gpus": res.scenario.topology.num_gpus, "collective": collective,
           "false_swaps": s["false_swaps"], "wall_s": time.perf_counter() - wall,
           "healthy": s["algbw_healthy"], "sim_ms": res.scenario.duration_s * 1e3}
    for k in ("detect_ms", "synth_ms", "swap_ms", "dispatch_ms", "reaction_ms", "algbw_degraded", "algbw_after",
              "algbw_final", "algbw_offline", "recovery_ratio", "probe_cost", "recovered_ms"):
        row[k] = ev.get(k)
    row["versions"] = len(ev.get("versions", [])) if ev else 0
    if cls == "clear":
        cl = s["events"][1]
        row.update(clear_versions=len(cl["versions"]), clear_reaction_ms=cl["reaction_ms"],
                   clear_recovered_ms=cl["recovered_ms"], clear_ratio=cl["recovery_ratio"])
    return row


def loop_table(sizes, classes, collectives=("allgather", "alltoall")) -> list[dict]:
    rows = []
    for shape in sizes:
        for coll in collectives:
            for cls in classes:
                if cls.startswith("noise") and shape == "1x8x8":
                    continue                      # noise: 5 s on 8 GPUs, 1 s on 16 (simulation cost)
                rows.append(measure_loop(cls, shape, coll))
                print_loop_row(rows[-1], flush=True)
    return rows


LOOP_HEADER = (f"{'class':<8} {'gpus':>4} {'coll':<9} {'detect':>7} {'synth':>7} {'swap':>7} {'disp':>6} {'react':>7} "
               f"{'degr':>7} {'after':>7} {'offline':>7} {'ratio':>6} {'t95':>7} {'vers':>4} {'false':>5} {'probe%':>6} "
               f"{'clear':>16}")


def print_loop_row(r: dict, flush: bool = False) -> None:
    f = (lambda v, w=7, p=1: f"{'-':>{w}}" if v is None else f"{v:>{w}.{p}f}")
    clear = ""
    if r["class"] == "clear":
        clear = f"v{r['clear_versions']} {f(r['clear_recovered_ms'], 5)}ms r{f(r['clear_ratio'], 4, 2)}"
    ratio = r["recovery_ratio"]
    if ratio is None and r["versions"] == 0 and r["algbw_final"] and not r["class"].startswith(("dip", "noise")):
        ratio_s = f"{r['algbw_final'] / r['algbw_offline']:>5.3f}*"       # no version needed: final / offline
    else:
        ratio_s = f(ratio, 6, 3)
    print(f"{r['class']:<8} {r['gpus']:>4} {r['collective']:<9} {f(r['detect_ms'])} {f(r['synth_ms'])} "
          f"{f(r['swap_ms'])} {f(r['dispatch_ms'], 6)} {f(r['reaction_ms'])} {f(r['algbw_degraded'])} "
          f"{f(r['algbw_after'])} {f(r['algbw_offline'])} {ratio_s} {f(r['recovered_ms'])} {r['versions']:>4} "
          f"{r['false_swaps']:>5} "
          f"{f(100 * (r['probe_cost'] or 0), 6, 2)} {clear:>16}", flush=flush)


def probe_cost() -> None:
    """Algbw cost of probing while Fail2 lasts (HPN 1x2x4), paired runs: probes off, on
    links without passive windows (default), on every link held below nominal."""
    from mccl_runtime.loop import LoopConfig, run_loop
    from mccl_runtime.scenario import parse_scenario

    print(f"{'collective':<10} {'probes':<10} {'mean algbw during failure':>26} {'cost':>7} {'probe time':>10}")
    for coll in ("allgather", "alltoall"):
        scn = parse_scenario(loop_scenario("fail2", "1x2x4", coll))
        base = None
        for label, cfg in (("off", LoopConfig(probe_period_ms=0.0)), ("idle", LoopConfig()),
                           ("all", LoopConfig(probe_idle_only=False))):
            res = run_loop(cfg, scenario=scn)
            rows = [r for r in res.rows if r["version"] > 1]           # after the swap, failure lasting
            span = sum(r["end_ms"] - r["t_ms"] for r in rows)
            bw = sum(r["algbw"] * (r["end_ms"] - r["t_ms"]) for r in rows) / span
            base = base or bw
            probe = sum(r["probe_ms"] for r in rows) / span
            print(f"{coll:<10} {label:<10} {bw:>26.2f} {100 * (1 - bw / base):>6.2f}% {100 * probe:>9.2f}%",
                  flush=True)


def tradeoff(settings=((0.5, 0.004), (1.0, 0.008), (2.0, 0.016))) -> None:
    """Estimator trade-off: detection delay (Fail2 and a 25 % NIC drop) vs false swaps
    (dips of 5 and 10 ms to 10 %, 5 % noise) for CUSUM thresholds ``h`` and ``hold_s``."""
    from mccl_runtime import level as lv
    from mccl_runtime.loop import LoopConfig, run_loop
    from mccl_runtime.scenario import parse_scenario

    print(f"{'h':>5} {'hold_ms':>7} {'fail2_detect':>12} {'drop25_detect':>13} {'dip5_false':>10} "
          f"{'dip10_false':>11} {'noise5_false':>12}")
    for h, hold in settings:
        params = lv.LevelParams(h=h, hold_s=hold)
        out = []
        for cls, links, dur in (("fail2", [_cable("s0h0g0", "s0tor0", 50.0)], None),
                                ("drop25", [_cable("s0h0g0", "s0tor0", 300.0)], None),
                                ("dip5", [_cable("s0h0g0", "s0tor0", 40.0)], 5),
                                ("dip10", [_cable("s0h0g0", "s0tor0", 40.0)], 10),
                                ("noise5", None, None)):
            ev = [] if links is None else [{"t_ms": 20, "links": links} | ({"duration_ms": dur} if dur else {})]
            scn = parse_scenario({"format": "mccl-scenario/1", "topology": "hpn 1x2x4",
                                  "collective": "allgather", "message_bytes": 16 * 2**20,
                                  "duration_ms": 1000.0 if links is None else 120.0,
                                  "noise": 0.05 if links is None else 0.01, "events": ev})
            s = run_loop(LoopConfig(level=params), scenario=scn).summary
            out.append(s["false_swaps"] if dur or links is None else s["events"][0]["detect_ms"])
        fmt = (lambda v: "-" if v is None else f"{v:.1f}")
        print(f"{h:>5} {hold * 1e3:>7.0f} {fmt(out[0]):>12} {fmt(out[1]):>13} {out[2]:>10} {out[3]:>11} "
              f"{out[4]:>12}", flush=True)


def test_decision_latency_128(benchmark):
    store, mgr, batch = decision_setup(128)
    samples = batch(1.0)
    decide(store, mgr, samples, 1.0)
    benchmark(decide, store, mgr, samples, 1.0)
    mgr.close()


def test_decision_latency_512(benchmark):
    """Timed only under ``--benchmark-enable`` (``make bench``): in ``make test`` its setup
    (4.5 s of CPU) would re-check what the 128-GPU case checks on the same code path."""
    if benchmark.disabled:
        pytest.skip("a benchmark: runs with --benchmark-enable (the 128-GPU case covers the path)")
    store, mgr, batch = decision_setup(512)
    samples = batch(1.0)
    decide(store, mgr, samples, 1.0)
    benchmark.pedantic(decide, args=(store, mgr, samples, 1.0), rounds=5, iterations=1)
    mgr.close()


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--loop-only", action="store_true", help="skip the decision-latency table")
    p.add_argument("--sizes", default="1x2x4,1x2x8,1x8x8", help="HPN shapes (8, 16, 64 GPUs)")
    p.add_argument("--classes", default=",".join(CLASSES))
    p.add_argument("--collectives", default="allgather,alltoall")
    p.add_argument("--tradeoff", action="store_true", help="only the estimator trade-off table")
    p.add_argument("--probe-cost", action="store_true", help="only the probe cost table")
    args = p.parse_args(argv)
    if args.tradeoff:
        tradeoff()
        return
    if args.probe_cost:
        probe_cost()
        return
    if not args.loop_only:
        print("decision latency per telemetry batch (ingest + Algorithm 1 on AllGather + AllToAll)")
        print(f"{'gpus':>5} {'links':>6} {'samples':>8} {'median_ms':>10} {'max_ms':>8}")
        for g in SHAPES:
            r = measure_decision(g)
            print(f"{r['gpus']:>5} {r['links']:>6} {r['samples']:>8} {r['median_ms']:>10.2f} {r['max_ms']:>8.2f}")
    print("\nclosed loop (simulation; times in ms, algbw in GB/s; ratio = after / offline; t95 = from the event "
          "to the first collective at >= 0.95 of offline; clear: versions, time to >= 0.95 of healthy, ratio)")
    print(LOOP_HEADER)
    loop_table(args.sizes.split(","), args.classes.split(","), tuple(args.collectives.split(",")))


if __name__ == "__main__":
    main()
