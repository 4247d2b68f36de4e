"""``solve_allgather``: ForestColl(-warm) AllGather synthesis (paper §4.3, App. C).

Pipeline: Phase 1 exact optimum (:mod:`.throughput`) → chunk budget (:mod:`.budget`) →
Phase 2 switch removal (:mod:`.splitting`) → Phase 3 tree packing (:mod:`.trees`) →
physical trees (:mod:`.mapping`).  Fast paths are tried first and certified; the exact
ForestColl procedures are the fallbacks (see docs/allgather.md).
"""

from __future__ import annotations

import dataclasses
import time
from fractions import Fraction
from typing import Any

import numpy as np

from ..errors import SolveError, TopologyError
from ..schedule import Schedule, bottleneck_links, schedule_rate, share_loads
from ..topology import Topology
from .budget import CutBounds, choose_trees, exact_k, guess_budget, guess_trees
from .fabric import fabric_of, quantum_for
from .mapping import MappedTrees, map_classes, to_physical, tree_chunks, tree_loads
from .splitting import LogicalGraph, SplitGraph, balance_switches, split_all
from .throughput import Fabric, PhaseOneResult, cut_upper_bound, optimal_rate
from .repair import repair_pack
from .reroute import PhysicalForest, Rerouted, reroute
from .trees import exact_pack, greedy_pack

__all__ = ["solve_allgather", "restore_warm_state", "WarmState"]


class WarmState(dict):
    """What ForestColl-warm reuses: ``cut`` (node ids of Phase 1's tight set), ``k``,
    ``guides`` (per root rank, the parent rank of every rank in its largest tree),
    ``shapes`` (``(roots, parent ranks)`` of every tree class, largest first per root),
    ``loads`` (share load per link), ``links`` (the ``(tail, head)`` arrays they
    refer to) and the physical trees: ``forest`` (a :class:`.reroute.PhysicalForest`)
    or the ``mapped`` trees and ``tree_depths`` it is built from on demand."""


def _guides_from(warm: Schedule, topo: Topology) -> dict[int, np.ndarray]:
    """Per root rank, the parent ranks of its largest previous tree (by rank position,
    so a replaced GPU keeps its rank's guidance)."""
    if len(warm.gpus) != topo.num_gpus:
        return {}
    rank = {g: i for i, g in enumerate(warm.gpus)}
    best: dict[int, tuple[float, Any]] = {}
    for c in warm.chunks:
        r = rank.get(c.src)
        if r is not None and (r not in best or c.share > best[r][0]):
            best[r] = (c.share, c)
    guides = {}
    for r, (_, c) in best.items():
        par = np.full(topo.num_gpus, -1, np.int64)
        for e in getattr(c, "edges", ()):
            if e[0] in rank and e[-1] in rank:
                par[rank[e[-1]]] = rank[e[0]]
        guides[r] = par
    return guides


def _warm_shapes(warm: Schedule | None, topo: Topology,
                 guides: dict[int, np.ndarray]) -> tuple[np.ndarray, np.ndarray] | None:
    """Previous tree shapes in rank space: the warm state's, else the guides'."""
    if warm is None:
        return None
    state = warm.warm_state if isinstance(warm.warm_state, dict) else {}
    if state.get("num_gpus") == topo.num_gpus and state.get("shapes") is not None:
        return state["shapes"]
    if not guides:
        return None
    roots = sorted(guides)
    return np.array(roots, np.int64), np.stack([guides[r] for r in roots])


def _shapes_of(classes: list, lg: LogicalGraph) -> tuple[np.ndarray, np.ndarray]:
    """Rank-space shapes of the classes, by root and largest first."""
    classes = sorted(classes, key=lambda c: (c.root, -c.mult))
    parents = np.array([c.parent_arc for c in classes], np.int64)
    ranks = np.where(parents >= 0, lg.tail[np.maximum(parents, 0)], -1)
    return np.array([c.root for c in classes], np.int64), ranks


