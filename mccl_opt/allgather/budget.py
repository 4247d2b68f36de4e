"""The chunk budget: how many unit trees ``k`` per root, and their bandwidth ``y``.

With ``x* = num/den`` (quanta), ``k0 = num / gcd(num, den * gcd(caps))`` is the fewest
trees per root for which every link carries a whole number of trees of bandwidth
``x*/k0`` (ForestColl's k: 41 on a healthy 8-GPU rail host pair).  With a budget
``K >= k0`` (or ``None``) that is the exact optimum.  Otherwise every ``k <= K`` is
scored by the best ``y`` for which ``floor(cap/y)`` admits ``k`` trees per root
(:func:`~.throughput.best_tree_bandwidth`); ``k`` is tried in decreasing order of a cheap
upper bound (the tightest single-GPU cuts and Phase 1's cut), stopping once the bound
cannot beat the best rate found; ties go to the smaller ``k`` (fewest trees: least
Phase 2/3 work), and the search stops once some ``k`` reaches ``x*`` exactly.  Warm
solves choose exactly like cold ones (keeping the previous ``k`` on ties was measured
slower: more trees to split, pack and map).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from .throughput import Fabric, PhaseOneResult, best_tree_bandwidth, cut_tree_bandwidth

__all__ = ["exact_k", "choose_trees", "guess_trees", "guess_budget", "MAX_UNITS"]

#: trees a link may carry before the exact k is declared impractical (int64 headroom)
MAX_UNITS = 1 << 40


def exact_k(fab: Fabric, p1: PhaseOneResult) -> int:
    """Fewest trees per root that realise ``x*`` exactly."""
    g = int(np.gcd.reduce(fab.cap[fab.cap > 0]))
    return p1.num // math.gcd(p1.num, p1.den * g)


def _hint_cuts(fab: Fabric, p1: PhaseOneResult, extra: list[np.ndarray], count: int = 8) -> list[np.ndarray]:
    """Phase 1's cut, ``extra`` cuts and the ``count`` GPUs with the smallest ingress."""
    ingress = np.bincount(fab.head, weights=fab.cap, minlength=fab.n)[fab.gpus]
    cuts = [p1.cut] + list(extra)
    for g in fab.gpus[np.argsort(ingress, kind="stable")[:count]]:
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


def choose_trees(fab: Fabric, p1: PhaseOneResult, max_chunks: int | None,
                 extra_cuts: list[np.ndarray] | None = None) -> tuple[int, Fraction, int]:
    """``(k, y, maxflow calls)``: trees per root and tree bandwidth (quanta)."""
    k0 = exact_k(fab, p1)
    max_units = int(fab.cap.max()) * k0 * p1.den // p1.num
    if (max_chunks is None or k0 <= max_chunks) and max_units <= MAX_UNITS:
        return k0, Fraction(p1.num, p1.den * k0), 0
    budget = max_chunks if max_chunks is not None else 64
    cuts = _hint_cuts(fab, p1, extra_cuts or [])
    x_star = Fraction(p1.num, p1.den)
    best_k, best_y, calls = 0, Fraction(0), 0
    profiles = _profiles(fab, cuts)
    bounds = {k: min(_upper(k, profiles), x_star / k) for k in range(1, budget + 1)}
    for k in sorted(bounds, key=lambda k: (-(k * bounds[k]), k)):
        if best_k and k * bounds[k] <= best_k * best_y:
            continue
        y, c = best_tree_bandwidth(fab, k, bounds[k], cuts)
        calls += c
        if k * y > best_k * best_y or (k * y == best_k * best_y and k < best_k):
            best_k, best_y = k, y
        if k * y == x_star:               # k·y <= x* for every k: nothing can beat it
            break
    return best_k, best_y, calls


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
                 extra_cuts: list[np.ndarray] | None = None) -> tuple[int, Fraction] | None:
    """``(k, ȳ)`` for the budget search :func:`choose_trees` would sweep (``k0 > K``),
    without its max-flows: ``ȳ_k = min(hint-cut bound, x*/k)`` bounds the best tree
    bandwidth of ``k`` from above, so ``max_k k·ȳ_k`` (ties: smallest ``k``) bounds the
    budget optimum.  A completed packing of ``k`` trees per root in ``floor(cap/ȳ)``
    proves ``ȳ_k = y_k`` and that no ``k' <= K`` does better, i.e. ``(k, ȳ)`` is
    exactly :func:`choose_trees`' answer.  ``None`` when no sweep is needed or no
    bound is positive."""
    k0 = exact_k(fab, p1)
    if (max_chunks is None or k0 <= max_chunks) and \
            int(fab.cap.max()) * k0 * p1.den // p1.num <= MAX_UNITS:
        return None
    x_star = Fraction(p1.num, p1.den)
    profiles = _profiles(fab, _hint_cuts(fab, p1, extra_cuts or []))
    budget = max_chunks if max_chunks is not None else 64
    bounds = {k: min(_upper(k, profiles), x_star / k) for k in range(1, budget + 1)}
    k = max(bounds, key=lambda k: (k * bounds[k], -k))
    return (k, bounds[k]) if bounds[k] > 0 else None
