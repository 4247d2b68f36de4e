"""Rises still moving, for the EWMA at ``alpha`` 1 (docs/runtime.md, "Recoveries read in steps").

With the level estimator a change is *pending* until its confirmation rule settles it
(:mod:`.level`).  The EWMA has no such rule; on real ranks (``alpha`` 1, each sample the
executor's median of a few collectives, docs/executor.md) a drop arrives confirmed by the
executor, but a link that recovers while the schedule avoids it is read by probes that
under-read it, in steps about a second apart (102, 141, 124, then 400 Gbps; 252, 269,
then 400, for a NIC back at 400): each step flagged, and a version was published for a
partial reading.  A step can also be reported twice (the executor repeats a pair's level
while it holds a rise back), so reading the same value again does not settle it.

A channel *rises* when one batch lifts its value by more than ``tol`` (relative; 5 %,
the level estimator's ``k``: what counts as a change) to below ``low`` of nominal.  It
keeps *moving* while batches move it by more than ``tol`` either way, and is *settled*
once ``quiet_s`` pass without such a move, or at once by a batch that lifts it to ``low``
of nominal or more (it cannot read higher).  A drop of a settled channel is not tracked
(the executor confirmed it), except within ``quiet_s`` of a moving rise that settled at
``low`` of nominal or more: right after a clear read in steps the recovered link's
readings still swing (400, 295, then 400 again), and that drop moves it again (a
*swing*).  A stall that recovers in one reading is no such rise, so noise makes no swing.  Times are the samples' (the store's ``now``).
"""

from __future__ import annotations

import numpy as np

__all__ = ["RiseTracker"]


class RiseTracker:
    """The channels whose latest rise is not settled yet (module docstring)."""

    def __init__(self, tol: float = 0.05, low: float = 0.95, quiet_s: float = 1.5) -> None:
        self.tol = tol
        self.low = low
        self.quiet_s = quiet_s
        self.moved_t: dict[int, float] = {}          # moving channel -> time of its latest move
        self.recovered_t: dict[int, float] = {}      # channel -> time a moving rise settled at ``low``
        self.swings: set[int] = set()                 # moving channels that moved by a swing
        self.now = -np.inf                            # the latest time seen

    def update(self, chans: np.ndarray, before: np.ndarray, after: np.ndarray, nominal: np.ndarray,
               now: float) -> None:
        """One folded batch at ``now``: ``chans`` (unique) moved from ``before`` to ``after``."""
        self.now = now = max(self.now, now)
        if self.moved_t:
            was = np.isin(chans, np.fromiter(self.moved_t, dtype=np.int64, count=len(self.moved_t)))
        else:
            was = np.zeros(len(chans), dtype=bool)
        below = after < self.low * nominal
        moved = np.abs(after - before) > self.tol * before
        risen = after > (1.0 + self.tol) * before
        for cid in chans[was & ~below].tolist():
            del self.moved_t[cid]
            self.swings.discard(cid)
            self.recovered_t[cid] = now
        recent = [c for c, t in self.recovered_t.items() if now - t < self.quiet_s]
        self.recovered_t = {c: self.recovered_t[c] for c in recent}
        swing = np.isin(chans, np.array(recent, dtype=np.int64)) & below & moved & ~risen
        rose = ~was & below & risen
        self.moved_t.update(dict.fromkeys(chans[(was & below & moved) | rose | swing].tolist(), now))
        self.swings.update(chans[swing].tolist())

    def moving(self, now: float) -> list[int]:
        """The channels still moving at ``now`` (or the latest batch's time, if later);
        those quiet for ``quiet_s`` are dropped."""
        now = max(self.now, now)
        for cid in [c for c, t in self.moved_t.items() if now - t >= self.quiet_s]:
            del self.moved_t[cid]
            self.swings.discard(cid)
        return list(self.moved_t)