def _warm_inputs(warm: Schedule | None, topo: Topology
                 ) -> tuple[list[np.ndarray], dict[int, np.ndarray]]:
    if warm is None:
        return [], {}
    if not isinstance(warm, Schedule) or warm.collective != "allgather":
        raise TypeError("warm must be a previous AllGather Schedule")
    state = warm.warm_state if isinstance(warm.warm_state, dict) else {}
    ids = state.get("cut")
    if ids is None:
        ids = {b.dst for b in warm.bottleneck}
    cut = np.array([topo.has_node(n.id) and n.id in ids for n in topo.nodes], bool)
    guides = state.get("guides") if state.get("num_gpus") == topo.num_gpus else None
    if guides is None:
        guides = _guides_from(warm, topo)
    return ([cut] if cut.any() else []), guides


def _check_inputs(topo: Topology, max_chunks: int | None) -> None:
    if not isinstance(topo, Topology):
        raise TopologyError(f"expected a mccl_opt.Topology, got {type(topo).__name__}")
    if max_chunks is not None and (isinstance(max_chunks, bool) or not isinstance(max_chunks, int)
                                   or max_chunks < 1):
        raise ValueError(f"max_chunks must be a positive integer or None, got {max_chunks!r}")


def _phase_one_budget(topo: Topology, max_chunks: int | None, stats: dict[str, Any],
                      hint_cuts: list[np.ndarray] | None = None,
                      cuts: CutBounds | None = None
                      ) -> tuple[Fabric, float, PhaseOneResult, int, Fraction, int]:
    """Phase 1 (exact optimum, §4.3) and the chunk budget: ``(fabric, quantum, phase-1
    result, trees per root k, tree bandwidth y, budget max-flow calls)``; ``cuts``: the
    cut bounds of the warm guesses on the same capacities."""
    t = time.perf_counter()
    fab, quantum = fabric_of(topo)
    p1 = optimal_rate(fab, hint_cuts)
    stats["phase1_s"] = time.perf_counter() - t
    stats["phase1_maxflows"] = p1.maxflow_calls

    t = time.perf_counter()
    k, y, calls = choose_trees(fab, p1, max_chunks, extra_cuts=hint_cuts, cuts=cuts)
    if k == 0 or y <= 0:
        raise SolveError("no tree bandwidth admits the chunk budget; raise max_chunks")
    stats["budget_s"] = time.perf_counter() - t
    stats["budget_maxflows"] = calls
    stats["k"], stats["k_exact"] = int(k), int(exact_k(fab, p1))
    return fab, quantum, p1, k, y, calls


def _balanced_split(fab: Fabric, is_switch: np.ndarray, k: int, y: Fraction,
                    max_chunks: int | None, stats: dict[str, Any]) -> tuple[SplitGraph, int]:
    """Tree units of every link, switches balanced.  When balancing must give up
    capacity the optimum cannot spare (one-directional degradations;
    ``stats['balanced_exactly'] = False``, the rate then sits below ``lp_rate_gbps``),
    two balanced fabrics are tried and the one with more bandwidth per root kept: the
    balanced units re-optimised (``k``, ``y`` chosen again on them, at most 3 times), and
    every cable at a switch at the smaller of its two directions' capacities, which
    balances each switch by construction (``stats['symmetrized']``).  The trees,
    synthesized for less capacity than the fabric has, are valid on it."""
    stats["balanced_exactly"] = True
    units = (fab.cap * y.denominator) // y.numerator
    split = SplitGraph.from_links(fab.n, fab.tail, fab.head, units, is_switch, fab.gpus, k)
    if balance_switches(split):
        return split, k
    stats["balanced_exactly"] = False
    options = []                        # (bandwidth per root in quanta, split, k, symmetrized)
    original, unit = fab, Fraction(1)   # a unit of ``fab``'s capacities, in quanta
    for _ in range(3):
        kept = np.array([split.units.get((a, b), 0) for a, b in
                         zip(fab.tail.tolist(), fab.head.tolist())], np.int64)
        fab, unit = Fabric.build(fab.n, fab.tail, fab.head, kept, fab.gpus), unit * y
        balanced = _split_for(fab, is_switch, max_chunks)
        if balanced is None:
            break
        split, k, y, exact = balanced
        if exact:
            options.append((k * y * unit, split, k, False))
            break
    balanced = _split_for(_symmetrized(original, is_switch), is_switch, max_chunks)
    if balanced is not None and balanced[3]:
        split, k, y, _ = balanced
        options.append((k * y, split, k, True))
    if not options:
        raise SolveError("switches could not be balanced (in- vs out-capacity) without losing "
                         "every tree, even with each cable at its weaker direction; check the "
                         "one-directional links of the fabric")
    _, split, k, symmetrized = max(options, key=lambda o: o[0])     # ties: re-optimised
    if symmetrized:
        stats["symmetrized"] = True
    return split, k


