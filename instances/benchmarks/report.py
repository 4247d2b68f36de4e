"""Benchmark reports: a table, a ``mccl-bench/1`` JSON document and a log-log PNG of
synthesis time against GPU count per method (docs/benchmarks.md)."""

from __future__ import annotations

import json
import math
import platform
from pathlib import Path

from .registry import CaseResult

__all__ = ["TABLE_HEADERS", "table_rows", "to_json", "plot_png"]

TABLE_HEADERS = ("suite", "method", "backend", "fabric", "gpus", "build s", "solve s",
                 "round s", "validate s", "total s", "vs ref", "gap", "note")
COLORS = {"cold_cg": "tab:blue", "warm_cg": "tab:orange", "compact_lp": "tab:red",
          "forestcoll_cold": "tab:green", "forestcoll_warm": "tab:purple"}
STYLES = {"highs": "-", "maxflow": "-", "gurobi": "--", "scip": ":"}
LABELS = {"cold_cg": "cold CG", "warm_cg": "warm CG", "compact_lp": "compact LP",
          "forestcoll_cold": "ForestColl-style cold", "forestcoll_warm": "ForestColl-style warm"}


def table_rows(results: list[CaseResult]) -> list[list]:
    """One row per case; ``vs ref`` = reference time / time, ``gap`` = 1 - rate/bound."""
    rows = []
    for r in results:
        c = r.case
        fabric = f"{c.shape}-{c.failure or 'healthy'}"
        if r.error:
            rows.append([c.suite, c.method, c.backend, fabric, r.gpus, *["-"] * 7, r.error[:60]])
            continue
        rows.append([c.suite, c.method, c.backend, fabric, r.gpus, r.build_s, r.solve_s,
                     r.round_s, r.validate_s, r.total_s, r.vs_ref, r.gap, ""])
    return rows


def to_json(results: list[CaseResult], path: str | Path, *, command: str = "") -> Path:
    """Write the results (NaN as null) with the machine they ran on."""
    def clean(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        return v

    doc = {"format": "mccl-bench/1", "command": command,
           "machine": {"python": platform.python_version(), "platform": platform.platform(),
                       "processor": platform.processor() or platform.machine()},
           "reference": "AllToAll: compact LP on HiGHS; AllGather: cold ForestColl",
           "results": [clean(r.to_dict()) for r in results]}
    path = Path(path)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def plot_png(results: list[CaseResult], path: str | Path) -> Path:
    """Synthesis time (build + solve + round) against GPU count, one line per
    (method, backend), log-log axes (matplotlib Agg); colour = method, dash = backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for r in results:
        if r.error is None and r.total_s > 0:
            series.setdefault((r.case.method, r.case.backend), []).append((r.gpus, r.total_s))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (method, backend), pts in sorted(series.items()):
        pts.sort()
        label = LABELS.get(method, method) + ("" if backend == "maxflow" else f" ({backend})")
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label,
                color=COLORS.get(method), linestyle=STYLES.get(backend, "-."))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("synthesis time (s): build + solve + round")
    ax.set_title("MCCL synthesis time vs fabric size")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
