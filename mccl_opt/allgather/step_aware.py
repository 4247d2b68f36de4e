"""Step-aware switch removal for AllGather (paper App. C; docs/allgather.md).

Replaces Phase 2's local split proposal by an LP over the star switches
(:mod:`formulations.switch_removal`): each switch's in-units are assigned to its
out-neighbours so that the logical GPU graph keeps ``k_keep`` trees per root (rooted
cut conditions, separated lazily by max-flow: a cutting-plane loop) while the smallest
logical capacity of any switch-sharing pair is as large as possible.  Dense, even
logical graphs let Phase 3's breadth-first packing finish in fewer GPU hops.

The LP solution is made integral switch by switch (``floor(f)``, then the fractional
parts, then any unused units: an integral transport completion, so every pair keeps at
least ``floor(f)``) and certified by a completed packing or the rooted cut test.  The
default spread split is packed as well and the shallower of the two packings (max,
then mean depth) is returned, so step-aware is never deeper than the default.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from formulations.switch_removal import SwitchRemovalModel, build_switch_removal_lp

from ..backends import get_backend
from ..backends.base import SolveStatus
from ..errors import SolveError
from .maxflow import INF, FlowNetwork
from .splitting import LogicalGraph, SplitGraph, split_all
from .trees import TreeClass, exact_pack, greedy_pack

__all__ = ["StepAware", "step_aware_pack", "switch_removal_model", "tree_depths"]

_SCALE = 1 << 20          # fixed-point scale of fractional logical capacities in max-flow


@dataclass(frozen=True)
class StepAware:
    """Options of step-aware switch removal.

    ``tolerance``: fraction of the rate that may be given up for depth (trees per root
    kept: ``ceil(k (1 - tolerance))``, so the rate stays >= ``(1 - tolerance)`` of the
    optimum); ``objective``: ``"maxmin"`` (max-min logical units over switch-sharing
    pairs) or ``"proportional"`` (max-min fraction of each pair's proportional share);
    ``max_rounds``: cutting-plane rounds before giving up on the LP.
    """

    tolerance: float = 0.0
    objective: str = "maxmin"
    max_rounds: int = 60

    def __post_init__(self) -> None:
        if not 0.0 <= self.tolerance < 1.0:
            raise ValueError(f"tolerance must be in [0, 1), got {self.tolerance!r}")
        if self.objective not in ("maxmin", "proportional"):
            raise ValueError(f"objective must be 'maxmin' or 'proportional', "
                             f"got {self.objective!r}")
        if self.max_rounds < 1:
            raise ValueError("max_rounds must be >= 1")


# ---------------------------------------------------------------------- model
def _has_switch_neighbour(g: SplitGraph, w: int) -> bool:
    return any(g.is_switch[b] for _, b in g.out_arcs(w)) or \
        any(g.is_switch[a] for a, _ in g.in_arcs(w))


def _realize(g: SplitGraph, w: int, seed: dict[tuple[int, int], float] | None) -> None:
    """Split every unit of switch ``w``: each pair ``(u, t)`` first gets
    ``floor(seed)``, then up to ``ceil(seed)``, then whatever completes the transport
    (``seed=None``: proportional shares as the seed).  Integral max-flows throughout."""
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
    if pairs:
        tail = np.array([i for i, _ in pairs], np.int64)
        head = np.array([len(us) + j for _, j in pairs], np.int64)
        net = FlowNetwork(len(us) + len(ts), tail, head)
        for stage in (1, 2):
            caps = net.caps()
            if stage == 1:
                frac = [seed.get((us[i], ts[j]), 0.0) for i, j in pairs]
                caps[: len(pairs)] = [int(math.ceil(s - 1e-9)) - int(math.floor(s + 1e-9))
                                      for s in frac]
            else:
                caps[: len(pairs)] = INF
            caps[net.s_arc0: net.s_arc0 + len(us)] = supply
            caps[net.t_arc0 + len(us): net.t_arc0 + len(us) + len(ts)] = demand
            net.max_flow(caps)
            flow = net._res[1: 2 * len(pairs): 2].copy()
            amounts += flow
            np.subtract.at(supply, tail, flow)
            np.subtract.at(demand, head - len(us), flow)
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


def switch_removal_model(g: SplitGraph, stars: list[int], rank_of: np.ndarray, k_keep: int,
                         objective: str = "maxmin") -> tuple[SwitchRemovalModel, list]:
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
        k_keep=float(k_keep))
    if objective == "proportional" and triples:
        share = np.zeros(model.num_gpus * model.num_gpus)
        for (u, w, t) in triples:
            total = sum(g.units[a] for a in g.in_arcs(w))
            share[rank_of[u] * model.num_gpus + rank_of[t]] += \
                g.units[(u, w)] * g.units[(w, t)] / max(total, 1)
        pr = model.pairs
        model = SwitchRemovalModel(**{**model.__dict__,
                                      "target": share[pr[:, 0] * model.num_gpus + pr[:, 1]]})
    return model, triples


def _violated_cuts(cap: np.ndarray, k_keep: int) -> list[np.ndarray]:
    """GPU sets ``S`` (sink sides of min-cuts, one per failing sink) with
    ``L(δ⁻(S)) < k_keep |V \\ S|``, by max-flow in fixed point."""
    n = cap.shape[0]
    tail, head = np.nonzero(cap > 1e-12)
    net = FlowNetwork(n, tail, head)
    caps = net.caps()
    caps[: net.m] = np.floor(cap[tail, head] * _SCALE).astype(np.int64)
    caps[net.s_arc0: net.s_arc0 + n] = k_keep * _SCALE
    need = k_keep * n * _SCALE - max(1, int(1e-7 * k_keep * n * _SCALE))
    found: dict[bytes, np.ndarray] = {}
    for sink in range(n):
        caps[net.t_arc0 + sink] = INF
        if net.max_flow(caps) < need:
            mask = ~net.source_side()
            found.setdefault(mask.tobytes(), mask)
        caps[net.t_arc0 + sink] = 0
    return list(found.values())


def _solve_lp(model: SwitchRemovalModel, backend: str, max_rounds: int,
              stats: dict[str, Any]) -> np.ndarray | None:
    """Cutting-plane loop; the triple amounts ``f`` or ``None`` if it did not converge."""
    n = model.num_gpus
    eye = np.eye(n, dtype=bool)
    cuts = list(eye) + list(~eye)          # in- and out-degree of every GPU
    solver = get_backend(backend)
    try:
        solver.load(build_switch_removal_lp(model, cuts))
        for rounds in range(1, max_rounds + 1):
            sol = solver.solve()
            if sol.status != SolveStatus.OPTIMAL or sol.x is None:
                raise SolveError(f"step-aware switch removal LP ended {sol.status.value} "
                                 f"in round {rounds}; try another backend")
            f = np.maximum(sol.x[:-1], 0.0)
            new = _violated_cuts(model.logical(f), int(model.k_keep))
            stats["sa_rounds"], stats["sa_cuts"] = rounds, len(cuts)
            stats["sa_objective"] = float(sol.x[-1])
            if not new:
                return f
            lo, hi, A = model.cut_rows(new)
            solver.add_rows(lo, hi, A.indptr.astype(np.int64), A.indices.astype(np.int64),
                            A.data)
            cuts += new
        return None
    finally:
        solver.close()


# ---------------------------------------------------------------------- packing
def tree_depths(classes: list[TreeClass], lg: LogicalGraph) -> np.ndarray:
    """Depth (GPU hops) of every tree class."""
    out = np.zeros(len(classes), np.int64)
    for i, cls in enumerate(classes):
        par = cls.parent_arc
        best = 0
        for v in range(lg.num_gpus):
            d, x = 0, v
            while par[x] >= 0:
                x = int(lg.tail[par[x]])
                d += 1
            best = max(best, d)
        out[i] = best
    return out


def _pack(g: SplitGraph, rank_of: np.ndarray, k: int,
          guides: dict[int, np.ndarray]) -> tuple[LogicalGraph, list[TreeClass]] | None:
    lg = LogicalGraph.from_split(g, rank_of)
    classes = greedy_pack(lg.num_gpus, lg.tail, lg.head, lg.units, k, guides)
    if classes is None and lg.admits(k):
        classes = exact_pack(lg.num_gpus, lg.tail, lg.head, lg.units, k)
    return None if classes is None else (lg, classes)


def _depth_key(lg: LogicalGraph, classes: list[TreeClass]) -> tuple[int, float]:
    d = tree_depths(classes, lg)
    w = np.array([c.mult for c in classes], float)
    return int(d.max()), float((d * w).sum() / w.sum())


def step_aware_pack(split: SplitGraph, rank_of: np.ndarray, k: int,
                    guides: dict[int, np.ndarray], stats: dict[str, Any],
                    backend: str = "highs", options: StepAware | None = None,
                    ) -> tuple[LogicalGraph, list[TreeClass], int] | None:
    """Phases 2+3 with step-aware switch removal on a balanced ``split`` (tree units).

    Returns ``(logical graph, tree classes, trees per root)`` — the shallower of the
    step-aware and the default spread packing — or ``None`` if neither packing
    completed (the caller then runs its exact fallbacks).
    """
    opts = options or StepAware()
    t0 = time.perf_counter()
    k_keep = max(1, math.ceil(k * (1.0 - opts.tolerance) - 1e-9))
    g = split.copy()
    stars = _reduce_to_stars(g)
    model, triples = switch_removal_model(g, stars, rank_of, k_keep, opts.objective)
    stats["sa_triples"] = model.num_triples
    f = _solve_lp(model, backend, opts.max_rounds, stats)
    stats["sa_lp_s"] = time.perf_counter() - t0
    candidates: list[tuple[tuple[int, float], str, LogicalGraph, list[TreeClass], int]] = []
    if f is not None:
        by_switch: dict[int, dict[tuple[int, int], float]] = {}
        for (u, w, t), amount in zip(triples, f.tolist()):
            by_switch.setdefault(w, {})[(u, t)] = amount
        for w in stars:
            _realize(g, w, by_switch.get(w, {}))
        packed = _pack(g, rank_of, k_keep, guides)
        if packed is not None:
            candidates.append((_depth_key(*packed), "step-aware", *packed, k_keep))
    default = split.copy()
    split_all(default, exact=False)
    packed = _pack(default, rank_of, k, guides)
    if packed is not None:
        candidates.append((_depth_key(*packed), "spread", *packed, k))
    stats["sa_total_s"] = time.perf_counter() - t0
    if not candidates:
        return None
    for key, name, *_ in candidates:
        stats[f"sa_{name}_depth"] = key
    key, name, lg, classes, k_used = min(candidates, key=lambda c: (c[0], -c[4], c[1]))
    stats["split"], stats["packing"] = name, "greedy"
    return lg, classes, k_used