def _split_for(fab: Fabric, is_switch: np.ndarray, max_chunks: int | None
               ) -> tuple[SplitGraph, int, Fraction, bool] | None:
    """Phase 1 and the chunk budget on ``fab``, then its tree units with switches
    balanced: ``(split, k, y, balanced without loss)``, or ``None`` if no tree fits."""
    p1 = optimal_rate(fab)
    if p1.num == 0:
        return None
    k, y, _ = choose_trees(fab, p1, max_chunks)
    if y <= 0:
        return None
    units = (fab.cap * y.denominator) // y.numerator
    split = SplitGraph.from_links(fab.n, fab.tail, fab.head, units, is_switch, fab.gpus, k)
    return split, k, y, balance_switches(split)


def _symmetrized(fab: Fabric, is_switch: np.ndarray) -> Fabric:
    """``fab`` with every arc at a switch capped at its reverse arc's capacity (0 when
    there is none), so every switch's in-capacity equals its out-capacity."""
    reverse = {(int(a), int(b)): i for i, (a, b) in enumerate(zip(fab.tail, fab.head))}
    cap = fab.cap.copy()
    for i, (a, b) in enumerate(zip(fab.tail.tolist(), fab.head.tolist())):
        if is_switch[a] or is_switch[b]:
            j = reverse.get((b, a))
            cap[i] = min(cap[i], fab.cap[j]) if j is not None else 0
    return Fabric.build(fab.n, fab.tail, fab.head, cap, fab.gpus)


def _pack_fast(lg: LogicalGraph, k: int, guides: dict[int, np.ndarray], stats: dict[str, Any],
               shapes: tuple[np.ndarray, np.ndarray] | None) -> list | None:
    """Repair packing (reusing previous shapes), then the guided greedy portfolio
    (both certify themselves)."""
    classes, info = repair_pack(lg.num_gpus, lg.tail, lg.head, lg.units, k, shapes)
    stats.update(info)
    stats["packing"] = "repair"
    if classes is None:
        classes = greedy_pack(lg.num_gpus, lg.tail, lg.head, lg.units, k, guides)
        stats["packing"] = "greedy"
    return classes


def _pack(split: SplitGraph, rank_of: np.ndarray, k: int, guides: dict[int, np.ndarray],
          stats: dict[str, Any], shapes: tuple[np.ndarray, np.ndarray] | None = None
          ) -> tuple[LogicalGraph, list]:
    """Spread split + fast packing; exact splitting (when the spread split broke the
    cut condition) and exact packing as fallbacks."""
    t = time.perf_counter()
    g = split.copy()
    split_all(g, exact=False)
    lg = LogicalGraph.from_split(g, rank_of)
    stats["phase2_s"] = time.perf_counter() - t
    stats["split"] = "spread"
    t = time.perf_counter()
    classes = _pack_fast(lg, k, guides, stats, shapes)
    if classes is None and not lg.admits(k):
        t2 = time.perf_counter()
        g = split.copy()
        if not split_all(g, exact=True):
            raise SolveError("exact switch removal did not complete; the fabric's "
                             "switches could not be balanced without losing the optimum")
        lg = LogicalGraph.from_split(g, rank_of)
        stats["split"] = "exact"
        stats["phase2_s"] += time.perf_counter() - t2
        classes = _pack_fast(lg, k, guides, stats, shapes)
    if classes is None:
        classes = exact_pack(lg.num_gpus, lg.tail, lg.head, lg.units, k)
        stats["packing"] = "exact"
    stats["phase3_s"] = time.perf_counter() - t
    return lg, classes


