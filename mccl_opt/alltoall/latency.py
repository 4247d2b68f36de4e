"""``max_steps="min"``: the smallest step bound that keeps the LP optimum (paper App. D).

The LP optimum ``z(m)`` is non-decreasing in the step bound ``m``.  We solve without a
bound (``z*``), then binary-search ``m`` between the largest per-pair minimum step count
(below it some pair has no path) and the longest path the unbounded optimum uses (there
``z(m) = z*``), accepting ``m`` when ``z(m) >= (1 - tol)·z*``.  Every probe warm-starts
from the columns found so far that respect its bound.
"""

from __future__ import annotations

import time

import numpy as np

from .colgen import CGOptions
from .initial import min_steps_per_pair
from .problem import Problem
from .driver import Solved, run_cg

__all__ = ["min_steps_solve"]


def _columns(solved: Solved) -> tuple[np.ndarray, ...]:
    pool = solved.master.pool
    return pool.pair.copy(), pool.start.copy(), pool.arcs.copy(), pool.origin.copy()


def min_steps_solve(prob: Problem, backend: str, columns, deadline: float | None,
                    options: CGOptions, tol: float) -> tuple[Solved, dict]:
    """Solve at the smallest lossless step bound; returns the run and search statistics."""
    t0 = time.perf_counter()
    full = run_cg(prob, backend, prob.topo.num_nodes - 1, columns, deadline, options)
    z_star = full.result.rate
    pool = full.master.pool
    used = full.result.solution.y > 1e-12
    lo = int(min_steps_per_pair(prob).max())
    hi = int(pool.steps(prob.is_step_arc)[used].max())
    probes: list[tuple[int, float]] = []
    best: Solved | None = None
    known = _columns(full)
    while lo < hi:
        if deadline is not None and time.perf_counter() >= deadline:
            break
        mid = (lo + hi) // 2
        run = run_cg(prob, backend, mid, known, deadline, options)
        probes.append((mid, run.result.rate))
        known = _columns(run) if len(run.master.pool) >= len(known[0]) else known
        if run.result.rate >= (1 - tol) * z_star:
            hi, best = mid, run
        else:
            lo = mid + 1
    if best is None or best.max_steps != hi:
        best = run_cg(prob, backend, hi, _columns(full), deadline, options)
    stats = {"min_steps": hi, "unbounded_lp_rate_gbps": z_star, "step_probes": probes,
             "step_search_seconds": time.perf_counter() - t0}
    return best, stats
