"""A packing sized to the time its limit has left (paper §4.3, ForestColl-warm;
docs/allgather.md, *Warm never slower than cold* and *Time limits*).

A repair packing is one compiled call that cannot check the clock, so under a limit (a
warm stage's allowance or the solve's ``time_limit``) it caps its repair searches by
what the limit has left instead: the growth of ``k·n·n`` tree entries and the searches'
tree visits at the measured rates below, scaled by the CPU share the solve gets
(:func:`mccl_opt.anytime.cpu_share`).  :func:`limited_repair` is the repair packing so
sized, stopping the limit (:func:`mccl_opt.anytime.run_out`) where it cannot finish.
"""

from __future__ import annotations

import numpy as np

from mccl_opt import anytime
from .packing.forecast import NO_FORECAST, Forecast
from .packing.repair import repair_pack
from .packing.trees import TreeClass

__all__ = ["PACKING_ENTRIES_PER_S", "REPAIR_VISITS_PER_S", "sized_visits", "limited_repair"]

#: throughput of the repair packing kernel, measured on an 80-GPU shared-aggregation
#: fabric at k=1442: growing ``k·n·n`` tree entries (~1.4 s for 9.2e6) and the repair
#: searches' tree visits (~0.9 s for 9.2e6) on top
PACKING_ENTRIES_PER_S = 6_000_000
REPAIR_VISITS_PER_S = 10_000_000


def sized_visits(entries: int, visits: int) -> int | None:
    """A repair packing's visit cap (at most ``visits``) for ``entries`` tree entries
    (``k·n·n``), cut to what the current warm stage has left
    (:func:`mccl_opt.anytime.time_left`), or ``None`` when the growth alone would
    outlast it: the packing is one compiled call that cannot check the clock, so a warm
    step's packing must give up inside it rather than run past the allowance
    (docs/allgather.md, *Warm never slower than cold*)."""
    left = anytime.time_left()
    if left is None:
        return visits
    spare = left * anytime.cpu_share() - entries / PACKING_ENTRIES_PER_S
    return None if spare <= 0 else min(visits, int(spare * REPAIR_VISITS_PER_S))


def limited_repair(where: str, n: int, tail: np.ndarray, head: np.ndarray, units: np.ndarray,
                   k: int, shapes: tuple[np.ndarray, np.ndarray] | None = None,
                   max_visits: int = 1 << 62, rail_first: bool | None = None,
                   fc: Forecast = NO_FORECAST) -> tuple[list[TreeClass] | None, dict[str, int]]:
    """:func:`.packing.repair.repair_pack` under the current limit: checked before it
    starts, its searches capped at :func:`sized_visits`, and the limit stopped
    (:func:`mccl_opt.anytime.run_out`, naming ``where``) when the growth alone would
    outlast it or the searches run out of the time-derived cap (not of ``max_visits``:
    that is the packing failing, ``None`` as without a limit, as is a stop by the
    forecast ``fc``, :mod:`.packing.forecast`).  Without a limit, the
    plain call (before, a packing at 128 GPUs under a 0.2 s limit ran 1.3 s past it)."""
    anytime.check(where)
    cap = sized_visits(k * n * n, max_visits)
    if cap is None:
        anytime.run_out(f"{where}: its growth would outlast the time left")
        cap = max_visits            # not reached: sized_visits is None only under a limit
    classes, info = repair_pack(n, tail, head, units, k, shapes, max_visits=cap,
                                rail_first=rail_first, fc=fc)
    if classes is None and cap < max_visits and info.get("repair_visits", 0) > cap:
        anytime.run_out(f"{where}: its searches outgrew the time left")
    return classes, info