def _same_fabric(warm: Schedule, topo: Topology) -> dict | None:
    """The previous schedule's warm state if ``topo`` has its GPUs and links (only
    capacities may differ), else ``None``."""
    state = warm.warm_state if isinstance(warm.warm_state, dict) else {}
    links = state.get("links")
    arr = topo.arrays
    if (links is None or tuple(warm.gpus) != tuple(topo.gpus) or links[0].size != arr.tail.size
            or not (np.array_equal(links[0], arr.tail) and np.array_equal(links[1], arr.head))):
        return None
    return state


def _keep_previous(warm: Schedule, topo: Topology, budget_opt_gbps: float,
                   max_chunks: int | None) -> np.ndarray | None:
    """The previous schedule's link loads if, on the new capacities, it still reaches
    the chunk-budget optimum (a drift on links it does not saturate); else ``None``."""
    state = _same_fabric(warm, topo)
    loads = None if state is None else state.get("loads")
    if loads is None or warm.max_chunks != max_chunks:
        return None
    if schedule_rate(topo, loads) < budget_opt_gbps * (1 - 1e-12):
        return None
    return loads


def _kept_schedule(warm: Schedule, topo: Topology, loads: np.ndarray, fab: Fabric,
                   p1: PhaseOneResult, x_star: float, stats: dict[str, Any], t_start: float,
                   calls: int) -> Schedule:
    """The previous trees, re-rated and re-certified on the new capacities."""
    prev = warm.warm_state
    rate = schedule_rate(topo, loads)
    stats.update({key: warm.stats[key] for key in ("num_trees", "max_depth", "mean_depth")
                  if key in warm.stats})
    stats["k"], stats["reused_schedule"] = int(prev["k"]), True
    seconds = time.perf_counter() - t_start
    stats["total_s"] = seconds
    state = WarmState(prev, cut=_cut_ids(topo, p1))
    return Schedule(
        collective="allgather", topology=topo.name, gpus=topo.gpus, rate_gbps=rate,
        lp_rate_gbps=x_star, max_chunks=warm.max_chunks, chunks=warm.chunks,
        bottleneck=bottleneck_links(topo, loads, rate, prev["k"],
                                    saturated=fab.cut_arcs(p1.cut)),
        solver={"backend": "maxflow", "seconds": seconds,
                "maxflow_calls": p1.maxflow_calls + calls, "algorithm": "forestcoll-warm"},
        stats=stats, warm_state=state)


def _forest_of(warm: Schedule, topo: Topology) -> PhysicalForest | None:
    """The previous schedule's physical trees, if ``topo`` has its nodes and links."""
    state = _same_fabric(warm, topo)
    if state is None:
        return None
    forest = state.get("forest")
    if forest is None and state.get("mapped") is not None:
        forest = PhysicalForest.from_mapped(state["mapped"], state["k"], state["tree_depths"],
                                            topo, warm.chunks)
    return forest


def _reroute_previous(warm: Schedule, topo: Topology, fab: Fabric, k: int, y: Fraction,
                      stats: dict[str, Any]) -> Rerouted | None:
    """The previous trees, as ``k`` unit trees per root, rerouted to carry ``k·y``
    (quanta; certified by the caller as an upper bound of the budget optimum) on the
    new capacities, or ``None``."""
    if stats.get("reroute_failed_at") == (k, y):
        return None                     # deterministic: the same target fails again
    t = time.perf_counter()
    forest = _forest_of(warm, topo)
    if forest is None:
        return None
    out = reroute(forest, topo, fab.cap, k, k * y)
    stats["reroute_s"] = time.perf_counter() - t
    stats["reroute"] = "failed" if out is None else "done"
    if out is None:
        stats["reroute_failed_at"] = (k, y)
    return out


