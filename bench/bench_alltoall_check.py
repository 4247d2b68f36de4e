"""AllToAll schedules at scale: validate, save and load, against another checkout.

    python bench/bench_alltoall_check.py                                  # 16, 64, 1024 GPUs
    python bench/bench_alltoall_check.py --shapes 1x8x8 --base /tmp/base   # paired with a base

For each HPN shape (Fail2 applied), one AllToAll schedule is synthesized once per
checkout with ``mccl_opt.solve_alltoall`` and pickled in ``--cache`` as that checkout
holds it in memory (chunk objects, or a path table whose objects are built when read;
a fresh synthesized table is made on first read, 0.3 s at 1024 GPUs, not timed here).
The solve is deterministic: both sides time the same schedule (a fingerprint -- chunk
count, hop count, share sum, rate -- is compared).  Each round then
times, in a fresh process per checkout, ``mccl_opt.validate`` of the schedule as
synthesized, ``share_loads``, ``Schedule.save`` (the default format), ``Schedule.load``
of that file, and ``validate`` of the loaded schedule.  ``--base`` names a checkout of
the code to compare with (its ``mccl_opt`` is imported through ``PYTHONPATH``); the
checkouts alternate within each of ``--repeat`` rounds so both see the same machine
load.  The table gives median wall seconds, CPU seconds in brackets.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEPS = ("validate", "share_loads", "save", "load", "validate_loaded")


def worker(shape: str, cache: Path, tag: str) -> dict:
    """One round in this process's checkout: the timings of :data:`STEPS` and the file
    size (the schedule solved and pickled on the first round)."""
    import pickle

    import mccl_opt as mo
    from mccl_opt.cli._inputs import load_topology
    from mccl_opt.schedule import share_loads

    topo = load_topology(f"hpn-{shape}-fail2")
    pkl = cache / f"{tag}-{shape}.pkl"
    if not pkl.exists():
        sched = mo.solve_alltoall(topo)
        sched.warm_state = None
        if hasattr(sched.chunks, "table"):          # array chunks: pickled as their table
            sched.chunks = type(sched.chunks)(sched.chunks.table)
        pkl.write_bytes(pickle.dumps(sched, protocol=pickle.HIGHEST_PROTOCOL))
    sched = pickle.loads(pkl.read_bytes())
    out: dict = {"fingerprint": [len(sched.chunks), sum(len(c.path) - 1 for c in sched.chunks),
                                 round(sum(c.share for c in sched.chunks), 6), sched.rate_gbps]}
    path = cache / f"{tag}-{shape}.json"
    loaded: list = []
    steps = {"validate": lambda: mo.validate(topo, sched),
             "share_loads": lambda: share_loads(topo, sched.chunks),
             "save": lambda: sched.save(path),
             "load": lambda: loaded.append(mo.Schedule.load(path)),
             "validate_loaded": lambda: mo.validate(topo, loaded[0])}
    for name in STEPS:
        wall, cpu = time.perf_counter(), time.process_time()
        steps[name]()
        out[name] = (time.perf_counter() - wall, time.process_time() - cpu)
    if loaded[0] != sched:
        raise SystemExit(f"{tag}: the schedule did not round-trip through {path}")
    out["mb"] = path.stat().st_size / 1e6
    out["format"] = json.loads(path.read_bytes())["format"]
    return out


def run(shapes: list[str], repeat: int, base: str | None, cache: Path) -> list[dict]:
    """Alternate the checkouts within each round; median per step."""
    sides = {"this": str(ROOT)} | ({"base": str(Path(base).resolve())} if base else {})
    rows = []
    for shape in shapes:
        got: dict[str, list[dict]] = {s: [] for s in sides}
        for round_ in range(repeat):
            order = list(sides.items())
            for side, root in order[::-1] if round_ % 2 else order:   # each side first in turn
                env = {**os.environ, "PYTHONPATH": root}
                proc = subprocess.run([sys.executable, __file__, "--worker", shape, "--cache", str(cache),
                                       "--tag", side], env=env, capture_output=True, text=True)
                if proc.returncode:
                    raise SystemExit(f"{side} on {shape} failed:\n{proc.stderr[-2000:]}")
                got[side].append(json.loads(proc.stdout.strip().splitlines()[-1]))
        prints = {s: r[0]["fingerprint"] for s, r in got.items()}
        if len({json.dumps(p) for p in prints.values()}) > 1:
            raise SystemExit(f"{shape}: the checkouts synthesized different schedules: {prints}")
        for side, runs in got.items():
            row = {"fabric": f"hpn-{shape}-fail2", "chunks": prints[side][0], "side": side,
                   "format": runs[0]["format"], "mb": runs[0]["mb"]}
            for name in STEPS:
                row[name] = [statistics.median(r[name][0] for r in runs),
                             statistics.median(r[name][1] for r in runs)]
            rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="1x2x8,1x8x8,8x16x8", help="HPN SxHxN shapes, comma-separated")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--base", help="a checkout of the code to compare with (e.g. a git worktree)")
    p.add_argument("--cache", help="folder for the pickled schedules and files (default: a temporary one)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--tag", default="this", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.worker, Path(args.cache), args.tag)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(args.cache or tmp)
        cache.mkdir(parents=True, exist_ok=True)
        load0 = os.getloadavg()[0]
        rows = run(args.shapes.split(","), args.repeat, args.base, cache)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"median of {args.repeat} alternating rounds; wall s (cpu s); load average "
          f"{load0:.1f} -> {os.getloadavg()[0]:.1f}")
    cols = ["fabric", "chunks", "side", "format", "mb", *STEPS]
    print("  ".join(f"{c:>16}" for c in cols))
    for r in rows:
        cells = [f"{v[0]:.3f} ({v[1]:.2f})" if isinstance(v, list) else f"{v:.1f}" if isinstance(v, float)
                 else str(v) for v in (r[c] for c in cols)]
        print("  ".join(f"{c:>16}" for c in cells))
    return 0


def test_alltoall_check_bench_smoke(tmp_path):
    """The benchmark runs end to end on a tiny fabric against its own checkout (no
    timing checked)."""
    rows = run(["1x2x2"], 1, str(ROOT), tmp_path)
    assert [r["side"] for r in rows] == ["this", "base"] and all(r["load"][0] >= 0 for r in rows)


if __name__ == "__main__":
    sys.exit(main())
