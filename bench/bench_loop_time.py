"""The closed loop under time (issue 26): scenario classes whose difficulty is *when*
things happen, over freshly generated ``mccl-scenario/1`` files.

    python bench/bench_loop_time.py --fabrics "hpn 1x2x8,irregular 7" --out /tmp/scn
    python bench/bench_loop_time.py --classes further,flap --collectives alltoall
    python bench/bench_loop_time.py --synth-clock cpu --cold-gpus 16   # synthesis in CPU time
    python bench/bench_loop_time.py --classes further --alone   # each job's time in the loop vs alone
    python bench/bench_loop_time.py --seed 5      # fresh telemetry noise

Every class acts on one NIC cable (both directions): ``s0h0g0 - s0tor0`` on HPN, and on
an irregular fabric (``instances.irregular(seed)``) the GPU-spine cable ``h1g2 - spine``
when there is one, else the first GPU-spine cable of the healthy AllGather's cut, else its
first GPU cable.
Capacities are fractions of the cable's nominal:

* ``steady``: to 12.5 % at 20 ms (Fail2);
* ``further``: to 50 % at 20 ms, then to 12.5 % 50 ms later;
* ``flap``: to 12.5 % at 20 ms, cleared 40 ms later;
* ``dead``: to 1 % at 20 ms;
* ``ramp``: from 100 % to 12.5 % in 8 equal steps, one every 100 ms;
* ``noise5``: healthy, 5 % telemetry noise (false swaps);
* ``lane`` (HPN only, not run by default): one direction of GPU 1's NVSwitch port
  (``s0h0g1 -> s0h0nvs``) to 12.5 % at 20 ms (issue 26's one-way NVSwitch lane);
* ``further-slow`` / ``flap-slow``: ``further`` / ``flap`` with a synthesizer made slow on
  purpose (45 / 35 ms modelled synthesis, ``LoopConfig.synth_ms``): on HPN 1x2x8 its
  result is ready while the second change is still being confirmed.

One line per event: ``ratio`` = first collective on a new version / offline, ``final`` =
end of segment / offline, ``t95`` = from the event to the first collective at >= 0.95 of
offline, ``vers`` = versions published in the segment, ``ran`` = the version whose first
collective gave ``ratio`` (the first published for the event that ran), ``stale`` =
versions that first ran in the segment below 0.95 of offline (a stale version that ran),
``lost`` = time of
collectives aborted for a new version.  Where the reaction's time goes
(:mod:`mccl_runtime.loop_report`): ``alarm`` = the event to the first alarm (``detect -
alarm`` is the confirmation), ``synth`` = the first job's synthesis (also when it ends after
the segment), ``wait`` = the new version due to its first collective, ``floor`` = the
earliest t95 this detection and synthesis allow (detect + synth + dispatch + OOB + one
collective at the offline rate), ``spec`` = the same with synthesis started at the alarm,
``seg`` = the segment; ``reach`` is ``ok`` when the floor fits in the segment, ``spec`` when
only a synthesis started at the alarm would fit, ``no`` when neither does (no loop with this
detection and synthesis ends the segment at >= 0.95 of offline).  The scenario files are written to ``--out``
(a temporary folder by default) and read back, as ``mccl loop --scenario`` would.
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CLASSES = ("steady", "further", "flap", "dead", "ramp", "noise5", "further-slow", "flap-slow")
SLOW_MS = {"further-slow": 45.0, "flap-slow": 35.0}


def fabric(spec: str):
    """``"hpn SxHxN"`` or ``"irregular SEED"`` -> (topology, the cable the events act on)."""
    kind, arg = spec.split()
    if kind == "hpn":
        from instances import hpn, parse_shape

        return hpn(*parse_shape(arg)), ("s0h0g0", "s0tor0")
    from instances import irregular

    topo = irregular(int(arg))
    if topo.has_link("h1g2", "spine"):
        return topo, ("h1g2", "spine")
    import mccl_opt

    cut = mccl_opt.solve_allgather(topo).bottleneck
    gpus = set(topo.gpus)
    pick = next(((b.src, b.dst) for b in cut if b.dst == "spine"), None) or \
        next(((b.src, b.dst) for b in cut if b.src in gpus), None)
    if pick is None:
        raise SystemExit(f"{spec}: the healthy AllGather's cut has no GPU cable to act on; pick another seed")
    return topo, pick


def message_bytes(collective: str, gpus: int) -> float:
    """The scenarios' message: 16 MiB per GPU for AllGather, 128 MiB in all for AllToAll."""
    return 16 * 2**20 if collective == "allgather" else 128 * 2**20 / gpus


