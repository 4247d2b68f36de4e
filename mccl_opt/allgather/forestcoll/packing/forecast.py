"""Which Phase 3 path completes cheaper at ``max_chunks=None``: a repair packing that is
still searching, or the exact few-trees packing that follows its failure (paper §4.3;
docs/allgather.md, *Repair or few-trees: a forecast*).

Both costs are counted in the repair searches' unit, trees visited:

* the repair packing's remaining cost is extrapolated from its progress: every tree entry
  still missing needs at most one augmenting chain, at the visits per chain measured
  over the last stretch of the search (:func:`hopeless`, called by the compiled growth);
* the few-trees packing's cost is its max-flow checks (about ``2 n²``: one per class edge
  tried, classes ~``1.1-3.2 n``), each worth :data:`VISITS_PER_CHECK` visits
  (:func:`few_trees_visits`).  The exact split before it (0.2-0.9 s at 64-128 GPUs) is
  left out, so the estimate is a lower bound and the forecast leans to the bounded path.

The repair packing stops once the extrapolation exceeds the few-trees estimate, and in
any case after its own size ``k·n²`` plus that estimate (then the two paths cost at most
twice the cheaper one).
"""

from __future__ import annotations

from typing import NamedTuple

from numba import njit

__all__ = ["VISITS_PER_CHECK", "FEW_TREES_CHECKS_PER_N2_EST", "Forecast", "few_trees_visits",
           "forecast", "hopeless", "NO_FORECAST"]

#: repair visits one few-trees max-flow check costs, both timed on the 2-core machine:
#: ~510 at 64 GPUs (SuperPOD 2x4x8: 15 M visits/s, 34 µs per check), ~400 at 128
#: (leaf-spine 8x2x8 with 4 spines: 3.5 M visits/s, 113 µs per check)
VISITS_PER_CHECK = 450

#: few-trees max-flow checks per ``n²`` expected (measured 1.1 at one tree per root,
#: 1.8-2.1 at 41 trees per root, 3.2 on the 583-tree restriction of leaf-spine 4x2x8)
FEW_TREES_CHECKS_PER_N2_EST = 2

#: the visits per chain are measured from this fraction of ``decide_at`` on, and need
#: at least :data:`MIN_WINDOW_CHAINS` chains in that stretch before a forecast is made
WINDOW_FROM = 0.5
MIN_WINDOW_CHAINS = 8


class Forecast(NamedTuple):
    """When the repair packing first weighs stopping (``decide_at`` visits; 0: never)
    and the few-trees packing's estimated cost in visits (``alt_visits``)."""

    decide_at: int
    alt_visits: int


NO_FORECAST = Forecast(0, 0)


def few_trees_visits(n: int) -> int:
    """The few-trees packing's estimated cost on ``n`` GPUs, in repair visits."""
    return FEW_TREES_CHECKS_PER_N2_EST * n * n * VISITS_PER_CHECK


def forecast(n: int, k: int) -> tuple[Forecast, int]:
    """The forecast of a repair packing of ``k`` trees per root that the few-trees packing
    follows, and its visit cap: decide from half its size ``k·n²`` on, stop at the latest
    after its size plus the few-trees estimate."""
    alt = few_trees_visits(n)
    return Forecast(max(1, k * n * n // 2), alt), k * n * n + alt


@njit(cache=True, _nrt=False)
def hopeless(fc, visits, chains, missing, mark):
    """Should the repair packing stop?  ``visits`` trees visited and ``chains`` searches
    run so far, ``missing`` tree entries not placed; ``mark`` holds the visits and chains
    when the search passed ``WINDOW_FROM·decide_at`` (set here, ``mark[0] < 0`` before).
    True when the remaining chains, ``missing`` at the visits per chain since the mark,
    are forecast to cost more than the few-trees packing (``fc``: :class:`Forecast`)."""
    decide_at, alt = fc
    if decide_at <= 0:
        return False
    if mark[0] < 0:
        if visits >= WINDOW_FROM * decide_at:
            mark[0] = visits
            mark[1] = chains
        return False
    if visits < decide_at or chains - mark[1] < MIN_WINDOW_CHAINS:
        return False
    per_chain = (visits - mark[0]) / (chains - mark[1])
    return missing * per_chain > alt
