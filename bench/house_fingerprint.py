"""What a refactoring must not change: solve fingerprints and the cross-file walk.

``python bench/house_fingerprint.py -o before.json`` solves a fixed set of fabrics cold
with both synthesizers and records each schedule's rate and a hash of its chunks (trees
or paths, in a canonical order); ``--compare before.json`` solves them again and lists
every case whose rate or chunks differ.  ``--walk`` counts the calls that cross from one
module of the packages into another during one unbalanced 16-GPU AllGather solve and one
balanced one (docs/architecture.md "Two walks"), the measure a restructuring of the
AllGather package is judged by.  Cold solves only: a warm start's use depends on wall
time (docs/allgather.md), its trees may legitimately differ between two runs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Callable

import instances as ins
from mccl_opt import Schedule, Topology, solve_allgather, solve_alltoall

PACKAGES = ("mccl_opt", "formulations", "instances", "mccl_runtime", "executor_cuda")


def _one_way(topo: Topology, gbps: float) -> Topology:
    """The first GPU's NIC link degraded in its sending direction only."""
    gpu = topo.gpus[0]
    nic = next(link for link in topo.links
               if link.src == gpu and topo.node(link.dst).kind == "switch" and "nvs" not in link.dst)
    return topo.with_capacity(src=nic.src, dst=nic.dst, gbps=gbps, both_directions=False)


def cases() -> dict[str, Callable[[], Topology]]:
    """The fabrics fingerprinted: healthy, Fail1-3, one-way and irregular states."""
    return {
        "hpn-1x2x8": lambda: ins.hpn(1, 2, 8),
        "hpn-1x2x8-fail1": lambda: ins.fail1(ins.hpn(1, 2, 8)),
        "hpn-1x2x8-fail2": lambda: ins.fail2(ins.hpn(1, 2, 8)),
        "hpn-1x2x8-fail3": lambda: ins.fail3(ins.hpn(1, 2, 8)),
        "hpn-2x4x8-fail2": lambda: ins.fail2(ins.hpn(2, 4, 8)),
        "hpn-1x2x8-oneway": lambda: _one_way(ins.hpn(1, 2, 8), 123.4),
        "shared-agg-2x2x8-oneway": lambda: _one_way(ins.shared_aggregation(2, 2, 8), 200.0),
        "leaf-spine-2x2x4": lambda: ins.leaf_spine(2, 2, 4),
        "irregular-3": lambda: ins.irregular(3),
        "irregular-7": lambda: ins.irregular(7),
    }


def _digest(sched: Schedule) -> str:
    """A hash of the schedule's chunks in a canonical order (trees or paths)."""
    rows = sorted(json.dumps(chunk.to_dict(), sort_keys=True) for chunk in sched.chunks)
    return hashlib.sha256("\n".join(rows).encode()).hexdigest()[:16]


def fingerprint() -> dict[str, dict[str, object]]:
    """Every case solved cold by both synthesizers, at K=10 and (AllGather) exactly."""
    out: dict[str, dict[str, object]] = {}
    for name, build in cases().items():
        topo = build()
        solves = {"allgather-k10": lambda t: solve_allgather(t),
                  "allgather-exact": lambda t: solve_allgather(t, max_chunks=None),
                  "alltoall-k10": lambda t: solve_alltoall(t)}
        for kind, solve in solves.items():
            sched = solve(topo)
            out[f"{name}/{kind}"] = {"rate_gbps": round(sched.rate_gbps, 9),
                                     "chunks": len(sched.chunks), "digest": _digest(sched)}
    return out


def compare(before: dict[str, dict[str, object]], after: dict[str, dict[str, object]]) -> list[str]:
    """Cases whose rate, chunk count or chunk digest differ (or that are missing)."""
    return [f"{key}: {before.get(key)} -> {after.get(key)}"
            for key in sorted(set(before) | set(after)) if before.get(key) != after.get(key)]


def _module(filename: str) -> str | None:
    """The dotted module of a file inside the packages, else None."""
    parts = Path(filename).with_suffix("").parts
    for i, part in enumerate(parts):
        if part in PACKAGES:
            return ".".join(parts[i:])
    return None


