"""``mccl bench [--suite alltoall|allgather|all] [--sizes 1x2x8,1x4x8] [--json OUT] [--png OUT]``.

Runs the cases of :mod:`instances.benchmarks.registry` with a progress indicator on stderr, prints a
table (phase times, ``vs ref`` = the reference method's time in the same run divided by
the case's, gap to the reference bound), and writes JSON and a PNG of synthesis time
against GPU count per method on log axes.
"""

from __future__ import annotations

import argparse
import sys

from ..errors import MCCLError

DEFAULT_SIZES = "1x2x4,1x2x8,1x4x8"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmark the synthesizers and LP models over fabric sizes")
    p.add_argument("--suite", choices=["alltoall", "allgather", "all"], default="all")
    p.add_argument("--sizes", default=DEFAULT_SIZES,
                   help=f"comma-separated HPN shapes SxHxN (default {DEFAULT_SIZES})")
    p.add_argument("--failures", default="fail2",
                   help="comma-separated failures to re-synthesize after (fail1,fail2,fail3,none)")
    p.add_argument("--backends", default=None,
                   help="comma-separated LP backends (default: every installed one)")
    p.add_argument("--max-chunks", type=int, default=10, help="chunks per pair / tree budget K")
    p.add_argument("--json", metavar="OUT", default=None, help="write results as mccl-bench/1 JSON")
    p.add_argument("--png", metavar="OUT", default=None, help="write the time-vs-GPUs plot")
    p.set_defaults(handler=_bench)


def _split(text: str | None) -> list[str] | None:
    return None if text is None else [t.strip() for t in text.split(",") if t.strip()]


def _bench(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from instances.benchmarks import registry, report

    from ..tables import print_table

    from ._guard import output_path

    if args.max_chunks < 1:
        raise MCCLError(f"--max-chunks must be >= 1, got {args.max_chunks}")
    output_path(args.json, "--json")
    output_path(args.png, "--png")
    failures = tuple(None if f == "none" else f for f in _split(args.failures))
    backends = _split(args.backends)
    if backends is not None:
        from ..backends import available_backends

        missing = sorted(set(backends) - set(available_backends()))
        if missing:
            raise MCCLError(f"backend(s) {', '.join(missing)} not installed; available: "
                            f"{', '.join(available_backends())}")
    todo = [replace(c, max_chunks=args.max_chunks) for c in registry.cases(
        args.suite, tuple(_split(args.sizes)), failures,
        tuple(backends) if backends else None)]
    print("compiling kernels ...", file=sys.stderr)
    registry.warmup()
    results = []
    end = "" if sys.stderr.isatty() else "\n"
    for k, case in enumerate(todo, 1):
        bar = "#" * (30 * k // len(todo))
        print(f"\r[{bar:<30}] {k}/{len(todo)} {case.id:<60}", end=end, file=sys.stderr, flush=True)
        results.append(registry.run_case(case))
    if end == "":
        print(file=sys.stderr)
    registry.add_reference_ratios(results)
    print_table(report.TABLE_HEADERS, report.table_rows(results))
    command = "mccl bench " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["bench"] else "mccl bench"
    if args.json:
        print(f"wrote {report.to_json(results, args.json, command=command)}", file=sys.stderr)
    if args.png:
        print(f"wrote {report.plot_png(results, args.png)}", file=sys.stderr)
    return 0
