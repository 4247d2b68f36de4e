"""Benchmark reports (docs/benchmarks.md): tables within 100 columns with their notes
below, the ``mccl-bench/2`` JSON document, and a PNG of synthesis time against GPU
count per method, one panel per failure."""

from __future__ import annotations

import math
import os
import platform
import textwrap
from pathlib import Path
from typing import TextIO

from mccl_opt.tables import print_table

from ..failures import FAIL1_GBPS, FAIL2_GBPS, FAIL3_HOST_GBPS, FAIL3_NIC_GBPS
from ..hpn import NIC_GBPS, NVSWITCH_GBPS
from .repeat import FIGURES, Measured
from .registry import MAXFLOW

__all__ = ["FORMAT", "TABLE_HEADERS", "WIDTH", "table_rows", "print_report", "to_doc",
           "plot_png", "failure_title", "machine_load"]

FORMAT = "mccl-bench/2"
WIDTH = 100
TABLE_HEADERS = ("method", "backend", "fabric", "GPUs", "build", "solve", "round", "total",
                 "spread", "vs ref", "gap %", "note")
LABELS = {"compact_lp": "A2A compact", "cold_cg": "A2A cold CG", "warm_cg": "A2A warm CG",
          "forestcoll_cold": "AG cold", "forestcoll_warm": "AG warm"}
COLORS = {"cold_cg": "tab:blue", "warm_cg": "tab:orange", "compact_lp": "tab:red",
          "forestcoll_cold": "tab:green", "forestcoll_warm": "tab:purple"}
STYLES = {"highs": "-", MAXFLOW: "-", "gurobi": "--", "scip": ":"}
_FAILURES = {
    None: "healthy",
    "fail1": f"Fail1: GPU 0's NVSwitch link {NVSWITCH_GBPS:g} -> {FAIL1_GBPS:g} Gbps",
    "fail2": f"Fail2: GPU 0's NIC link {NIC_GBPS:g} -> {FAIL2_GBPS:g} Gbps",
    "fail3": (f"Fail3: GPU 0 moved to a backup ({FAIL3_HOST_GBPS:g} Gbps to its host, "
              f"{FAIL3_NIC_GBPS:g} Gbps NIC)"),
}


def failure_title(failure: str | None) -> str:
    """What ``failure`` does to an HPN fabric, in words (paper §6.1)."""
    return _FAILURES.get(failure, str(failure))


def machine_load() -> list[float] | None:
    """The 1/5/15-minute load averages (``None`` where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    if ms >= 100:
        return f"{ms:.0f}"
    return f"{ms:.3g}" if ms >= 0.1 else f"{ms:.2f}"


def _num(v: float, fmt: str) -> str:
    return "-" if v is None or not math.isfinite(v) else format(v, fmt)


def _pct(gap: float) -> float:
    """``gap`` in percent, a solver's last-digit noise (|gap| < 1e-7) shown as 0."""
    return 0.0 if abs(gap) < 1e-7 else 100 * gap


def _notes(results: list[Measured]) -> dict[str, int]:
    """Reason -> note number, in order of first appearance."""
    out: dict[str, int] = {}
    for m in results:
        if m.status != "ok":
            out.setdefault(f"{m.status}: {m.reason}", len(out) + 1)
    return out


def table_rows(results: list[Measured], notes: dict[str, int] | None = None) -> list[list[str]]:
    """One row per case: median phase times (ms), ``spread`` = (max - min) / median of
    the total, ``vs ref``, ``gap %``; a skipped or failed case says so in ``note``."""
    notes = _notes(results) if notes is None else notes
    rows = []
    for m in results:
        c = m.case
        head = [LABELS.get(c.method, c.method), c.backend, c.shape, str(m.gpus)]
        if m.status != "ok":
            rows.append(head + ["-"] * 7 + [f"{m.status} [{notes[f'{m.status}: {m.reason}']}]"])
            continue
        total = m.stat("total_s")
        spread = (total["max"] - total["min"]) / total["median"] if total["median"] > 0 else 0.0
        rnd = _ms(m.median("round_s")) if c.method != "compact_lp" else "-"
        rows.append(head + [_ms(m.median("build_s")), _ms(m.median("solve_s")), rnd,
                            _ms(total["median"]), f"{100 * spread:.0f}%", _num(m.vs_ref, ".3g"),
                            _num(_pct(m.gap), ".2f"), ""])
    return rows


def print_report(results: list[Measured], repeat: int, load: dict,
                 file: TextIO | None = None, *, not_run: dict[str, str] | None = None) -> None:
    """One table per failure (a title line above), then the notes, wrapped to
    :data:`WIDTH` columns, never cut; ``not_run``: backends left out of the sweep and why."""
    notes = _notes(results)
    failures = list(dict.fromkeys(m.case.failure for m in results))
    for k, failure in enumerate(failures):
        if k:
            print(file=file)
        print(f"HPN fabrics, {failure_title(failure)}", file=file)
        print_table(TABLE_HEADERS, table_rows([m for m in results if m.case.failure == failure],
                                              notes), file=file)
    before, after = load.get("before"), load.get("after")
    text = [
        f"Times in ms: median of {repeat} timed run(s) per case after one untimed warm-up run; "
        "cold and warm runs alternate. total = build + solve + round of each run (validation "
        "excluded), each column its own median; min, max, every run and CPU times in --json. "
        "spread = (max - min) / median of the total.",
        "cold: synthesis from scratch; warm: re-synthesis from the healthy fabric's schedule. "
        "A2A = AllToAll (compact LP App. G.3, column generation §4.2), AG = AllGather "
        "(ForestColl-style, §4.3; backend maxflow: no LP solver).",
        "vs ref = the reference's median total / this median total (> 1: faster); reference: "
        "A2A compact LP (on highs when it ran), AG cold. gap % = 1 - rate / bound, bound = the "
        "reference's LP optimum in the same run.",
        f"Load average (1 min) {before[0] if before else '?'} before, "
        f"{after[0] if after else '?'} after, on {os.cpu_count()} CPUs.",
    ]
    if not_run:
        text.append("Backends not run: " + "; ".join(f"{b}: {why}" for b, why in not_run.items()))
    text += [f"[{n}] {reason}" for reason, n in notes.items()]
    for para in text:
        print(textwrap.fill(para, WIDTH, subsequent_indent="    "), file=file)


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_clean(x) for x in v]
    return v


