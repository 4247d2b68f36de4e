"""The closed loop on real ranks (docs/executor.md, "Scenarios on real ranks"): gloo CPU
ranks, a ``mccl controller serve`` process and the emulated fabric, per scenario class.

    python bench/bench_executor_loop.py [--shape 1x2x4] [--collectives allgather,alltoall]
                                        [--repeats 1] [--json]
    python bench/bench_executor_loop.py --clear [--repeats 2]    # probes, recovery after clear
    python bench/bench_executor_loop.py --classes steady,further,flap,dead,ramp,three,noise
                                        [--controller-logs DIR] [--pieces P] [--block-kib K] [--no-abort] [--no-stalls]
                                        [--pipeline S]      # S slices per chunk (default 0: the piece rule)
                                        [--rank-nice N]     # 0: the controller in a session of its own

``--controller-logs DIR`` keeps each class run's controller decision log (``serve -v``:
which links moved, by how much, and why each version was published) as
``DIR/COLL-CLASS.log``.

Each case is one ``mccl loop --executor gloo`` run of a scenario built here: HPN
``shape``, a 16 MiB message, a healthy phase, then ``fail2`` (GPU0 <-> its ToR, 400 ->
50 Gbps, both directions) or ``onedir`` (GPU1 -> its ToR only, 400 -> 100 Gbps), held
to the end.  Columns: median real ms per collective healthy / degraded (old schedule)
/ first collective on the new version / the event's offline schedule run directly on
the degraded fabric; reaction (event to the first new-version collective, real ms);
versions received; recovery ratio ``offline / after`` (first collective, and median
of the first three).  Times are the slowest rank's; the ranks share this machine's
cores, so rerun or raise ``--repeats`` (the table then shows the median per case).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402,F401  (imported before the ranks fork)

from executor_cuda.scenario_run import RANK_NICE, GlooLoopConfig, run_gloo_loop  # noqa: E402
from mccl_runtime.scenario import parse_scenario  # noqa: E402

EVENTS = {
    "fail2": [{"src": "s0h0g0", "dst": "s0tor0", "capacity_gbps": 50, "both_directions": True}],
    "onedir": [{"src": "s0h0g1", "dst": "s0tor1", "capacity_gbps": 100, "both_directions": False}],
}


NIC = ("s0h0g0", "s0tor0")


def _nic(gbps: float) -> dict:
    return {"links": [{"src": NIC[0], "dst": NIC[1], "capacity_gbps": gbps, "both_directions": True}]}


#: scenario classes on real ranks, in healthy collectives ``h`` of fabric time: (events as
#: (time, event body), duration); the simulated loop's classes (bench/bench_loop_time.py)
#: stretched so each step lasts tens of collectives
CLASSES = {
    "steady": ([(30, _nic(50))], 120),
    "further": ([(30, _nic(200)), (60, _nic(50))], 120),
    "flap": ([(30, _nic(50)), (75, {"clear": True})], 140),
    "dead": ([(30, _nic(4))], 400),
    "ramp": ([(30, _nic(312.5)), (55, _nic(225)), (80, _nic(137.5)), (105, _nic(50))], 150),
    "three": ([(30, {"links": [
        {"src": "s0h0g0", "dst": "s0h0nvs", "capacity_gbps": 800, "both_directions": True},
        {"src": "s0h0g1", "dst": "s0tor1", "capacity_gbps": 50, "both_directions": True},
        {"src": "s0h1g3", "dst": "s0h1nvs", "capacity_gbps": 1000, "both_directions": False}]})], 120),
    "noise": ([], 100),
}


def class_scenario(shape: str, collective: str, cls: str, h_ms: float):
    events, total = CLASSES[cls]
    return parse_scenario({
        "format": "mccl-scenario/1", "topology": f"hpn {shape}", "collective": collective,
        "message_bytes": 16 * 2**20, "duration_ms": total * h_ms,
        "events": [{"t_ms": t * h_ms, **body} for t, body in events]})


def class_table(shape: str, collectives: list[str], classes: list[str], cfg: GlooLoopConfig,
                as_json: bool, log_dir: str | None = None) -> None:
    """One real-rank run per (collective, class); per class the worst event: versions, first
    collective on a new version / offline (``first``), median of its first three
    (``first3``), the last three before the next event (``final``), event to the first
    collective on a new version (``react``, real ms, the slowest event), event to the first
    collective at >= 0.95 of offline (``t95``, real ms), and the run's false swaps.
    ``log_dir``: keep each run's controller decision log there (``COLL-CLASS.log``)."""
    from executor_cuda.scenario_run import plan_scales
    from mccl_runtime.synthesizer import solver_synthesizer

    if log_dir:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
    rows = []
    for coll in collectives:
        probe = scenario(shape, coll, "fail2", 1.0, 2.0)
        healthy = solver_synthesizer(cfg.backend)(coll, probe.topology, None, None)
        h_ms = 1e3 * plan_scales(probe, healthy, cfg)[3]
        for cls in classes:
            t0 = time.monotonic()
            run_cfg = cfg if not log_dir else replace(cfg, controller_log=f"{log_dir}/{coll}-{cls}.log")
            s = run_gloo_loop(class_scenario(shape, coll, cls, h_ms), run_cfg)
            evs = s["events"]

            def worst(fn, evs=evs):
                vals = [v for v in map(fn, evs) if v is not None]
                return min(vals) if vals else None

            rows.append({
                "collective": coll, "class": cls, "events": len(evs),
                "versions": max((len(e["versions"]) for e in evs), default=0),
                "first": worst(lambda e: e["recovery_ratio"]),
                "first3": worst(lambda e: e["recovery_ratio3"]),
                "final": worst(lambda e: e["time_offline_ms"] / e["time_final3_ms"]
                               if e["time_final3_ms"] and e["time_offline_ms"] else None),
                "t95_ms": max((e["recovered_ms"] for e in evs if e["recovered_ms"] is not None), default=None),
                "reaction_ms": max((e["reaction_ms"] for e in evs if e["reaction_ms"] is not None), default=None),
                "received_ms": [e["received_ms"] for e in evs], "swap_ms": [e["swap_ms"] for e in evs],
                "never95": sum(e["recovered_ms"] is None for e in evs),
                "false_swaps": s["false_swaps"], "wrong": s["wrong_results"],
                "inflight": len(s.get("inflight_switches", [])), "aborts": len(s.get("aborts", [])),
                "stalls": len(s.get("stalls", [])),
                "per_event": [_event_row(e) for e in evs], "wall_s": time.monotonic() - t0})
            if not as_json:
                _print_class_row(rows[-1])
    if as_json:
        print(json.dumps(rows))


