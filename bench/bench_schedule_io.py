"""Schedule files and the controller's schedule messages: size and time per format.

    python bench/bench_schedule_io.py                         # HPN 1x8x8 and 2x32x8 AllGather
    python bench/bench_schedule_io.py --shapes 1x2x8 --collective alltoall --repeat 5

For each fabric, one schedule is synthesized, then written and read back in each way:

* ``v1-indented``: ``mccl-schedule/1`` with one-space indentation (the earlier writer);
* ``v1``: ``mccl-schedule/1``, compact JSON;
* ``v2``: the compact format, compact JSON — the default: ``mccl-schedule/2`` (paths and
  trees stored once) for AllGather, ``mccl-schedule/3`` (chunk columns) for AllToAll;
* ``v2.gz``: the same, gzip-compressed (``-o s.json.gz``).

``save``/``load`` are :meth:`Schedule.save` / :meth:`Schedule.load` (``v1-indented`` is
written with ``json.dumps(indent=1)``, read with ``Schedule.load``).  ``wire`` is what the
controller's dispatch costs: ``protocol.encode`` of a ``schedule`` reply carrying
``to_dict()``, then ``protocol.decode`` and ``Schedule.from_dict`` (unsigned; ``wire+key``
signed with a shared key, which serialises the body twice).  The ways alternate within
each of ``--repeat`` rounds so all see the same machine load; the table gives medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WAYS = ("v1-indented", "v1", "v2", "v2.gz")


def _timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure(sched, folder: Path, repeat: int) -> list[dict]:
    """Median save / load / wire seconds and file size of each way (:data:`WAYS`)."""
    from mccl_opt import Schedule
    from mccl_runtime.protocol import decode, encode

    key = b"k" * 32
    times: dict[str, dict[str, list[float]]] = {w: {"save": [], "load": [], "wire": [], "wire+key": []}
                                                for w in WAYS}
    paths = {w: folder / ("s.json.gz" if w == "v2.gz" else f"s-{w}.json") for w in WAYS}

    def save(way: str) -> None:
        if way == "v1-indented":
            paths[way].write_text(json.dumps(sched.to_dict(compact=False), indent=1) + "\n")
        else:
            sched.save(paths[way], compact=way != "v1")

    def wire(compact: bool, k: bytes | None) -> None:
        raw = encode("schedule", {"version": 1, "schedule": sched.to_dict(compact)}, k)
        Schedule.from_dict(decode(raw, k).body["schedule"])

    for _ in range(repeat):
        for way in WAYS:
            t = times[way]
            t["save"].append(_timed(lambda: save(way)))
            loaded: list = []
            t["load"].append(_timed(lambda: loaded.append(Schedule.load(paths[way]))))
            assert loaded[0] == sched, f"{way} did not round-trip"
            if way in ("v1", "v2"):
                t["wire"].append(_timed(lambda: wire(way == "v2", None)))
                t["wire+key"].append(_timed(lambda: wire(way == "v2", key)))
    rows = []
    for way in WAYS:
        t = times[way]
        med = {k: statistics.median(v) if v else None for k, v in t.items()}
        rows.append({"way": way, "mb": paths[way].stat().st_size / 1e6, **{f"{k}_s": v for k, v in med.items()}})
    return rows


def run(shapes: list[str], collective: str, repeat: int) -> list[dict]:
    import mccl_opt as mo
    from instances import hpn

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for shape in shapes:
            s, h, n = (int(x) for x in shape.split("x"))
            topo = hpn(s, h, n)
            solve = mo.solve_alltoall if collective == "alltoall" else mo.solve_allgather
            sched = solve(topo)
            edges = sum(len(c.edges) if hasattr(c, "edges") else 1 for c in sched.chunks)
            for row in measure(sched, Path(tmp), repeat):
                out.append({"fabric": f"hpn-{shape}", "gpus": topo.num_gpus, "chunks": len(sched.chunks),
                            "hops": edges, **row})
    return out


def _fmt(v: object) -> str:
    return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", default="1x8x8,2x32x8", help="HPN SxHxN shapes, comma-separated")
    p.add_argument("--collective", choices=("allgather", "alltoall"), default="allgather")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = p.parse_args(argv)
    rows = run(args.shapes.split(","), args.collective, args.repeat)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    cols = list(rows[0])
    print("  ".join(f"{c:>11}" for c in cols))
    for r in rows:
        print("  ".join(f"{_fmt(r[c]):>11}" for c in cols))
    return 0


def test_schedule_io_bench_smoke():
    """The benchmark runs end to end on a tiny fabric (no timing checked)."""
    rows = run(["1x2x2"], "allgather", 1)
    assert [r["way"] for r in rows] == list(WAYS) and all(r["load_s"] is not None for r in rows)


if __name__ == "__main__":
    sys.exit(main())
