"""A warm step's packing sized to the time its stage has left (paper §4.3,
ForestColl-warm; docs/allgather.md, *Warm never slower than cold*).

A repair packing is one compiled call that cannot check the clock, so a warm step
caps its repair searches by what the warm allowance has left instead: the growth of
``k·n·n`` tree entries and the searches' tree visits at the measured rates below.
"""

from __future__ import annotations

from mccl_opt import anytime

__all__ = ["PACKING_ENTRIES_PER_S", "REPAIR_VISITS_PER_S", "sized_visits"]

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
    spare = left - entries / PACKING_ENTRIES_PER_S
    return None if spare <= 0 else min(visits, int(spare * REPAIR_VISITS_PER_S))
