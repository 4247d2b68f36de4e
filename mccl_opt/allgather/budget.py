"""The chunk budget: how many unit trees ``k`` per root, and their bandwidth ``y``.

With ``x* = num/den`` (quanta), ``k0 = num / gcd(num, den * gcd(caps))`` is the fewest
trees per root for which every link carries a whole number of trees of bandwidth
``x*/k0`` (ForestColl's k: 41 on a healthy 8-GPU rail host pair).  With a budget
``K >= k0`` (or ``None``) that is the exact optimum.  Otherwise every ``k <= K`` is
scored by the best ``y_k`` for which ``floor(cap/y)`` admits ``k`` trees per root
(:func:`~.forestcoll.throughput.best_tree_bandwidth`), best-first: every ``k`` keeps an upper
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
from functools import cmp_to_key

import numpy as np

from ..errors import SolveError
from .forestcoll.throughput import (Fabric, PhaseOneResult, best_tree_bandwidth, cut_tree_bandwidth,
                         violated_tree_cut)

__all__ = ["exact_k", "CutBounds", "fewest_trees", "choose_trees", "guess_trees", "guess_budget",
           "MAX_UNITS", "EXACT_TREES_LIMIT", "BudgetUnpacked", "ChunkCounts"]


class BudgetUnpacked(SolveError):
    """ForestColl chose the chunk budget of ``k`` trees per root but could not split or
    pack it.  Every limit ``K`` in ``[k, K_tried]`` chooses that same budget (the best
    ``k·y_k`` over ``k <= K``, ties to the smaller ``k``), so retrying them repeats the
    same failing split and packing (:class:`ChunkCounts` skips them)."""

    def __init__(self, k: int, message: str) -> None:
        super().__init__(message)
        self.k = k


class ChunkCounts:
    """The chunk limits ``K, K-1, ..., 1`` a retry loop asks ForestColl for (the method
    chain on a balanced restriction, the general method's seed), skipping from a failed
    budget of ``k`` trees per root straight to ``k - 1``."""

    def __init__(self, start: int) -> None:
        self._next = start

    def __iter__(self):
        while self._next >= 1:
            limit = self._next
            self._next = limit - 1
            yield limit

    def failed(self, error: SolveError) -> None:
        """The limit just yielded failed with ``error``: skip the limits that repeat it."""
        if isinstance(error, BudgetUnpacked):
            self._next = min(self._next, error.k - 1)

#: trees a link may carry before the exact k is declared impractical (int64 headroom)
MAX_UNITS = 1 << 40

#: above this many exact trees per root (``max_chunks=None``), ForestColl does not pack:
#: the general method solves cold, and a warm guess needing more is not tried (its
#: packing alone took 70 s on a 12-GPU fabric where the general method takes 0.05 s)
EXACT_TREES_LIMIT = 4096

#: largest k :func:`fewest_trees` tries below the exact k0
FEWEST_TRIES = 64


def exact_k(fab: Fabric, p1: PhaseOneResult) -> int:
    """Fewest trees per root that realise ``x*`` exactly."""
    g = int(np.gcd.reduce(fab.cap[fab.cap > 0]))
    return p1.num // math.gcd(p1.num, p1.den * g)


def _weakest_gpus(fab: Fabric, count: int = 8) -> np.ndarray:
    """The ``count`` GPUs with the smallest ingress (ties: rank order)."""
    ingress = fab.ingress()[fab.gpus]
    return fab.gpus[np.argsort(ingress, kind="stable")[:count]]


Profile = tuple[tuple[int, ...], int]


class CutBounds:
    """Cut bounds on the tree bandwidth of one fabric: a set of cut *profiles*
    ``(sorted capacities, GPUs outside)`` and, memoised per profile and ``k``, the
    largest ``y`` with which the cut admits ``k`` trees per root
    (:func:`~.forestcoll.throughput.cut_tree_bandwidth`).  One instance serves every guess and
    search of a solve, so a profile's bound is computed once."""

    def __init__(self, fab: Fabric) -> None:
        self.fab = fab
        self.profiles: set[Profile] = set()
        self._is_gpu = fab.is_gpu()
        self._y: dict[tuple[Profile, int], Fraction] = {}
        self._singles_added = False

    def add(self, cuts: list[np.ndarray]) -> set[Profile]:
        """Add the proper cuts among ``cuts`` (sink-side masks); returns the new profiles."""
        fab, is_gpu = self.fab, self._is_gpu
        new = set()
        for s in cuts:
            m = int(np.count_nonzero(is_gpu & ~s))
            if m and (is_gpu & s).any():
                new.add((tuple(sorted(fab.cap[fab.cut_arcs(s)].tolist())), m))
        new -= self.profiles
        self.profiles |= new
        return new

    def upper(self, k: int, profiles: set[Profile] | None = None) -> Fraction:
        """The smallest bound on ``y_k`` over ``profiles`` (default: all; 0 if none)."""
        best = None
        for prof in self.profiles if profiles is None else profiles:
            y = self._y.get((prof, k))
            if y is None:
                y = self._y[prof, k] = cut_tree_bandwidth(prof[0], k * prof[1])
            if best is None or _below(y, best):
                best = y
        return Fraction(0) if best is None else best

    def admits(self, k: int, x: Fraction) -> bool:
        """Whether every profile's cut admits ``k`` trees per root of bandwidth ``x/k``
        (``sum floor(cap·k / x) >= k · GPUs outside``), i.e. ``upper(k) >= x/k``."""
        num, den = x.numerator, x.denominator * k
        return all(sum(c * den // num for c in caps) >= k * m for caps, m in self.profiles)

    def bounds(self, budget: int, x_star: Fraction) -> dict[int, Fraction]:
        """``ȳ_k = min(cut bound, x*/k)`` for every ``k <= budget``."""
        out = {}
        for k in range(1, budget + 1):
            y = self.upper(k)           # x*/k < y, in integers:
            below = x_star.numerator * y.denominator < y.numerator * k * x_star.denominator
            out[k] = x_star / k if below else y
        return out

    def add_hints(self, p1: PhaseOneResult, extra: list[np.ndarray]) -> None:
        """Phase 1's cut, ``extra`` cuts and (once) the single-GPU cuts of
        :func:`_weakest_gpus` (a GPU's profile: its ingress capacities)."""
        self.add([p1.cut] + list(extra))
        if not self._singles_added:
            fab, outside = self.fab, self.fab.num_gpus - 1
            self.profiles |= {(tuple(sorted(fab.cap[fab.head == g].tolist())), outside)
                              for g in _weakest_gpus(fab).tolist()}
            self._singles_added = True


def _below(a: Fraction, b: Fraction) -> bool:
    """``a < b`` by integer cross-multiplication (Fraction's operators cost ~3 us)."""
    return a.numerator * b.denominator < b.numerator * a.denominator


def _ranked(bounds: dict[int, Fraction]) -> list[int]:
    """``k`` by decreasing ``k·ȳ_k``, ties smallest ``k`` first."""
    def order(i: int, j: int) -> int:
        a = i * bounds[i].numerator * bounds[j].denominator
        b = j * bounds[j].numerator * bounds[i].denominator
        return -1 if a > b else 1 if a < b else i - j
    return sorted(bounds, key=cmp_to_key(order))


def _exact_fits(fab: Fabric, p1: PhaseOneResult, max_chunks: int | None, k0: int) -> bool:
    """Whether ``k0`` trees per root are within the budget and int64 unit counts."""
    return (max_chunks is None or k0 <= max_chunks) and \
        int(fab.cap.max()) * k0 * p1.den // p1.num <= MAX_UNITS


def fewest_trees(fab: Fabric, p1: PhaseOneResult, k0: int) -> tuple[int, Fraction, int]:
    """``(k, x*/k, max-flows)`` for the smallest ``k <= k0`` whose floored units
    ``floor(cap·k/x*)`` admit ``k`` trees per root (single-GPU and Phase 1 cuts first,
    then the rooted test): ``k0`` makes every link's units exact, but the floors drop
    only capacity no tight cut needs, so fewer trees often reach ``x*`` too (4096-GPU
    HPN: 1 instead of 5).  Only ``k <= FEWEST_TRIES`` are tried (exact mode's ``k0``
    can be in the millions).  Cold and warm choose alike (same fabric, same ``x*``).
    A failed rooted test's cut joins the screening cuts, so a later ``k`` that cut
    excludes costs no max-flow (a warm guess above ``x*``: 64 rooted tests -> a few)."""
    x = Fraction(p1.num, p1.den)
    singles = CutBounds(fab)
    singles.add_hints(p1, [])
    calls = 0
    for k in range(1, min(k0, FEWEST_TRIES + 1)):
        if singles.admits(k, x):
            pos, sink_side = violated_tree_cut(fab, k, x / k, fab.sweep())
            calls += fab.num_gpus if pos < 0 else pos + 1
            if pos < 0:
                return k, x / k, calls
            if sink_side is not None:
                singles.add([sink_side])
    return k0, x / k0, calls


def choose_trees(fab: Fabric, p1: PhaseOneResult, max_chunks: int | None,
                 extra_cuts: list[np.ndarray] | None = None,
                 cuts: CutBounds | None = None) -> tuple[int, Fraction, int]:
    """``(k, y, maxflow calls)``: trees per root and tree bandwidth (quanta), the best
    ``k·y_k`` over ``k <= K`` (ties: smallest ``k``; ``(0, 0)`` if every ``y_k`` is 0),
    found best-first with shared cuts (module doc); ``cuts`` may carry the bounds of
    an earlier guess on the same fabric."""
    k0 = exact_k(fab, p1)
    if _exact_fits(fab, p1, max_chunks, k0):
        return fewest_trees(fab, p1, k0)
    budget = max_chunks if max_chunks is not None else 64
    cuts = cuts or CutBounds(fab)
    cuts.add_hints(p1, extra_cuts or [])
    bounds = cuts.bounds(budget, Fraction(p1.num, p1.den))
    passed = dict.fromkeys(bounds, 0)
    calls = 0
    while True:
        k, *rest = _ranked(bounds)
        if bounds[k] <= 0:
            return 0, Fraction(0), calls
        if passed[k] == fab.num_gpus:           # y_k = ȳ_k >= every other ȳ
            return k, bounds[k], calls
        rival = rest[0] * bounds[rest[0]] / k if rest else Fraction(0)
        y, c, passed[k], found = best_tree_bandwidth(fab, k, bounds[k], passed[k], rival)
        calls += c
        bounds[k] = y
        new = cuts.add(found)
        if new:
            bounds = {j: min(b, cuts.upper(j, new)) for j, b in bounds.items()}


def guess_trees(fab: Fabric, bound: PhaseOneResult, max_chunks: int | None,
                cuts: CutBounds | None = None) -> tuple[int, Fraction] | None:
    """``(k, y)`` with ``k·y`` equal to the upper bound ``bound`` on ``x*`` (no max-flow):
    the exact ``k0`` of the bound if the budget allows it, else the smallest ``k`` whose
    hint-cut bound does not exclude ``y = bound/k``; ``None`` if none.  Only a completed
    packing of ``k`` trees per root in ``floor(cap/y)`` units proves ``bound = x*``
    (then no ``k <= K`` can do better).  ``cuts`` keeps the cut bounds for later guesses."""
    x = Fraction(bound.num, bound.den)
    k0 = exact_k(fab, bound)
    if _exact_fits(fab, bound, max_chunks, k0):
        return fewest_trees(fab, bound, k0)[:2]
    budget = max_chunks if max_chunks is not None else 64
    cuts = cuts or CutBounds(fab)
    cuts.add_hints(bound, [])
    for k in range(1, budget + 1):          # fewest trees: least Phase 2/3 work
        if cuts.admits(k, x):
            return k, x / k
    return None


def guess_budget(fab: Fabric, p1: PhaseOneResult, max_chunks: int | None,
                 extra_cuts: list[np.ndarray] | None = None, rounds: int = 4,
                 cuts: CutBounds | None = None) -> tuple[int, Fraction, int] | None:
    """``(k, ȳ, maxflow calls)`` for the budget search :func:`choose_trees` would run
    (``k0 > K``), with a few probing max-flows instead of its sweeps: ``ȳ_k = min(cut
    bound, x*/k)`` bounds the best tree bandwidth of ``k`` from above, so ``max_k k·ȳ_k``
    (ties: smallest ``k``) bounds the budget optimum.  Each of up to ``rounds`` probes
    runs the rooted test of the argmax ``(k, ȳ_k)`` on :func:`_weakest_gpus` only; the
    first failing GPU's sink side joins the cuts and the argmax is taken again (every
    cut is a true cut: the result stays an upper bound).  A completed packing of ``k``
    trees per root in ``floor(cap/ȳ)`` proves ``ȳ_k = y_k`` and that no ``k' <= K`` does
    better, i.e. ``(k, ȳ)`` is exactly :func:`choose_trees`' answer.  ``None`` when no
    search is needed or no bound is positive.  ``cuts`` may carry earlier bounds."""
    if _exact_fits(fab, p1, max_chunks, exact_k(fab, p1)):
        return None
    x_star = Fraction(p1.num, p1.den)
    cuts = cuts or CutBounds(fab)
    cuts.add_hints(p1, extra_cuts or [])
    budget = max_chunks if max_chunks is not None else 64
    sinks = _weakest_gpus(fab)
    calls = 0
    for probe in range(rounds + 1):
        bounds = cuts.bounds(budget, x_star)
        k = _ranked(bounds)[0]
        if bounds[k] <= 0:
            return None
        if probe == rounds:
            break
        pos, sink_side = violated_tree_cut(fab, k, bounds[k], sinks)
        calls += len(sinks) if pos < 0 else pos + 1
        if sink_side is None:
            break
        cuts.add([sink_side])
    return k, bounds[k], calls
