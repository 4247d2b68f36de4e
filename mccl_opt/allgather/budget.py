"""The chunk budget: how many unit trees ``k`` per root, and their bandwidth ``y``.

With ``x* = num/den`` (quanta), ``k0 = num / gcd(num, den * gcd(caps))`` is the fewest
trees per root for which every link carries a whole number of trees of bandwidth
``x*/k0`` (ForestColl's k: 41 on a healthy 8-GPU rail host pair).  With a budget
``K >= k0`` (or ``None``) that is the exact optimum.  Otherwise every ``k <= K`` is
scored by the best ``y_k`` for which ``floor(cap/y)`` admits ``k`` trees per root
(:func:`~.throughput.best_tree_bandwidth`), best-first: every ``k`` keeps an upper
bound ``ȳ_k >= y_k`` (``x*/k``, Phase 1's cut, the tightest single-GPU cuts and every
violated cut any ``k``'s sweep has found so far: one cut bounds every ``k``) and how
far its sweep has passed; the ``k`` with the largest ``k·ȳ_k`` resumes its sweep until
it passes every GPU (then ``ȳ_k = y_k`` and no ``k`` can beat it) or drops below the
runner-up.  Ties go to the smaller ``k`` (fewest trees: least Phase 2/3 work).  Warm
solves choose exactly like cold ones (keeping the previous ``k`` on ties was measured
slower: more trees to split, pack and map).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from .throughput import (Fabric, PhaseOneResult, best_tree_bandwidth, cut_tree_bandwidth,
                         violated_tree_cut)

__all__ = ["exact_k", "choose_trees", "guess_trees", "guess_budget", "MAX_UNITS"]

#: trees a link may carry before the exact k is declared impractical (int64 headroom)
MAX_UNITS = 1 << 40


def exact_k(fab: Fabric, p1: PhaseOneResult) -> int:
    """Fewest trees per root that realise ``x*`` exactly."""
    g = int(np.gcd.reduce(fab.cap[fab.cap > 0]))
    return p1.num // math.gcd(p1.num, p1.den * g)


def _weakest_gpus(fab: Fabric, count: int = 8) -> np.ndarray:
    """The ``count`` GPUs with the smallest ingress (ties: rank order)."""
    ingress = np.bincount(fab.head, weights=fab.cap, minlength=fab.n)[fab.gpus]
    return fab.gpus[np.argsort(ingress, kind="stable")[:count]]


def _hint_cuts(fab: Fabric, p1: PhaseOneResult, extra: list[np.ndarray]) -> list[np.ndarray]:
    """Phase 1's cut, ``extra`` cuts and the single-GPU cuts of :func:`_weakest_gpus`."""
    cuts = [p1.cut] + list(extra)
    for g in _weakest_gpus(fab):
        s = np.zeros(fab.n, bool)
        s[g] = True
        cuts.append(s)
    return cuts


def _profiles(fab: Fabric, cuts: list[np.ndarray]) -> set[tuple[tuple[int, ...], int]]:
    """Distinct ``(sorted cut capacities, GPUs outside)`` of the proper cuts."""
    is_gpu = fab.is_gpu()
    out = set()
    for s in cuts:
        m = int(np.count_nonzero(is_gpu & ~s))
        if m and (is_gpu & s).any():
            out.add((tuple(sorted(fab.cap[fab.cut_arcs(s)].tolist())), m))
    return out


def _upper(k: int, profiles: set[tuple[tuple[int, ...], int]]) -> Fraction:
    ys = [cut_tree_bandwidth(np.array(caps), k * m) for caps, m in sorted(profiles)]
    return min(ys) if ys else Fraction(0)


def _bounds(budget: int, x_star: Fraction,
            profiles: set[tuple[tuple[int, ...], int]]) -> dict[int, Fraction]:
    """``ȳ_k = min(cut bound of the profiles, x*/k)`` for every ``k <= budget``."""
    return {k: min(_upper(k, profiles), x_star / k) for k in range(1, budget + 1)}


def _ranked(bounds: dict[int, Fraction]) -> list[int]:
    """``k`` by decreasing ``k·ȳ_k``, ties smallest ``k`` first."""
    return sorted(bounds, key=lambda k: (-(k * bounds[k]), k))


