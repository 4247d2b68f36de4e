"""``mccl train --model llama3-405b|deepseek-v3|both|FILE --gpus N[,N...] [--fail ...]``:
iteration time of a training stage healthy / under a gray failure with NCCL's static
schedules / with MCCL's re-synthesized ones, the paper's Figure 14 (docs/training.md)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..files import write_figure
from ..errors import TopologyError, WorkloadError
from ..tables import print_json, print_table
from ._inputs import backend_arg

FAILS = ("fail1", "fail2", "fail3")
HEADERS = ("model", "gpus", "state", "healthy_s", "static_s", "mccl_s", "speedup", "joint_s", "comm_share")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("train", help="end-to-end training iteration under gray failures: NCCL vs MCCL "
                                     "(paper Figure 14)")
    p.add_argument("--model", required=True,
                   help="llama3-405b, deepseek-v3, both, or a mccl-workload/1 file")
    p.add_argument("--gpus", default="128",
                   help="GPU counts of the stage, comma-separated (multiples of 8 up to 128, of 128 "
                        "beyond: HPN segments of 16 hosts x 8 GPUs); default 128")
    p.add_argument("--fail", default="all", choices=(*FAILS, "all", "none"),
                   help="gray failure on GPU 0 (default all three; none: healthy only)")
    p.add_argument("--joint", action="store_true",
                   help="also re-synthesize jointly the communicators that share links (docs/training.md "
                        "\"Joint re-synthesis\")")
    p.add_argument("--relay", choices=("members", "host"), default="members",
                   help="who may forward a communicator's traffic: its members only (default), or "
                        "also the other GPUs on its members' hosts (docs/training.md, relays)")
    p.add_argument("--reduce-scatter", choices=("ring", "mccl"), default="ring",
                   help="ReduceScatter under MCCL: the vendor's ring as in the paper (default), or MCCL's "
                        "AllGather trees run backwards")
    p.add_argument("--backend", type=backend_arg, default="highs", help="LP backend of the synthesizers")
    p.add_argument("--write-workload", metavar="FILE", default=None,
                   help="write the workload of the first model and GPU count as mccl-workload/1 JSON")
    p.add_argument("--png", default=None, metavar="P", help="write a Figure 14 style bar chart")
    p.add_argument("--json", action="store_true", help="print rows and synthesis time as JSON")
    p.set_defaults(handler=_train)


def _gpu_counts(text: str) -> list[int]:
    try:
        counts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TopologyError(f"--gpus takes comma-separated integers, got {text!r}") from None
    for n in counts:
        if n < 8 or n % 8 or (n > 128 and n % 128):
            raise TopologyError(f"--gpus {n}: use a multiple of 8 up to 128 or of 128 beyond "
                                "(HPN segments of 16 hosts x 8 GPUs)")
    if not counts:
        raise TopologyError("--gpus needs at least one GPU count")
    return counts


def _fabric(n: int):
    from instances import hpn

    return hpn(1, n // 8, 8) if n <= 128 else hpn(n // 128, 16, 8)


def _models(spec: str) -> dict:
    from ..training.builtin import BUILTIN, builtin_workload
    from ..training.workload import load_workload

    names = sorted(BUILTIN) if spec == "both" else [spec] if spec in BUILTIN else []
    if names:
        return {name: (lambda n, name=name: builtin_workload(name, n)) for name in names}
    if not Path(spec).exists():
        raise WorkloadError(f"--model {spec!r} is neither a built-in model ({', '.join(sorted(BUILTIN))}, "
                            "both) nor an existing workload file")
    workload = load_workload(spec)
    return {workload.name or Path(spec).stem: (lambda n: workload)}


def _train(args: argparse.Namespace) -> int:
    from instances import FAILURES

    from ..training.figure import timed_sweep
    from ..training.placement import group_sizes

    counts = _gpu_counts(args.gpus)
    models = _models(args.model)
    for path in (args.png, args.write_workload):
        if path is not None and not Path(path).resolve().parent.is_dir():
            raise WorkloadError(f"cannot write {path}: its directory does not exist")
    if args.write_workload:
        first = next(iter(models.values()))(counts[0])
        Path(args.write_workload).write_text(json.dumps(first.to_dict(), indent=1))
    fails = {} if args.fail == "none" else {f: FAILURES[f] for f in (FAILS if args.fail == "all" else (args.fail,))}
    for make in models.values():                   # every workload must fit every size before any synthesis
        for n in counts:
            group_sizes(make(n), n)
    out = timed_sweep(models, counts, _fabric, fails, joint=args.joint, relay=args.relay,
                      backend=args.backend, reduce_scatter=args.reduce_scatter,
                      progress=lambda msg: print(msg, file=sys.stderr, flush=True))
    if args.png:
        _plot(out["rows"], Path(args.png))
    if args.json:
        print_json({**out, "png": args.png})
        return 0
    print_table(HEADERS, [(r["model"], r["gpus"], r["state"], r["iteration_s_healthy"], r["iteration_s_static"],
                           r["iteration_s_mccl"], r["speedup"],
                           "-" if r["iteration_s_joint"] is None else r["iteration_s_joint"],
                           r["collective_share_healthy"]) for r in out["rows"]])
    s = out["synthesis"]
    print(f"synthesis: {s['synthesis_s']:.1f} s for {s['syntheses']} schedules ({s['reused']} reused); "
          f"baselines {s['baseline_s']:.1f} s; wall {s['wall_s']:.1f} s")
    return 0


def _plot(rows: list[dict], path: Path) -> None:
    """Grouped bars of iteration time per GPU count: one panel per model and failure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    states = [s for s in dict.fromkeys(r["state"] for r in rows) if s != "healthy"] or ["healthy"]
    fig, axes = plt.subplots(len(models), len(states), figsize=(4.2 * len(states), 3.2 * len(models)),
                             squeeze=False)
    bars = (("iteration_s_healthy", "healthy (NCCL)"), ("iteration_s_static", "degraded, static NCCL"),
            ("iteration_s_mccl", "degraded, MCCL"), ("iteration_s_joint", "degraded, MCCL joint"))
    for i, model in enumerate(models):
        for j, state in enumerate(states):
            ax = axes[i][j]
            sub = [r for r in rows if r["model"] == model and r["state"] == state]
            xs = range(len(sub))
            for k, (field, label) in enumerate(bars):
                ys = [r[field] if r[field] is not None else 0.0 for r in sub]
                if any(ys):
                    ax.bar([x + 0.2 * k for x in xs], ys, width=0.2, label=label)
            for x, r in zip(xs, sub):
                top = max(r[f] for f, _ in bars if r[f] is not None)
                ax.annotate(f"{r['speedup']:.2f}x", (x + 0.3, top), fontsize=7,
                            ha="center", va="bottom")
            ax.set_xticks([x + 0.3 for x in xs], [str(r["gpus"]) for r in sub])
            ax.set_ylim(0, 1.15 * max(r[f] for r in sub for f, _ in bars if r[f] is not None))
            ax.set_xlabel("GPUs (one pipeline stage)")
            ax.set_ylabel("iteration time (s)")
            ax.set_title(f"{model}, {state}", fontsize=9)
            ax.grid(alpha=0.3, axis="y")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=8)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    write_figure(fig, path)
    plt.close(fig)
