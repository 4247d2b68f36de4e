"""``mccl eval TOPOLOGY -b 1K -e 1G -f 2``: NCCL baselines, MCCL without and with
re-optimization under gray failures, per message size in nccl-tests' conventions
(docs/sim.md "mccl eval"), then the Figure 9 speedup summary at the largest size."""

from __future__ import annotations

import argparse
import csv
import io
import sys
from pathlib import Path

from ..errors import MCCLError, TopologyError
from ..files import write_figure, write_output
from ..tables import print_json, print_table
from ._inputs import MAX_COUNT, backend_arg, int_arg

SUMMARY_HEADERS = ("failure", "baseline", "baseline GB/s", "no-reopt GB/s", "reopt GB/s",
                   "no-reopt x", "reopt x", "cut check")
_SWEEP_HEADERS = (("size", "(B)"), ("count", "(elements)"), ("type", ""), ("method", ""),
                  ("time", "(us)"), ("algbw", "(GB/s)"), ("busbw", "(GB/s)"), ("model", ""))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="NCCL baselines vs MCCL (re-optimised) under gray failures, "
                                    "nccl-tests style size sweep and Figure 9 speedups")
    p.add_argument("target", nargs="+", metavar="TOPOLOGY",
                   help="'hpn SxHxN', a library instance (dgx-8, hpn-1x2x8) or a mccl-topology/1 file")
    p.add_argument("--collective", choices=["allgather", "alltoall", "both"], default="both",
                   help="which collective(s) to evaluate (default both)")
    p.add_argument("--failures", default="fail1,fail2,fail3",
                   help="comma-separated failures, 'none' for the healthy fabric (default "
                        "fail1,fail2,fail3); one that does not apply to the fabric is skipped")
    p.add_argument("-b", "--minbytes", default="1K", help="smallest size, K/M/G suffixes (default 1K)")
    p.add_argument("-e", "--maxbytes", default="1G", help="largest size (default 1G)")
    p.add_argument("-f", "--stepfactor", type=int_arg, default=2, help="size multiplier (default 2)")
    p.add_argument("--model", choices=("auto", "event", "fluid"), default="auto",
                   help="simulation: event-level with latency where tractable, fluid beyond (auto, "
                        "default), or force one")
    p.add_argument("--event-limit", type=int_arg, default=None, metavar="PIECES",
                   help="auto: event-level while a size's schedules have at most this many "
                        "512 KiB pieces (default 4096: mccl_opt.sweep.DEFAULT_EVENT_LIMIT, docs/sim.md)")
    p.add_argument("--backend", type=backend_arg, default="highs",
                   help="LP backend of the synthesizers: highs (default), gurobi, scip")
    p.add_argument("--png", default=None, metavar="FILE",
                   help="also plot algbw vs size per method into this PNG (default: no plot)")
    p.add_argument("--csv", default=None, metavar="FILE", help="also write the sweep rows as CSV")
    p.add_argument("--json", action="store_true", help="print rows, summary and what was skipped (failures, "
                                                               "baselines) as JSON")
    p.set_defaults(handler=_eval)


def _topology(target: list[str]):
    from instances import hpn, parse_shape

    from ._inputs import load_topology

    target = " ".join(target).split() if target[0].startswith("hpn ") else target  # 'hpn 1x2x8'
    if target[0] == "hpn":
        if len(target) != 2:
            raise TopologyError("use 'mccl eval hpn SxHxN', e.g. 'mccl eval hpn 1x4x8'")
        return hpn(*parse_shape(target[1]))
    if len(target) != 1:
        raise TopologyError("give either 'hpn SxHxN' or one topology JSON file")
    return load_topology(target[0])


def _failures(topo, spec: str, say) -> tuple[dict, list[dict]]:
    """The degraded fabrics to evaluate, and the failures that do not apply to ``topo``."""
    from instances import FAILURES, apply_failure

    names = [f.strip() for f in spec.split(",") if f.strip()]
    known = [*FAILURES, "none"]
    unknown = [f for f in names if f not in known]
    if unknown or not names:
        raise TopologyError(f"--failures: unknown {', '.join(unknown) or '(empty list)'}; "
                            f"choose from {', '.join(known)}")
    fabrics, skipped = {}, []
    for name in dict.fromkeys(names):
        try:
            fabrics[name] = apply_failure(topo, name)
        except TopologyError as exc:
            skipped.append({"failure": name, "collective": None, "method": None, "reason": str(exc)})
            say(f"{name} does not apply to {topo.name}: {exc}; skipped")
    if not fabrics:
        reasons = "; ".join(dict.fromkeys(s["reason"] for s in skipped))
        raise TopologyError(f"none of the failures applies to {topo.name} ({reasons}); "
                            "use --failures none to compare the methods on the healthy fabric")
    return fabrics, skipped


