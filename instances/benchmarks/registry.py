"""Benchmark case registry: synthesizers and LP models swept over fabric sizes
(docs/benchmarks.md).

A :class:`Case` is one (suite, method, backend, HPN shape, failure).  Running it times
four phases separately and records the quality beside the times:

=========  ==========================================================================
build      instance arrays / model construction (``problem_for``, compact LP + load)
solve      the LP optimum: column generation (paper §4.2), the compact LP (App. G.3),
           ForestColl Phase 1 cut search (§4.3)
round      LP solution -> executable schedule: deep-dive rounding to ``K`` chunks
           (AllToAll), tree budget + splitting + packing + mapping (AllGather)
validate   ``mccl_opt.validate`` of the schedule
=========  ==========================================================================

Quality: ``gap = 1 - rate / bound`` where ``bound`` is the optimum of the same run's
reference method (compact LP for AllToAll, cold ForestColl's cut search for AllGather),
and ``lp_gbps`` (each method's own LP optimum, which must equal the bound).  Methods:
``cold_cg`` / ``warm_cg`` (warm = re-synthesis from the healthy fabric's schedule),
``compact_lp`` (one commodity per source, the smaller compact model), ``forestcoll_cold``
/ ``forestcoll_warm``.  LP methods run on every installed backend.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from functools import lru_cache

from mccl_opt.errors import MCCLError
from mccl_opt.topology import Topology

from ..failures import apply_failure
from ..hpn import hpn, parse_shape

__all__ = ["Case", "CaseResult", "SUITES", "METHODS", "REFERENCE", "cases", "warmup",
           "run_case", "add_reference_ratios"]

METHODS = {"alltoall": ("compact_lp", "cold_cg", "warm_cg"),
           "allgather": ("forestcoll_cold", "forestcoll_warm")}
SUITES = ("alltoall", "allgather", "all")
REFERENCE = {"alltoall": ("compact_lp", "highs"), "allgather": ("forestcoll_cold", "maxflow")}
PHASES = ("build_s", "solve_s", "round_s", "validate_s")


@dataclass(frozen=True)
class Case:
    """One benchmark case."""

    suite: str
    method: str
    backend: str          # "maxflow" for ForestColl (no LP solver)
    shape: str            # HPN SxHxN
    failure: str | None   # None, fail1, fail2, fail3
    max_chunks: int = 10

    @property
    def id(self) -> str:
        return f"{self.suite}-{self.method}-{self.backend}-{self.shape}-{self.failure or 'healthy'}"

    def topology(self) -> Topology:
        return apply_failure(_healthy(self.shape), self.failure)


@dataclass
class CaseResult:
    """Phase times (s), quality and sizes of one run; ``error`` set if it could not run."""

    case: Case
    gpus: int
    build_s: float = 0.0
    solve_s: float = 0.0
    round_s: float = 0.0
    validate_s: float = 0.0
    lp_gbps: float = float("nan")
    rate_gbps: float = float("nan")
    bound_gbps: float = float("nan")
    gap: float = float("nan")
    vs_ref: float = float("nan")     # reference total time / this total time (>1: faster)
    extra: dict = field(default_factory=dict)
    error: str | None = None

    @property
    def total_s(self) -> float:
        """Synthesis time: build + solve + round (validation excluded)."""
        return self.build_s + self.solve_s + self.round_s

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(d.pop("case"))
        d["id"], d["total_s"] = self.case.id, self.total_s
        return d


@lru_cache(maxsize=16)
def _healthy(shape: str) -> Topology:
    return hpn(*parse_shape(shape))


@lru_cache(maxsize=16)
def _healthy_schedule(suite: str, shape: str, backend: str):
    """The healthy fabric's schedule a warm case starts from (solved once, untimed)."""
    if suite == "alltoall":
        from mccl_opt.alltoall import solve_alltoall

        return solve_alltoall(_healthy(shape), backend=backend)
    from mccl_opt.allgather import solve_allgather

    return solve_allgather(_healthy(shape))


def cases(suite: str = "all", sizes: tuple[str, ...] = ("1x2x8",),
          failures: tuple[str | None, ...] = ("fail2",), backends: tuple[str, ...] | None = None,
          methods: tuple[str, ...] | None = None) -> list[Case]:
    """The sweep: every method of the suite(s) × size × failure × installed backend."""
    from mccl_opt.backends import available_backends

    if suite not in SUITES:
        raise MCCLError(f"unknown suite {suite!r}; choose one of {', '.join(SUITES)}")
    backends = tuple(backends or available_backends())
    for shape in sizes:
        parse_shape(shape)                  # TopologyError names a bad shape early
    out = []
    for s in (("alltoall", "allgather") if suite == "all" else (suite,)):
        for shape in sizes:
            for failure in failures:
                for method in METHODS[s]:
                    if methods is not None and method not in methods:
                        continue
                    for be in (("maxflow",) if s == "allgather" else backends):
                        out.append(Case(s, method, be, shape, failure))
    return out


