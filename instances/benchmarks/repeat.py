"""Repeated benchmark runs: a warm-up run per case, then ``repeat`` timed rounds over
every case, and the median / min / max of each figure (docs/benchmarks.md, "How the
figures are measured").

Round 0 runs every case once untimed for the report (it loads the numba kernels of
every path — cold, warm, every backend — from numba's on-disk cache or compiles them,
and starts each LP backend once).  Rounds 1..N run every case once each, in the
registry's order on odd rounds and reversed on even ones, so a cold run and the warm
run of the same instance and backend are adjacent, each round swaps which comes first,
and a slow drift of the machine's load reaches every case alike.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Callable

from mccl_opt.errors import MCCLError

from .registry import PHASES, REFERENCE, Case, CaseResult, run_case

__all__ = ["Measured", "FIGURES", "measure", "add_reference_ratios"]

FIGURES = (*PHASES, "total_s", "cpu_s")

#: ``progress(done, total, case, round)`` after each run (round 0 is the warm-up).
Progress = Callable[[int, int, Case, int], None]


@dataclass
class Measured:
    """One case over its repeats: the timed runs (``runs``, warm-up excluded), the
    warm-up run's total time, and the quality and ratios the report prints."""

    case: Case
    gpus: int
    runs: list[CaseResult] = field(default_factory=list)
    warmup_total_s: float | None = None
    status: str = "ok"
    reason: str | None = None
    bound_gbps: float = float("nan")
    gap: float = float("nan")
    vs_ref: float = float("nan")     # reference median total / this median total (>1: faster)

    def values(self, figure: str) -> list[float]:
        """``figure`` (one of :data:`FIGURES`) of every timed run, in run order."""
        return [getattr(r, figure) for r in self.runs]

    def stat(self, figure: str) -> dict[str, float] | None:
        """Median, min and max of ``figure`` over the timed runs (``None`` if none ran)."""
        vals = self.values(figure)
        if not vals:
            return None
        return {"median": statistics.median(vals), "min": min(vals), "max": max(vals)}

    def median(self, figure: str) -> float:
        vals = self.values(figure)
        return statistics.median(vals) if vals else float("nan")

    @property
    def lp_gbps(self) -> float:
        return self.runs[0].lp_gbps if self.runs else float("nan")

    @property
    def rate_gbps(self) -> float:
        """The rounded schedule's rate (the worst over the repeats, should they differ)."""
        return min(r.rate_gbps for r in self.runs) if self.runs else float("nan")

    @property
    def extra(self) -> dict:
        return self.runs[0].extra if self.runs else {}


def measure(todo: list[Case], repeat: int = 5, progress: Progress | None = None) -> list[Measured]:
    """Run each case once untimed, then ``repeat`` timed rounds (see the module
    docstring).  A case whose run is skipped or fails is not run again; its status and
    reason are kept."""
    if repeat < 1:
        raise MCCLError(f"--repeat must be >= 1, got {repeat}")
    out = [Measured(c, c.num_gpus) for c in todo]
    total, done = len(todo) * (repeat + 1), 0
    for rnd in range(repeat + 1):
        order = out if rnd % 2 == 1 or rnd == 0 else out[::-1]
        for m in order:
            done += 1
            if progress is not None:
                progress(done, total, m.case, rnd)
            if m.status != "ok":
                continue
            res = run_case(m.case)
            if res.status != "ok":
                m.status, m.reason, m.runs = res.status, res.reason, []
            elif rnd == 0:
                m.warmup_total_s = res.total_s
            else:
                m.runs.append(res)
    return out


def add_reference_ratios(results: list[Measured]) -> list[Measured]:
    """Fill ``bound_gbps``, ``gap = 1 - rate / bound`` and ``vs_ref`` from each instance's
    reference case in ``results`` (:data:`.registry.REFERENCE`, on HiGHS when it ran,
    else the first backend that did): the LP optimum it found and its median total."""
    ref: dict[tuple, Measured] = {}
    for m in results:
        c = m.case
        key = (c.suite, c.shape, c.failure, c.max_chunks)
        if c.method == REFERENCE[c.suite] and m.status == "ok":
            if key not in ref or c.backend == "highs":
                ref[key] = m
    for m in results:
        c = m.case
        base = ref.get((c.suite, c.shape, c.failure, c.max_chunks))
        if base is None or m.status != "ok":
            continue
        m.bound_gbps = base.lp_gbps
        achieved = m.lp_gbps if c.method == "compact_lp" else m.rate_gbps
        m.gap = 1.0 - achieved / base.lp_gbps
        total = m.median("total_s")
        m.vs_ref = base.median("total_s") / total if total > 0 else float("nan")
    return results
