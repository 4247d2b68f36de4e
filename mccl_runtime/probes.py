"""Probes of links held below nominal, in the closed loop (:mod:`.loop`; docs/runtime.md,
"Links the schedule stops using: probes").

Passive telemetry sees only saturated links.  A link the estimator holds more than 5 %
below nominal and that no window measured during the last ``period`` is probed:
``nbytes`` sent alone on it, reported as 4 windows at its true capacity.  A link whose
change is still being confirmed (pending, held low or not) is probed after a quarter
period without a sample: a recovery is confirmed by the second probe ~3 ms after the
first, not a period later, and a drop that passive windows read only briefly is
confirmed without waiting for the next collective.

* **Between collectives** (:meth:`Probe.between`), every ``period``: a probe of a link the
  active schedule uses is charged in full to the collective that follows (an upper bound:
  it delays that collective by the probe's duration); a probe of a link it avoids costs
  nothing.  With ``idle_only=False`` every link held low is probed each period.
* **During a collective** (:meth:`Probe.during`, ``idle_only`` only): a suspect link that
  the collective in flight leaves at least half free at that moment (idle, or loaded by
  flows bottlenecked elsewhere) is probed at once, at no cost (:meth:`Probe.free`).  A long
  degraded collective can leave one direction of a cable idle for tens of milliseconds;
  without this that direction's change went unseen until the collective ended, and a
  re-synthesis was built with the other direction updated only.  Likewise a link that a
  collective saturates only in its first milliseconds (its flows then bottlenecked by
  another degraded link) was read by 2 windows and stayed pending until the next
  collective, 20-40 ms later (fuzz seed 7).
"""

from __future__ import annotations

import numpy as np

from .telemetry import MeasurementStore

__all__ = ["Probe"]

_NONE = (np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0))


class Probe:
    """Probes every ``period`` seconds (0: none) of ``nbytes`` on links held below 0.95 of
    ``nominal`` (module docstring)."""

    def __init__(self, period: float, nbytes: float, nominal: np.ndarray, idle_only: bool = True,
                 reverse: np.ndarray | None = None) -> None:
        self.period = period
        self.reverse = reverse      # each link's reverse direction (-1: none), to probe a cable whole
        self.nbytes = nbytes
        self.nominal = nominal
        self.idle_only = idle_only
        self.next_t = 0.0
        self.owed = 0.0             # seconds of a probe inside the last collective, charged to the next

    def _suspects(self, t: float, store: MeasurementStore) -> np.ndarray:
        """Links held low and not measured for a ``period``, and links whose change is being
        confirmed (pending, held low or not) not measured for a quarter of it: the next
        probe confirms the change without waiting a whole period, or for the end of a
        collective that saturated the link only briefly."""
        low = store.measured() < 0.95 * self.nominal
        if not self.idle_only:
            return np.flatnonzero(low)
        last = store.last_sample_t()
        due = low & (last < t - self.period)
        pending = store.pending_links()
        if pending.size:
            due[pending] |= last[pending] < t - 0.25 * self.period
        return np.flatnonzero(due)

    def unread(self, t: float, store: MeasurementStore, true_cap: np.ndarray, loaded: np.ndarray,
               load: np.ndarray, since: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(links, t, gbps)`` of probes at ``t`` of the links ``loaded`` by a finished
        synthesis job's schedule that no sample has read since ``since`` (the latest change
        alarmed): a link the running version does not saturate is never measured, and a
        change on it would otherwise be found only once the new version runs on it.  A
        probe of a link the collective in flight (carrying ``load``) does not leave free
        (:meth:`free`) is owed, in full, by the next collective (:meth:`between`)."""
        if self.period <= 0 or not self.idle_only:
            return _NONE
        stale = np.flatnonzero(loaded & (store.last_sample_t() < since))
        if stale.size == 0:
            return _NONE
        dur, links, times, gbps = self._windows(t, stale, true_cap)
        costly = ~self.free(store, load)[stale]
        if costly.any():
            self.owed = max(self.owed, float(dur[costly].max()))
        return links, times, gbps

    @staticmethod
    def free(store: MeasurementStore, load: np.ndarray) -> np.ndarray:
        """Per link: whether a probe costs the collective in flight nothing.  A link that
        carries at most half its capacity is not the bottleneck of any of its flows, and
        under max-min fair sharing a probe sent alone on it then takes only the headroom
        (every flow keeps its rate, at most ``load <= capacity - load``); the link runs
        saturated while the probe lasts, so its windows read the capacity.  The capacity
        is the lower of the confirmed and the newest estimate."""
        return load <= 0.5 * np.minimum(store.measured(), store.provisional())

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
        owed, self.owed = self.owed, 0.0
        if self.period <= 0 or t < self.next_t:
            return (owed,) + _NONE
        self.next_t = t + self.period
        suspect = self._suspects(t, store)
        if suspect.size == 0:
            return (owed,) + _NONE
        dur, links, times, gbps = self._windows(t, suspect, true_cap)
        charged = float(dur[used[suspect]].max()) if used[suspect].any() else 0.0
        return max(charged, owed), links, times, gbps

    def during(self, t: float, store: MeasurementStore, true_cap: np.ndarray,
               load: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(links, t, gbps)`` of the free probes at ``t`` inside a collective that
        carries ``load`` Gbps on each link at that moment: links it leaves at least half
        free by the controller's estimate (:meth:`free`).  A cable whose two directions are
        both due is probed only when both are free: one direction read alone confirmed a
        half-recovered cable, and a job then started on that partial picture (a warm
        AllToAll of 0.5 s on HPN 2x4x8 instead of reusing the healthy schedule)."""
        if self.period <= 0 or not self.idle_only:
            return _NONE
        suspect = self._suspects(t, store)
        free = self.free(store, load)
        ok = free[suspect]
        if self.reverse is not None:             # both directions due: the cable whole or not at all
            rev = self.reverse[suspect]
            ok &= ~((rev >= 0) & np.isin(rev, suspect)) | free[np.maximum(rev, 0)]
        suspect = suspect[ok]
        if suspect.size == 0:
            return _NONE
        return self._windows(t, suspect, true_cap)[1:]