def _rerouted_schedule(topo: Topology, warm: Schedule, max_chunks: int | None, fab: Fabric,
                       p1: PhaseOneResult, x_star: float, rerouted: Rerouted,
                       stats: dict[str, Any], t_start: float, calls: int) -> Schedule:
    """The schedule of rerouted previous trees and its warm state."""
    forest, loads = rerouted.forest, rerouted.loads
    rate = schedule_rate(topo, loads)
    stats.update(k=forest.k, rerouted_edges=rerouted.moved_edges,
                 rerouted_trees=rerouted.rebuilt_trees, num_trees=int(forest.roots.size),
                 max_depth=int(forest.depth.max()), mean_depth=float(forest.depth.mean()))
    seconds = time.perf_counter() - t_start
    stats["total_s"] = seconds
    state = _warm_state(topo, _cut_ids(topo, p1), forest.k, _forest_shapes(forest), loads,
                        forest=forest)
    return Schedule(
        collective="allgather", topology=topo.name, gpus=topo.gpus, rate_gbps=rate,
        lp_rate_gbps=x_star, max_chunks=max_chunks, chunks=forest.tree_chunks(topo.gpus),
        bottleneck=bottleneck_links(topo, loads, rate, forest.k, saturated=fab.cut_arcs(p1.cut)),
        solver={"backend": "maxflow", "seconds": seconds,
                "maxflow_calls": p1.maxflow_calls + calls, "algorithm": "forestcoll-warm"},
        stats=stats, warm_state=state)


def _forest_shapes(forest: PhysicalForest) -> tuple[np.ndarray, np.ndarray]:
    """Rank-space shapes of a forest's trees, by root and largest first."""
    order = np.lexsort((-forest.mults, forest.roots))
    return forest.roots[order], forest.parent[order].astype(np.int64)


def restore_warm_state(schedule: Schedule, topo: Topology) -> Schedule:
    """An AllGather ``schedule`` read without its warm state (a file, a controller's saved
    state) with that state rebuilt from its trees on ``topo`` (its GPUs and links), so a
    warm start from it reroutes the trees (:mod:`.reroute`) instead of packing anew; the
    schedule unchanged if it has a warm state or its chunks are not spanning trees over
    ``topo``'s switch paths with shares in multiples of one ``1/k``.  Costs ~60 ms at
    128 GPUs: done when a schedule is loaded, not when a failure strikes."""
    state = schedule.warm_state
    if schedule.collective != "allgather" or (isinstance(state, dict) and state.get("links")) \
            or tuple(schedule.gpus) != tuple(topo.gpus):
        return schedule
    forest = PhysicalForest.from_chunks(schedule.chunks, topo)
    if forest is None:
        return schedule
    cut = {b.dst for b in schedule.bottleneck}
    state = _warm_state(topo, cut, forest.k, _forest_shapes(forest),
                        share_loads(topo, schedule.chunks), forest=forest)
    return dataclasses.replace(schedule, warm_state=state)


def _cut_ids(topo: Topology, p1: PhaseOneResult) -> set[str]:
    """Node ids of Phase 1's tight set."""
    node_ids = [n.id for n in topo.nodes]
    return {node_ids[i] for i in np.flatnonzero(p1.cut)}


def _warm_state(topo: Topology, cut: set[str], k: int,
                shapes: tuple[np.ndarray, np.ndarray], loads: np.ndarray,
                **trees: Any) -> WarmState:
    """A new schedule's warm state; ``cut`` the node ids of its tight set; ``shapes``
    are by root, largest first, so the first shape of every root is its guide;
    ``trees`` the physical-tree entries."""
    roots, parents = shapes
    first = np.ones(roots.size, bool)
    first[1:] = roots[1:] != roots[:-1]
    arr = topo.arrays
    return WarmState(cut=cut, k=int(k),
                     num_gpus=topo.num_gpus, shapes=shapes,
                     guides={int(r): p for r, p in zip(roots[first], parents[first])},
                     loads=loads, links=(arr.tail, arr.head), **trees)