def _event_row(e: dict) -> dict:
    """One event's figures in the JSON rows: versions received (with their rates), first
    collective on a new version / offline, last three / offline, reaction and t95 (real ms)."""
    final = e["time_offline_ms"] / e["time_final3_ms"] if e["time_final3_ms"] and e["time_offline_ms"] else None
    return {"versions": [(v["version"], round(v["t_ms"]), v["rate_gbps"]) for v in e["versions"]],
            "first": e["recovery_ratio"], "final": final, "reaction_ms": e["reaction_ms"],
            "t95_ms": e["recovered_ms"]}


def _print_class_row(r: dict) -> None:
    f = (lambda v, p=2: "n/a" if v is None else f"{v:.{p}f}")
    print(f"{r['collective']:<10}{r['class']:<8}{r['events']:>7}{r['versions']:>9}{f(r['first']):>7}"
          f"{f(r['first3']):>8}{f(r['final']):>7}{f(r['reaction_ms'], 0):>7}{f(r['t95_ms'], 0):>8}{r['never95']:>9}"
          f"{r['false_swaps']:>7}{r['wrong']:>7}{r['wall_s']:>7.0f}{r['inflight']:>9}{r['aborts']:>7}", flush=True)


def scenario(shape: str, collective: str, event: str, t_ms: float, duration_ms: float):
    return parse_scenario({
        "format": "mccl-scenario/1", "topology": f"hpn {shape}", "collective": collective,
        "message_bytes": 16 * 2**20, "duration_ms": duration_ms,
        "events": [{"t_ms": t_ms, "links": EVENTS[event]}]})


