"""Initial columns: one path per pair that makes the restricted master meaningful.

Each pair without a column gets a shortest path within the step bound, ties towards
fewer steps -- a capacity-aware variant of the paper's shortest-hop start (§4.2).  The
sources are routed in ``W`` interleaved waves (ranks ``w, w+W, w+2W, ...``, ``W`` in
:data:`WAVES`), and each wave prices a link at ``(load_a + 1/2) / cap_a``, the marginal
cost of ``sum_a load_a^2 / (2 cap_a)`` under the paths of the waves before it
(``load_a``: their pairs on link ``a``; the first wave prices ``1/(2 cap_a)``, the time
a bit spends on the link, halved).  Equal-cost alternatives -- two NICs behind one PCIe
switch, several rails -- are then taken in turn instead of all by the lowest arc index,
so on fabrics with such ties (healthy NCCL DGX imports) the single-path start is already
balanced and the first master is optimal (docs/alltoall.md, *Imported fabrics*).  A
wave routes all of a source's pairs under one set of prices, so a degraded link that
needs one source's pairs split over several NICs is not balanced.  Raises
:class:`TopologyError` when the step bound leaves a pair unconnected.
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import TopologyError
from .pricing import PricedColumns, price_paths, price_sources
from .problem import Problem

__all__ = ["initial_columns", "certified_routing", "min_steps_per_pair", "WAVES",
           "MASTER_COST_FACTOR"]

#: The numbers of interleaved source waves tried, in this order; the routing with the
#: lowest maximum link utilisation is kept (1: every source under the capacity prices
#: alone).  8 waves put one GPU of each 8-GPU host in a wave; on the NCCL DGX imports
#: 4 and 16 waves more found nothing 8 did not (docs/alltoall.md, *Imported fabrics*),
#: and each wave count tried costs one all-source pricing pass on a cold start.
WAVES = (1, 8)


#: The first master on a routing of every pair (its arrays, closed-form solution,
#: rounding and schedule) costs up to this many times the routing: CPU measured 1.6-2.8x
#: at 1,024 GPUs, 4.2x at 2,048 (docs/alltoall.md, *Time limits at 1024-2048 GPUs*).
MASTER_COST_FACTOR = 4.0


def initial_columns(prob: Problem, max_steps: int, missing: np.ndarray,
                    waves: tuple[int, ...] = WAVES,
                    deadline: float | None = None) -> PricedColumns:
    """Paths for the pairs where ``missing[p]`` is true (pair order): of the routings
    in ``waves`` waves (module docstring), the one whose busiest link has the lowest
    utilisation (ties: the first).  When every pair is missing (a cold start) and a
    routing is already optimal by the cut bound of its busiest links
    (:func:`_cut_certified`), the later wave counts are not tried; nor are they (nor
    the certification) when a time limit's ``deadline`` (``time.perf_counter()``)
    leaves less time than another routing and the first master
    (:data:`MASTER_COST_FACTOR` routings) take: the master's first round prices the
    routing anyway, and a 2,048-GPU routing pass costs 0.5 s."""
    want = (~np.eye(prob.num_gpus, dtype=bool) if missing.all()
            else prob.pair_matrix(missing.astype(float), 0.0) > 0)
    best, best_t = None, np.inf
    for w in dict.fromkeys(max(1, min(int(w), prob.num_gpus)) for w in waves):
        start = time.perf_counter()
        priced = _routed(prob, max_steps, want, w)
        load = np.bincount(priced.arcs, minlength=prob.num_links).astype(float)
        t = float((load / prob.capacity).max(initial=0.0))
        if t < best_t * (1 - 1e-9) or best is None:
            best, best_t = priced, t
        took = time.perf_counter() - start
        if (deadline is not None
                and deadline - time.perf_counter() < took * (1 + MASTER_COST_FACTOR)):
            break                       # no room for another routing and the master after it
        if missing.all() and _cut_certified(prob, max_steps, load, t):
            break
    _check_reached(prob, max_steps, missing, best)
    return best


def certified_routing(prob: Problem, max_steps: int) -> PricedColumns | None:
    """The first routing of every pair a cold start tries (``WAVES[0]`` waves) when the
    cut bound of its busiest links proves it optimal (:func:`_cut_certified`), else
    ``None``.  One routing pass and one pricing pass: what a cold start spends before
    its first master anyway."""
    want = ~np.eye(prob.num_gpus, dtype=bool)
    priced = _routed(prob, max_steps, want, max(1, min(int(WAVES[0]), prob.num_gpus)))
    load = np.bincount(priced.arcs, minlength=prob.num_links).astype(float)
    t = float((load / prob.capacity).max(initial=0.0))
    if priced.count != prob.num_pairs or not _cut_certified(prob, max_steps, load, t):
        return None
    return priced


#: A routing is certified when its cut bound is within this relative gap of its ``t``.
CERTIFIED_REL_TOL = 1e-7


def _cut_certified(prob: Problem, max_steps: int, load: np.ndarray, t: float) -> bool:
    """Whether a routing of every pair (one path each, ``load`` pairs per link, busiest
    link at utilisation ``t``) is optimal: the cut bound of its busiest links ``S``,
    ``sum_p min_P |P ∩ S| / cap(S)`` (a lower bound on the optimal ``t``, proof at
    ``colgen.class_cut_prices``), reaches ``t``.  Then its first master, this routing,
    is certified by column generation's first round as well (the healthy HPN and
    imported DGX fabrics without CPU paths)."""
    if t <= 0:
        return False
    sat = load >= prob.capacity * t * (1 - 1e-6)
    w = sat / float(prob.capacity @ sat)
    none = np.full((prob.num_gpus, prob.num_gpus), -np.inf)
    bound = float(prob.pair_values(price_paths(prob.graph, w, none, max_steps).shortest).sum())
    return bound >= t * (1 - CERTIFIED_REL_TOL)


def _routed(prob: Problem, max_steps: int, want: np.ndarray, waves: int) -> PricedColumns:
    """One path per wanted pair, the sources routed in ``waves`` interleaved waves."""
    g = prob.num_gpus
    load = np.zeros(prob.num_links)
    parts: list[PricedColumns] = []
    waves = max(1, min(int(waves), g))
    for w in range(waves):
        sources = np.arange(w, g, waves, dtype=np.int64)
        sources = sources[want[sources].any(axis=1)]
        if not sources.size:
            continue
        part = price_sources(prob.graph, (load + 0.5) / prob.capacity, sources, max_steps, want)
        if w + 1 < waves:               # the last wave's load prices nothing
            load += np.bincount(part.arcs, minlength=prob.num_links)
        parts.append(part)
    return _concat(parts, g)


def _check_reached(prob: Problem, max_steps: int, missing: np.ndarray,
                   priced: PricedColumns) -> None:
    """Raise :class:`TopologyError` naming a missing pair that ``priced`` leaves without
    a path (the step bound cuts it off)."""
    if priced.count == np.count_nonzero(missing):
        return                          # at most one path per missing pair: all routed
    routed = np.zeros(prob.num_pairs, dtype=bool)
    routed[prob.pair_index(priced.src, priced.dst)] = True
    unreachable = missing & ~routed
    if unreachable.any():
        p = int(np.flatnonzero(unreachable)[0])
        gpus = prob.topo.gpus
        raise TopologyError(
            f"GPU {gpus[prob.pair_src[p]]!r} cannot reach GPU {gpus[prob.pair_dst[p]]!r} within "
            f"max_steps={max_steps} steps ({int(unreachable.sum())} pair(s) affected); raise "
            f"max_steps or use max_steps='min'")


def _concat(parts: list[PricedColumns], g: int) -> PricedColumns:
    """One :class:`PricedColumns` from the waves' (``shortest``: the sum of their rows,
    each source's row set by one wave only)."""
    if len(parts) == 1:                 # one wave: nothing to join (4M pairs at 2,048 GPUs)
        return parts[0]
    shortest = np.zeros((g, g))
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return PricedColumns(shortest, empty, empty, np.zeros(0), np.zeros(1, dtype=np.int64),
                             empty)
    offsets = np.cumsum([0] + [int(p.arcs.size) for p in parts[:-1]])
    for p in parts:
        shortest += p.shortest
    return PricedColumns(
        shortest, np.concatenate([p.src for p in parts]), np.concatenate([p.dst for p in parts]),
        np.concatenate([p.cost for p in parts]),
        np.concatenate([[0]] + [p.start[1:] + o for p, o in zip(parts, offsets)]).astype(np.int64),
        np.concatenate([p.arcs for p in parts]))


def min_steps_per_pair(prob: Problem) -> np.ndarray:
    """Fewest steps any path of each pair needs (zero prices: ties go to fewer steps)."""
    threshold = np.full((prob.num_gpus, prob.num_gpus), np.inf)
    priced = price_paths(prob.graph, np.zeros(prob.num_links), threshold, prob.topo.num_nodes - 1)
    seg = np.repeat(np.arange(priced.count), np.diff(priced.start))
    steps = np.bincount(seg, weights=prob.is_step_arc[priced.arcs].astype(float),
                        minlength=priced.count)
    out = np.zeros(prob.num_pairs, dtype=np.int64)
    out[prob.pair_index(priced.src, priced.dst)] = steps.astype(np.int64)
    return out