def _gbps(p1: PhaseOneResult, quantum: float) -> float:
    return float(Fraction(p1.num, p1.den) * Fraction(quantum).limit_denominator(10**12))


def _warm_guess(topo: Topology, warm: Schedule, max_chunks: int | None,
                hint_cuts: list[np.ndarray], guides: dict[int, np.ndarray],
                stats: dict[str, Any], t_start: float, cuts: CutBounds) -> Schedule | None:
    """ForestColl-warm without Phase 1's max-flow sweep: guess ``x*`` as the smallest
    single-GPU ingress/egress or previous-cut ratio (an upper bound), take ``k`` trees
    of bandwidth ``y = guess/k`` and repair-pack them (reusing the previous shapes).  A
    completed packing reaches the bound, so the guess is ``x*`` and the rate is cold's;
    otherwise ``None`` (the caller runs the exact Phase 1; nothing is reused from here).
    The previous schedule is kept outright if it already reaches the bound."""
    t = time.perf_counter()
    fab, quantum = cuts.fab, quantum_for(topo.arrays.capacity)
    bound = cut_upper_bound(fab, hint_cuts)
    guess = guess_trees(fab, bound, max_chunks, cuts)
    stats["phase1_s"] = time.perf_counter() - t
    stats["phase1_maxflows"] = 0
    if guess is None:
        return None
    k, y = guess
    x_star = _gbps(bound, quantum)
    # beyond the budget (k0 > K) a guess of x* is rarely reachable: when the previous
    # trees cannot be rerouted to it, no packing tests it either
    pack = max_chunks is None or exact_k(fab, bound) <= max_chunks
    return _keep_or_certify(topo, warm, max_chunks, fab, bound, x_star, x_star, k, y, guides,
                            stats, t_start, "phase1_guess", pack)


def _certify_by_packing(topo: Topology, warm: Schedule, max_chunks: int | None, fab: Fabric,
                        k: int, y: Fraction, guides: dict[int, np.ndarray],
                        stats: dict[str, Any]) -> tuple[LogicalGraph, list] | None:
    """Balance, spread-split and repair-pack ``k`` trees per root of bandwidth ``y``
    (reusing the previous shapes); the logical graph and classes if the packing
    completes — then ``k·y`` is reached, which certifies a guessed ``(k, y)`` that
    bounds the optimum — else ``None``."""
    arr = topo.arrays
    t = time.perf_counter()
    split, k_bal = _balanced_split(fab, arr.is_switch, k, y, max_chunks, stats)
    stats["balance_s"] = time.perf_counter() - t
    if not stats["balanced_exactly"] or k_bal != k:
        return None
    t = time.perf_counter()
    g = split.copy()
    split_all(g, exact=False)
    lg = LogicalGraph.from_split(g, arr.rank_of)
    stats["phase2_s"] = time.perf_counter() - t
    stats["split"] = "spread"
    t = time.perf_counter()
    classes, info = repair_pack(lg.num_gpus, lg.tail, lg.head, lg.units, k,
                                _warm_shapes(warm, topo, guides))
    stats["phase3_s"] = time.perf_counter() - t
    if classes is None:                   # a wrong guess fails here, before any greedy
        return None
    stats.update(info)
    stats["packing"] = "repair"
    stats["k"] = int(k)
    return lg, classes