def run(shape: str, collective: str, event: str, cfg: GlooLoopConfig, healthy_n: int,
        total_n: int) -> dict:
    """One run; event time and duration are set in healthy collectives of fabric time."""
    from executor_cuda.scenario_run import plan_scales
    from mccl_runtime.synthesizer import solver_synthesizer

    probe = scenario(shape, collective, event, 1.0, 2.0)
    healthy = solver_synthesizer(cfg.backend)(collective, probe.topology, None, None)
    fabric_ms = 1e3 * plan_scales(probe, healthy, cfg)[3]
    scn = scenario(shape, collective, event, healthy_n * fabric_ms, total_n * fabric_ms)
    return run_gloo_loop(scn, cfg)


def clear_table(repeats: int, collective_ms: float) -> None:
    """Recovery after ``clear`` on 4 ranks (HPN 1x2x2, AllGather), probes on and off
    alternately (paired, so both see the same load): GPU0 <-> its ToR at 8 Gbps, the
    first swap avoids the NIC's pairs, then ``clear``.  Columns: healthy ms, ms per
    collective on the avoiding schedule (last three before the clear) and the probes'
    share of that time, then after the clear: versions, reaction (clear to the first
    collective on a new version), last three collectives / healthy."""
    from executor_cuda.scenario_run import GlooLoopConfig, run_gloo_loop

    scn = parse_scenario({
        "format": "mccl-scenario/1", "topology": "hpn 1x2x2", "collective": "allgather",
        "message_bytes": 16 * 2**20, "duration_ms": 130,
        "events": [{"t_ms": 10, "links": [EVENTS["fail2"][0] | {"capacity_gbps": 8}]},
                   {"t_ms": 90, "clear": True}]})
    f = (lambda v, p=1: "n/a" if v is None else f"{v:.{p}f}")
    print(f"recovery after clear, 4 gloo ranks, HPN 1x2x2 AllGather, healthy collective ~{collective_ms:g} ms, "
          f"probes every 4 collectives or off, alternating")
    print(f"{'probes':<8}{'healthy':>9}{'avoiding':>10}{'probe %':>9}{'versions':>10}{'reaction':>10}"
          f"{'final/healthy':>15}")
    for _ in range(repeats):
        for every in (4, 0):
            s = run_gloo_loop(scn, GlooLoopConfig(world=4, collective_ms=collective_ms, probe_every=every))
            fail, clear = s["events"]
            print(f"{'every 4' if every else 'off':<8}{f(s['time_healthy_ms']):>9}{f(fail['time_final3_ms']):>10}"
                  f"{f(100 * fail['probe_share']):>9}{len(clear['versions']):>10}{f(clear['reaction_ms'], 0):>10}"
                  f"{f(clear['time_final3_ms'] / s['time_healthy_ms'], 2):>15}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="1x2x4")
    ap.add_argument("--collectives", default="allgather,alltoall")
    ap.add_argument("--events", default="fail2,onedir")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--healthy", type=int, default=30, help="healthy collectives before the event")
    ap.add_argument("--total", type=int, default=120, help="scenario length in healthy collectives")
    ap.add_argument("--collective-ms", type=float, default=60.0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--clear", action="store_true", help="only the recovery-after-clear table (probes on/off)")
    ap.add_argument("--pieces", type=int, default=1, help="pieces per collective (the in-flight switch)")
    ap.add_argument("--abort", action=argparse.BooleanOptionalAction, default=True,
                    help="abort a collective stuck on a dead link and re-run it on the new version "
                         "(default; --no-abort: it runs to its end on the old version)")
    ap.add_argument("--stalls", action=argparse.BooleanOptionalAction, default=True,
                    help="readings of a collective in which a rank stalled are no link evidence (default; "
                         "docs/executor.md)")
    ap.add_argument("--block-kib", type=float, default=32.0, help="real KiB per block (larger: pieces less noisy)")
    ap.add_argument("--pipeline", type=int, default=0,
                    help="slices per chunk (default 0: the simulator's piece rule; 1: whole chunks, as before)")
    ap.add_argument("--workers", type=int, default=0,
                    help="the controller's synthesis worker processes (default 0: a thread in the controller)")
    ap.add_argument("--speculate", action=argparse.BooleanOptionalAction, default=True,
                    help="ranks send drops still being confirmed as early estimates; the controller "
                         "synthesizes on them and publishes once confirmed (default; docs/executor.md)")
    ap.add_argument("--cable-wait", type=float, default=0.2, metavar="S",
                    help="the controller waits up to S s for a cable's other direction before synthesizing "
                         "(default %(default)s; 0: off)")
    ap.add_argument("--telemetry-frontend", action="store_true",
                    help="the ranks send telemetry through a front end (`serve --frontends 1`), early values "
                         "included, instead of to the controller (docs/executor.md)")
    ap.add_argument("--rank-nice", type=int, default=RANK_NICE, metavar="N",
                    help="ranks N below the controller, in its session (0: a session of its own, as before)")
    ap.add_argument("--controller-logs", metavar="DIR", help="keep each class run's controller decision log in DIR")
    ap.add_argument("--classes", help=f"instead: one run per scenario class ({','.join(CLASSES)})")
    args = ap.parse_args()
    if args.clear:
        clear_table(args.repeats, 30.0)
        return
    n = 1
    for part in args.shape.split("x"):
        n *= int(part)
    cfg = GlooLoopConfig(world=n, collective_ms=args.collective_ms, pieces=args.pieces, block_kib=args.block_kib,
                         pipeline=args.pipeline,
                         abort=args.abort, stalls=args.stalls, workers=args.workers, speculate=args.speculate,
                         cable_wait_s=args.cable_wait, telemetry_frontend=args.telemetry_frontend,
                         rank_nice=args.rank_nice)
    if args.classes:
        if not args.json:
            print(f"scenario classes on {n} gloo ranks, HPN {args.shape}, 16 MiB, healthy collective "
                  f"~{args.collective_ms:g} ms real; worst event per class")
            print(f"{'coll':<10}{'class':<8}{'events':>7}{'versions':>9}{'first':>7}{'first3':>8}{'final':>7}{'react':>7}"
                  f"{'t95 ms':>8}{'never95':>9}{'false':>7}{'wrong':>7}{'wall s':>7}{'inflight':>9}{'aborts':>7}")
        class_table(args.shape, args.collectives.split(","), args.classes.split(","), cfg, args.json,
                    args.controller_logs)
        return
    rows = []
    for coll in args.collectives.split(","):
        for event in args.events.split(","):
            runs = [run(args.shape, coll, event, cfg, args.healthy, args.total) for _ in range(args.repeats)]
            evs = [r["events"][0] for r in runs]

            def med(key: str, evs=evs):
                vals = [e[key] for e in evs if e[key] is not None]
                return statistics.median(vals) if vals else None

            rows.append({"case": f"{coll}/{event}", "healthy_ms": statistics.median(r["time_healthy_ms"] for r in runs),
                         "degraded_ms": med("time_degraded_ms"), "after_ms": med("time_after_ms"),
                         "offline_ms": med("time_offline_ms"), "reaction_ms": med("reaction_ms"),
                         "versions": [len(e["versions"]) for e in evs],
                         "false_swaps": [r["false_swaps"] for r in runs],
                         "recovery": med("recovery_ratio"), "recovery3": med("recovery_ratio3"),
                         "wrong": sum(r["wrong_results"] for r in runs)})
    if args.json:
        print(json.dumps(rows))
        return
    print(f"closed loop on {n} gloo ranks, HPN {args.shape}, 16 MiB, healthy collective ~{args.collective_ms:g} ms "
          f"real, {args.repeats} run(s) per case (medians)")
    f = (lambda v, p=1: "n/a" if v is None else f"{v:.{p}f}")
    print(f"{'case':<18}{'healthy':>9}{'degraded':>10}{'after':>8}{'offline':>9}{'reaction':>10}"
          f"{'versions':>10}{'false':>7}{'recovery':>10}{'first3':>8}")
    for r in rows:
        print(f"{r['case']:<18}{f(r['healthy_ms']):>9}{f(r['degraded_ms']):>10}{f(r['after_ms']):>8}"
              f"{f(r['offline_ms']):>9}{f(r['reaction_ms'], 0):>10}{','.join(map(str, r['versions'])):>10}"
              f"{','.join(map(str, r['false_swaps'])):>7}{f(r['recovery'], 2):>10}{f(r['recovery3'], 2):>8}")


if __name__ == "__main__":
    main()
