"""Step-aware switch removal for AllGather (paper App. C; docs/allgather.md).

Replaces Phases 2+3 by: a hop-indexed LP over the star switches
(:func:`formulations.switch_removal.build_step_lp`) that splits each switch's units
into logical GPU links *and* plans, per root, tree edges by depth, for the smallest
depth bound ``D`` whose relaxation is feasible (infeasible ``D`` is a proven lower
bound); rooted cut conditions on the logical graph are added lazily by max-flow
separation (cutting planes).  The LP split is made integral switch by switch (``floor``,
fractional parts, then an integral transport completion) and packed by a
layer-synchronous, depth-capped BFS that follows the LP's per-root plan.  A completed
packing respects every unit (rate ``k·y``, certified by construction).  The default
Phases 2+3 run too and the shallower result is returned, so step-aware is never deeper
than the default.

:func:`switch_removal_lp` exposes the converged LP of a topology (with every separated
cut row) for export (``mccl export mps --model switch-removal``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from formulations.lp import LinearProgram
from formulations.names import FabricLabels
from formulations.switch_removal import (SwitchRemovalModel, build_step_lp,
                                         build_switch_removal_lp, hop_columns, logical_links)

from mccl_opt import progress
from mccl_opt.backends import get_backend
from mccl_opt.backends.base import SolveStatus
from mccl_opt.errors import InputError, SolveError
from mccl_opt.topology import Topology
from .capped import allowances, candidates, depth_key, eccentricity
from .maxflow import INF, FlowNetwork
from .pack_steps import Packed, Packing, SplitKind, pack
from .pipeline import balanced_split, check_inputs, phase_one_budget
from .removal.splitting import LogicalGraph, SplitGraph
from .removal.transport import transport

__all__ = ["CutLoop", "StepAware", "solve_cut_lp", "step_aware_pack", "switch_removal_lp",
           "converged_switch_removal", "switch_removal_model"]

_SCALE = 1 << 20          # fixed-point scale of fractional logical capacities in max-flow


@dataclass(frozen=True)
class StepAware:
    """Options of step-aware switch removal.

    ``tolerance``: fraction of the rate that may be given up for depth (trees per root
    kept: ``ceil(k (1 - tolerance))``, so the rate stays >= ``(1 - tolerance)`` of the
    optimum); ``objective``: ``"steps"`` (hop-indexed LP: smallest depth bound whose
    relaxation is feasible, mean depth minimised) or ``"even"`` (water-fill the logical
    units of switch-sharing pairs; no depth variables, cheaper on large fabrics);
    ``max_rounds``: cutting-plane rounds before giving up on the LP; ``max_columns``:
    the largest hop LP tried (``L·(1 + (D-1)(N-2))`` columns for ``L`` logical links,
    ``N`` GPUs and depth bound ``D``: 360k at 128 GPUs and D = 4, about 4 minutes on 2
    cores); depth bounds beyond it are not tried, and when none fits the default
    packing is returned with ``stats["sa_skipped"]`` saying why (512 GPUs need 18M).
    """

    tolerance: float = 0.0
    objective: str = "steps"
    max_rounds: int = 60
    max_columns: int = 1_000_000

    def __post_init__(self) -> None:
        if not 0.0 <= self.tolerance < 1.0:
            raise InputError(f"tolerance must be in [0, 1), got {self.tolerance!r}")
        if self.objective not in ("steps", "even"):
            raise InputError(f"objective must be 'steps' or 'even', "
                             f"got {self.objective!r}")
        if self.max_rounds < 1:
            raise InputError("max_rounds must be >= 1")
        if self.max_columns < 1:
            raise InputError("max_columns must be >= 1")


# ---------------------------------------------------------------------- model
def _has_switch_neighbour(g: SplitGraph, w: int) -> bool:
    return any(g.is_switch[b] for _, b in g.out_arcs(w)) or \
        any(g.is_switch[a] for a, _ in g.in_arcs(w))


def _realize(g: SplitGraph, w: int, seed: dict[tuple[int, int], float] | None) -> None:
    """Split every unit of switch ``w``: each pair ``(u, t)`` first gets
    ``floor(seed)``, then up to ``ceil(seed)``, then whatever completes the transport
    (:func:`.removal.transport.transport`; ``seed=None``: proportional shares as the seed)."""
    ins, outs = g.in_arcs(w), g.out_arcs(w)
    us, ts = [a for a, _ in ins], [b for _, b in outs]
    supply = np.array([g.units[a] for a in ins], np.int64)
    demand = np.array([g.units[a] for a in outs], np.int64)
    pairs = [(i, j) for i in range(len(us)) for j in range(len(ts)) if us[i] != ts[j]]
    if seed is None:
        total = max(int(supply.sum()), 1)
        seed = {(us[i], ts[j]): supply[i] * demand[j] / total for i, j in pairs}
    amounts = np.zeros(len(pairs), np.int64)
    for i_p, (i, j) in enumerate(pairs):      # stage 0: floor(seed) is always feasible
        take = min(int(math.floor(seed.get((us[i], ts[j]), 0.0) + 1e-9)), supply[i], demand[j])
        amounts[i_p] = take
        supply[i] -= take
        demand[j] -= take
    if pairs:                        # then up to ceil(seed), then any completion
        frac = [seed.get((us[i], ts[j]), 0.0) for i, j in pairs]
        amounts += transport(len(us), len(ts), np.array([i for i, _ in pairs], np.int64),
                             np.array([j for _, j in pairs], np.int64), supply, demand,
                             [np.array([int(math.ceil(s - 1e-9)) - int(math.floor(s + 1e-9))
                                        for s in frac], np.int64), None])
    for i_p, (i, j) in enumerate(pairs):
        g.split(us[i], w, ts[j], int(amounts[i_p]))
    for i, u in enumerate(us):        # units that can only loop back (u -> w -> u)
        if supply[i]:
            g.split(u, w, u, int(supply[i]))
    for j, t in enumerate(ts):        # unbalanced leftovers are dropped
        if demand[j] and (w, t) in g.units:
            g.reduce((w, t), int(demand[j]))


def _reduce_to_stars(g: SplitGraph) -> list[int]:
    """Split (proportionally) every switch with a switch neighbour until only star
    switches remain; returns the star switches."""
    while True:
        sw = [w for w in np.flatnonzero(g.is_switch).tolist() if g.in_arcs(w) or g.out_arcs(w)]
        inner = [w for w in sw if _has_switch_neighbour(g, w)]
        if not inner:
            return sw
        _realize(g, min(inner, key=lambda w: (-len(g.in_arcs(w)), w)), None)


def switch_removal_model(g: SplitGraph, stars: list[int], rank_of: np.ndarray,
                         k_keep: int) -> tuple[SwitchRemovalModel, list]:
    """The LP arrays of ``g``'s star switches; also the ``(u, w, t)`` node triples."""
    arcs: list[tuple[int, int]] = []
    index: dict[tuple[int, int], int] = {}
    triples: list[tuple[int, int, int]] = []
    for w in stars:
        ins, outs = g.in_arcs(w), g.out_arcs(w)
        for a in ins + outs:
            index[a] = len(arcs)
            arcs.append(a)
        triples += [(u, w, t) for (u, _) in ins for (_, t) in outs if u != t]
    direct = sorted(a for a in g.units if not g.is_switch[a[0]] and not g.is_switch[a[1]])
    model = SwitchRemovalModel(
        num_gpus=int(g.gpus.size),
        arc_units=np.array([g.units[a] for a in arcs], float),
        triple_in=np.array([index[(u, w)] for u, w, _ in triples], np.int64),
        triple_out=np.array([index[(w, t)] for _, w, t in triples], np.int64),
        triple_u=np.array([rank_of[u] for u, _, _ in triples], np.int64),
        triple_t=np.array([rank_of[t] for _, _, t in triples], np.int64),
        direct_tail=np.array([rank_of[a] for a, _ in direct], np.int64),
        direct_head=np.array([rank_of[b] for _, b in direct], np.int64),
        direct_units=np.array([g.units[a] for a in direct], float),
        k_keep=float(k_keep), arc_nodes=np.array(arcs, np.int64).reshape(-1, 2))
    return model, triples


