"""``mccl export mps|msccl|forestcoll|teccl|taccl``: a model, a schedule or a fabric in
another tool's format (the peers' formats: :mod:`.peers`).

``mccl export mps --model compact|master|switch-removal TOPO -o F [--lp]`` writes an
instance's model (see :mod:`mccl_opt.models`) as free MPS, and with ``--lp`` also as a
CPLEX LP file next to it, so any LP solver can be run on it.  When the topology is a
library instance (same name and content as the shipped file), the manifest's known
optimum is printed with the file.

``mccl export msccl SCHED -o algo.xml`` writes a schedule as MSCCL XML for
msccl-executor-nccl (:mod:`mccl_opt.lowering.msccl`) and replays it with the checker.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ._inputs import number_arg

MODEL_CHOICES = ("compact", "master", "switch-removal")


def register(sub: argparse._SubParsersAction) -> None:
    group = sub.add_parser("export", help="export schedules and models to other formats"
                           ).add_subparsers(dest="export_command", metavar="FORMAT")
    group.required = True
    _register_mps(group)
    _register_msccl(group)
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
               "nnz": info.nnz, "known_optimum": known_optimum(topo, args.model)}
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


def _export_msccl(args: argparse.Namespace) -> int:
    from ..lowering.msccl import check_msccl_xml, to_msccl_xml
    from ..schedule import Schedule
    from ..tables import print_json, print_table

    from ..errors import MCCLError, ScheduleError
    from ._guard import check_self_consistent, output_path, structure_problem

    from ._inputs import parse_bytes

    args.min_bytes = 0 if str(args.min_bytes).strip() == "0" else parse_bytes(args.min_bytes, "--min-bytes")
    args.max_bytes = parse_bytes(args.max_bytes, "--max-bytes")
    if args.min_bytes > args.max_bytes:
        raise MCCLError(f"need --min-bytes <= --max-bytes, got {args.min_bytes} and {args.max_bytes}")
    output_path(args.output, "-o")
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
    text = to_msccl_xml(sched, nchannels=args.channels, proto=args.proto,
                        min_bytes=args.min_bytes, max_bytes=args.max_bytes)
    report = check_msccl_xml(text)
    with open(args.output, "w") as fh:
        fh.write(text)
    info = {"output": args.output, "collective": report.collective, "ngpus": report.ngpus,
            "threadblocks": report.threadblocks, "steps": report.steps,
            "transfers": report.transfers, "checked": True}
    if args.json:
        print_json(info)
    else:
        print_table(list(info), [list(info.values())])
    return 0