def warmup() -> None:
    """Compile the numba kernels (pricing, max-flow) outside the timings."""
    from mccl_opt.allgather import solve_allgather
    from mccl_opt.alltoall import solve_alltoall

    tiny = hpn(1, 2, 2)
    solve_alltoall(tiny)
    solve_allgather(tiny)


def _validate(res: CaseResult, topo: Topology, sched) -> None:
    from mccl_opt.validate import validate

    t = time.perf_counter()
    validate(topo, sched)
    res.validate_s = time.perf_counter() - t
    res.rate_gbps, res.lp_gbps = float(sched.rate_gbps), float(sched.lp_rate_gbps)


def _run_cg(case: Case, topo: Topology, res: CaseResult) -> None:
    from mccl_opt.alltoall import solve_alltoall
    from mccl_opt.alltoall.problem import problem_for

    warm = _healthy_schedule("alltoall", case.shape, case.backend) if case.method == "warm_cg" else None
    t = time.perf_counter()
    problem_for(topo)                       # cached: solve_alltoall reuses it
    res.build_s = time.perf_counter() - t
    sched = solve_alltoall(topo, warm=warm, backend=case.backend, max_chunks=case.max_chunks)
    res.solve_s = sched.stats["lp_phase_seconds"]
    res.round_s = sched.stats["seconds"] - sched.stats["lp_phase_seconds"]
    res.extra = {"rounds": sched.stats["rounds"], "columns": sched.stats["columns"],
                 "warm_columns": sched.stats["warm_columns"], "rounding": sched.stats["rounding"]}
    _validate(res, topo, sched)


def _run_compact(case: Case, topo: Topology, res: CaseResult) -> None:
    from formulations.compact import build_compact_lp
    from mccl_opt.backends import get_backend
    from mccl_opt.backends.base import SolveStatus

    ar = topo.arrays
    t = time.perf_counter()
    lp = build_compact_lp(topo.num_nodes, ar.tail, ar.head, ar.capacity, ar.is_switch,
                          ar.gpu_nodes, commodities="source")
    with get_backend(case.backend) as be:
        be.load(lp)
        res.build_s = time.perf_counter() - t
        t = time.perf_counter()
        sol = be.solve()
        res.solve_s = time.perf_counter() - t
    if sol.status != SolveStatus.OPTIMAL:
        raise MCCLError(f"{case.id}: compact LP ended {sol.status.name}")
    res.lp_gbps = float(sol.objective)
    res.extra = {"cols": lp.num_cols, "rows": lp.num_rows, "nnz": int(lp.A.nnz),
                 "schedule": "none (an LP optimum, not a schedule)"}


def _run_forestcoll(case: Case, topo: Topology, res: CaseResult) -> None:
    from mccl_opt.allgather import solve_allgather
    from mccl_opt.allgather.fabric import fabric_of

    warm = _healthy_schedule("allgather", case.shape, "") if case.method == "forestcoll_warm" else None
    t = time.perf_counter()
    fabric_of(topo)
    res.build_s = time.perf_counter() - t
    sched = solve_allgather(topo, warm=warm, max_chunks=case.max_chunks)
    res.solve_s = sched.stats["phase1_s"]
    res.round_s = sched.stats["total_s"] - sched.stats["phase1_s"]
    res.extra = {"k": sched.stats["k"], "trees": sched.stats["num_trees"],
                 "max_depth": sched.stats["max_depth"]}
    _validate(res, topo, sched)


_RUNNERS = {"cold_cg": _run_cg, "warm_cg": _run_cg, "compact_lp": _run_compact,
            "forestcoll_cold": _run_forestcoll, "forestcoll_warm": _run_forestcoll}


def run_case(case: Case) -> CaseResult:
    """Run one case; a solver/licence/synthesis failure is recorded in ``error``."""
    topo = case.topology()
    res = CaseResult(case, topo.num_gpus)
    try:
        _RUNNERS[case.method](case, topo, res)
    except MCCLError as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    return res


def add_reference_ratios(results: list[CaseResult]) -> list[CaseResult]:
    """Fill ``bound_gbps``, ``gap`` and ``vs_ref`` from each instance's reference run in
    ``results`` (the LP optimum it found and its total time)."""
    ref = {}
    for r in results:
        if (r.case.method, r.case.backend) == REFERENCE[r.case.suite] and r.error is None:
            ref[(r.case.suite, r.case.shape, r.case.failure)] = r
    for r in results:
        base = ref.get((r.case.suite, r.case.shape, r.case.failure))
        if base is None or r.error is not None:
            continue
        r.bound_gbps = base.lp_gbps
        achieved = r.lp_gbps if r.case.method == "compact_lp" else r.rate_gbps
        r.gap = 1.0 - achieved / base.lp_gbps
        r.vs_ref = base.total_s / r.total_s if r.total_s > 0 else float("nan")
    return results
