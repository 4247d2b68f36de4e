"""``mccl export mps|msccl|forestcoll|teccl|taccl``: a model, a schedule or a fabric in
another tool's format (the peers' formats: :mod:`.peers`).

``mccl export mps --model compact|master|switch-removal TOPO -o F [--lp]`` writes an
instance's model (see :mod:`mccl_opt.models`) as free MPS, and with ``--lp`` also as a
CPLEX LP file next to it, so any LP solver can be run on it.  When the topology is a
library instance (same name and content as the shipped file), the manifest's known
optimum is printed with the file.

``mccl export msccl SCHED -o algo.xml`` writes a schedule as MSCCL XML for
msccl-executor-nccl (:mod:`mccl_opt.lowering.msccl`) and replays it with the checker.
``mccl export mscclpp SCHED -o plan.json`` writes it as an MSCCL++ execution plan
(:mod:`mccl_opt.lowering.mscclpp`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..files import write_output
from ._inputs import MAX_COUNT, number_arg

MODEL_CHOICES = ("compact", "master", "switch-removal")


def register(sub: argparse._SubParsersAction) -> None:
    group = sub.add_parser("export", help="export schedules and models to other formats"
                           ).add_subparsers(dest="export_command", metavar="FORMAT")
    group.required = True
    _register_mps(group)
    _register_msccl(group)
    _register_mscclpp(group)
    from .peers import register_exports

    register_exports(group)


def _register_mps(group: argparse._SubParsersAction) -> None:
    p = group.add_parser(
        "mps", help="write an instance's LP model as MPS (and LP) for any solver")
    p.add_argument("topology", help="topology: a mccl-topology/1 file, a library name (hpn-1x2x8-fail2, dgx-8) or hpn-SxHxN[-failK]")
    p.add_argument("--model", choices=MODEL_CHOICES, default="compact",
                   help="compact: AllToAll arc-flow LP (max z); master: column-generation "
                        "master over its final columns (min 1/z); switch-removal: App. C model")
    p.add_argument("--commodities", choices=["source", "pair"], default="source",
                   help="compact model: one commodity per source (default) or per ordered pair")
    p.add_argument("-o", "--output", required=True, help="MPS file to write")
    p.add_argument("--lp", action="store_true", help="also write a CPLEX LP file (OUTPUT with .lp)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(handler=_export_mps)


def known_optimum(topo, model: str) -> float | None:
    """The manifest's optimum of ``model`` if ``topo`` is a library instance, else None."""
    from instances.library import MANIFEST, instance, load_manifest
    from mccl_opt.errors import MCCLError

    if not MANIFEST.exists():
        return None
    try:
        inst = instance(topo.name)
    except MCCLError:
        return None
    if not inst.path.exists() or inst.load().to_dict() != topo.to_dict():
        return None
    rec = load_manifest()["instances"].get(topo.name)
    return None if rec is None or model not in rec["models"] else rec["models"][model]["optimum"]


def _export_mps(args: argparse.Namespace) -> int:
    from formulations.export import write_lp, write_mps
    from mccl_opt.models import build_model

    from ..tables import print_json, print_table
    from ._guard import output_path

    output_path(args.output, "-o")
    from ._inputs import load_topology

    topo = load_topology(args.topology)
    lp, info = build_model(topo, args.model, commodities=args.commodities)
    files = [str(write_mps(lp, args.output))]
    if args.lp:
        files.append(str(write_lp(lp, Path(args.output).with_suffix(".lp"))))
    summary = {"files": files, "model": info.model, "topology": topo.name, "sense": info.sense,
               "objective": info.objective, "cols": info.num_cols, "rows": info.num_rows,
               "nnz": info.nnz,     # switch-removal: the optimum of this very LP (its loop's)
               "known_optimum": info.optimum if info.optimum is not None else known_optimum(topo, args.model)}
    if args.json:
        print_json(summary)
    else:
        print_table(list(summary), [[", ".join(files), *list(summary.values())[1:]]])
    return 0


def _register_msccl(group: argparse._SubParsersAction) -> None:
    p = group.add_parser("msccl", help="write a schedule as MSCCL XML (load it with MSCCL_ALGO_DIR)")
    p.add_argument("schedule", help="mccl-schedule/1 file (alltoall or allgather)")
    p.add_argument("-o", "--output", required=True, help="XML file to write")
    p.add_argument("--channels", type=number_arg(int, 1, high=32, expected="an integer in [1, 32]"), default=1, help="channels to spread transfers over")
    p.add_argument("--proto", default="Simple", choices=["Simple", "LL", "LL128"],
                   help="NCCL protocol the algorithm is registered for")
    p.add_argument("--min-bytes", default="0",
                   help="smallest buffer MSCCL uses it for (bytes; K/M/G suffixes, e.g. 64K)")
    p.add_argument("--max-bytes", default="1T",
                   help="largest buffer MSCCL uses it for (bytes; K/M/G/T suffixes, default 1T)")
    p.add_argument("--topology", help="mccl-topology/1 file: check the schedule against it first "
                                      "(without it, the schedule is checked on its own paths)")
    p.add_argument("--json", action="store_true", help="print the checker's summary as JSON")
    p.set_defaults(handler=_export_msccl)