def _violated_cuts(cap: np.ndarray, k_keep: int) -> list[np.ndarray]:
    """GPU sets ``S`` (sink sides of min-cuts, one per failing sink) with
    ``L(δ⁻(S)) < k_keep |V \\ S|``, by max-flow in fixed point (a violation below one
    fixed-point unit per arc, ``|arcs| / 2**20``, counts as rounding)."""
    n = cap.shape[0]
    tail, head = np.nonzero(cap > 1e-12)
    net = FlowNetwork(n, tail, head)
    caps = net.caps()
    caps[: net.m] = np.floor(cap[tail, head] * _SCALE).astype(np.int64)
    caps[net.s_arc0: net.s_arc0 + n] = k_keep * _SCALE
    # flooring loses < 1 fixed-point unit per arc of a min-cut: tight cuts are not violated
    need = k_keep * n * _SCALE - max(net.m, int(1e-7 * k_keep * n * _SCALE))
    found: dict[bytes, np.ndarray] = {}
    for sink in range(n):
        caps[net.t_arc0 + sink] = INF
        if net.max_flow(caps) < need:
            mask = ~net.source_side()
            found.setdefault(mask.tobytes(), mask)
        caps[net.t_arc0 + sink] = 0
    return list(found.values())


@dataclass(frozen=True)
class CutLoop:
    """Outcome of the cutting-plane loop: ``status`` is ``"optimal"``, ``"infeasible"``
    (the hop LP: no packing of that depth exists) or ``"unconverged"`` (``max_rounds``
    hit); ``cuts``: every GPU set of the final LP's cut rows, in row order (the initial
    in/out-degree sets first); ``x``, ``objective``: the final solution (optimal only)."""

    status: str
    cuts: list[np.ndarray]
    x: np.ndarray | None = None
    objective: float | None = None


