"""Which Phase 3 path completes cheaper at ``max_chunks=None``: a repair packing that is
past its own size ``k·n²`` in tree visits, or the exact few-trees packing that follows
its failure (paper §4.3; docs/allgather.md, *Repair or few-trees: a forecast*).

Both costs are counted in the repair searches' unit, trees visited:

* the repair packing's remaining cost is extrapolated from its progress: the tree
  entries still missing at the rate the search placed entries per visit over its last
  stretch (``[k·n²/2, k·n²]``; chains and the growth they unblock both count);
* the few-trees packing's cost is its max-flow checks (about ``2 n²``: one per class edge
  tried, classes ~``1.1-3.2 n``), each worth :data:`VISITS_PER_CHECK` visits
  (:func:`few_trees_visits`).  The exact split before it (0.2-0.9 s at 64-128 GPUs) is
  left out: a lower bound, so the forecast leans to the bounded path.

At ``k·n²`` visits (where the packing used to stop) the forecast is made once: the
packing stops unless its extrapolated rest ``R`` costs less than the few-trees packing,
and then goes on for at most ``min(TRUST·R, estimate)`` visits more.  Its progress comes
in bursts (one chain can unblock thousands of entries), so ``R`` is rough: the packings
that completed took 0.09-2.4 ``R`` (hence :data:`TRUST`), and where a burst in the window
made ``R`` too small (scrambled leaf-spine 8x2x8 with 4 spines, which never completes)
the packing stops after ``TRUST·R`` (1-3 ``k·n²``), not after the estimate (22 ``k·n²``).
It separates SuperPOD 2x4x8 (``R`` at 0.13-0.77 of the few-trees estimate; it completes
at 4.1-8.4 ``k·n²``) from leaf-spine 8x2x8 with 4 spines (2.0-3.0), not every leaf-spine
4x2x8 packing (some complete at 1.5-7 ``k·n²`` with ``R`` at 1.3-3.8 estimates).
"""

from __future__ import annotations

from typing import NamedTuple

from numba import njit

__all__ = ["VISITS_PER_CHECK", "FEW_TREES_CHECKS_PER_N2_EST", "WINDOW_FROM", "TRUST", "Forecast",
           "NO_FORECAST", "few_trees_visits", "forecast", "hopeless"]

#: repair visits one few-trees max-flow check costs, both timed on the 2-core machine:
#: ~510 at 64 GPUs (SuperPOD 2x4x8: 15 M visits/s, 34 µs per check), ~400 at 128
#: (leaf-spine 8x2x8 with 4 spines: 3.5 M visits/s, 113 µs per check)
VISITS_PER_CHECK = 450

#: few-trees max-flow checks per ``n²`` expected (measured 1.1 at one tree per root,
#: 1.8-2.1 at 41 trees per root, 3.2 on the 583-tree restriction of leaf-spine 4x2x8)
FEW_TREES_CHECKS_PER_N2_EST = 2

#: the progress rate is measured from this fraction of ``decide_at`` on
WINDOW_FROM = 0.5

#: a packing forecast to finish in ``R`` visits may take this many times ``R`` (those that
#: completed took 0.09-2.4 ``R``)
TRUST = 3


class Forecast(NamedTuple):
    """When the repair packing decides (``decide_at`` visits; 0: never) and the
    few-trees packing's estimated cost in visits (``alt_visits``)."""

    decide_at: int
    alt_visits: int


NO_FORECAST = Forecast(0, 0)


def few_trees_visits(n: int) -> int:
    """The few-trees packing's estimated cost on ``n`` GPUs, in repair visits."""
    return FEW_TREES_CHECKS_PER_N2_EST * n * n * VISITS_PER_CHECK


def forecast(n: int, k: int) -> tuple[Forecast, int]:
    """The forecast of a repair packing of ``k`` trees per root that the few-trees packing
    follows, and its visit cap: decide at its size ``k·n²``, stop at the latest after its
    size plus the few-trees estimate."""
    alt = few_trees_visits(n)
    return Forecast(k * n * n, alt), k * n * n + alt


@njit(cache=True, _nrt=False)
def hopeless(fc, visits, missing, mark):
    """Should the repair packing stop?  ``visits`` trees visited so far, ``missing`` tree
    entries not placed; ``mark`` (set here): the visits and missing entries when the
    search passed ``WINDOW_FROM·decide_at`` (``mark[0] < 0`` before), and once decided
    the visits it may run to (``mark[2] < 0`` before).  At ``decide_at``: True when
    ``missing`` at the entries placed per visit since the mark would take more visits
    than the few-trees packing's estimate (``fc``: :class:`Forecast`; no progress is
    hopeless), else it may go on for ``TRUST`` times that rest, at most the estimate."""
    decide_at, alt = fc
    if decide_at <= 0:
        return False
    if mark[2] >= 0:
        return visits > mark[2]
    if mark[0] < 0:
        if visits >= WINDOW_FROM * decide_at:
            mark[0] = visits
            mark[1] = missing
        return False
    if visits < decide_at:
        return False
    placed = mark[1] - missing
    if placed <= 0:
        return True
    rest = missing * (visits - mark[0]) / placed
    if rest >= alt:
        return True
    mark[2] = visits + int(min(alt, TRUST * rest))
    return False
