"""The full column-generation run: build a (warm) master, solve it to LP optimality,
round it (paper §4.2, App. D).

:func:`run_cg` builds the restricted master over the carried-over columns (plus initial
columns for the pairs they miss) and runs :func:`~.colgen.column_generation`;
:func:`round_solved` rounds the result to ``max_chunks`` chunks per pair by the deep
dive (:mod:`.rounding`) and returns the :class:`~.assemble.Outcome` the assembler turns
into a schedule, with the warm state of the run.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import numpy as np

from .. import progress
from ..backends import get_backend
from .assemble import SATURATION_REL_TOL, Outcome, RunReport, WarmMode, fractional, rounded_columns
from .colgen import CGOptions, CGResult, column_generation
from .initial import certified_routing, initial_columns
from .master import ColumnPool, RestrictedMaster
from .pricing import PricedColumns
from .problem import Problem
from .rounding import deep_dive, dive_budget
from .rows import Rows, csr_take
from .state import ChunkRoutes, LPColumns, OldFabric, PricingCertificate, AllToAllWarmState
from .warm import reusable_basis, sharply_fallen

__all__ = ["Solved", "build_master", "cold_routing", "certified_cold_routing", "run_cg", "round_solved", "certificate_of",
           "PRESOLVE_EVERY_TIME_MIN_PAIRS"]

#: A warm master without a usable basis is rebuilt and presolved before every solve
#: from this many pairs up (256 GPUs); below, warm primal simplex after added columns is
#: faster (docs/alltoall.md, *Which columns carry over*).
PRESOLVE_EVERY_TIME_MIN_PAIRS = 30_000

#: Below :data:`PRESOLVE_EVERY_TIME_MIN_PAIRS` pairs the full master adds only the priced
#: columns whose reduced cost is at least this share of the round's largest
#: (:func:`.colgen.strongest_columns`; measured at 16-128 GPUs, docs/alltoall.md, *The last
#: rounds and the local try*); from there up, every priced column as before.
STRONGEST_COLUMNS = 0.5


@dataclass
class Solved:
    """A column-generation run: its master (live), result and step bound, and how many
    of its columns were carried over from a warm start."""

    master: RestrictedMaster
    result: CGResult
    max_steps: int
    warm_columns: int


def build_master(prob: Problem, backend: str, max_steps: int,
                 columns: tuple[np.ndarray, ...] | None,
                 state: AllToAllWarmState | None = None,
                 deadline: float | None = None,
                 routing: PricedColumns | None = None) -> tuple[RestrictedMaster, int]:
    """A master over the given columns ``(pair, start, arcs, origin)`` (those within
    ``max_steps``) plus initial columns for the pairs they miss.  With ``state``'s basis
    still optimal (:func:`~.warm.reusable_basis`) the master starts from it; otherwise
    only the columns the old LP used are kept, less those through a link that fell to
    :data:`~.warm.SHARP_FALL` of its capacity or below (:func:`~.warm.sharply_fallen`:
    their pairs get fresh initial columns), pairs with a single column stay out of
    the solver until they get a second one (``fix_single_pairs``), and from
    :data:`PRESOLVE_EVERY_TIME_MIN_PAIRS` pairs up every solve is presolved
    (docs/alltoall.md).  ``deadline``: a time limit's, the initial routing tries fewer
    wave counts when it leaves no room (:func:`.initial.initial_columns`).  ``routing``:
    the initial routing of every pair, already made (:func:`cold_routing`; cold starts
    only).  Returns the master and the number of carried-over columns."""
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
                carried_y = state.lp.y[np.maximum(pool.origin, 0)]
                pool.keep((pool.origin < 0) | (carried_y > 0))
                fell = sharply_fallen(prob, state)
                if len(pool) and fell.any():
                    pool.keep(pool.costs(fell.astype(float)) == 0)
    carried = len(pool)
    missing = np.bincount(pool.pair, minlength=prob.num_pairs) == 0
    if routing is not None and missing.all():
        pool.append(prob.pair_index(routing.src, routing.dst), routing.start, routing.arcs)
    elif missing.any():
        init = initial_columns(prob, max_steps, missing, deadline=deadline)
        pool.append(prob.pair_index(init.src, init.dst), init.start, init.arcs)
    master = RestrictedMaster(get_backend(backend), prob.num_pairs, prob.capacity, pool,
                              fix_single_pairs=basis is None)
    if basis is not None:
        master.start_from(basis)
    elif carried:
        if prob.num_pairs >= PRESOLVE_EVERY_TIME_MIN_PAIRS:
            master.presolve_every_time()
    return master, carried


def cold_routing(prob: Problem, max_steps: int, deadline: float | None
                 ) -> tuple[PricedColumns, float]:
    """The initial routing of every pair (:func:`.initial.initial_columns`) and the
    seconds it took: a cold solve under a time limit routes first, then decides whether
    the first master fits (:func:`.direct.no_room_for_master`)."""
    progress.update("AllToAll: routing the pairs")
    t = time.perf_counter()
    routing = initial_columns(prob, max_steps, np.ones(prob.num_pairs, dtype=bool),
                              deadline=deadline)
    return routing, time.perf_counter() - t


def certified_cold_routing(prob: Problem, max_steps: int) -> tuple[PricedColumns, float] | None:
    """A cold start's first routing and its seconds when it is provably optimal
    (:func:`.initial.certified_routing`), else ``None``: a warm solve after a repair
    checks it first, since a cold start that needs no LP round beats any warm master
    (docs/alltoall.md, *Warm is never the slow path*)."""
    t = time.perf_counter()
    routing = certified_routing(prob, max_steps)
    return None if routing is None else (routing, time.perf_counter() - t)


def run_cg(prob: Problem, backend: str, max_steps: int, columns, deadline: float | None,
           options: CGOptions, state: AllToAllWarmState | None = None,
           routing: tuple[PricedColumns, float] | None = None) -> Solved:
    """Build a master (warm from ``columns`` and ``state``'s basis; on ``routing``, a
    :func:`cold_routing` and its seconds, when given) and run column generation on it
    (under a deadline, the initial routing's time is the first pricing's expected cost:
    both price every source)."""
    progress.update("AllToAll: building the master")
    t = time.perf_counter()
    master, carried = build_master(prob, backend, max_steps, columns, state, deadline,
                                   None if routing is None else routing[0])
    routed_s = time.perf_counter() - t + (0.0 if routing is None else routing[1])
    strongest = STRONGEST_COLUMNS if prob.num_pairs < PRESOLVE_EVERY_TIME_MIN_PAIRS else 0.0
    res = column_generation(master, prob, max_steps,
                            options=dataclasses.replace(options, strongest=strongest),
                            deadline=deadline, pricing_s=routed_s, set_cut=True)
    return Solved(master, res, max_steps, carried)


def certificate_of(res: CGResult, prob: Problem, max_steps: int) -> PricingCertificate | None:
    """The prices of ``res``'s best Farley bound (else its last pricing) as a certificate
    (``None``: it did not price)."""
    if res.cert_w is not None and res.cert_sp is not None:
        return PricingCertificate(res.cert_w.copy(), res.cert_sp, max_steps)
    if res.shortest is None or res.shortest_w is None:
        return None
    sp = float(prob.pair_values(res.shortest).sum())
    return PricingCertificate(res.shortest_w.copy(), sp, max_steps)


def round_solved(prob: Problem, solved: Solved, backend: str, max_chunks: int | None,
                 deadline: float | None, old: AllToAllWarmState | None,
                 floor: float = 0.0) -> Outcome:
    """Round the LP of ``solved`` (deep dive, or the fractional shares when
    ``max_chunks`` is None) and collect the outcome and the run's warm state.  ``floor``:
    the rate of a schedule the caller keeps if better (:mod:`.kept`), the dive's bar."""
    master, res = solved.master, solved.result
    pool = master.pool
    y = res.solution.y
    lp_done = time.perf_counter()
    lp_loads = pool.loads(y, prob.num_links)
    saturated = lp_loads >= prob.capacity * res.solution.t * (1 - SATURATION_REL_TOL)
    y_final = y.copy()                  # the dive appends columns to ``pool`` after these
    basis = master.get_basis()          # ... and moves the basis
    columns_final = len(pool)
    lp = LPColumns.from_pool(pool, y_final, res.solution.t)
    t_round = time.perf_counter()
    progress.update("AllToAll: rounding (deep dive)")
    dive: dict = {}
    if max_chunks is None:
        rounded = fractional(pool, y, prob)
    else:
        rounded, dive = deep_dive(master, prob, y, max_chunks, solved.max_steps, res.rate,
                                  deadline=deadline, floor=floor,
                                  budget_s=dive_budget(res.lp_seconds + res.pricing_seconds))
    rounding_s = time.perf_counter() - t_round
    k = 1 if max_chunks is None else max_chunks
    used, loads = rounded_columns(prob, rounded, k)
    chunk_of = np.full(columns_final, -1, dtype=np.int64)
    in_cg = used < columns_final
    chunk_of[used[in_cg]] = np.flatnonzero(in_cg)
    routes = ChunkRoutes(rounded.pool_pair[used],
                         Rows(*csr_take(rounded.pool_start, rounded.pool_arcs, used)),
                         rounded.counts[used] / k, chunk_of, max_chunks)
    warm_state = AllToAllWarmState(OldFabric.of(prob), lp, routes, basis,
                           certificate_of(res, prob, solved.max_steps))
    mode = (WarmMode.BASIS if master.basis_used
            else WarmMode.FULL if solved.warm_columns else WarmMode.COLD)
    report = RunReport(
        status=res.status, warm_mode=mode, backend=backend, iterations=res.iterations,
        rounds=res.rounds, columns=columns_final, columns_dropped=res.dropped,
        warm_columns=solved.warm_columns, lp_bound_gbps=res.rate_bound,
        bound_history=[list(h) for h in res.history], max_steps=solved.max_steps,
        rounding=rounded.method, lp_seconds=res.lp_seconds, pricing_seconds=res.pricing_seconds,
        rounding_seconds=rounding_s,
        extra=dive if res.trouble is None else {**dive, "stopped_by": res.trouble})
    return Outcome(loads, res.rate, saturated, warm_state, report, lp_done)
