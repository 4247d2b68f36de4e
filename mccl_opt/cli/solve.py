"""``mccl solve alltoall|allgather TOPO -o SCHED [--warm OLD]``."""

from __future__ import annotations

import argparse
import sys
import time

from ..tables import print_json, print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("solve", help="synthesize a schedule for a topology file")
    ssub = p.add_subparsers(dest="collective", metavar="COLLECTIVE")
    ssub.required = True
    for name, help_text in (("alltoall", "AllToAll by column generation (paper §4.2)"),
                            ("allgather", "AllGather by ForestColl tree packing (paper §4.3)")):
        s = ssub.add_parser(name, help=help_text)
        s.add_argument("topology", help="mccl-topology/1 file")
        s.add_argument("-o", "--output", help="write the mccl-schedule/1 file here")
        s.add_argument("--warm", help="previous schedule to warm-start from")
        s.add_argument("--backend", default="highs", help="LP/MIP backend: highs (default), gurobi, scip")
        s.add_argument("--max-chunks", type=_chunks, default=10,
                       help="chunk budget K (default 10; 'none' for the exact fractional optimum)")
        if name == "alltoall":
            s.add_argument("--max-steps", default=None,
                           help="step bound m_s: an integer, or 'min' for the smallest lossless one")
            s.add_argument("--time-limit", type=float, default=None, help="seconds; returns the best so far")
        else:
            s.add_argument("--step-aware", action="store_true",
                           help="step-aware switch removal: shallower trees (paper App. C)")
        s.add_argument("--json", action="store_true", help="print the result summary as JSON")
        s.set_defaults(handler=_solve)


def _chunks(text: str) -> int | None:
    if text.lower() == "none":
        return None
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("--max-chunks must be >= 1 or 'none'")
    return value


def _max_steps(text: str | None) -> int | str | None:
    if text is None or text == "min":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("--max-steps must be an integer or 'min'") from None


def summary(schedule, seconds: float) -> dict:
    return {"collective": schedule.collective, "topology": schedule.topology,
            "gpus": schedule.num_gpus, "chunks": len(schedule.chunks),
            "rate_gbps": schedule.rate_gbps, "lp_rate_gbps": schedule.lp_rate_gbps,
            "rounding_gap": schedule.rounding_gap, "bottleneck_links": len(schedule.bottleneck),
            "seconds": seconds}


def _solve(args: argparse.Namespace) -> int:
    import mccl_opt as mo

    topo = mo.Topology.load(args.topology)
    warm = mo.Schedule.load(args.warm) if args.warm else None
    start = time.perf_counter()
    if args.collective == "alltoall":
        sched = mo.solve_alltoall(topo, warm=warm, backend=args.backend,
                                  max_chunks=args.max_chunks,
                                  max_steps=_max_steps(args.max_steps), time_limit=args.time_limit)
    else:
        from mccl_opt.allgather import restore_warm_state

        if warm is not None:            # the trees' warm state, rebuilt outside the timing
            warm = restore_warm_state(warm, topo)
            start = time.perf_counter()
        sched = mo.solve_allgather(topo, warm=warm, backend=args.backend,
                                   max_chunks=args.max_chunks, step_aware=args.step_aware)
    seconds = time.perf_counter() - start
    mo.validate(topo, sched)
    if args.output:
        sched.save(args.output)
    info = summary(sched, seconds)
    if args.json:
        print_json(info)
    else:
        print_table(list(info), [list(info.values())])
        if args.output:
            print(f"wrote {args.output}", file=sys.stderr)
    return 0
