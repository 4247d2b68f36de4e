"""``mccl bench --suite lp``: every exported model of an instance tier on every LP
backend, against the tier's certified optimum (docs/benchmarks.md, "Solver benchmarking
suite").

Each model file of the tier directory (:mod:`instances.tiers`; generated when missing)
is read with :func:`formulations.export.read_mps` (untimed) and, per backend and repeat,
loaded into a fresh solver and solved from scratch (``solve`` timed: the backend's own
``LPSolution.seconds``).  A row reports the median time over the repeats, the status,
the objective's relative error against the certified optimum and the simplex/barrier
iterations the backend reports.  A backend that is not installed, or a model beyond a
size-limited Gurobi licence (:class:`~mccl_opt.errors.SolverLicenseError`), is a
``skipped`` row with the reason; any other solver failure is an ``error`` row.

The ``mccl bench`` parser defines ``--backends``, ``--json`` (rows on stdout), ``--out
FILE`` and ``--repeat``; :func:`add_arguments` adds ``--tier``, ``--dir`` and
``--time-limit``.
"""

from __future__ import annotations

import argparse
import math
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from mccl_opt.errors import MCCLError, SolverLicenseError, SolverNotAvailableError

__all__ = ["SuiteRow", "add_arguments", "run", "run_suite", "HEADERS", "table_rows"]

TIERS = ("tiny", "easy", "medium", "hard")
HEADERS = ("instance", "model", "backend", "status", "solve s", "iters", "rel err", "note")
TABLE_WIDTH = 100
TIME_LIMIT = 600.0


@dataclass
class SuiteRow:
    """One (instance, model, backend): times over the repeats, outcome, quality."""

    instance: str
    model: str
    backend: str
    gpus: int
    cols: int
    rows: int
    nnz: int
    optimum: float
    status: str                     # a SolveStatus value, "skipped" or "error"
    seconds: float | None = None    # median solve time
    seconds_min: float | None = None
    seconds_max: float | None = None
    repeats: int = 0
    iterations: int | None = None
    objective: float | None = None
    rel_error: float | None = None
    reason: str = ""                # short: why skipped or failed (the table's note)
    note: str = ""                  # the full message


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options ``--suite lp`` adds to the ``mccl bench`` parser."""
    parser.add_argument("--tier", choices=TIERS, default=None,
                        help="--suite lp: instance tier (easy <= 32 GPUs, the default; medium "
                             "64-128; hard 256-512; tiny: a 4-8 GPU smoke tier)")
    parser.add_argument("--dir", default=None,
                        help="--suite lp: the tier's directory (default: the cache directory "
                             "`python -m instances.library build --tier` writes to); the "
                             "tier is generated there when its manifest is missing")
    parser.add_argument("--max-gpus", type=int, default=None,
                        help="--suite lp: only the tier's instances with at most this many GPUs")
    parser.add_argument("--models", default=None,
                        help="--suite lp: comma-separated models to run (compact,master; "
                             "default both)")
    # finite and positive: NaN ran unlimited, -1 reached Gurobi as a traceback
    parser.add_argument("--time-limit", type=_seconds, default=TIME_LIMIT,
                        help=f"--suite lp: seconds per solve (default {TIME_LIMIT:g})")


def _seconds(text: str) -> float:
    """``--time-limit``: seconds in (0, 1e9] (the instances layer sits below the CLI, so it
    checks its own option)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 < value <= 1e9:
        raise argparse.ArgumentTypeError(f"expected seconds in (0, 1e9], got {text!r}")
    return value


def _backends(text: str | list[str] | None) -> list[str]:
    from mccl_opt.backends import BACKENDS

    if text is None:
        return list(BACKENDS)
    names = text if isinstance(text, list) else [t.strip() for t in text.split(",") if t.strip()]
    unknown = [n for n in names if n.lower() not in BACKENDS]
    if unknown:
        raise MCCLError(f"unknown backend(s) {', '.join(unknown)}; choose from "
                        f"{', '.join(BACKENDS)}")
    return [n.lower() for n in names]


def _models(text: str | None) -> list[str] | None:
    from ..tiers import TIER_MODELS

    if text is None:
        return None
    names = [t.strip() for t in text.split(",") if t.strip()]
    unknown = sorted(set(names) - set(TIER_MODELS))
    if unknown or not names:
        raise MCCLError(f"--models: unknown model(s) {', '.join(unknown) or '(none given)'}; "
                        f"choose from {', '.join(TIER_MODELS)}")
    return names


def _solve_once(backend: str, lp, time_limit: float | None):
    from mccl_opt.backends import get_backend

    with get_backend(backend) as be:
        be.load(lp)
        return be.solve(time_limit=time_limit)


