"""The closed loop on random scenarios (issue 26): event chains nobody designed, drawn from a
seed, written as ``mccl-scenario/1`` files and run through :mod:`bench.bench_loop_time`'s loop.

    python bench/fuzz_loop.py --seed 1 --count 40             # synthesis timed in CPU time
    python bench/fuzz_loop.py --seed 2 --count 5 --out /tmp/fz --only 3   # one scenario again

Each scenario draws a fabric (HPN 1x2x8 / 1x8x8 / 2x4x8 or ``instances.irregular(k)``, half
of them renamed and relisted by ``instances.scrambled``), a collective, telemetry noise
(0-5 %) and a chain of 1-4 steps 10-300 ms apart, each one of

* ``drop``: a cable drawn at random (NIC = GPU to a far switch, NVSwitch = GPU to its host
  switch, spine = switch to switch, direct GPU cables on irregular fabrics), one way or both,
  to 1-90 % of its nominal;
* ``further``: the last dropped cable lower still;
* ``pair``: two cables at once;
* ``ramp``: the last (or a new) cable down in 2-5 equal steps 20-120 ms apart;
* ``clear``: every link back to the scenario's fabric (after a drop: a flap).

Per event (``bench_loop_time``'s columns): ``ratio`` = first collective on a new version /
offline, ``final`` = end of the segment / offline, ``vers`` = versions published in the
segment, ``reach`` = whether the loop's floor (detection + synthesis + one collective) fits
in the segment.  A *miss* is an event whose segment the floor fits (``reach ok``) that ends
below 0.95 of offline or whose first swap is below 0.95, a segment of at least 100 ms that
ends below 0.95 with no synthesis finished in it (``reach -``: no floor to compare to; the
loop did not react in time), any event with more than 2
versions, a stale version (one that first ran below 0.95 of offline, e.g. a failure's
schedule after its clear), and any false swap.  The tables give, per step kind and per
fabric, p50 / p5 / min of ``ratio`` and ``final`` over the events whose floor fits.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_loop_time import message_bytes, reach, run_case, stale_versions  # noqa: E402

FABRICS = ("hpn 1x2x8", "hpn 1x8x8", "hpn 2x4x8", "irregular")
#: a segment this long with no finished synthesis ends below target only through the loop
#: (the floors measured here are 25-60 ms when synthesis takes milliseconds)
NO_REACTION_MS = 100.0
STEPS = ("drop", "further", "pair", "ramp", "clear")


def draw_fabric(rng: np.random.Generator):
    """(label, topology): a fabric family drawn at random, half of them scrambled."""
    from instances import hpn, irregular, parse_shape, scrambled

    family = str(rng.choice(FABRICS))
    if family == "irregular":
        topo = irregular(int(rng.integers(0, 10_000)))
        label = "irregular"
    else:
        topo = hpn(*parse_shape(family.split()[1]))
        label = family
    if rng.random() < 0.5:
        topo = scrambled(topo, int(rng.integers(0, 2**31)))
        label += "*"
    return label, topo


def cable_kind(topo, link) -> str:
    """``nvswitch`` (GPU to a switch at the host's latency), ``nic`` (GPU to a far switch),
    ``spine`` (switch to switch) or ``direct`` (GPU to GPU); from node kinds and latency, so
    it holds on scrambled names."""
    gpu_src, gpu_dst = topo.is_gpu(link.src), topo.is_gpu(link.dst)
    if gpu_src and gpu_dst:
        return "direct"
    if not (gpu_src or gpu_dst):
        return "spine"
    return "nvswitch" if link.latency_us < 0.1 else "nic"


def cables(topo) -> dict[str, list[tuple[str, str]]]:
    """The fabric's cables (one direction each) by :func:`cable_kind`."""
    out: dict[str, list[tuple[str, str]]] = {}
    for link in topo.links:
        if link.src < link.dst or not topo.has_link(link.dst, link.src):
            out.setdefault(cable_kind(topo, link), []).append((link.src, link.dst))
    return out


def draw_scenario(rng: np.random.Generator, noise_seed: int) -> tuple[dict, list[str]]:
    """A ``mccl-scenario/1`` dictionary and the step kind behind each of its events."""
    label, topo = draw_fabric(rng)
    kinds = cables(topo)
    collective = str(rng.choice(["allgather", "alltoall"]))

    def pick() -> dict:
        kind = str(rng.choice(sorted(kinds)))
        src, dst = kinds[kind][int(rng.integers(len(kinds[kind])))]
        both = bool(rng.random() < 0.5) and topo.has_link(dst, src)
        return {"src": src, "dst": dst, "both_directions": both, "kind": kind,
                "nominal": topo.link(src, dst).capacity_gbps}

    def setting(cable: dict, share: float) -> dict:
        return {"src": cable["src"], "dst": cable["dst"], "both_directions": cable["both_directions"],
                "capacity_gbps": max(cable["nominal"] * share, 1e-3)}

    events: list[dict] = []
    tags: list[str] = []
    t = float(rng.uniform(15, 40))
    last: dict | None = None
    share = 1.0
    for i in range(int(rng.integers(1, 5))):
        step = str(rng.choice(STEPS)) if i else str(rng.choice(["drop", "pair", "ramp"]))
        if step == "further" and (last is None or share < 0.02):
            step = "drop"
        if step == "clear" and not events:
            step = "drop"
        if step == "clear":
            events.append({"t_ms": t, "clear": True})
            last, share = None, 1.0
        elif step == "pair":
            a, b = pick(), pick()
            while (b["src"], b["dst"]) in ((a["src"], a["dst"]), (a["dst"], a["src"])):
                b = pick()
            share = float(rng.uniform(0.01, 0.9))
            events.append({"t_ms": t, "links": [setting(a, float(rng.uniform(0.01, 0.9))), setting(b, share)]})
            step += f"-{a['kind']}-{b['kind']}"
            last = b
        elif step == "ramp":
            if last is None or rng.random() < 0.5:
                last, share = pick(), 1.0
            target = float(rng.uniform(0.01, 0.9)) * share
            n = int(rng.integers(2, 6))
            gap = float(rng.uniform(20, 120))
            for k in range(n):
                events.append({"t_ms": t + k * gap,
                               "links": [setting(last, share + (target - share) * (k + 1) / n)]})
                tags.append(f"ramp-{last['kind']}")
            t += (n - 1) * gap
            share = target
            t += float(rng.uniform(10, 300))
            continue
        else:
            if step == "drop":
                last = pick()
                share = float(rng.uniform(0.01, 0.9))
            else:
                share *= float(rng.uniform(0.05, 0.9))
            events.append({"t_ms": t, "links": [setting(last, share)]})
            step += f"-{last['kind']}{'' if last['both_directions'] else '-1way'}"
        tags.append(step)
        t += float(rng.uniform(10, 300))
    duration = events[-1]["t_ms"] + (250.0 if topo.num_gpus <= 16 else 400.0)
    data = {"format": "mccl-scenario/1", "topology": topo.to_dict(), "collective": collective,
            "message_bytes": message_bytes(collective, topo.num_gpus), "duration_ms": duration,
            "noise": float(rng.uniform(0, 0.05)), "seed": noise_seed, "events": events,
            "fuzz": {"fabric": label, "steps": tags}}
    return data, tags


def misses(out: dict, tags: list[str]) -> list[tuple[int, str]]:
    """(event, why) for every target this event misses (module docstring)."""
    s = out["summary"]
    found = []
    for i, ev in enumerate(s["events"]):
        end = s["events"][i + 1]["t_ms"] if i + 1 < len(s["events"]) else float("inf")
        why = []
        final = None if ev["algbw_final"] is None else ev["algbw_final"] / ev["algbw_offline"]
        if reach(ev) == "-" and ev.get("segment_ms", 0) >= NO_REACTION_MS and final is not None and final < 0.95:
            before = [r["algbw"] for r in out["rows"] if r["end_ms"] <= ev["t_ms"]]
            unaffected = bool(before) and ev["algbw_final"] >= 0.99 * before[-1]
            why.append(f"final {final:.3f} and no version finished in {ev['segment_ms']:.0f} ms"
                       + (" (the running version is as fast as before the event: not a loop miss)"
                          if unaffected else ""))
        if reach(ev) == "ok":
            if final is None or final < 0.95:
                why.append(f"final {final if final is None else round(final, 3)}")
            if ev["recovery_ratio"] is not None and ev["recovery_ratio"] < 0.95:
                why.append(f"ratio {ev['recovery_ratio'] if ev['recovery_ratio'] is None else round(ev['recovery_ratio'], 3)}")
        if len(ev["versions"]) > 2:
            why.append(f"{len(ev['versions'])} versions")
        stale = stale_versions(out["rows"], ev, end)
        if stale:
            why.append(f"{stale} stale")
        if why:
            found.append((i, ", ".join(why)))
    if s["false_swaps"]:
        found.append((-1, f"{s['false_swaps']} false swaps"))
    return found


def pct(values: list[float], q: float) -> str:
    return "-" if not values else f"{float(np.percentile(values, q)):.3f}"


def table(records: list[dict], key: str) -> None:
    """p50 / p5 / min of first-swap and final ratios per ``key`` over events the floor allows."""
    print(f"\n{key:<22} {'events':>6} {'reach':>5} {'ratio p50':>9} {'p5':>6} {'min':>6} "
          f"{'final p50':>9} {'p5':>6} {'min':>6} {'maxvers':>7} {'stale':>5} {'false':>5} {'miss':>4}")
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(r[key], []).append(r)
    for name in sorted(groups):
        rs = groups[name]
        ok = [r for r in rs if r["reach"] == "ok"]
        ratio = [r["ratio"] for r in ok if r["ratio"] is not None]
        final = [r["final"] for r in ok if r["final"] is not None]
        print(f"{name:<22} {len(rs):>6} {len(ok):>5} {pct(ratio, 50):>9} {pct(ratio, 5):>6} "
              f"{min(ratio, default=float('nan')):>6.3f} {pct(final, 50):>9} {pct(final, 5):>6} "
              f"{min(final, default=float('nan')):>6.3f} {max(r['vers'] for r in rs):>7} "
              f"{sum(r['stale'] for r in rs):>5} {sum(r['false'] for r in rs):>5} "
              f"{sum(1 for r in rs if r['miss']):>4}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--count", type=int, default=40, help="scenarios to draw")
    p.add_argument("--only", type=int, default=None, help="run only scenario number ONLY of this seed")
    p.add_argument("--out", default=None, help="folder for the scenario files (default: a temporary one)")
    p.add_argument("--synth-clock", choices=["wall", "cpu"], default="cpu")
    p.add_argument("--json", default=None, help="also write every event's record to this file")
    args = p.parse_args(argv)
    folder = Path(args.out or tempfile.mkdtemp(prefix="mccl-fuzz-loop-"))
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(args.seed)
    records: list[dict] = []
    all_misses: list[str] = []
    start = time.perf_counter()
    for n in range(args.count):
        data, tags = draw_scenario(rng, int(rng.integers(0, 2**31)))
        if args.only is not None and n != args.only:
            continue
        path = folder / f"fuzz{args.seed}-{n:03d}.json"
        path.write_text(json.dumps(data))
        label, coll = data["fuzz"]["fabric"], data["collective"]
        out = run_case(path, "fuzz", synth_clock=args.synth_clock)
        s = out["summary"]
        missed = dict(misses(out, tags))
        for i, ev in enumerate(s["events"]):
            end = s["events"][i + 1]["t_ms"] if i + 1 < len(s["events"]) else float("inf")
            final = None if ev["algbw_final"] is None else ev["algbw_final"] / ev["algbw_offline"]
            records.append({"scenario": n, "event": i, "fabric": label.rstrip("*"), "collective": coll,
                            "step": tags[i].split("-")[0], "tag": tags[i], "reach": reach(ev),
                            "ratio": ev["recovery_ratio"], "final": final, "vers": len(ev["versions"]),
                            "stale": stale_versions(out["rows"], ev, end), "false": 0, "miss": i in missed,
                            "detect": ev["detect_ms"], "floor": ev.get("floor_ms"), "seg": ev.get("segment_ms")})
        if records and s["false_swaps"]:
            records[-1]["false"] = s["false_swaps"]
        for i, why in sorted(missed.items()):
            tag = tags[i] if i >= 0 else "scenario"
            all_misses.append(f"  #{n} {label} {coll} noise {data['noise']:.3f} event {i} ({tag}): {why}")
        print(f"#{n:<3} {label:<12} {coll:<9} {len(tags)} events {out['wall_s']:5.1f} s  "
              f"{' '.join(tags)}{'  MISS' if missed else ''}", flush=True)
    print(f"\nseed {args.seed}: {len({r['scenario'] for r in records})} scenarios, {len(records)} events, "
          f"{time.perf_counter() - start:.0f} s wall")
    table(records, "step")
    table(records, "fabric")
    print(f"\nmisses ({len(all_misses)}):")
    print("\n".join(all_misses) or "  none")
    if args.json:
        Path(args.json).write_text(json.dumps(records, default=float))


if __name__ == "__main__":
    main()
