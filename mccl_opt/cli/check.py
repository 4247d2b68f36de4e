"""``mccl check TOPO SCHED [--strict]``: validate a schedule against a topology.

A schedule is *valid* on a fabric when it is structurally sound there (its GPUs are the
fabric's ranks, every block is delivered, every hop is a link, trees span, shares sum
to one: :func:`mccl_opt.validate`).  The rate it reaches is recomputed on the fabric's
capacities; a schedule synthesized before a capacity change stays valid and is reported
with the rate it runs at here.  ``--strict`` also requires that rate to be the one the
file states (what :func:`mccl_opt.validate` checks), exiting 2 otherwise.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from ..tables import print_json, print_table

#: relative difference between the recomputed and the stated rate that counts as equal
RATE_TOL = 1e-6


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="validate a schedule file against a topology file")
    p.add_argument("topology", help="topology: a mccl-topology/1 file, a library name (hpn-1x2x8-fail2, dgx-8) or hpn-SxHxN[-failK]")
    p.add_argument("schedule")
    p.add_argument("--strict", action="store_true",
                   help="also fail (exit 2) when the schedule runs at another rate than it states")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=_check)


def gpu_mismatch(topo, sched) -> str | None:
    """Why ``sched``'s GPUs are not ``topo``'s ranks (count first, then the first rank
    that differs), or ``None``."""
    mine, theirs = list(sched.gpus), list(topo.gpus)
    if len(mine) != len(theirs):
        return (f"schedule has {len(mine)} GPUs, topology {topo.name!r} has {len(theirs)}; "
                f"was it synthesized for another topology?")
    for rank, (a, b) in enumerate(zip(mine, theirs)):
        if a != b:
            return (f"schedule rank {rank} is GPU {a!r}, topology {topo.name!r} rank {rank} is {b!r}; "
                    f"was it synthesized for another topology?")
    return None


def _check(args: argparse.Namespace) -> int:
    from ..errors import ScheduleError
    from ..schedule import Schedule, schedule_rate, share_loads
    from ..validate import validate
    from ._inputs import load_topology

    topo = load_topology(args.topology)
    sched = Schedule.load(args.schedule)
    problem = gpu_mismatch(topo, sched)
    if problem:
        raise ScheduleError(problem)
    if sched.rate_gbps > sched.lp_rate_gbps * (1 + 10 * RATE_TOL) + 1e-9:
        raise ScheduleError(f"{args.schedule}: rate_gbps {sched.rate_gbps:.9g} exceeds its own "
                            f"lp_rate_gbps {sched.lp_rate_gbps:.9g}")
    if args.strict:
        report = validate(topo, sched)
    else:                                   # every check but the stated rate
        rate = schedule_rate(topo, share_loads(topo, sched.chunks))
        report = validate(topo, replace(sched, rate_gbps=rate, lp_rate_gbps=max(rate, sched.lp_rate_gbps)))
    same = abs(report.rate_gbps - sched.rate_gbps) <= RATE_TOL * max(sched.rate_gbps, 1e-12)
    info = {"valid": True, "collective": sched.collective, "chunks": report.num_chunks,
            "rate_gbps": report.rate_gbps, "schedule_rate_gbps": sched.rate_gbps,
            "rate_as_stated": same, "lp_rate_gbps": sched.lp_rate_gbps,
            "rounding_gap": sched.rounding_gap, "max_steps": report.max_steps,
            "max_link_utilisation": report.max_utilisation}
    if args.json:
        print_json(info)
        return 0
    if same:
        print(f"OK: {args.schedule} is a valid {sched.collective} schedule for {topo.name}")
    else:
        print(f"OK: {args.schedule} is a valid {sched.collective} schedule for {topo.name}; "
              f"runs at {report.rate_gbps:.4g} Gbps on this fabric (schedule says {sched.rate_gbps:.4g}; "
              f"re-synthesize for this fabric, or pass --strict to make this an error)")
    print_table(list(info)[1:], [list(info.values())[1:]])
    return 0