def _warm_budget(topo: Topology, warm: Schedule, max_chunks: int | None,
                 hint_cuts: list[np.ndarray], guides: dict[int, np.ndarray],
                 stats: dict[str, Any], t_start: float, cuts: CutBounds) -> Schedule | None:
    """ForestColl-warm when the ``x*`` guess was rejected because ``k0 > K`` (the
    budget optimum lies below ``x*``, e.g. Fail2 at >= 32 GPUs): the exact Phase 1
    (seeded with the previous cut), then the chunk budget *guessed* with a few probing
    max-flows instead of its sweep (:func:`.budget.guess_budget`) and certified by
    rerouted previous trees or, when those cannot be rerouted at all, a completed
    packing; ``None`` (the caller runs the exact budget) if there is nothing to guess
    or that fails.  (A failed reroute means a non-tight guess more often than not, and
    the exact budget sweep costs less than a packing from 256 GPUs on.)"""
    t = time.perf_counter()
    fab, quantum = cuts.fab, quantum_for(topo.arrays.capacity)
    p1 = optimal_rate(fab, hint_cuts)
    stats["phase1_s"] = time.perf_counter() - t
    stats["phase1_maxflows"] = p1.maxflow_calls
    t = time.perf_counter()
    guess = guess_budget(fab, p1, max_chunks, hint_cuts, cuts=cuts)
    stats["budget_s"] = time.perf_counter() - t
    if guess is None:
        return None
    k, y, stats["budget_maxflows"] = guess
    return _keep_or_certify(topo, warm, max_chunks, fab, p1, _gbps(p1, quantum),
                            float(k * y) * quantum, k, y, guides, stats, t_start, "budget_guess",
                            pack=False)


def _keep_or_certify(topo: Topology, warm: Schedule, max_chunks: int | None, fab: Fabric,
                     p1: PhaseOneResult, x_star: float, target_gbps: float, k: int,
                     y: Fraction, guides: dict[int, np.ndarray], stats: dict[str, Any],
                     t_start: float, stat_key: str, pack: bool = True) -> Schedule | None:
    """Certify a guessed ``(k, y)`` reaching ``target_gbps``: keep the previous schedule
    if it already reaches it, else the previous trees rerouted to carry it
    (:mod:`.reroute`), else (if ``pack``) a completed packing of ``k`` trees of
    bandwidth ``y`` does; ``None`` if all fail (the caller falls back to the exact
    path)."""
    calls = stats.get("budget_maxflows", 0)       # the budget guess's probes
    kept = _keep_previous(warm, topo, target_gbps, max_chunks)
    if kept is not None:
        stats[stat_key] = "certified by the previous schedule"
        return _kept_schedule(warm, topo, kept, fab, p1, x_star, stats, t_start, calls)
    rerouted = _reroute_previous(warm, topo, fab, k, y, stats)
    if rerouted is not None:
        stats[stat_key] = "certified by rerouting"
        return _rerouted_schedule(topo, warm, max_chunks, fab, p1, x_star, rerouted, stats,
                                  t_start, calls)
    if not pack and stats.get("reroute") == "failed":
        return None
    stats["k_exact"] = int(exact_k(fab, p1))
    packed = _certify_by_packing(topo, warm, max_chunks, fab, k, y, guides, stats)
    if packed is None:
        return None
    stats[stat_key] = "certified by packing"
    return _finish(topo, warm, max_chunks, fab, p1, x_star, k, *packed, guides, stats,
                   t_start, calls)


