"""``mccl eval hpn SxHxN | TOPO.json``: the gray-failure speedup table (paper Figure 9)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..errors import TopologyError
from ..tables import print_json, print_table

HEADERS = ("failure", "baseline", "baseline GB/s", "no-reopt GB/s", "reopt GB/s",
           "no-reopt x", "reopt x", "cut check")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="speedups of re-optimised schedules under gray failures (Fig. 9)")
    p.add_argument("target", nargs="+", metavar="TOPOLOGY",
                   help="'hpn SxHxN' (e.g. hpn 1x4x8) or a mccl-topology/1 JSON file")
    p.add_argument("--collective", choices=["allgather", "alltoall", "both"], default="both")
    p.add_argument("--failures", default="fail1,fail2,fail3",
                   help="comma-separated failures (default fail1,fail2,fail3)")
    p.add_argument("--message-mb", type=float, default=128.0,
                   help="MiB per source: AllGather shard / AllToAll send buffer (default 128)")
    p.add_argument("--pieces", type=int, default=None,
                   help="simulate N pipelined pieces per chunk (default: fluid mode, fast)")
    p.add_argument("--backend", default="highs", help="LP backend of the synthesizers")
    p.add_argument("--png", default=None, help="bar chart path (default mccl-eval-<topology>.png)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.set_defaults(handler=_eval)


def _topology(target: list[str]):
    from instances import hpn, parse_shape

    from ._inputs import load_topology

    if target[0] == "hpn":
        if len(target) != 2:
            raise TopologyError("use 'mccl eval hpn SxHxN', e.g. 'mccl eval hpn 1x4x8'")
        return hpn(*parse_shape(target[1]))
    if len(target) != 1:
        raise TopologyError("give either 'hpn SxHxN' or one topology JSON file")
    return load_topology(target[0])


def _eval(args: argparse.Namespace) -> int:
    from ..evaluate import run_failure_experiment

    from ._guard import output_path

    topo = _topology(args.target)
    output_path(args.png or f"mccl-eval-{topo.name}.png", "--png")
    collectives = ["allgather", "alltoall"] if args.collective == "both" else [args.collective]
    from instances import apply_failure

    names = [f.strip() for f in args.failures.split(",") if f.strip()]
    say = (lambda msg: print(msg, file=sys.stderr)) if not args.json else None
    rows = []
    failures = {name: apply_failure(topo, name) for name in names}
    for coll in collectives:
        rows += run_failure_experiment(topo, coll, failures, args.message_mb * 2**20,
                                       backend=args.backend, pieces=args.pieces, progress=say)
    png = Path(args.png or f"mccl-eval-{topo.name}.png")
    _plot(rows, topo.name, png)
    if args.json:
        print_json({"topology": topo.name, "png": str(png), "rows": rows})
        return 0
    for coll in collectives:
        print(f"\n{coll} on {topo.name}, {args.message_mb:g} MiB per source "
              f"(speedup = algbw / baseline algbw)")
        print_table(HEADERS, [_cells(r) for r in rows if r["collective"] == coll])
    print(f"\nwrote {png}")
    return 0


def _cells(r: dict) -> list:
    verdict = "re-opt needed" if r["reopt_needed"] else "cut saturated: keep"
    return [r["failure"], r["baseline"], r["baseline_algbw"], r["no_reopt_algbw"], r["reopt_algbw"],
            r["no_reopt_speedup"], r["reopt_speedup"], verdict]


def _plot(rows: list[dict], name: str, path: Path) -> None:
    """Grouped bars like the paper's Figure 9: one panel per collective."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colls = sorted({r["collective"] for r in rows})
    fig, axes = plt.subplots(1, len(colls), figsize=(5 * len(colls), 3.6), squeeze=False)
    for ax, coll in zip(axes[0], colls):
        sub = [r for r in rows if r["collective"] == coll]
        xs = range(len(sub))
        for k, (key, label) in enumerate((("baseline", "baseline"), ("no_reopt", "no re-opt"),
                                          ("reopt", "MCCL re-opt"))):
            vals = [1.0 if key == "baseline" else r[f"{key}_speedup"] for r in sub]
            ax.bar([x + (k - 1) * 0.27 for x in xs], vals, width=0.27, label=label)
        ax.set_xticks(list(xs), [r["failure"] for r in sub])
        ax.set_ylabel("algbw speedup over baseline")
        ax.set_title(f"{coll} ({name})")
        ax.axhline(1.0, color="grey", linewidth=0.5)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