def crossings_of(run: Callable[[], object]) -> Counter[str]:
    """Calls between two different modules of the packages while ``run()`` runs, in
    every thread (:func:`sys.setprofile`; Python calls only, compiled kernels are leaves)."""
    crossings: Counter[str] = Counter()

    def profile(frame, event, _arg):  # type: ignore[no-untyped-def]
        if event != "call" or frame.f_back is None:
            return
        callee = _module(frame.f_code.co_filename)
        caller = _module(frame.f_back.f_code.co_filename)
        if callee and caller and callee != caller:
            crossings[f"{caller} -> {callee}"] += 1

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)      # type: ignore[arg-type]
    return crossings


def walk(topo: Topology) -> Counter[str]:
    """The crossings of one cold AllGather on ``topo`` (kernels loaded beforehand)."""
    solve_allgather(topo)
    return crossings_of(lambda: solve_allgather(topo))


def telemetry_walk() -> Counter[str]:
    """The crossings from one telemetry batch (a NIC cable of HPN 1x2x8 at 50 Gbps) to
    the published AllGather version: the store's ingest, the manager's step (Algorithm
    1, the job started) and its poll (the re-check, the version published)."""
    from mccl_runtime.manager import Policy, ScheduleManager
    from mccl_runtime.synthesizer import solver_synthesizer
    from mccl_runtime.telemetry import MeasurementStore

    topo = ins.hpn(1, 2, 8)
    store = MeasurementStore(topo, alpha=1.0)
    manager = ScheduleManager(store, solver_synthesizer(), Policy(gamma=0.1, min_dwell_s=0.0))
    manager.register("world", "ag", "allgather", solve_allgather(topo))
    solve_allgather(ins.fail2(topo))                    # kernels loaded: count the walk only
    batch = [{"kind": "link", "src": a, "dst": b, "gbps": 50.0, "t": 1.0}
             for a, b in (("s0h0g0", "s0tor0"), ("s0tor0", "s0h0g0"))]
    events: list = []

    def react() -> None:
        store.ingest(batch, now=1.0)
        events.extend(manager.step(1.0))
        events.extend(manager.poll(1.0, wait_s=30.0))

    try:
        crossings = crossings_of(react)
    finally:
        manager.close()
    if not any(e.to_dict()["action"] == "published" for e in events):
        raise SystemExit(f"the telemetry walk published nothing: {events}")
    return crossings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--out", type=Path, help="write the fingerprints to this JSON file")
    parser.add_argument("--compare", type=Path, help="fingerprints to compare against")
    parser.add_argument("--walk", action="store_true", help="count cross-module calls instead")
    args = parser.parse_args(argv)
    if args.walk:
        walks = {"unbalanced shared-agg 2x1x8": _one_way(ins.shared_aggregation(2, 1, 8), 123.4),
                 "unbalanced hpn-1x2x8": _one_way(ins.hpn(1, 2, 8), 123.4),
                 "balanced hpn-1x2x8 fail2": ins.fail2(ins.hpn(1, 2, 8))}
        counted = {name: walk(topo) for name, topo in walks.items()}
        counted["telemetry batch -> version"] = telemetry_walk()
        print(f"{'walk':32s} {'cross-module calls':>18s} {'module pairs':>12s}")
        for name, crossings in counted.items():
            print(f"{name:32s} {sum(crossings.values()):18d} {len(crossings):12d}")
        return 0
    prints = fingerprint()
    for key, row in prints.items():
        print(f"{key:42s} {row['rate_gbps']:12.4f} {row['chunks']:6d} {row['digest']}")
    if args.out:
        args.out.write_text(json.dumps(prints, indent=1, sort_keys=True))
    if args.compare:
        diffs = compare(json.loads(args.compare.read_text()), prints)
        print(f"{len(diffs)} of {len(prints)} cases differ")
        for line in diffs:
            print("  " + line)
        return 1 if diffs else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
