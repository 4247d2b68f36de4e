"""``mccl check TOPO SCHED``: validate a schedule against a topology."""

from __future__ import annotations

import argparse

from ..tables import print_json, print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="validate a schedule file against a topology file")
    p.add_argument("topology")
    p.add_argument("schedule")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=_check)


def _check(args: argparse.Namespace) -> int:
    from ..schedule import Schedule
    from ..topology import Topology
    from ..validate import validate

    topo = Topology.load(args.topology)
    sched = Schedule.load(args.schedule)
    report = validate(topo, sched)
    info = {"valid": True, "collective": sched.collective, "chunks": report.num_chunks,
            "rate_gbps": report.rate_gbps, "lp_rate_gbps": sched.lp_rate_gbps,
            "rounding_gap": sched.rounding_gap, "max_steps": report.max_steps,
            "max_link_utilisation": report.max_utilisation}
    if args.json:
        print_json(info)
    else:
        print(f"OK: {args.schedule} is a valid {sched.collective} schedule for {topo.name}")
        print_table(list(info)[1:], [list(info.values())[1:]])
    return 0
