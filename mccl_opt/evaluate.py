"""The gray-failure experiment of the paper's Figure 9 (paper §6.1, docs/sim.md).

For a fabric and each degraded version of it (the paper's Fail1/Fail2/Fail3 come from
``instances.apply_failure``; the caller builds them, this layer does not import
instances), three schedules run in the simulator on the *degraded* fabric:

(a) the NCCL baselines built for the degraded fabric, named as NCCL's algorithms
    (``nccl-ring`` AllGather; ``nccl-pxn`` and ``nccl-direct`` AllToAll on a rail
    fabric, ``nccl-direct`` elsewhere); Figure 9 compares against the first,
(b) "no re-opt": the schedule synthesized for the healthy fabric, transplanted onto the
    degraded one (:func:`transplant`),
(c) "re-opt": the schedule re-synthesized for the degraded fabric,

and speedups are algbw ratios over (a).  The table also runs the bottleneck-cut check of
paper §3.2 (Algorithm 1) on (b): when the failure leaves the cut ``K_s`` saturated the
old schedule is still optimal and no re-synthesis is needed.

Message sizes follow the paper's "128 MB per source": an AllGather shard of
``message_bytes``; an AllToAll send buffer of ``message_bytes``, i.e. ``B =
message_bytes / N`` per ordered pair (README "Units and definitions").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from .baselines import direct_alltoall, pxn_alltoall, ring_allgather
from .errors import ScheduleError, TopologyError
from .link_rate import rate_of_loads
from .paths import path_nodes, switch_path
from .schedule import (PathChunk, Schedule, TreeChunk, chunk_counts, schedule_rate,
                       share_loads)
from .topology import Topology

__all__ = ["run_failure_experiment", "failure_cases", "FailureCase", "figure9_row", "nccl_baselines",
           "transplant", "cut_check", "COLLECTIVES", "NO_REOPT", "REOPT"]

COLLECTIVES = ("allgather", "alltoall")
DEFAULT_GAMMA = 0.05


# ---------------------------------------------------------------------- no re-opt
def _switch_route(topo: Topology, u: str, v: str) -> tuple[str, ...]:
    """The switch-only route ``u -> v`` the network takes (:func:`mccl_opt.paths.switch_path`)."""
    try:
        return path_nodes(topo, switch_path(topo, topo.node_index(u), topo.node_index(v)))
    except TopologyError as exc:
        raise ScheduleError(f"cannot transplant hop {u}->{v}: {exc}") from None


def _reroute(topo: Topology, path: Sequence[str], rename: dict[str, str]) -> tuple[str, ...]:
    nodes = [rename.get(x, x) for x in path]
    out = [nodes[0]]
    for u, v in zip(nodes[:-1], nodes[1:]):
        out += _switch_route(topo, u, v)[1:] if not topo.has_link(u, v) else [v]
    return tuple(out)


def transplant(schedule: Schedule, topo: Topology) -> Schedule:
    """Run an existing schedule on a changed fabric ("no re-opt").

    GPUs are matched by rank (Fail3's backup takes the failed GPU's rank); a hop that is
    no longer a link is replaced by the fewest-hop (then lowest-latency) switch route the network would use
    (e.g. ``g0 -> tor`` becomes ``g0-bk -> bk-tor -> tor``).  Rates are recomputed.
    """
    if len(schedule.gpus) != topo.num_gpus:
        raise ScheduleError(f"schedule has {len(schedule.gpus)} GPUs, {topo.name!r} has {topo.num_gpus}")
    rename = {old: new for old, new in zip(schedule.gpus, topo.gpus) if old != new}
    cache: dict[tuple[str, ...], tuple[str, ...]] = {}

    def move(path: tuple[str, ...]) -> tuple[str, ...]:
        if path not in cache:
            cache[path] = _reroute(topo, path, rename)
        return cache[path]

    chunks: list = []
    for c in schedule.chunks:
        if isinstance(c, PathChunk):
            chunks.append(PathChunk(rename.get(c.src, c.src), rename.get(c.dst, c.dst), c.share, move(c.path)))
        else:
            chunks.append(TreeChunk(rename.get(c.src, c.src), c.share, tuple(move(e) for e in c.edges)))
    loads = share_loads(topo, chunks)
    rate = schedule_rate(topo, loads)
    return Schedule(schedule.collective, topo.name, topo.gpus, rate, rate, schedule.max_chunks,
                    tuple(chunks), (), schedule.version, dict(schedule.solver, transplanted=True))


def cut_check(healthy: Schedule, stale: Schedule, topo: Topology,
              gamma: float = DEFAULT_GAMMA) -> tuple[bool, float]:
    """Paper §3.2 / Algorithm 1 on the stale schedule with capacities ``topo``:
    ``x_min = min_a M_a / n_a``; for each cut link the slack ``(M_a - n_a x_min) / M_a``
    is compared with its ``base_slack``.  Returns ``(reopt_needed, max_deviation)``; a
    cut link that no longer exists counts as deviation 1."""
    loads = share_loads(topo, stale.chunks)
    n = chunk_counts(loads, stale.max_chunks)
    cap = topo.arrays.capacity
    x_min = rate_of_loads(cap, n)
    rename = dict(zip(healthy.gpus, topo.gpus))
    worst = 0.0
    for b in healthy.bottleneck:
        src, dst = rename.get(b.src, b.src), rename.get(b.dst, b.dst)
        if not topo.has_link(src, dst):
            worst = 1.0
            continue
        a = topo.link_index(src, dst)
        slack = (cap[a] - n[a] * x_min) / cap[a]
        worst = max(worst, abs(slack - b.base_slack))
    return worst > gamma, worst


# ---------------------------------------------------------------------- experiment
NO_REOPT, REOPT = "mccl-no-reopt", "mccl-reopt"


@dataclass(frozen=True)
class FailureCase:
    """One degraded fabric and the schedules compared on it (paper §6.1).

    ``schedules`` maps a method to its schedule: the NCCL baselines under their NCCL
    names first (:func:`nccl_baselines`), then ``mccl-no-reopt`` (the healthy schedule
    transplanted) and ``mccl-reopt`` (re-synthesized); ``baseline`` is the one Figure 9
    compares against (the first baseline, ``None`` when none applies to the fabric);
    ``unavailable`` says why a baseline or ``mccl-no-reopt`` is missing (the healthy
    schedule has a hop the degraded network cannot route without a GPU forwarding).
    ``reopt_needed``/``cut_deviation`` come from :func:`cut_check` (``True``/1 when the
    healthy schedule cannot run).
    """

    failure: str
    topo: Topology
    schedules: dict[str, Schedule]
    baseline: str | None
    reopt_needed: bool
    cut_deviation: float
    unavailable: dict[str, str]


def nccl_baselines(topo: Topology, collective: str) -> tuple[dict[str, Schedule], dict[str, str]]:
    """NCCL's algorithms on ``topo`` (ring AllGather; PXN on HPN and direct AllToAll),
    and why any of them cannot be built there (e.g. a rank-order ring hop with no
    switch-only path on an irregular fabric)."""
    if collective == "allgather":
        builders = {"nccl-ring": ring_allgather}
    else:
        builders = {"nccl-pxn": pxn_alltoall} if topo.extra.get("family") == "hpn" else {}
        builders["nccl-direct"] = direct_alltoall
    built, unavailable = {}, {}
    for name, build in builders.items():
        try:
            built[name] = build(topo)
        except TopologyError as exc:
            unavailable[name] = str(exc)
    return built, unavailable


def _solve(topo: Topology, collective: str, backend: str) -> Schedule:
    if collective == "allgather":
        from .allgather import solve_allgather

        return solve_allgather(topo, backend=backend)
    from .alltoall import solve_alltoall

    return solve_alltoall(topo, backend=backend)


def failure_cases(topo: Topology, collective: str, failures: Mapping[str, Topology], *,
                  backend: str = "highs", gamma: float = DEFAULT_GAMMA,
                  progress: Callable[[str], None] | None = None) -> list[FailureCase]:
    """Synthesize once for the healthy ``topo`` and once per degraded fabric of
    ``failures`` (name -> topology with the same GPUs; ``topo`` itself stands for the
    healthy fabric, where no-reopt and reopt are the healthy schedule)."""
    if collective not in COLLECTIVES:
        raise ScheduleError(f"collective must be one of {COLLECTIVES}, got {collective!r}")
    say = progress or (lambda msg: None)
    say(f"{collective}: synthesizing for healthy {topo.name}")
    healthy = _solve(topo, collective, backend)
    cases = []
    for failure, degraded in failures.items():
        say(f"{collective}/{failure}: baseline, no re-opt and re-opt schedules")
        schedules, unavailable = nccl_baselines(degraded, collective)
        baseline = next(iter(schedules), None)
        if degraded is topo:
            schedules[NO_REOPT] = schedules[REOPT] = healthy
        else:
            try:
                schedules[NO_REOPT] = transplant(healthy, degraded)
            except ScheduleError as exc:
                unavailable[NO_REOPT] = f"the healthy schedule cannot run on {degraded.name}: {exc}"
            schedules[REOPT] = _solve(degraded, collective, backend)
        needed, deviation = (cut_check(healthy, schedules[NO_REOPT], degraded, gamma)
                             if NO_REOPT in schedules else (True, 1.0))
        cases.append(FailureCase(failure, degraded, schedules, baseline, bool(needed), float(deviation),
                                 unavailable))
    return cases


def figure9_row(case: FailureCase, collective: str, block_bytes: float,
                algbw: Mapping[str, float]) -> dict[str, Any]:
    """The Figure 9 row of one case from each method's simulated algbw (GB/s); the
    figures of a method the case lacks (no baseline applies, or the healthy schedule
    cannot run on the degraded fabric) and the speedups they enter are ``None``."""
    methods = {"baseline": case.baseline, "no_reopt": NO_REOPT, "reopt": REOPT}
    bw = {k: algbw[m] if m in case.schedules else None for k, m in methods.items()}
    rate = {k: case.schedules[m].rate_gbps if m in case.schedules else None for k, m in methods.items()}

    def speedup(k: str) -> float | None:
        return None if bw[k] is None or bw["baseline"] is None else bw[k] / bw["baseline"]

    return {
        "failure": case.failure, "collective": collective, "topology": case.topo.name,
        "gpus": case.topo.num_gpus, "block_bytes": block_bytes, "baseline": case.baseline,
        "baseline_algbw": bw["baseline"], "no_reopt_algbw": bw["no_reopt"], "reopt_algbw": bw["reopt"],
        "no_reopt_speedup": speedup("no_reopt"), "reopt_speedup": speedup("reopt"),
        "baseline_rate_gbps": rate["baseline"], "no_reopt_rate_gbps": rate["no_reopt"],
        "reopt_rate_gbps": rate["reopt"], "reopt_needed": case.reopt_needed,
        "cut_deviation": case.cut_deviation,
        "stale_still_optimal": rate["no_reopt"] is not None
        and bool(rate["no_reopt"] >= rate["reopt"] * (1 - 1e-6)),
    }


def run_failure_experiment(topo: Topology, collective: str, failures: Mapping[str, Topology],
                           message_bytes: float = 128 * 2**20, *,
                           backend: str = "highs", gamma: float = DEFAULT_GAMMA,
                           pieces: int | None = None, progress=None) -> list[dict[str, Any]]:
    """Figure 9: baseline vs no re-opt vs re-opt on each degraded fabric.

    ``failures`` maps a failure's name to the degraded fabric (same GPUs as ``topo``),
    e.g. ``{f: apply_failure(topo, f) for f in ("fail1", "fail2", "fail3")}``.

    Returns one row per failure with algbw (GB/s) of the three schedules, their speedups
    over the baseline, their fluid rates, and the cut check (``reopt_needed``).
    ``pieces=None`` simulates in fluid mode (fast, exact for rates); an integer cuts
    every chunk into that many pipelined pieces (slow on large fabrics).
    """
    from .sim import simulate

    block = message_bytes if collective == "allgather" else message_bytes / topo.num_gpus
    mode = {"fluid": True} if pieces is None else {"pieces": pieces}
    rows = []
    for case in failure_cases(topo, collective, failures, backend=backend, gamma=gamma,
                              progress=progress):
        algbw = {k: simulate(case.topo, case.schedules[k], block, **mode).algbw_gbytes_per_s
                 for k in (case.baseline, NO_REOPT, REOPT) if k in case.schedules}
        rows.append(figure9_row(case, collective, block, algbw))
    return rows
