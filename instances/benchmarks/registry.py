"""Benchmark case registry: synthesizers and LP models swept over fabric sizes
(docs/benchmarks.md).

A :class:`Case` is one (suite, method, backend, HPN shape, failure).  :func:`run_case`
runs it once and times four phases separately, with the quality beside the times:

=========  ==========================================================================
build      instance arrays / model construction (``problem_for``, compact LP + load)
solve      the LP optimum: column generation (paper §4.2), the compact LP (App. G.3),
           ForestColl Phase 1 cut search (§4.3)
round      LP solution -> executable schedule: deep-dive rounding to ``K`` chunks
           (AllToAll), tree budget + splitting + packing + mapping (AllGather), and
           whatever else the synthesizer's call does
validate   ``mccl_opt.validate`` of the schedule
=========  ==========================================================================

The synthesizer's call is timed from outside (``solve`` is its own LP-phase timer, and
``round`` the rest of the call), so ``build + solve + round`` is what a caller waits for.

Methods: ``compact_lp`` (one commodity per source, the AllToAll reference), ``cold_cg``
/ ``warm_cg`` (column generation from scratch / re-synthesis from the healthy fabric's
schedule, §4.2), ``forestcoll_cold`` (the AllGather reference) / ``forestcoll_warm``
(§4.3).  LP methods run on each requested backend.  Every run builds its fabric afresh
and a warm run starts from a freshly solved healthy schedule (solved untimed), so no
run reuses what an earlier one cached on those objects.  Repeats, medians and the
ratios to the reference live in :mod:`.repeat`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from mccl_opt.errors import MCCLError, SolverLicenseError, SolverNotAvailableError
from mccl_opt.topology import Topology

from ..failures import FAILURES, apply_failure
from ..hpn import hpn, parse_shape

__all__ = ["Case", "CaseResult", "SUITES", "METHODS", "REFERENCE", "PHASES", "cases",
           "run_case", "not_installed"]

METHODS = {"alltoall": ("compact_lp", "cold_cg", "warm_cg"),
           "allgather": ("forestcoll_cold", "forestcoll_warm")}
SUITES = ("alltoall", "allgather", "all")
#: The method whose optimum is each suite's bound and whose time ``vs ref`` divides by.
REFERENCE = {"alltoall": "compact_lp", "allgather": "forestcoll_cold"}
PHASES = ("build_s", "solve_s", "round_s", "validate_s")
#: The backend ForestColl cases are listed under (it solves max-flows, no LP).
MAXFLOW = "maxflow"


@dataclass(frozen=True)
class Case:
    """One benchmark case."""

    suite: str
    method: str
    backend: str          # MAXFLOW for ForestColl (no LP solver)
    shape: str            # HPN SxHxN
    failure: str | None   # None, fail1, fail2, fail3
    max_chunks: int = 10

    @property
    def id(self) -> str:
        return f"{self.suite}-{self.method}-{self.backend}-{self.shape}-{self.failure or 'healthy'}"

    @property
    def num_gpus(self) -> int:
        s, h, n = parse_shape(self.shape)
        return s * h * n

    def topology(self) -> Topology:
        """A freshly built fabric (nothing cached on it by an earlier run)."""
        return apply_failure(hpn(*parse_shape(self.shape)), self.failure)


@dataclass
class CaseResult:
    """Phase times (wall-clock s), CPU time and quality of one run.  ``status`` is ``ok``, ``skipped`` (the
    backend is not installed or its licence cannot solve this size) or ``error`` (the
    method failed); ``reason`` says why for the last two."""

    case: Case
    gpus: int
    build_s: float = 0.0
    solve_s: float = 0.0
    round_s: float = 0.0
    validate_s: float = 0.0
    cpu_s: float = 0.0    # process CPU time (all threads) of the timed calls
    lp_gbps: float = float("nan")
    rate_gbps: float = float("nan")
    extra: dict = field(default_factory=dict)
    status: str = "ok"
    reason: str | None = None

    @property
    def total_s(self) -> float:
        """Synthesis time: build + solve + round (validation excluded)."""
        return self.build_s + self.solve_s + self.round_s


def cases(suite: str = "all", sizes: tuple[str, ...] = ("1x2x8",),
          failures: tuple[str | None, ...] = ("fail2",), backends: tuple[str, ...] | None = None,
          methods: tuple[str, ...] | None = None, max_chunks: int = 10) -> list[Case]:
    """The sweep: every method of the suite(s) × size × failure × backend (default: the
    installed ones; a named backend that is not installed gives cases that run as
    ``skipped``).  Within an instance the cases of one backend are adjacent (compact LP,
    cold, warm), so repeated rounds alternate cold and warm runs."""
    from mccl_opt.backends import BACKENDS, available_backends

    if suite not in SUITES:
        raise MCCLError(f"unknown suite {suite!r}; choose one of {', '.join(SUITES)}")
    unknown = sorted(set(backends or ()) - set(BACKENDS))
    if unknown:
        raise MCCLError(f"unknown backend(s) {', '.join(unknown)}; choose from "
                        f"{', '.join(BACKENDS)}")
    if max_chunks < 1:
        raise MCCLError(f"max_chunks must be >= 1, got {max_chunks}")
    backends = tuple(backends or available_backends())
    for shape in sizes:
        parse_shape(shape)                  # TopologyError names a bad shape early
    bad = [f for f in failures if f is not None and f not in FAILURES]
    if bad:
        raise MCCLError(f"unknown failure(s) {', '.join(map(str, bad))}; choose from "
                        f"{', '.join(FAILURES)} or none")
    if not sizes or not failures:
        raise MCCLError("no case to run: give at least one size and one failure")
    out = []
    for s in (("alltoall", "allgather") if suite == "all" else (suite,)):
        chosen = [m for m in METHODS[s] if methods is None or m in methods]
        for shape in sizes:
            for failure in failures:
                for be in ((MAXFLOW,) if s == "allgather" else backends):
                    out += [Case(s, m, be, shape, failure, max_chunks) for m in chosen]
    return out


def not_installed() -> dict[str, str]:
    """Known LP backends whose solver package is missing -> how to install it (the
    default sweep runs only installed ones; reports name these)."""
    from mccl_opt.backends import BACKENDS, backend_class

    out = {}
    for name in BACKENDS:
        cls = backend_class(name)
        if not cls.is_available():
            out[name] = f"not installed: pip install {cls.pip_package}"
    return out


def _previous(case: Case):
    """The healthy fabric's schedule a warm case starts from (solved afresh, untimed)."""
    healthy = hpn(*parse_shape(case.shape))
    if case.suite == "alltoall":
        from mccl_opt.alltoall import solve_alltoall

        return solve_alltoall(healthy, backend=case.backend, max_chunks=case.max_chunks)
    from mccl_opt.allgather import solve_allgather

    return solve_allgather(healthy, max_chunks=case.max_chunks)


