"""``mccl bench``: benchmark the synthesizers and LP models over fabric sizes
(docs/benchmarks.md).

``--suite alltoall|allgather|all`` runs the cases of :mod:`instances.benchmarks.registry`
— one untimed warm-up run per case, then ``--repeat`` timed rounds with cold and warm
runs alternating (:mod:`instances.benchmarks.repeat`) — with progress on stderr, and
prints one table per failure (median phase times, spread, ratio and gap to the
reference) with its notes below; ``--json`` prints the ``mccl-bench/2`` document
instead, ``--out FILE`` writes it, ``--png FILE`` plots time against GPU count.
``--suite lp`` runs the exported LP models on each backend
(:mod:`instances.benchmarks.lp_suite`, which adds its own options).
"""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import MCCLError
from ..files import write_output
from ._inputs import MAX_COUNT, int_arg, number_arg

DEFAULT_SIZES = "1x2x4,1x2x8,1x4x8"
SUITES = ("alltoall", "allgather", "all", "lp")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark the synthesizers and LP models over fabric sizes")
    p.add_argument("--suite", choices=SUITES, default="all",
                   help="synthesizer cases (alltoall, allgather, all) or the LP model suite (lp)")
    p.add_argument("--sizes", "--shape", dest="sizes", default=DEFAULT_SIZES,
                   help=f"comma-separated HPN shapes SxHxN (default {DEFAULT_SIZES})")
    p.add_argument("--failures", default="fail2",
                   help="comma-separated failures to re-synthesize after (fail1,fail2,fail3,none)")
    p.add_argument("--backends", "--backend", dest="backends", default=None,
                   help="comma-separated LP backends (default: every installed one; a named one "
                        "that is not installed is reported as skipped)")
    p.add_argument("--max-chunks", type=number_arg(int, 1, high=MAX_COUNT, expected=f"an integer in [1, {MAX_COUNT}]"), default=10, help="chunks per pair / tree budget K")
    p.add_argument("--repeat", type=int_arg, default=5,
                   help="timed runs per case (default 5; synthesizer suites: after one "
                        "untimed warm-up run)")
    p.add_argument("--json", action="store_true",
                   help="print the results as JSON on stdout instead of the table "
                        "(mccl-bench/2; --suite lp: its own rows)")
    p.add_argument("-o", "--output", "--out", dest="out", metavar="FILE", default=None,
                   help="write the JSON document to FILE (mccl-bench/2, or the LP suite's)")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="one progress line per run on stderr (default: on a terminal only)")
    p.add_argument("--png", metavar="FILE", default=None,
                   help="write the time-vs-GPUs plot (synthesizer suites)")
    from instances.benchmarks import lp_suite

    lp_suite.add_arguments(p)                   # its own options (--tier, --dir, --time-limit)
    p.set_defaults(handler=_bench)


def split(text: str | None) -> list[str] | None:
    """``"a, b,"`` -> ``["a", "b"]``; ``None`` stays ``None``."""
    return None if text is None else [t.strip() for t in text.split(",") if t.strip()]


def _progress(force: bool | None):
    """The ``measure`` callback drawing ``done/total round case`` on stderr (a terminal,
    or any stream with ``--progress``); ``None`` when progress is off.  Its own
    reporter, not :func:`mccl_opt.progress.start`: the synthesizers' updates must not
    be formatted inside the timed runs."""
    from .. import progress

    reporter = progress.Reporter(sys.stderr, "mccl bench")
    if force is False or (force is None and not reporter.terminal):
        return None, reporter

    def show(done: int, total: int, case, rnd: int) -> None:
        what = "warm-up" if rnd == 0 else f"round {rnd}"
        reporter.update(f"{done}/{total} {what} {case.id}", None, None, None, None)

    return show, reporter


#: timed rounds per case
MAX_REPEAT = 1000


def _bench(args: argparse.Namespace) -> int:
    from ._guard import output_path

    if not 1 <= args.repeat <= MAX_REPEAT:             # 10^20 timed rounds ran until killed
        raise MCCLError(f"--repeat must be in [1, {MAX_REPEAT}], got {args.repeat}")
    output_path(args.out, "--out")
    output_path(args.png, "--png")
    if args.suite == "lp":
        from instances.benchmarks import lp_suite

        if args.png:
            raise MCCLError("--png plots the synthesizer suites; --suite lp has no plot")
        return int(lp_suite.run(args) or 0)
    return _synthesis(args)


def _synthesis(args: argparse.Namespace) -> int:
    from instances.benchmarks import registry, report
    from instances.benchmarks.repeat import add_reference_ratios, measure

    from ..tables import print_json

    failures = tuple(None if f in ("none", "healthy") else f for f in split(args.failures))
    todo = registry.cases(args.suite, tuple(split(args.sizes)), failures,
                          tuple(split(args.backends) or ()) or None, max_chunks=args.max_chunks)
    not_run = registry.not_installed() if args.backends is None else {}
    load = {"before": report.machine_load()}
    show, reporter = _progress(args.progress)
    try:
        results = add_reference_ratios(measure(todo, args.repeat, show))
    finally:
        reporter.close()
    load["after"] = report.machine_load()
    command = "mccl bench " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["bench"] else "mccl bench"
    doc = report.to_doc(results, repeat=args.repeat, load=load, command=command, not_run=not_run)
    # the files first: a closed stdout (``mccl bench | head``) must not lose them
    if args.out:
        write_output(args.out, json.dumps(doc, indent=1, default=float) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)
    if args.png:
        print(f"wrote {report.plot_png(results, args.png, repeat=args.repeat)}", file=sys.stderr)
    if args.json:
        print_json(doc)
    else:
        report.print_report(results, args.repeat, load, sys.stdout, not_run=not_run)
    return 0