def _eval(args: argparse.Namespace) -> int:
    from ..evaluate import failure_cases
    from ..sweep import DEFAULT_EVENT_LIMIT, check_sizes, summary_rows, sweep_rows

    from ._guard import output_path
    from ._inputs import parse_bytes

    topo = _topology(args.target)
    collectives = ["allgather", "alltoall"] if args.collective == "both" else [args.collective]
    sizes = check_sizes(collectives, parse_bytes(args.minbytes, "-b"), parse_bytes(args.maxbytes, "-e"),
                        args.stepfactor, topo.num_gpus)
    limit = DEFAULT_EVENT_LIMIT if args.event_limit is None else args.event_limit
    if not 0 <= limit <= MAX_COUNT:
        raise MCCLError(f"--event-limit must be >= 0 and at most {MAX_COUNT} pieces, got {limit}")
    png = Path(args.png) if args.png else None
    if png is not None:
        output_path(str(png), "--png")
    if args.csv:
        output_path(args.csv, "--csv")
    warn = lambda msg: print(msg, file=sys.stderr)  # noqa: E731
    say = None if args.json else warn
    failures, skipped = _failures(topo, args.failures, warn)
    rows, summary = [], []
    for coll in collectives:
        cases = failure_cases(topo, coll, failures, backend=args.backend, progress=say)
        for case in cases:
            for method, reason in case.unavailable.items():
                skipped.append({"failure": case.failure, "collective": coll, "method": method,
                                "reason": reason})
                warn(f"{method} does not apply to {case.topo.name}: {reason}; skipped")
        mine = sweep_rows(cases, coll, sizes, model=args.model, event_limit=limit,
                          progress=say)
        rows += mine
        summary += summary_rows(cases, coll, mine)
    changed = {name: what_changed(topo, fabric) for name, fabric in failures.items()}
    if png is not None:
        _plot(rows, topo.name, png, changed)
    if args.csv:
        _write_csv(rows, Path(args.csv))
    if args.json:
        print_json({"topology": topo.name, "gpus": topo.num_gpus, "png": None if png is None else str(png),
                    "csv": args.csv, "failures": changed, "sizes": sizes, "rows": rows,
                    "summary": summary, "skipped": skipped})
        return 0
    for coll in collectives:
        for failure in failures:
            print(f"\n# {coll} on {topo.name} ({topo.num_gpus} GPUs), {failure}: {changed[failure]}")
            _print_sweep([r for r in rows if r["collective"] == coll and r["failure"] == failure])
    for coll in collectives:
        mine = [r for r in summary if r["collective"] == coll]
        print(f"\n{coll} on {topo.name} at size {mine[0]['size']} B (speedup = algbw / baseline algbw)")
        print_table(SUMMARY_HEADERS, [_summary_cells(r) for r in mine])
    written = [str(p) for p in (png, args.csv) if p]
    if written:
        print(f"wrote {' and '.join(written)}", file=sys.stderr)
    return 0


def what_changed(healthy, failed) -> str:
    """Which links a failure changed, in words: ``s0h0g0 <-> s0tor0: 400 -> 50 Gbps`` (a
    cable whose two directions changed alike), ``a -> b: ...`` (one direction), or the
    GPUs replaced (Fail3, a GPU moved to a backup node)."""
    gone = [g for g in healthy.gpus if not failed.has_node(g)]
    if gone:
        return f"GPU {', '.join(gone)} replaced by {', '.join(g for g in failed.gpus if not healthy.has_node(g))}"
    changes = {(l.src, l.dst): (healthy.link(l.src, l.dst).capacity_gbps, l.capacity_gbps)
               for l in failed.links if healthy.has_link(l.src, l.dst)
               and healthy.link(l.src, l.dst).capacity_gbps != l.capacity_gbps}
    words = []
    for (a, b), (was, now) in changes.items():
        if (b, a) in changes and a > b:
            continue                                  # said with its reverse
        both = changes.get((b, a)) == (was, now)
        words.append(f"{a} {'<->' if both else '->'} {b}: {was:g} -> {now:g} Gbps")
    return "; ".join(words) or "no link changed (healthy)"



