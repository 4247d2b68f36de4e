"""Capacities a hair below a tree unit (docs/runtime.md): the AllGather the loop's
synthesizer builds for a NIC measured near its true value, simulated on the true fabric,
over the schedule built on the true value.

    python bench/bench_unit_tolerance.py                       # irregular 7, h1g2 - spine at 50
    python bench/bench_unit_tolerance.py --seed 7 --true 50 --measured 49.5,49.9,50.1

``before`` is ``solver_synthesizer(unit_tolerance=None)``, ``after`` the default; each
column is ``simulated time of the true schedule / of the measured one`` (1.0: as fast as
the offline schedule) with the schedule's chunk count.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> None:
    from instances import irregular
    from mccl_opt.sim import simulate
    from mccl_runtime.synthesizer import solver_synthesizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=7, help="irregular fabric seed")
    ap.add_argument("--cable", default="h1g2,spine", help="the GPU-spine cable, both directions")
    ap.add_argument("--true", type=float, default=50.0, help="its true capacity (Gbps)")
    ap.add_argument("--measured", default="49.5,49.75,49.9,49.943,49.99,50.1,50.25")
    ap.add_argument("--mib", type=float, default=16.0, help="MiB per GPU")
    args = ap.parse_args(argv)
    a, b = args.cable.split(",")
    cable = {(a, b), (b, a)}
    base = irregular(args.seed)

    def at(gbps: float):
        return base.with_capacities([gbps if (l.src, l.dst) in cable else l.capacity_gbps for l in base.links])

    true, size = at(args.true), args.mib * 2**20
    for name, synth in (("before", solver_synthesizer(unit_tolerance=None)), ("after", solver_synthesizer())):
        offline = simulate(true, synth("allgather", true, None, None), size).completion_s
        cols = []
        for v in (float(x) for x in args.measured.split(",")):
            sched = synth("allgather", at(v), None, None)
            cols.append(f"{v:g}: {offline / simulate(true, sched, size).completion_s:.3f} ({len(sched.chunks)})")
        print(f"{name:<7} " + "  ".join(cols), flush=True)


if __name__ == "__main__":
    main()