def choose_trees(fab: Fabric, p1: PhaseOneResult, max_chunks: int | None,
                 extra_cuts: list[np.ndarray] | None = None) -> tuple[int, Fraction, int]:
    """``(k, y, maxflow calls)``: trees per root and tree bandwidth (quanta), the best
    ``k·y_k`` over ``k <= K`` (ties: smallest ``k``; ``(0, 0)`` if every ``y_k`` is 0),
    found best-first with shared cuts (module doc)."""
    k0 = exact_k(fab, p1)
    max_units = int(fab.cap.max()) * k0 * p1.den // p1.num
    if (max_chunks is None or k0 <= max_chunks) and max_units <= MAX_UNITS:
        return k0, Fraction(p1.num, p1.den * k0), 0
    budget = max_chunks if max_chunks is not None else 64
    x_star = Fraction(p1.num, p1.den)
    profiles = _profiles(fab, _hint_cuts(fab, p1, extra_cuts or []))
    bounds = _bounds(budget, x_star, profiles)
    passed = dict.fromkeys(bounds, 0)
    calls = 0
    while True:
        k, *rest = _ranked(bounds)
        if bounds[k] <= 0:
            return 0, Fraction(0), calls
        if passed[k] == fab.num_gpus:           # y_k = ȳ_k >= every other ȳ
            return k, bounds[k], calls
        rival = rest[0] * bounds[rest[0]] / k if rest else Fraction(0)
        y, c, passed[k], cuts = best_tree_bandwidth(fab, k, bounds[k], passed[k], rival)
        calls += c
        bounds[k] = y
        new = _profiles(fab, cuts) - profiles
        if new:
            profiles |= new
            bounds = {j: min(b, _upper(j, new)) for j, b in bounds.items()}


def guess_trees(fab: Fabric, bound: PhaseOneResult,
                max_chunks: int | None) -> tuple[int, Fraction] | None:
    """``(k, y)`` with ``k·y`` equal to the upper bound ``bound`` on ``x*`` (no max-flow):
    the exact ``k0`` of the bound if the budget allows it, else the smallest ``k`` whose
    hint-cut bound does not exclude ``y = bound/k``; ``None`` if none.  Only a completed packing of ``k`` trees per root in ``floor(cap/y)``
    units proves ``bound = x*`` (then no ``k <= K`` can do better)."""
    x = Fraction(bound.num, bound.den)
    k0 = exact_k(fab, bound)
    if (max_chunks is None or k0 <= max_chunks) and \
            int(fab.cap.max()) * k0 * bound.den // bound.num <= MAX_UNITS:
        return k0, x / k0
    budget = max_chunks if max_chunks is not None else 64
    profiles = _profiles(fab, _hint_cuts(fab, bound, []))
    for k in range(1, budget + 1):          # fewest trees: least Phase 2/3 work
        if _upper(k, profiles) * k >= x:
            return k, x / k
    return None


def guess_budget(fab: Fabric, p1: PhaseOneResult, max_chunks: int | None,
                 extra_cuts: list[np.ndarray] | None = None,
                 rounds: int = 4) -> tuple[int, Fraction, int] | None:
    """``(k, ȳ, maxflow calls)`` for the budget search :func:`choose_trees` would run
    (``k0 > K``), with a few probing max-flows instead of its sweeps: ``ȳ_k = min(cut
    bound, x*/k)`` bounds the best tree bandwidth of ``k`` from above, so ``max_k k·ȳ_k``
    (ties: smallest ``k``) bounds the budget optimum.  Each of up to ``rounds`` probes
    runs the rooted test of the argmax ``(k, ȳ_k)`` on :func:`_weakest_gpus` only; the
    first failing GPU's sink side joins the cuts and the argmax is taken again (every
    cut is a true cut: the result stays an upper bound).  A completed packing of ``k``
    trees per root in ``floor(cap/ȳ)`` proves ``ȳ_k = y_k`` and that no ``k' <= K`` does
    better, i.e. ``(k, ȳ)`` is exactly :func:`choose_trees`' answer.  ``None`` when no
    search is needed or no bound is positive."""
    k0 = exact_k(fab, p1)
    if (max_chunks is None or k0 <= max_chunks) and \
            int(fab.cap.max()) * k0 * p1.den // p1.num <= MAX_UNITS:
        return None
    x_star = Fraction(p1.num, p1.den)
    profiles = _profiles(fab, _hint_cuts(fab, p1, extra_cuts or []))
    budget = max_chunks if max_chunks is not None else 64
    sinks = _weakest_gpus(fab)
    calls = 0
    for probe in range(rounds + 1):
        bounds = _bounds(budget, x_star, profiles)
        k = _ranked(bounds)[0]
        if bounds[k] <= 0:
            return None
        if probe == rounds:
            break
        pos, sink_side = violated_tree_cut(fab, k, bounds[k], sinks)
        calls += len(sinks) if pos < 0 else pos + 1
        if sink_side is None:
            break
        profiles |= _profiles(fab, [sink_side])
    return k, bounds[k], calls