def _result_doc(m: Measured) -> dict:
    c = m.case
    doc = {"id": c.id, "suite": c.suite, "method": c.method, "backend": c.backend,
           "shape": c.shape, "failure": c.failure, "max_chunks": c.max_chunks, "gpus": m.gpus,
           "status": m.status, "reason": m.reason}
    doc.update({f: m.stat(f) for f in FIGURES})
    doc["repeats"] = {f: m.values(f) for f in FIGURES}
    doc.update(warmup_total_s=m.warmup_total_s, lp_gbps=m.lp_gbps, rate_gbps=m.rate_gbps,
               bound_gbps=m.bound_gbps, gap=m.gap, vs_ref=m.vs_ref, extra=m.extra)
    return _clean(doc)


def to_doc(results: list[Measured], *, repeat: int, load: dict, command: str = "",
           not_run: dict[str, str] | None = None) -> dict:
    """The ``mccl-bench/2`` document (NaN as null): protocol, machine and load, the
    backends left out and why, and per case its status, median/min/max of every figure,
    every timed run and the quality."""
    return {"format": FORMAT, "command": command, "backends_not_run": dict(not_run or {}),
            "machine": {"python": platform.python_version(), "platform": platform.platform(),
                        "processor": platform.processor() or platform.machine(),
                        "cpus": os.cpu_count(), "load_average": load},
            "protocol": {"warmup_runs": 1, "repeat": repeat, "statistic": "median",
                         "order": "rounds over all cases, alternately forward and reversed",
                         "total_s": "build_s + solve_s + round_s",
                         "cpu_s": "process CPU time (all threads) over the same calls",
                         "units": "seconds"},
            "reference": {"alltoall": "compact_lp (highs when it ran)",
                          "allgather": "forestcoll_cold"},
            "results": [_result_doc(m) for m in results]}


def _series_order(item) -> tuple:
    (method, backend), _ = item
    return (list(LABELS).index(method) if method in LABELS else len(LABELS), backend)


def _time_label(seconds: float, _pos=None) -> str:
    return f"{seconds * 1e3:g} ms" if seconds < 1 else f"{seconds:g} s"


def plot_png(results: list[Measured], path: str | Path, *, repeat: int) -> Path:
    """Median synthesis time (bars: min..max) against GPU count, one line per (method,
    backend), one panel per failure (named in its title); the legend sits right of the
    panels; cases that did not run are listed under them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullFormatter

    failures = list(dict.fromkeys(m.case.failure for m in results))
    fig, axes = plt.subplots(1, len(failures), figsize=(5.2 * len(failures) + 2.6, 4.6),
                             sharey=True, squeeze=False)
    handles: dict[str, object] = {}
    for ax, failure in zip(axes[0], failures):
        series: dict[tuple[str, str], list[Measured]] = {}
        for m in results:
            if m.case.failure == failure and m.status == "ok" and m.median("total_s") > 0:
                series.setdefault((m.case.method, m.case.backend), []).append(m)
        gpus = sorted({m.gpus for m in results if m.case.failure == failure})
        for (method, backend), pts in sorted(series.items(), key=_series_order):
            pts.sort(key=lambda m: m.gpus)
            med = [m.median("total_s") for m in pts]
            stats = [m.stat("total_s") for m in pts]
            err = [[v - s["min"] for v, s in zip(med, stats)],
                   [s["max"] - v for v, s in zip(med, stats)]]
            label = LABELS.get(method, method) + ("" if backend == MAXFLOW else f" ({backend})")
            line = ax.errorbar([m.gpus for m in pts], med, yerr=err, marker="o", capsize=3,
                               label=label, color=COLORS.get(method),
                               linestyle=STYLES.get(backend, "-."))
            handles.setdefault(label, line)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(FixedLocator(gpus))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10))
        ax.yaxis.set_major_formatter(FuncFormatter(_time_label))
        ax.set_xlabel("GPUs")
        ax.set_title(f"HPN, {failure_title(failure)}", fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].set_ylabel("synthesis time (build + solve + round)")
    fig.suptitle(f"MCCL synthesis time vs fabric size: median of {repeat} run"
                 f"{'s' if repeat > 1 else ''}, bars min..max",
                 fontsize=10)
    fig.legend(list(handles.values()), list(handles), loc="center left",
               bbox_to_anchor=(1.0, 0.5), fontsize=8, frameon=False)
    missing = [f"{LABELS.get(m.case.method, m.case.method)} ({m.case.backend}) at {m.gpus} GPUs, "
               f"{m.case.failure or 'healthy'}: {m.status}, {(m.reason or '').split(':')[0]}"
               for m in results if m.status != "ok"]
    if missing:
        fig.text(0.01, -0.02, "Not plotted: " + "; ".join(missing), fontsize=7, va="top",
                 wrap=True)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