def _run_model(base: dict, lp, backend: str, repeat: int, time_limit: float | None) -> SuiteRow:
    """Solve ``lp`` ``repeat`` times on ``backend`` (fresh solver each time)."""
    row = SuiteRow(backend=backend, status="error", **base)
    times, sol = [], None
    try:
        for _ in range(repeat):
            sol = _solve_once(backend, lp, time_limit)
            times.append(sol.seconds)
    except SolverLicenseError as exc:
        row.status, row.reason, row.note = "skipped", "licence limit", str(exc)
        return row
    except SolverNotAvailableError as exc:
        row.status, row.reason, row.note = "skipped", "not installed", str(exc)
        return row
    except MCCLError as exc:
        row.reason, row.note = type(exc).__name__, str(exc)
        return row
    row.status, row.repeats, row.iterations = sol.status.value, len(times), int(sol.iterations)
    row.seconds = statistics.median(times)
    row.seconds_min, row.seconds_max = min(times), max(times)
    if sol.objective is not None:
        row.objective = float(sol.objective)
        row.rel_error = abs(row.objective - row.optimum) / abs(row.optimum)
    return row


def run_suite(directory: Path, backends: list[str], *, repeat: int = 1,
              time_limit: float | None = TIME_LIMIT, max_gpus: int | None = None,
              models: list[str] | None = None, log=sys.stderr) -> list[SuiteRow]:
    """Rows for every model of the tier in ``directory`` (instances with at most
    ``max_gpus`` GPUs; only ``models`` when given) × ``backends``."""
    from formulations.export import read_mps
    from formulations.lp import FormulationError
    from mccl_opt.backends import backend_class

    from ..tiers import load_tier

    if repeat < 1:
        raise MCCLError(f"--repeat must be >= 1, got {repeat}")
    manifest = load_tier(directory)
    if not manifest.get("complete", True):
        print(f"warning: {directory} holds an incomplete build, interrupted or still running "
              f"({len(manifest['instances'])} instances); finish it with `python -m instances.library build --tier "
              f"{manifest['tier']} --out {directory}`", file=log)
    missing = {b: f"pip install {backend_class(b).pip_package}"
               for b in backends if not backend_class(b).is_available()}
    rows: list[SuiteRow] = []
    for rec in manifest["instances"]:
        if max_gpus is not None and rec["gpus"] > max_gpus:
            continue
        for model, info in rec["models"].items():
            if models is not None and model not in models:
                continue
            path = Path(directory) / info["file"]
            base = {"instance": rec["name"], "model": model, "gpus": rec["gpus"],
                    "cols": info["cols"], "rows": info["rows"], "nnz": info["nnz"],
                    "optimum": info["optimum"]}
            try:
                lp = read_mps(path)
            except (OSError, FormulationError) as exc:
                raise MCCLError(f"{path}: cannot read the model ({exc}); rebuild the tier with "
                                f"`python -m instances.library build --tier "
                                f"{manifest['tier']} --out {directory}`") from None
            for be in backends:
                print(f"{rec['name']} {model} {be}", file=log, flush=True)
                if be in missing:
                    rows.append(SuiteRow(backend=be, status="skipped", reason="not installed",
                                         note=missing[be], **base))
                else:
                    rows.append(_run_model(base, lp, be, repeat, time_limit))
    return rows


def table_rows(rows: list[SuiteRow], width: int = TABLE_WIDTH) -> list[list]:
    """Table cells; the note is the short reason plus as much of the message as fits
    ``width`` columns (``--json`` and ``--out`` keep the whole message)."""
    cells = [[r.instance, r.model, r.backend, r.status,
              "-" if r.seconds is None else f"{r.seconds:.3g}",
              "-" if r.iterations is None else str(r.iterations),
              "-" if r.rel_error is None else f"{r.rel_error:.1e}"] for r in rows]
    used = sum(max([len(h)] + [len(c[i]) for c in cells]) + 2
               for i, h in enumerate(HEADERS[:-1]))
    room = max(width - used, len(HEADERS[-1]))
    for cell, r in zip(cells, rows):
        note = f"{r.reason}: {r.note}" if r.reason else r.note
        cell.append(note if len(note) <= room else note[:room - 3] + "...")
    return cells


def run(args: argparse.Namespace) -> int:
    """``mccl bench --suite lp``: table on stdout (or ``--json`` rows), ``--out FILE``."""
    from mccl_opt.tables import print_json, print_table

    from ..tiers import TIER_MANIFEST, build_tier, default_dir, load_tier

    tier = args.tier or "easy"
    directory = Path(args.dir) if getattr(args, "dir", None) else default_dir(tier)
    if not (directory / TIER_MANIFEST).exists():
        print(f"generating the {tier} tier in {directory} ...", file=sys.stderr)
        build_tier(tier, directory)
    held = load_tier(directory)["tier"]
    if args.tier is not None and held != args.tier:
        raise MCCLError(f"{directory} holds the {held} tier, not {args.tier}; pass --tier {held} "
                        f"or another --dir")
    rows = run_suite(directory, _backends(getattr(args, "backends", None)),
                     repeat=getattr(args, "repeat", None) or 1,
                     time_limit=getattr(args, "time_limit", TIME_LIMIT),
                     max_gpus=getattr(args, "max_gpus", None),
                     models=_models(getattr(args, "models", None)))
    doc = [asdict(r) for r in rows]
    if getattr(args, "json", False):
        print_json(doc)
    else:
        print_table(HEADERS, table_rows(rows))
    out = getattr(args, "out", None)
    if out:
        Path(out).write_text(json.dumps({"format": "mccl-bench-lp/1", "tier": held,
                                         "dir": str(directory), "rows": doc}, indent=1) + "\n")
        print(f"wrote {out}", file=sys.stderr)
    return 0