def solve_allgather(topo: Topology, warm: Schedule | None = None, backend: str = "highs",
                    max_chunks: int | None = 10, step_aware: Any = False) -> Schedule:
    """Throughput-optimal AllGather trees (ForestColl), warm-started from ``warm``.

    ``max_chunks=K``: every root's trees carry multiples of ``1/k`` for one ``k <= K``
    (the best such ``k``); ``None``: the exact optimum.  ``step_aware=True`` (or a
    :class:`.step_aware.StepAware` with a rate tolerance) uses the step-aware switch
    removal LP of App. C on ``backend`` for shallower trees.
    Raises :class:`TopologyError` for unusable fabrics, :class:`SolveError` if a
    certified fallback fails.
    """
    _check_inputs(topo, max_chunks)
    t_start = time.perf_counter()
    stats: dict[str, Any] = {"warm": warm is not None}
    hint_cuts, guides = _warm_inputs(warm, topo)

    cuts = None
    if warm is not None and not step_aware:
        cuts = CutBounds(fabric_of(topo)[0])        # cut bounds shared by the guesses
        quick = _warm_guess(topo, warm, max_chunks, hint_cuts, guides, stats, t_start, cuts)
        if quick is not None:
            return quick
        stats["phase1_guess"] = "rejected"
        quick = _warm_budget(topo, warm, max_chunks, hint_cuts, guides, stats, t_start, cuts)
        if quick is not None:
            return quick
        stats["budget_guess"] = "rejected"
    fab, quantum, p1, k, y, calls = _phase_one_budget(topo, max_chunks, stats, hint_cuts, cuts)
    x_star = _gbps(p1, quantum)

    if warm is not None and not step_aware:
        kept = _keep_previous(warm, topo, float(k * y) * quantum, max_chunks)
        if kept is not None:
            return _kept_schedule(warm, topo, kept, fab, p1, x_star, stats, t_start, calls)
        rerouted = _reroute_previous(warm, topo, fab, k, y, stats)
        if rerouted is not None:
            return _rerouted_schedule(topo, warm, max_chunks, fab, p1, x_star, rerouted, stats,
                                      t_start, calls)

    arr = topo.arrays
    t = time.perf_counter()
    split, k = _balanced_split(fab, arr.is_switch, k, y, max_chunks, stats)
    stats["balance_s"] = time.perf_counter() - t
    shapes = _warm_shapes(warm, topo, guides)
    packed = None
    if step_aware:
        from .step_aware import StepAware, step_aware_pack
        opts = step_aware if isinstance(step_aware, StepAware) else None
        packed = step_aware_pack(split, arr.rank_of, k, guides, stats, backend, opts)
    if packed is not None:
        lg, classes, k = packed
    else:
        lg, classes = _pack(split, arr.rank_of, k, guides, stats, shapes)
    return _finish(topo, warm, max_chunks, fab, p1, x_star, k, lg, classes, guides, stats,
                   t_start, calls)


def _finish(topo: Topology, warm: Schedule | None, max_chunks: int | None, fab: Fabric,
            p1: PhaseOneResult, x_star: float, k: int, lg: LogicalGraph, classes: list,
            guides: dict[int, np.ndarray], stats: dict[str, Any], t_start: float,
            calls: int) -> Schedule:
    """Physical trees of the packed classes, their loads and rate, the warm state."""
    arr = topo.arrays
    t = time.perf_counter()
    mapped = map_classes(classes, lg)
    if mapped is None:
        trees, depths = MappedTrees.from_physical(to_physical(classes, lg)), None
    else:
        trees, depths = mapped
    node_ids = [n.id for n in topo.nodes]
    chunks = tree_chunks(trees, k, node_ids, topo.gpus)
    link = np.full((topo.num_nodes, topo.num_nodes), -1, np.int64)
    link[arr.tail, arr.head] = np.arange(arr.tail.size)
    loads = tree_loads(trees, k, link, topo.num_links)
    rate = schedule_rate(topo, loads)
    if depths is None:
        depths = np.array([max(c.depths().values()) for c in chunks])
    stats["mapping_s"] = time.perf_counter() - t
    stats["num_trees"] = len(chunks)
    stats["max_depth"] = int(np.max(depths))
    stats["mean_depth"] = float(np.mean(depths))
    if guides:
        stats["guided_roots"] = len(guides)
    saturated = fab.cut_arcs(p1.cut)
    seconds = time.perf_counter() - t_start
    stats["total_s"] = seconds
    state = _warm_state(topo, _cut_ids(topo, p1), k, _shapes_of(classes, lg), loads, mapped=trees,
                        tree_depths=depths)
    return Schedule(
        collective="allgather", topology=topo.name, gpus=topo.gpus, rate_gbps=rate,
        lp_rate_gbps=x_star, max_chunks=max_chunks, chunks=tuple(chunks),
        bottleneck=bottleneck_links(topo, loads, rate, k, saturated=saturated),
        solver={"backend": "maxflow", "seconds": seconds,
                "maxflow_calls": p1.maxflow_calls + calls, "algorithm": "forestcoll-warm"
                if warm is not None else "forestcoll"},
        stats=stats, warm_state=state)