def scenario(cls: str, spec: str, collective: str, seed: int = 0) -> dict:
    """The ``mccl-scenario/1`` dictionary of one case (module docstring); ``seed`` seeds
    the telemetry noise."""
    topo, (src, dst) = fabric(spec)
    base = cls.replace("-slow", "")
    both = base != "lane"
    if not both:                        # one direction of GPU 1's port into its NVSwitch (HPN)
        src = topo.gpus[1]
        dst = src.rsplit("g", 1)[0] + "nvs"
    nominal = topo.links[topo.link_index(src, dst)].capacity_gbps

    def at(t_ms: float, share: float) -> dict:
        return {"t_ms": t_ms, "links": [{"src": src, "dst": dst, "capacity_gbps": nominal * share,
                                         "both_directions": both}]}

    events = {
        "steady": [at(20, 0.125)],
        "further": [at(20, 0.5), at(70, 0.125)],
        "flap": [at(20, 0.125), {"t_ms": 60, "clear": True}],
        "dead": [at(20, 0.01)],
        "ramp": [at(20 + 100 * i, 1.0 - 0.875 * (i + 1) / 8) for i in range(8)],
        "noise5": [],
        "lane": [at(20, 0.125)],
    }[base]
    duration = {"ramp": 900.0, "noise5": 600.0}.get(base, 250.0 if topo.num_gpus <= 16 else 600.0)
    return {"format": "mccl-scenario/1", "topology": topo.to_dict(), "collective": collective,
            "message_bytes": message_bytes(collective, topo.num_gpus), "duration_ms": duration, "noise": 0.05 if base == "noise5" else 0.01,
            "seed": seed, "events": events}


class RecordingSynthesizer:
    """The loop's synthesizer, recording the inputs and the CPU / wall seconds of every
    solve run by a synthesis job (in the manager's worker thread; the initial and offline
    solves run in the main thread and are not recorded), to re-solve them alone."""

    def __init__(self) -> None:
        from mccl_runtime.synthesizer import solver_synthesizer

        self.inner = solver_synthesizer()
        self.jobs: list[tuple[tuple, float, float]] = []

    def __call__(self, kind, topo, warm, time_limit_s):
        if threading.current_thread() is threading.main_thread():
            return self.inner(kind, topo, warm, time_limit_s)
        cpu, wall = time.thread_time(), time.perf_counter()
        schedule = self.inner(kind, topo, warm, time_limit_s)
        self.jobs.append(((kind, topo, warm, time_limit_s), time.thread_time() - cpu,
                          time.perf_counter() - wall))
        return schedule

    def alone(self, repeats: int = 3) -> list[dict]:
        """Each recorded solve re-run alone in this thread (best of ``repeats``), next to its
        in-loop seconds."""
        out = []
        for args, cpu, wall in self.jobs:
            best_cpu = best_wall = float("inf")
            for _ in range(repeats):
                fresh = copy.deepcopy(args)          # no cache a first solve left on its inputs
                c, w = time.thread_time(), time.perf_counter()
                self.inner(*fresh)
                best_cpu, best_wall = min(best_cpu, time.thread_time() - c), min(best_wall, time.perf_counter() - w)
            out.append({"gpus": args[1].num_gpus, "warm": args[2] is not None, "loop_cpu_ms": 1e3 * cpu,
                        "alone_cpu_ms": 1e3 * best_cpu, "loop_wall_ms": 1e3 * wall, "alone_wall_ms": 1e3 * best_wall})
        return out