def _cut_lp(model: SwitchRemovalModel, cuts: list[np.ndarray],
            max_depth: int | None) -> LinearProgram:
    """The even (``max_depth=None``) or hop-indexed LP with the cut rows of ``cuts``."""
    return (build_switch_removal_lp(model, cuts) if max_depth is None
            else build_step_lp(model, max_depth, cuts)[0])


def solve_cut_lp(model: SwitchRemovalModel, backend: str, max_rounds: int,
              stats: dict[str, Any], max_depth: int | None) -> CutLoop:
    """Cutting-plane loop over the even (``max_depth=None``) or the hop-indexed LP,
    starting from the in- and out-degree cut of every GPU and adding the violated cuts
    separated by max-flow each round (App. C); the solution vector has the triple
    amounts ``f`` first."""
    n = model.num_gpus
    eye = np.eye(n, dtype=bool)
    cuts = list(eye) + list(~eye)          # in- and out-degree of every GPU
    lp = _cut_lp(model, cuts, max_depth)
    solver = get_backend(backend)
    try:
        solver.load(lp)
        for rounds in range(1, max_rounds + 1):
            progress.update("AllGather step-aware: switch-removal LP, cutting planes", rounds)
            sol = solver.solve()
            if sol.status in (SolveStatus.INFEASIBLE, SolveStatus.INFEASIBLE_OR_UNBOUNDED):
                return CutLoop("infeasible", cuts)
            if sol.status != SolveStatus.OPTIMAL or sol.x is None:
                raise SolveError(f"step-aware switch removal LP ended {sol.status.value} "
                                 f"in round {rounds}; try another backend")
            f = np.maximum(sol.x[: model.num_triples], 0.0)
            new = _violated_cuts(model.logical(f), int(model.k_keep))
            stats["sa_rounds"] = stats.get("sa_rounds", 0) + 1
            stats["sa_lp_cols"] = lp.num_cols
            if not new:
                return CutLoop("optimal", cuts, np.maximum(sol.x, 0.0), float(sol.objective))
            lo, hi, A = model.cut_rows(new, lp.num_cols)
            solver.add_rows(lo, hi, A.indptr.astype(np.int64), A.indices.astype(np.int64),
                            A.data)
            cuts += new
        return CutLoop("unconverged", cuts)
    finally:
        solver.close()


