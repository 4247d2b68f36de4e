"""Rises still moving, for the EWMA estimator (docs/runtime.md, "Recoveries read in steps").

With the level estimator a change is *pending* until its confirmation rule settles it
(:mod:`.level`).  The EWMA has no such rule; on real ranks (``alpha`` 1, each sample the
executor's median of a few collectives, docs/executor.md) a drop arrives confirmed by the
executor, but a link that recovers while the schedule avoids it is read by probes that
under-read it, in steps (102, 141, 124, then 400 Gbps for a NIC back at 400): each step
flagged, and a version was published for a partial reading.

A channel *rises* when one batch lifts its value by more than ``tol`` (relative; 5 %,
the level estimator's ``k``: what counts as a change) to below ``low`` of nominal.  It
keeps *moving* while later batches move it by more than ``tol`` either way, and is
*settled* by a batch that leaves it within ``tol`` (the link read again at that level) or
lifts it to ``low`` of nominal or more (it cannot read higher).  A drop of a settled
channel is not tracked (the executor confirmed it).  The steps of a real recovery differ
by 7-40 % (252 then 269; 102, 141, 124), so 10 % would have settled on the first pair.
"""

from __future__ import annotations

import numpy as np

__all__ = ["RiseTracker"]


class RiseTracker:
    """The channels whose latest rise is not settled yet (module docstring)."""

    def __init__(self, tol: float = 0.05, low: float = 0.95) -> None:
        self.tol = tol
        self.low = low
        self.moving: set[int] = set()

    def update(self, chans: np.ndarray, before: np.ndarray, after: np.ndarray, nominal: np.ndarray) -> None:
        """One folded batch: ``chans`` (unique) moved from ``before`` to ``after``."""
        if self.moving:
            was = np.isin(chans, np.fromiter(self.moving, dtype=np.int64, count=len(self.moving)))
        else:
            was = np.zeros(len(chans), dtype=bool)
        below = after < self.low * nominal
        moved = np.abs(after - before) > self.tol * before
        settled = was & ~(below & moved)
        rose = ~was & below & (after > (1.0 + self.tol) * before)
        self.moving.difference_update(chans[settled].tolist())
        self.moving.update(chans[rose].tolist())
