"""``solve_alltoall``: the public AllToAll synthesizer (paper §4.2, App. D, App. G).

Pipeline: instance arrays -> warm columns (if any) + initial columns -> column
generation to LP optimality with a certified bound -> deep-dive rounding to
``max_chunks`` chunks per pair -> a validated-shape :class:`~mccl_opt.Schedule` with the
bottleneck cut of the LP's saturated links.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from ..backends import get_backend
from ..errors import ScheduleError, SolveError
from ..schedule import PathChunk, Schedule, bottleneck_links, schedule_rate
from ..topology import Topology
from .colgen import CGOptions, CGResult, column_generation
from .initial import initial_columns
from .master import ColumnPool, RestrictedMaster
from .problem import Problem, problem_for
from .rounding import Rounded, deep_dive, rounded_rate
from .local import local_eligible, local_resolve, raises_a_binding_link, reuse_certified
from .warm import WarmState, changes_are_nonbinding, csr_take, reusable_basis, warm_columns

__all__ = ["solve_alltoall", "build_master", "Solved"]

SATURATION_REL_TOL = 1e-6
#: A warm master without a usable basis is rebuilt and presolved before every solve
#: from this many pairs up (256 GPUs); below, warm primal simplex after added columns is
#: faster (docs/alltoall.md, *Which columns carry over*).
PRESOLVE_EVERY_TIME_MIN_PAIRS = 30_000


@dataclass
class Solved:
    """A column-generation run: its master (live), result and step bound."""

    master: RestrictedMaster
    result: CGResult
    max_steps: int
    warm_columns: int


def build_master(prob: Problem, backend: str, max_steps: int,
                 columns: tuple[np.ndarray, ...] | None,
                 state: WarmState | None = None) -> tuple[RestrictedMaster, int]:
    """A master over the given columns ``(pair, start, arcs, origin)`` (those within
    ``max_steps``) plus initial columns for the pairs they miss.  With ``state``'s basis
    still optimal (:func:`reusable_basis`) the master starts from it; otherwise only the
    columns the old LP used are kept, and from :data:`PRESOLVE_EVERY_TIME_MIN_PAIRS`
    pairs up every solve is presolved (docs/alltoall.md).
    Returns the master and the number of carried-over columns."""
    pool = ColumnPool()
    basis = None
    if columns is not None:
        pair, start, arcs, origin = columns
        pool.append(pair, start, arcs, origin)
        if len(pool):
            pool.keep(pool.steps(prob.is_step_arc) <= max_steps)
        if state is not None:
            basis = reusable_basis(prob, state, pool, backend.lower())
            if basis is None and len(pool):
                carried_y = state.y[np.maximum(pool.origin, 0)]
                pool.keep((pool.origin < 0) | (carried_y > 0))
    carried = len(pool)
    missing = np.bincount(pool.pair, minlength=prob.num_pairs) == 0
    if missing.any():
        init = initial_columns(prob, max_steps, missing)
        pool.append(prob.pair_index(init.src, init.dst), init.start, init.arcs)
    master = RestrictedMaster(get_backend(backend), prob.num_pairs, prob.capacity, pool)
    if basis is not None:
        master.start_from(basis)
    elif carried:
        if prob.num_pairs >= PRESOLVE_EVERY_TIME_MIN_PAIRS:
            master.presolve_every_time()
    return master, carried


def run_cg(prob: Problem, backend: str, max_steps: int, columns, deadline: float | None,
           options: CGOptions, state: WarmState | None = None) -> Solved:
    """Build a master (warm from ``columns`` and ``state``'s basis) and run column
    generation on it."""
    master, carried = build_master(prob, backend, max_steps, columns, state)
    res = column_generation(master, prob, max_steps, options=options, deadline=deadline)
    return Solved(master, res, max_steps, carried)


def _check_args(topo: Topology, warm, max_chunks, max_steps, time_limit) -> None:
    if not isinstance(topo, Topology):
        raise TypeError(f"topo must be a mccl_opt.Topology, got {type(topo).__name__}")
    if max_chunks is not None and (isinstance(max_chunks, bool) or not isinstance(max_chunks, int)
                                   or max_chunks < 1):
        raise ValueError(f"max_chunks must be a positive integer or None, got {max_chunks!r}")
    if max_steps is not None and max_steps != "min" and (
            isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
        raise ValueError(f"max_steps must be None, a positive integer or 'min', got {max_steps!r}")
    if time_limit is not None and not time_limit > 0:
        raise ValueError(f"time_limit must be > 0 seconds, got {time_limit!r}")
    if isinstance(warm, Schedule) and warm.collective != "alltoall":
        raise ScheduleError(f"cannot warm-start AllToAll from a {warm.collective!r} schedule")


def solve_alltoall(topo: Topology, warm: Schedule | WarmState | None = None, backend: str = "highs",
                   max_chunks: int | None = 10, max_steps: int | str | None = None,
                   time_limit: float | None = None, *, rel_tol: float = 1e-7,
                   min_steps_tol: float = 1e-6) -> Schedule:
    """Synthesize an AllToAll schedule for ``topo`` (DESIGN.md §5).

    ``warm``: a previous schedule (or its ``warm_state``) whose still-valid columns seed
    the master.  ``max_chunks``: chunks of ``1/K`` per pair (``None``: the fractional LP
    optimum).  ``max_steps``: ``None`` (no bound), an int (GPU-arrivals per path) or
    ``"min"`` (the smallest bound that keeps the LP optimum within ``min_steps_tol``,
    paper App. D).  ``time_limit`` (s): return the best schedule found so far with
    ``stats["status"] == "time_limit"``.  ``rel_tol``: column generation stops when the
    master is within this relative gap of its certified bound.
    """
    _check_args(topo, warm, max_chunks, max_steps, time_limit)
    t0 = time.perf_counter()
    deadline = None if time_limit is None else t0 + float(time_limit)
    prob = problem_for(topo)
    options = CGOptions(rel_tol=rel_tol)
    state = warm.warm_state if isinstance(warm, Schedule) else warm
    state = state if isinstance(state, WarmState) else None
    steps = topo.num_nodes - 1 if max_steps in (None, "min") else int(max_steps)
    if max_steps != "min":
        sched = reuse_certified(prob, state, backend, steps, max_chunks, rel_tol)
        if sched is not None:
            sched.stats["seconds"] = sched.stats["lp_phase_seconds"] = time.perf_counter() - t0
            sched.solver["seconds"] = sched.stats["seconds"]
            return sched
    tried_local = (max_steps != "min" and local_eligible(prob, state, max_chunks)
                   and not (state.basis is not None and changes_are_nonbinding(prob, state))
                   and not raises_a_binding_link(prob, state))
    if tried_local:
        t_local = time.perf_counter()
        sched = local_resolve(prob, state, backend, steps, max_chunks, options, deadline)
        if sched is not None:
            sched.stats["lp_phase_seconds"] += t_local - t0
            sched.stats["seconds"] = time.perf_counter() - t0
            sched.solver["seconds"] = sched.stats["seconds"]
            return sched
    columns = warm_columns(prob, warm) if warm is not None else None
    search: dict = {}
    if max_steps == "min":
        from .latency import min_steps_solve

        solved, search = min_steps_solve(prob, backend, columns, deadline, options, min_steps_tol)
    else:
        solved = run_cg(prob, backend, steps, columns, deadline, options, state)
    lp_done = time.perf_counter()
    sched = _finish(prob, solved, backend, max_chunks, deadline, state)
    sched.stats.update(search)
    sched.stats["local_fallback"] = bool(tried_local)
    sched.stats["seconds"] = time.perf_counter() - t0
    sched.stats["lp_phase_seconds"] = lp_done - t0
    sched.solver["seconds"] = sched.stats["seconds"]
    return sched


def _finish(prob: Problem, solved: Solved, backend: str, max_chunks: int | None,
            deadline: float | None, old: WarmState | None) -> Schedule:
    master, res = solved.master, solved.result
    pool = master.pool
    y = res.solution.y
    lp_rate = res.rate
    lp_loads = pool.loads(y, prob.num_links)
    saturated = lp_loads >= prob.capacity * res.solution.t * (1 - SATURATION_REL_TOL)
    y_final = y.copy()                  # the dive appends columns to ``pool`` after these
    basis = master.get_basis()          # ... and moves the basis
    columns_final = len(pool)
    t_round = time.perf_counter()
    dive: dict = {}
    if max_chunks is None:
        rounded = _fractional(pool, y, prob)
    else:
        rounded, dive = deep_dive(master, prob, y, max_chunks, solved.max_steps, lp_rate,
                                  deadline=deadline)
    rounding_s = time.perf_counter() - t_round
    k = 1 if max_chunks is None else max_chunks
    chunks, used, loads = _chunks(prob, rounded, k, old)
    chunk_of = np.full(columns_final, -1, dtype=np.int64)
    in_cg = used < columns_final
    chunk_of[used[in_cg]] = np.flatnonzero(in_cg)
    routes = (rounded.pool_pair[used], *csr_take(rounded.pool_start, rounded.pool_arcs, used))
    warm_state = WarmState.from_pool(prob, pool, y_final, res.solution.t, basis, tuple(chunks),
                                     chunk_of, rounded.counts[used] / k, routes, max_chunks
                                     ).with_prices(res, prob, solved.max_steps)
    stats = {
        "status": res.status,
        "rounds": res.rounds,
        "columns": columns_final,
        "columns_dropped": res.dropped,
        "warm_columns": solved.warm_columns,
        "warm_basis": master.basis_used,
        "lp_seconds": res.lp_seconds,
        "pricing_seconds": res.pricing_seconds,
        "rounding_seconds": rounding_s,
        "lp_bound_gbps": res.rate_bound,
        "bound_history": [list(h) for h in res.history],
        "max_steps": solved.max_steps,
        "rounding": rounded.method,
        "warm_mode": "basis" if master.basis_used else ("full" if solved.warm_columns else "cold"),
        **dive,
    }
    return make_schedule(prob, chunks, loads, lp_rate, saturated, max_chunks, backend,
                         res.iterations, stats, warm_state)


def make_schedule(prob: Problem, chunks: list[PathChunk], loads: np.ndarray, lp_rate: float,
                  saturated: np.ndarray, max_chunks: int | None, backend: str, iterations: int,
                  stats: dict, warm_state: WarmState) -> Schedule:
    """The :class:`Schedule` of rounded ``chunks`` with per-link share ``loads``, and its
    bottleneck cut (the LP-``saturated`` links); ``stats["lp_gap"]`` uses the final rate."""
    rate = schedule_rate(prob.topo, loads)
    if not np.isfinite(rate):
        raise SolveError("rounding produced a schedule that loads no link; report this as a bug")
    if rate > lp_rate and rate <= lp_rate * (1 + 1e-9):
        lp_rate = rate                                  # float noise of the LP's t
    bound = stats["lp_bound_gbps"]
    stats["lp_gap"] = max(0.0, bound / lp_rate - 1.0) if lp_rate > 0 else 0.0
    bottleneck = bottleneck_links(prob.topo, loads, rate, max_chunks, saturated=saturated)
    return Schedule("alltoall", prob.topo.name, prob.topo.gpus, rate, lp_rate, max_chunks,
                    tuple(chunks), bottleneck, 1,
                    {"backend": backend, "seconds": 0.0, "iterations": iterations},
                    stats, warm_state)


def _fractional(pool: ColumnPool, y: np.ndarray, prob: Problem) -> Rounded:
    """The LP solution itself, as shares ``y_j / sum_p y`` (``max_chunks=None``)."""
    y = np.where(y > 1e-12, y, 0.0)
    total = np.bincount(pool.pair, weights=y, minlength=prob.num_pairs)
    shares = y / total[pool.pair]
    return Rounded(shares, rounded_rate(pool, shares, 1, prob.capacity), pool.pair.copy(),
                   pool.start.copy(), pool.arcs.copy(), pool.origin.copy(), "fractional")


def _chunks(prob: Problem, rounded: Rounded, k: int, old: WarmState | None
            ) -> tuple[list[PathChunk], np.ndarray, np.ndarray]:
    """Schedule chunks (ordered by pair, then column), the pool column of each, and the
    per-link share loads.  A column carried over from ``old`` whose share is unchanged
    reuses the old chunk object (same node ids, same share)."""
    topo = prob.topo
    gpus = topo.gpus
    used = np.flatnonzero(rounded.counts > 0)
    used = used[np.argsort(rounded.pool_pair[used], kind="stable")]
    start = rounded.pool_start
    shares = rounded.counts / k
    loads = np.bincount(rounded.pool_arcs,
                        weights=shares[np.repeat(np.arange(shares.size), np.diff(start))],
                        minlength=prob.num_links)
    out = np.empty(used.size, dtype=object)
    fresh = np.ones(used.size, dtype=bool)
    if old is not None and old.chunk_of is not None and old.chunk_share is not None:
        origin = rounded.pool_origin[used]
        cand = np.where(origin >= 0, old.chunk_of[np.maximum(origin, 0)], -1)
        same = cand >= 0
        same[same] = old.chunk_share[cand[same]] == shares[used[same]]
        if same.any():
            out[same] = old.chunk_array[cand[same]]
            fresh = ~same
    ids = np.array([n.id for n in topo.nodes], dtype=object)
    head = topo.arrays.head
    for i in np.flatnonzero(fresh).tolist():
        j = used[i]
        p = rounded.pool_pair[j]
        src = gpus[prob.pair_src[p]]
        path = (src, *ids[head[rounded.pool_arcs[start[j]:start[j + 1]]]].tolist())
        out[i] = PathChunk(src, gpus[prob.pair_dst[p]], float(shares[j]), path)
    return out.tolist(), used, loads