def switch_removal_lp(topo: Topology, *, max_chunks: int | None = 10,
                      max_depth: int | None = None, backend: str = "highs",
                      max_rounds: int = 60) -> tuple[LinearProgram, float]:
    """The converged switch-removal LP of ``topo`` (:func:`converged_switch_removal`), with
    every separated cut row (solved alone, it reproduces the optimum), and its optimum."""
    model, loop = converged_switch_removal(topo, max_chunks=max_chunks, max_depth=max_depth,
                                           backend=backend, max_rounds=max_rounds)
    lp = _cut_lp(model, loop.cuts, max_depth)
    lp.name = f"{topo.name}-switch-removal"
    return lp, float(loop.objective)


def converged_switch_removal(topo: Topology, *, max_chunks: int | None = 10,
                             max_depth: int | None = None, backend: str = "highs",
                             max_rounds: int = 60) -> tuple[SwitchRemovalModel, CutLoop]:
    """The switch-removal model of ``topo`` and its converged cutting-plane loop (App. C).

    Runs what :func:`~mccl_opt.allgather.solve_allgather` runs before switch removal
    (Phase 1, the chunk budget for ``max_chunks``, switch balancing), reduces the fabric
    to star switches, and solves the even LP (``max_depth=None``: maximise the
    water-filling utility of the logical capacities, in tree units) or the hop-indexed LP
    of depth ``max_depth`` (minimise the summed depth of tree edges) by cutting planes
    on ``backend`` until no rooted cut condition is violated (``k`` trees per root).
    Raises :class:`SolveError` if the fabric has no switch to remove, the hop LP is
    infeasible (no packing of depth ``max_depth`` exists) or the loop does not converge
    within ``max_rounds`` rounds.
    """
    check_inputs(topo, max_chunks)
    if max_depth is not None and max_depth < 1:
        raise InputError(f"max_depth must be a positive integer or None, got {max_depth!r}")
    stats: dict[str, Any] = {}
    budget = phase_one_budget(topo, max_chunks, stats)
    arr = topo.arrays
    balanced = balanced_split(budget.fab, arr.is_switch, budget.k, budget.y, max_chunks)
    split, k = balanced.split, balanced.k
    stars = _reduce_to_stars(split)
    model, _ = switch_removal_model(split, stars, arr.rank_of, k)
    model = replace(model, labels=FabricLabels.of([n.id for n in topo.nodes], arr.tail,
                                                  arr.head, arr.gpu_nodes))
    if model.num_triples == 0:
        raise SolveError(f"{topo.name} has no switch joining two GPUs, so its switch-removal "
                         "model is empty; export another model for switchless fabrics")
    loop = solve_cut_lp(model, backend, max_rounds, stats, max_depth)
    if loop.status == "infeasible":
        raise SolveError(f"{topo.name}: the hop-indexed switch-removal LP is infeasible at "
                         f"max_depth={max_depth} (no {k}-tree packing that shallow exists); "
                         "raise max_depth")
    if loop.status != "optimal":
        raise SolveError(f"{topo.name}: switch-removal cutting planes did not converge in "
                         f"{max_rounds} rounds; raise max_rounds")
    return model, loop


def _feasible_depths(model: SwitchRemovalModel, limit: int, solve, stats: dict[str, Any],
                     max_columns: int) -> list[int]:
    """Depth bounds worth packing: from the smallest whose hop LP is feasible (binary
    search; feasibility is monotone in the bound) up to ``limit - 1``, bounds whose LP
    exceeds ``max_columns`` left out.  The smallest feasible bound, or the next bound if
    the largest tried is infeasible, is a lower bound on the depth of any packing
    (``stats['sa_depth_lower_bound']``)."""
    links = logical_links(model)
    low = max(eccentricity(LogicalGraph(model.num_gpus, links[:, 0], links[:, 1],
                                         np.ones(len(links), np.int64), [])), 1)
    n = model.num_gpus

    def columns(depth: int) -> int:
        return len(links) * (1 + (depth - 1) * max(n - 2, 0))

    high = limit - 1
    while high >= low and columns(high) > max_columns:
        high -= 1
    if high < low:
        if limit - 1 >= low:
            stats["sa_skipped"] = (f"the hop LP at depth {low} has {columns(low)} columns, "
                                   f"more than max_columns={max_columns}; default packing kept")
        else:
            stats["sa_depth_lower_bound"] = low
        return []
    if solve(high) is None:
        stats["sa_depth_lower_bound"] = high + 1
        return []
    while low < high:
        mid = (low + high) // 2
        if solve(mid) is None:
            low = mid + 1
        else:
            high = mid
    stats["sa_depth_lower_bound"] = high
    return list(range(high, limit))


