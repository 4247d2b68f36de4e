"""Which Phase 3 path completes cheaper at ``max_chunks=None``: a repair packing that is
past its own size ``k·n²`` in tree visits, or the exact few-trees packing that follows
its failure (paper §4.3; docs/allgather.md, *Repair or few-trees: a forecast*).

Both costs are counted in the repair searches' unit, trees visited:

* the repair packing's remaining cost is extrapolated from its progress: the tree
  entries still missing at the rate the search placed entries per visit over its last
  stretch (:data:`WINDOW` ``·k·n²`` visits; chains and the growth they unblock both count);
* the few-trees packing's cost is its max-flow checks (about ``2 n²``: one per class edge
  tried, classes ~``1.1-3.2 n``), each worth :data:`VISITS_PER_CHECK` visits
  (:func:`few_trees_visits`).  The exact split before it (0.2-0.9 s at 64-128 GPUs) is
  left out: a lower bound, so the forecast leans to the bounded path.

From ``k·n²`` visits (where the packing used to stop) the forecast is renewed every
stretch of ``WINDOW·k·n²`` visits: the packing stops unless the rest ``R`` extrapolated
from the entries placed over the last stretch costs less than what is left of the
few-trees estimate (the estimate minus the visits spent past ``k·n²``).  Its progress comes
in bursts (one chain can unblock thousands of entries), so a forecast from one stretch is
rough; renewed, a burst buys one more stretch, not a run: decided once (from
``[k·n²/2, k·n²]``, then going on for 3 ``R``), the scrambled listings of leaf-spine 8x2x8
with 4 spines, which never complete, ran to 2.6-5.3 ``k·n²`` after a burst in that
window where the listing in rank order stopped at 1 (6-12 s instead of ~6.5 s).  Renewed
every ``k·n²/4`` they stop at 1-1.5 ``k·n²``, while every packing of the SuperPOD and
leaf-spine states measured that completes past ``k·n²`` (SuperPOD 2x4x8 at 1.3-8.1,
progress every stretch) still does; leaf-spine 4x2x8's (complete at 2-7 after one late
burst) stop at 1 as before.
"""

from __future__ import annotations

from typing import NamedTuple

from numba import njit

__all__ = ["VISITS_PER_CHECK", "FEW_TREES_CHECKS_PER_N2_EST", "WINDOW", "Forecast", "NO_FORECAST",
           "few_trees_visits", "forecast", "hopeless"]

#: repair visits one few-trees max-flow check costs, both timed on the 2-core machine:
#: ~510 at 64 GPUs (SuperPOD 2x4x8: 15 M visits/s, 34 µs per check), ~400 at 128
#: (leaf-spine 8x2x8 with 4 spines: 3.5 M visits/s, 113 µs per check)
VISITS_PER_CHECK = 450

#: few-trees max-flow checks per ``n²`` expected (measured 1.1 at one tree per root,
#: 1.8-2.1 at 41 trees per root, 3.2 on the 583-tree restriction of leaf-spine 4x2x8)
FEW_TREES_CHECKS_PER_N2_EST = 2

#: the stretch the progress rate is measured over, and the forecast renewed after, as a
#: fraction of ``decide_at`` (``k·n²``)
WINDOW = 0.25


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
    entries not placed; ``mark`` (set here, ``-1`` before the first call): the visits and
    missing entries at the start of the current stretch, and the visits at its end (the
    next forecast).  At the end of a stretch: True when ``missing`` at the entries placed
    per visit over the stretch would take at least what is left of the few-trees
    estimate (``fc``: :class:`Forecast`, the estimate counted from ``decide_at``; no
    progress is hopeless), else the next stretch starts."""
    decide_at, alt = fc
    if decide_at <= 0:
        return False
    if mark[2] < 0:
        mark[2] = decide_at
    if mark[0] < 0:
        if visits >= mark[2] - WINDOW * decide_at:
            mark[0] = visits
            mark[1] = missing
        return False
    if visits < mark[2]:
        return False
    placed = mark[1] - missing
    if placed <= 0:
        return True
    rest = missing * (visits - mark[0]) / placed
    if rest >= alt - (visits - decide_at):
        return True
    mark[0] = visits
    mark[1] = missing
    mark[2] = visits + max(1, int(WINDOW * decide_at))
    return False