def run_case(path: Path, cls: str, cold_gpus: int = 16, synth_clock: str = "wall",
             alone: bool = False, speculate: bool = False) -> dict:
    """Run one scenario file; the summary and the rows' versions (``alone``: also every
    synthesis job's seconds in the loop and re-run alone, :class:`RecordingSynthesizer`)."""
    from mccl_runtime.loop import LoopConfig, run_loop
    from mccl_runtime.scenario import load_scenario

    wall = time.perf_counter()
    cfg = LoopConfig(synth_ms=SLOW_MS.get(cls), cold_gpus=cold_gpus, synth_clock=synth_clock, speculate=speculate)
    recorder = RecordingSynthesizer() if alone else None
    res = run_loop(cfg, synthesize=recorder, scenario=load_scenario(str(path)))
    return {"summary": res.summary, "rows": res.rows, "wall_s": time.perf_counter() - wall,
            "aborted": len(getattr(res, "aborted", [])), "alone": recorder.alone() if recorder else []}


def print_alone(spec: str, collective: str, cls: str, jobs: list[dict]) -> None:
    """One line per synthesis job: CPU and wall milliseconds in the loop and alone."""
    for j in jobs:
        print(f"  synth {spec} {collective} {cls}: {j['gpus']} GPUs {'warm' if j['warm'] else 'cold'} "
              f"cpu {j['loop_cpu_ms']:.1f} / {j['alone_cpu_ms']:.1f} ms "
              f"({j['loop_cpu_ms'] / max(j['alone_cpu_ms'], 1e-9):.2f}x), "
              f"wall {j['loop_wall_ms']:.1f} / {j['alone_wall_ms']:.1f} ms", flush=True)


def stale_versions(rows: list[dict], ev: dict, end_ms: float) -> int:
    """Versions that first ran inside the event's segment below 0.95 of its offline level
    (a first collective that crossed the next event ran partly on the next fabric: not
    counted, as :mod:`mccl_runtime.loop_report` reads no ratio from it)."""
    first: dict[int, dict] = {}
    for r in rows:
        first.setdefault(r["version"], r)
    return sum(1 for r in first.values() if ev["t_ms"] <= r["t_ms"] and r["end_ms"] <= end_ms
               and r["algbw"] < 0.95 * ev["algbw_offline"])


HEADER = (f"{'fabric':<14} {'coll':<9} {'class':<12} {'ev':>2} {'kind':<8} {'detect':>7} {'react':>7} "
          f"{'ratio':>6} {'final':>6} {'t95':>7} {'vers':>4} {'ran':>4} {'stale':>5} {'lost':>6} {'false':>5} {'wall_s':>6} "
          f"{'alarm':>6} {'synth':>6} {'wait':>6} {'floor':>6} {'spec':>6} {'seg':>6} {'reach':<9}")


def reach(ev: dict) -> str:
    """Whether the segment's end at >= 0.95 of offline is within reach (module docstring)."""
    floor, spec, seg = ev.get("floor_ms"), ev.get("spec_floor_ms"), ev.get("segment_ms")
    if floor is None or seg is None:
        return "-"
    if floor <= seg:
        return "ok"
    return "no" if spec is None or spec > seg else "spec"