def _verdict(shallower: bool, found: tuple[int, float], default: tuple[int, float],
             skipped: str | None) -> str:
    """``stats['step_aware']``: whether step-aware found trees shallower than the default
    packing's (max depth, then mean depth), and why not when it did not."""
    if shallower:
        return (f"shallower trees: max depth {found[0]}, mean {found[1]:.3g} "
                f"(default trees: {default[0]}, {default[1]:.3g})")
    why = f"; {skipped}" if skipped else ""
    return f"nothing shallower than the default trees (max depth {default[0]}){why}"


def step_aware_pack(split: SplitGraph, rank_of: np.ndarray, k: int,
                    guides: dict[int, np.ndarray], stats: dict[str, Any],
                    backend: str = "highs", options: StepAware | None = None,
                    ) -> Packed:
    """Phases 2+3 with step-aware switch removal on a balanced ``split`` (tree units).

    Returns the shallowest of the default packing (:func:`.pack_steps.pack`) and the
    packings of each LP-feasible depth bound below it (max depth, then unit-weighted
    mean depth; ties keep more trees).
    """
    opts = options or StepAware()
    t0 = time.perf_counter()
    progress.update("AllGather step-aware: default packing, for comparison")
    default = pack(split, rank_of, k, guides, {})   # the default Phases 2+3, for comparison
    lg0, classes0 = default.lg, default.classes
    best = ((depth_key(lg0, classes0), -k, "default", "default"), lg0, classes0, k)
    stats["sa_default_depth"] = best[0][0]
    k_keep = max(1, math.ceil(k * (1.0 - opts.tolerance) - 1e-9))
    base = split.copy()
    stars = _reduce_to_stars(base)
    model, triples = switch_removal_model(base, stars, rank_of, k_keep)
    stats["sa_triples"] = model.num_triples
    solved: dict[int | None, np.ndarray | None] = {}

    def solve(depth: int | None) -> np.ndarray | None:
        if depth not in solved:
            solved[depth] = solve_cut_lp(model, backend, opts.max_rounds, stats, depth).x
        return solved[depth]

    depths: list[int | None] = [None]
    if opts.objective == "steps":
        depths = _feasible_depths(model, best[0][0][0], solve, stats, opts.max_columns)
    for depth in depths:
        if depth is not None and depth >= best[0][0][0]:
            break
        x = solve(depth)
        if x is None:
            continue
        f = x[: model.num_triples]
        g = base.copy()
        by_switch: dict[int, dict[tuple[int, int], float]] = {}
        for (u, w, t), amount in zip(triples, f.tolist()):
            by_switch.setdefault(w, {})[(u, t)] = amount
        for w in stars:
            _realize(g, w, by_switch.get(w, {}))
        lg = LogicalGraph.from_split(g, rank_of)
        allow = None if depth is None else allowances(lg, hop_columns(model, depth),
                                                       x[model.num_triples:])
        for key, classes, packing in candidates(lg, k_keep, guides, depth, allow):
            stats[f"sa_{depth}_{packing}_depth"] = key
            rank = (key, -k_keep, "step-aware", packing)
            if rank < best[0]:
                best = (rank, lg, classes, k_keep)
    stats["sa_total_s"] = time.perf_counter() - t0
    (_, _, split_kind, packing), lg, classes, k_used = best
    stats["split"], stats["packing"] = split_kind, packing
    stats["step_aware"] = _verdict(split_kind == "step-aware", best[0][0],
                                   stats["sa_default_depth"], stats.get("sa_skipped"))
    return Packed(lg, classes, k_used, SplitKind(split_kind), Packing(packing))