def _register_mscclpp(group: argparse._SubParsersAction) -> None:
    p = group.add_parser("mscclpp", help="write a schedule as an MSCCL++ execution plan (JSON)")
    p.add_argument("schedule", help="mccl-schedule file (alltoall or allgather)")
    p.add_argument("-o", "--output", required=True, help="plan JSON file to write")
    p.add_argument("--channel-type", default="port", choices=["port", "memory"],
                   help="channel of every GPU pair: port (proxy: IB across nodes, IPC inside) or memory "
                        "(CUDA IPC, one node) (default %(default)s)")
    p.add_argument("--gpus-per-node", type=number_arg(int, 1, high=MAX_COUNT, expected="an integer in [1, 2^20]"),
                   help="ranks per node: pairs inside a node use memory channels, the others "
                        "--channel-type (default: --channel-type for every pair)")
    p.add_argument("--threads", type=number_arg(int, 32, high=1024, expected="an integer in [32, 1024]"),
                   default=1024, help="num_threads_per_block (default %(default)s)")
    p.add_argument("--min-bytes", default="0", help="smallest message the plan is selected for (default 0)")
    p.add_argument("--max-bytes", default="1T", help="largest message (bytes; K/M/G/T suffixes, default 1T)")
    p.add_argument("--topology", help="mccl-topology/1 file: check the schedule against it first "
                                      "(without it, the schedule is checked on its own paths)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(handler=_export_mscclpp)


def _checked_schedule(args: argparse.Namespace):
    """The schedule of ``args.schedule``, checked against ``--topology`` or on its own."""
    from ..errors import ScheduleError
    from ..schedule import Schedule
    from ._guard import check_self_consistent, structure_problem

    sched = Schedule.load(args.schedule)
    if args.topology:
        from ._inputs import load_topology

        problem = structure_problem(load_topology(args.topology), sched)
        if problem is not None:
            raise ScheduleError(f"{args.schedule}: {problem}")
    else:
        try:
            check_self_consistent(sched)
        except ScheduleError as exc:
            raise ScheduleError(f"{args.schedule}: {exc}") from None
    return sched


def _byte_range(args: argparse.Namespace) -> tuple[int, int]:
    from ..errors import MCCLError
    from ._inputs import parse_bytes

    low = 0 if str(args.min_bytes).strip() == "0" else parse_bytes(args.min_bytes, "--min-bytes")
    high = parse_bytes(args.max_bytes, "--max-bytes")
    if low > high:
        raise MCCLError(f"need --min-bytes <= --max-bytes, got {low} and {high}")
    return low, high


def _export_mscclpp(args: argparse.Namespace) -> int:
    import json

    from ..lowering.mscclpp import to_mscclpp_plan
    from ..tables import print_json, print_table
    from ._guard import output_path

    low, high = _byte_range(args)
    output_path(args.output, "-o")
    sched = _checked_schedule(args)
    plan = to_mscclpp_plan(sched, channel_type=args.channel_type, gpus_per_node=args.gpus_per_node,
                           threads_per_block=args.threads, min_bytes=low, max_bytes=high)
    write_output(args.output, json.dumps(plan, indent=1) + "\n")
    ops = [op["name"] for g in plan["gpus"] for tb in g["threadblocks"] for op in tb["ops"]]
    info = {"output": args.output, "collective": plan["collective"], "ngpus": len(plan["gpus"]),
            "chunks_per_block": plan["gpus"][0]["output_chunks"] // len(plan["gpus"]),
            "threadblocks": max(len(g["threadblocks"]) for g in plan["gpus"]),
            "puts": ops.count("put"), "signals": ops.count("signal"), "waits": ops.count("wait")}
    if args.json:
        print_json(info)
    else:
        print_table(list(info), [list(info.values())])
    return 0


def _export_msccl(args: argparse.Namespace) -> int:
    from ..lowering.msccl import check_msccl_xml, to_msccl_xml
    from ..tables import print_json, print_table
    from ._guard import output_path

    args.min_bytes, args.max_bytes = _byte_range(args)
    output_path(args.output, "-o")
    sched = _checked_schedule(args)
    text = to_msccl_xml(sched, nchannels=args.channels, proto=args.proto,
                        min_bytes=args.min_bytes, max_bytes=args.max_bytes)
    report = check_msccl_xml(text)
    write_output(args.output, text)
    info = {"output": args.output, "collective": report.collective, "ngpus": report.ngpus,
            "threadblocks": report.threadblocks, "steps": report.steps,
            "transfers": report.transfers, "checked": True}
    if args.json:
        print_json(info)
    else:
        print_table(list(info), [list(info.values())])
    return 0
