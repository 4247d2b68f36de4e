"""Every Farley bound AllToAll column generation computes, for the oracle checks of
``bench/fuzz_alltoall.py``, ``bench/bench_alltoall_imports.py`` and the tests.

Column generation (``mccl_opt.alltoall.colgen``, paper §4.2) turns arc prices ``w`` into a
lower bound on the optimal ``t = 1/z`` (:func:`~mccl_opt.alltoall.colgen._bound`): the
master's vertex duals, the cut prices of the saturated set and, on imported fabrics,
the cut prices of its capacity classes (``class_cut_prices``).  Every such bound must be
at most ``1 / z*`` of the independent compact LP; :func:`recorded_bounds` records them,
tagging those of the class cut prices, so a caller can check each one.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

import numpy as np

from mccl_opt.alltoall import colgen

__all__ = ["Recorded", "recorded_bounds"]


@dataclass
class Recorded:
    """Bounds on ``t`` seen inside :func:`recorded_bounds` (``kind``: ``class`` for the
    class cut prices, ``other`` for the vertex duals and the whole saturated set)."""

    bounds: list[tuple[str, float]] = field(default_factory=list)
    _class_prices: list[np.ndarray] = field(default_factory=list)

    def rates(self, kind: str | None = None) -> list[float]:
        """The positive bounds of ``kind`` (all when ``None``) as rates ``1/t`` (Gbps)."""
        return [1.0 / b for k, b in self.bounds if b > 0 and kind in (None, k)]

    def clear(self) -> None:
        self.bounds.clear()
        self._class_prices.clear()


@contextmanager
def recorded_bounds() -> Iterator[Recorded]:
    """Record every bound ``colgen`` computes while the block runs (the module
    functions are wrapped and restored on exit)."""
    rec = Recorded()
    bound, class_cut = colgen._bound, colgen.class_cut_prices

    def class_cut_recorded(master, sol):
        out = class_cut(master, sol)
        rec._class_prices.extend(out)     # kept alive: their ids stay unique
        return out

    def bound_recorded(sp_sum, w, capacity):
        b = bound(sp_sum, w, capacity)
        tagged = any(w is c for c in rec._class_prices)
        rec.bounds.append(("class" if tagged else "other", b))
        return b

    colgen._bound, colgen.class_cut_prices = bound_recorded, class_cut_recorded
    try:
        yield rec
    finally:
        colgen._bound, colgen.class_cut_prices = bound, class_cut
