"""``mccl export msccl SCHED -o algo.xml``: MSCCL XML for msccl-executor-nccl.

``export`` is a subcommand group shared with other exporters (``mccl export mps``);
:func:`mccl_opt.cli.export.export_group` creates it or returns the existing one.
"""

from __future__ import annotations

import argparse

from mccl_opt.cli.export import export_group


def register(sub: argparse._SubParsersAction) -> None:
    p = export_group(sub).add_parser(
        "msccl", help="write a schedule as MSCCL XML (load it with MSCCL_ALGO_DIR)")
    p.add_argument("schedule", help="mccl-schedule/1 file (alltoall or allgather)")
    p.add_argument("-o", "--output", required=True, help="XML file to write")
    p.add_argument("--channels", type=int, default=1, help="channels to spread transfers over")
    p.add_argument("--proto", default="Simple", choices=["Simple", "LL", "LL128"])
    p.add_argument("--min-bytes", type=int, default=0, help="smallest buffer MSCCL uses it for")
    p.add_argument("--max-bytes", type=int, default=1 << 40, help="largest buffer MSCCL uses it for")
    p.add_argument("--json", action="store_true", help="print the checker's summary as JSON")
    p.set_defaults(handler=_export_msccl)


def _export_msccl(args: argparse.Namespace) -> int:
    from mccl_opt.cli._table import print_json, print_table
    from mccl_opt.schedule import Schedule

    from .msccl import check_msccl_xml, to_msccl_xml

    sched = Schedule.load(args.schedule)
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