def print_rows(spec: str, collective: str, cls: str, out: dict) -> None:
    f = (lambda v, w=7, p=1: f"{'-':>{w}}" if v is None else f"{v:>{w}.{p}f}")
    s = out["summary"]
    events = s["events"] or [None]
    for i, ev in enumerate(events):
        if ev is None:
            print(f"{spec:<14} {collective:<9} {cls:<12} {'-':>2} {'healthy':<8} {'':>7} {'':>7} {'':>6} {'':>6} "
                  f"{'':>7} {'':>4} {'':>4} {'':>5} {'':>6} {s['false_swaps']:>5} {out['wall_s']:>6.1f}", flush=True)
            continue
        end = s["events"][i + 1]["t_ms"] if i + 1 < len(s["events"]) else float("inf")
        final = None if ev["algbw_final"] is None else ev["algbw_final"] / ev["algbw_offline"]
        ran = "-" if ev["first_version"] is None else ev["first_version"]
        print(f"{spec:<14} {collective:<9} {cls:<12} {i:>2} {ev['kind']:<8} {f(ev['detect_ms'])} "
              f"{f(ev['reaction_ms'])} {f(ev['recovery_ratio'], 6, 3)} {f(final, 6, 3)} "
              f"{f(ev.get('recovered_ms'))} {len(ev['versions']):>4} {ran:>4} {stale_versions(out['rows'], ev, end):>5} "
              f"{f(ev.get('lost_ms'), 6)} {s['false_swaps']:>5} {out['wall_s']:>6.1f} "
              f"{f(ev.get('alarm_ms'), 6)} {f(ev.get('job_synth_ms'), 6)} {f(ev.get('wait_ms'), 6)} "
              f"{f(ev.get('floor_ms'), 6)} {f(ev.get('spec_floor_ms'), 6)} {f(ev.get('segment_ms'), 6, 0)} "
              f"{reach(ev):<9}", flush=True)


def print_short(results: list[dict]) -> None:
    """The segments that end below 0.95 of offline, each with whether its floor (the
    earliest t95 its detection and synthesis allow) fits in it."""
    short = [(r, i, ev) for r in results for i, ev in enumerate(r["summary"]["events"])
             if ev["algbw_final"] is None or ev["algbw_final"] < 0.95 * ev["algbw_offline"]]
    print(f"segments ending below 0.95 of offline: {len(short)}")
    for r, i, ev in short:
        floor, seg = ev.get("floor_ms"), ev["segment_ms"]
        note = {"no": "unattainable with this synthesis", "spec": "only with synthesis started at the alarm",
                "ok": "within reach: the loop missed it"}
        why = "no synthesis started" if floor is None else \
            f"floor {floor:.1f} ms, segment {seg:.0f} ms: {note[reach(ev)]}"
        print(f"  {r['fabric']} {r['collective']} {r['class']} event {i}: {why}")


def main(argv: list[str] | None = None) -> None:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fabrics", default="hpn 1x2x8,irregular 7,hpn 1x8x8")
    p.add_argument("--classes", default=",".join(CLASSES))
    p.add_argument("--collectives", default="allgather,alltoall")
    p.add_argument("--out", default=None, help="folder for the scenario files (default: a temporary one)")
    p.add_argument("--seed", type=int, default=0, help="seed of the scenarios' telemetry noise")
    p.add_argument("--json", default=None, help="also write every summary to this file")
    p.add_argument("--cold-gpus", type=int, default=16,
                   help="the loop re-synthesizes cold on fabrics of at most this many GPUs (0: always warm)")
    p.add_argument("--synth-clock", choices=["wall", "cpu"], default="wall",
                   help="time synthesis in wall time or in process CPU time (a loaded machine does not "
                        "count as slow synthesis)")
    p.add_argument("--alone", action="store_true",
                   help="also re-run every synthesis job alone and print its CPU / wall time in the loop "
                        "and alone (issue 26: within 1.5x)")
    p.add_argument("--speculate", action="store_true",
                   help="start synthesis on early estimates of a change still being confirmed; publish "
                        "only once it is confirmed (Policy.speculate)")
    args = p.parse_args(argv)
    folder = Path(args.out or tempfile.mkdtemp(prefix="mccl-loop-time-"))
    folder.mkdir(parents=True, exist_ok=True)
    print(HEADER)
    results = []
    for spec in args.fabrics.split(","):
        for collective in args.collectives.split(","):
            for cls in args.classes.split(","):
                path = folder / f"{spec.replace(' ', '-')}-{collective}-{cls}.json"
                path.write_text(json.dumps(scenario(cls, spec, collective, args.seed)))
                out = run_case(path, cls, args.cold_gpus, args.synth_clock, args.alone, args.speculate)
                print_rows(spec, collective, cls, out)
                print_alone(spec, collective, cls, out["alone"])
                results.append({"fabric": spec, "collective": collective, "class": cls,
                                "summary": out["summary"]})
    print_short(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, default=float))


if __name__ == "__main__":
    main()
