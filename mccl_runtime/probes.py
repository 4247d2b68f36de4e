"""Probes of links held below nominal, in the closed loop (:mod:`.loop`; docs/runtime.md,
"Links the schedule stops using: probes").

Passive telemetry sees only saturated links.  A link the estimator holds more than 5 %
below nominal and that no window measured during the last ``period`` is probed:
``nbytes`` sent alone on it, reported as 4 windows at its true capacity.  A link whose
change is still being confirmed (a probe read it off its level) is probed again after a
quarter period: a recovery is confirmed by the second probe ~3 ms after the first, not a
period later.

* **Between collectives** (:meth:`Probe.between`), every ``period``: a probe of a link the
  active schedule uses is charged in full to the collective that follows (an upper bound:
  it delays that collective by the probe's duration); a probe of a link it avoids costs
  nothing.  With ``idle_only=False`` every link held low is probed each period.
* **During a collective** (:meth:`Probe.during`, ``idle_only`` only): a link held low that
  the collective in flight carries nothing on at that moment is probed at once, at no
  cost.  A long degraded collective can leave one direction of a cable idle for tens of
  milliseconds; without this that direction's change went unseen until the collective
  ended, and a re-synthesis was built with the other direction updated only.
"""

from __future__ import annotations

import numpy as np

from .telemetry import MeasurementStore

__all__ = ["Probe"]

_NONE = (np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0))


class Probe:
    """Probes every ``period`` seconds (0: none) of ``nbytes`` on links held below 0.95 of
    ``nominal`` (module docstring)."""

    def __init__(self, period: float, nbytes: float, nominal: np.ndarray, idle_only: bool = True) -> None:
        self.period = period
        self.nbytes = nbytes
        self.nominal = nominal
        self.idle_only = idle_only
        self.next_t = 0.0

    def _suspects(self, t: float, store: MeasurementStore) -> np.ndarray:
        """Links held low and not measured for a ``period``, or for a quarter of it while a
        change on them is being confirmed (a probe read them off their level: the next
        probe confirms it without waiting a whole period)."""
        low = store.measured() < 0.95 * self.nominal
        if not self.idle_only:
            return np.flatnonzero(low)
        last = store.last_sample_t()
        due = last < t - self.period
        pending = store.pending_links()
        if pending.size:
            due[pending] |= last[pending] < t - 0.25 * self.period
        return np.flatnonzero(low & due)

    def _windows(self, t: float, links: np.ndarray, true_cap: np.ndarray) -> tuple[np.ndarray, ...]:
        """``(durations, links, t, gbps)``: 4 windows per probed link, at its true capacity."""
        dur = self.nbytes * 8 / (true_cap[links] * 1e9)
        frac = np.arange(1, 5) / 4.0
        times = t + (dur[:, None] * frac[None, :]).ravel()
        return dur, np.repeat(links, 4), times, np.repeat(true_cap[links], 4)

    def between(self, t: float, store: MeasurementStore, true_cap: np.ndarray,
                used: np.ndarray) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        """``(charged seconds, links, t, gbps)`` of the probes due at ``t``, before a
        collective of a schedule that uses the links ``used``."""
        if self.period <= 0 or t < self.next_t:
            return (0.0,) + _NONE
        self.next_t = t + self.period
        suspect = self._suspects(t, store)
        if suspect.size == 0:
            return (0.0,) + _NONE
        dur, links, times, gbps = self._windows(t, suspect, true_cap)
        charged = float(dur[used[suspect]].max()) if used[suspect].any() else 0.0
        return charged, links, times, gbps

    def during(self, t: float, store: MeasurementStore, true_cap: np.ndarray,
               busy: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(links, t, gbps)`` of the free probes at ``t`` inside a collective that
        carries traffic on the links ``busy`` at that moment."""
        if self.period <= 0 or not self.idle_only:
            return _NONE
        suspect = self._suspects(t, store)
        suspect = suspect[~busy[suspect]]
        if suspect.size == 0:
            return _NONE
        return self._windows(t, suspect, true_cap)[1:]