def _print_sweep(rows: list[dict]) -> None:
    """One nccl-tests style block: right-aligned columns, '#' header lines."""
    cells = [[str(r["size"]), str(r["count"]), r["type"], r["method"], f"{r['time_us']:.2f}",
              f"{r['algbw_GBps']:.2f}", f"{r['busbw_GBps']:.2f}", r["model"]] for r in rows]
    widths = [max(len(a), len(b), *(len(c[i]) for c in cells)) for i, (a, b) in enumerate(_SWEEP_HEADERS)]
    for k in range(2):
        print(("#" + "  ".join(h[k].rjust(w) for h, w in zip(_SWEEP_HEADERS, widths))[1:]).rstrip())
    for c in cells:
        print("  ".join(v.rjust(w) for v, w in zip(c, widths)))


def _summary_cells(r: dict) -> list:
    verdict = "re-opt needed" if r["reopt_needed"] else "cut saturated: keep"
    cells = [r["failure"], r["baseline"], r["baseline_algbw"], r["no_reopt_algbw"], r["reopt_algbw"],
             r["no_reopt_speedup"], r["reopt_speedup"], verdict]
    return ["n/a" if v is None else v for v in cells]


def _write_csv(rows: list[dict], path: Path) -> None:
    from ..sweep import ROW_FIELDS

    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=ROW_FIELDS)
    writer.writeheader()
    writer.writerows(rows)
    write_output(path, text.getvalue())                # whole or not at all (issue 27)


def _plot(rows: list[dict], name: str, path: Path, changed: dict[str, str]) -> None:
    """algbw (GB/s, the summary table's measure) vs size per method: one panel per
    collective (rows) and failure (columns, titled with the link it changed); y from 0;
    each method its own marker and line style, so equal series stay visible; a dotted
    line marks the size from which the fluid model took over; the figure says the
    numbers are simulated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ._inputs import format_bytes

    colls = list(dict.fromkeys(r["collective"] for r in rows))
    fails = list(dict.fromkeys(r["failure"] for r in rows))
    fig, axes = plt.subplots(len(colls), len(fails), figsize=(4.2 * len(fails), 3.4 * len(colls)),
                             squeeze=False)
    sizes = sorted({r["size"] for r in rows})
    for i, coll in enumerate(colls):
        for j, failure in enumerate(fails):
            ax = axes[i][j]
            sub = [r for r in rows if r["collective"] == coll and r["failure"] == failure]
            for k, method in enumerate(dict.fromkeys(r["method"] for r in sub)):
                pts = [(r["size"], r["algbw_GBps"]) for r in sub if r["method"] == method]
                ax.plot(*zip(*pts), marker="os^vD"[k % 5], markersize=7 - k, linewidth=2.2 - 0.4 * k,
                        linestyle=("-", "--", "-.", ":")[k % 4], label=method, alpha=0.85)
            fluid = [r["size"] for r in sub if r["model"] == "fluid"]
            if fluid and len(fluid) < len(sub):
                ax.axvline(min(fluid), color="grey", linestyle=":", linewidth=1)
                ax.annotate("event | fluid", (min(fluid), 0.02), xycoords=("data", "axes fraction"),
                            fontsize=7, color="grey", ha="center", backgroundcolor="white")
            ax.set_xscale("log", base=2)
            step = -(-len(sizes) // 6)           # at most 6 labelled sizes
            ax.set_xticks(sizes[::step], [format_bytes(s) for s in sizes[::step]])
            ax.minorticks_off()
            ax.set_xlabel("size (bytes, nccl-tests)")
            ax.set_ylabel("algbw (GB/s)")
            ax.set_ylim(bottom=0)
            ax.set_title(f"{coll}, {failure} ({name})\n{changed.get(failure, '')[:70]}", fontsize=8)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="upper left")
    fig.suptitle("simulated (mccl_opt.sim), not measured on hardware", fontsize=9)
    fig.tight_layout()
    write_figure(fig, path)
    plt.close(fig)