def _validate(res: CaseResult, topo: Topology, sched) -> None:
    from mccl_opt.validate import validate

    t = time.perf_counter()
    validate(topo, sched)
    res.validate_s = time.perf_counter() - t
    res.rate_gbps, res.lp_gbps = float(sched.rate_gbps), float(sched.lp_rate_gbps)


def _run_cg(case: Case, topo: Topology, res: CaseResult) -> None:
    from mccl_opt.alltoall import solve_alltoall
    from mccl_opt.alltoall.problem import problem_for

    warm = _previous(case) if case.method == "warm_cg" else None
    cpu, t = time.process_time(), time.perf_counter()
    problem_for(topo)                       # cached on topo: solve_alltoall reuses it
    res.build_s = time.perf_counter() - t
    t = time.perf_counter()
    sched = solve_alltoall(topo, warm=warm, backend=case.backend, max_chunks=case.max_chunks)
    call = time.perf_counter() - t
    res.cpu_s = time.process_time() - cpu
    res.solve_s = sched.stats["lp_phase_seconds"]
    res.round_s = max(0.0, call - res.solve_s)  # rounding and everything else the call does
    res.extra = {"rounds": sched.stats["rounds"], "columns": sched.stats["columns"],
                 "warm_columns": sched.stats["warm_columns"], "rounding": sched.stats["rounding"]}
    _validate(res, topo, sched)


def _run_compact(case: Case, topo: Topology, res: CaseResult) -> None:
    from formulations.compact import build_compact_lp
    from mccl_opt.backends import get_backend
    from mccl_opt.backends.base import SolveStatus

    ar = topo.arrays
    cpu, t = time.process_time(), time.perf_counter()
    lp = build_compact_lp(topo.num_nodes, ar.tail, ar.head, ar.capacity, ar.is_switch,
                          ar.gpu_nodes, commodities="source")
    with get_backend(case.backend) as be:
        be.load(lp)
        res.build_s = time.perf_counter() - t
        t = time.perf_counter()
        sol = be.solve()
        res.solve_s = time.perf_counter() - t
        res.cpu_s = time.process_time() - cpu
    if sol.status != SolveStatus.OPTIMAL:
        raise MCCLError(f"{case.id}: compact LP ended {sol.status.name}")
    res.lp_gbps = float(sol.objective)
    res.extra = {"cols": lp.num_cols, "rows": lp.num_rows, "nnz": int(lp.A.nnz),
                 "schedule": "none (an LP optimum, not a schedule)"}


def _run_forestcoll(case: Case, topo: Topology, res: CaseResult) -> None:
    from mccl_opt.allgather import solve_allgather
    from mccl_opt.allgather.fabric import fabric_of

    warm = _previous(case) if case.method == "forestcoll_warm" else None
    t = time.perf_counter()
    fabric_of(topo)
    res.build_s = time.perf_counter() - t
    cpu, t = time.process_time(), time.perf_counter()
    sched = solve_allgather(topo, warm=warm, max_chunks=case.max_chunks)
    call = time.perf_counter() - t
    res.cpu_s = time.process_time() - cpu
    # solve_allgather builds the integer fabric again inside the call: the phases are cut
    # out of the call's time, so build + solve + round == the call
    res.solve_s = sched.stats["phase1_s"]
    res.round_s = max(0.0, call - res.solve_s - res.build_s)
    res.extra = {"k": sched.stats["k"], "trees": sched.stats["num_trees"],
                 "max_depth": sched.stats["max_depth"]}
    _validate(res, topo, sched)


_RUNNERS = {"cold_cg": _run_cg, "warm_cg": _run_cg, "compact_lp": _run_compact,
            "forestcoll_cold": _run_forestcoll, "forestcoll_warm": _run_forestcoll}


def run_case(case: Case) -> CaseResult:
    """Run one case once.  A backend that is not installed or a size-limited licence
    makes the result ``skipped``; any other library error makes it ``error``; both keep
    the message in ``reason``."""
    res = CaseResult(case, case.num_gpus)
    try:
        _RUNNERS[case.method](case, case.topology(), res)
    except (SolverNotAvailableError, SolverLicenseError) as exc:
        res.status, res.reason = "skipped", str(exc)
    except MCCLError as exc:
        res.status, res.reason = "error", f"{type(exc).__name__}: {exc}"
    return res
