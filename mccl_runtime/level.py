"""Per-channel level estimation with change points: what a re-synthesis can trust.

The paper's controller smooths every telemetry channel with an EWMA (§3.2).  An EWMA
with a small factor rejects noise and short dips, but when Algorithm 1 flags, the EWMA
has moved only about ``Gamma`` of the way to the new level, so a schedule synthesized
on it is built for a fabric that no longer exists (docs/runtime.md, "Why the first swap
recovered little").  This module instead estimates the *current level* of a channel:

* **Change detection**: a two-sided CUSUM on relative deviations from the confirmed
  level ``L``: ``S- <- max(0, S- + (1 - y/L) - k)`` and ``S+ <- max(0, S+ + (y/L - 1) - k)``;
  an alarm is raised when either exceeds ``h``.  The change point is the last time both
  sums were zero; the samples since then are the *post-change run*.
* **Level**: the mean of the post-change run.  Its first sample is dropped once the run
  holds more than ``n_min``: a measurement window that spans the change averages the
  two levels (a window of 1 ms half before a drop to 12.5 % reads 56 %), and left in,
  that one sample kept the standard error above ``se_max`` for 15-25 more samples.  A
  two-window test guards the level: once the run holds ``2 n_min`` samples, if its last ``n_min`` samples differ from the rest by
  more than ``2 k`` (relative), a second change happened (the link degraded further, or
  a dip ended) and the run restarts at the last ``n_min`` samples.
* **Confidence rule**: a new level is *confirmed* (becomes ``L``) only when the run has
  at least ``n_min`` samples, spans at least ``hold_s`` seconds (a dip shorter than that
  never confirms), its relative standard error is at most ``se_max`` and it differs from
  ``L`` by more than ``k``.  A run whose level returns to within ``k`` of ``L`` is
  dropped (a rejected transient).  Only the newest ``max_run`` samples are kept; the
  hold time still counts from the change point.

A channel with an alarm and no confirmed level yet is *pending*: a controller should not
synthesize while a link it depends on is pending (docs/runtime.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from mccl_opt.errors import TelemetryError

__all__ = ["LevelParams", "LevelTracker", "fold_levels"]


@dataclass(frozen=True)
class LevelParams:
    """Estimator parameters (relative units; see the module docstring)."""

    k: float = 0.05
    h: float = 1.0
    n_min: int = 8
    se_max: float = 0.02
    hold_s: float = 0.008
    max_run: int = 512

    def __post_init__(self) -> None:
        if not (0 < self.k < 1 and self.h > 0 and self.n_min >= 2 and 0 < self.se_max < 1
                and self.hold_s >= 0 and self.max_run >= 2 * self.n_min):
            raise TelemetryError("level estimator needs 0 < k < 1, h > 0, n_min >= 2, 0 < se_max < 1, "
                                 f"hold_s >= 0 and max_run >= 2 n_min; got {self}")


@dataclass
class LevelTracker:
    """One channel's confirmed level, CUSUM state and post-change run."""

    level: float
    params: LevelParams = field(default_factory=LevelParams)
    s_lo: float = 0.0
    s_hi: float = 0.0
    alarm: bool = False
    t_last: float = -math.inf
    run_start: float = 0.0
    run_t: list[float] = field(default_factory=list)
    run_y: list[float] = field(default_factory=list)
    confirmed: int = 0
    rejected: int = 0
    changed_at: float | None = None
    trimmed: bool = False

    @property
    def pending(self) -> bool:
        """An alarm is raised and no new level is confirmed yet."""
        return self.alarm

    @property
    def provisional(self) -> float:
        """The newest estimate: the post-change run's mean while a change is pending (not
        yet confirmed), else the confirmed level."""
        if self.alarm and self.run_y:
            return sum(self.run_y) / len(self.run_y)
        return self.level

    @property
    def early(self) -> float | None:
        """The post-change run's mean once it passes every confirmation test but
        ``hold_s`` (more than ``n_min`` samples, the spanning window left out, relative
        standard error at most ``se_max``, more than ``k`` from the level); ``None``
        otherwise.  A synthesis may start on it; nothing is published before the level is
        confirmed (docs/runtime.md, "Speculative synthesis")."""
        p, ys = self.params, self.run_y
        if not (self.alarm and self.trimmed and len(ys) >= p.n_min):
            return None
        mean = sum(ys) / len(ys)
        if abs(mean - self.level) <= p.k * self.level:
            return None
        return self._tight_mean(ys)

    def update(self, t: float, y: float) -> bool:
        """Feed one sample (``t`` seconds, ``y`` Gbps); True when a new level was confirmed."""
        p = self.params
        self.t_last = t
        r = y / self.level
        self.s_lo = max(0.0, self.s_lo + (1.0 - r) - p.k)
        self.s_hi = max(0.0, self.s_hi + (r - 1.0) - p.k)
        if not self.alarm and self.s_lo == 0.0 and self.s_hi == 0.0:
            self.run_t.clear()
            self.run_y.clear()
            self.trimmed = False
            return False
        if not self.run_t:
            self.run_start = t
        self.run_t.append(t)
        self.run_y.append(y)
        if len(self.run_y) > p.max_run:                   # keep the newest; the run still starts at run_start
            del self.run_t[0], self.run_y[0]
        if not self.alarm:
            self.alarm = self.s_lo > p.h or self.s_hi > p.h
            if not self.alarm:
                return False
        return self._evaluate()

    def _evaluate(self) -> bool:
        p = self.params
        ys = self.run_y
        if len(ys) >= 2 * p.n_min:
            recent = sum(ys[-p.n_min:]) / p.n_min
            older = sum(ys[:-p.n_min]) / (len(ys) - p.n_min)
            if abs(recent - older) > 2.0 * p.k * max(recent, older):
                del self.run_t[:-p.n_min], self.run_y[:-p.n_min]
                ys = self.run_y
                self.run_start = self.run_t[0]
                self.trimmed = False
        if not self.trimmed and len(ys) > p.n_min:     # the window that spans the change point
            del self.run_t[0], self.run_y[0]
            self.trimmed = True
        n = len(ys)
        mean = sum(ys) / n
        if n >= p.n_min and abs(mean - self.level) <= p.k * self.level:
            self.rejected += 1                         # back to the confirmed level: a transient
            self._reset()
            return False
        if n < p.n_min or self.run_t[-1] - self.run_start < p.hold_s or self._tight_mean(ys) is None:
            return False
        self.changed_at = self.run_start
        self.level = mean
        self.confirmed += 1
        self._reset()
        return True

    def _tight_mean(self, ys: list[float]) -> float | None:
        """The run's mean when it is positive and its relative standard error is at most
        ``se_max`` (the confirmation's precision test), else ``None``; ``len(ys) >= 2``."""
        n = len(ys)
        mean = sum(ys) / n
        if mean <= 0:
            return None
        var = sum((y - mean) ** 2 for y in ys) / (n - 1)
        return mean if math.sqrt(var / n) <= self.params.se_max * mean else None

    def _reset(self) -> None:
        self.s_lo = self.s_hi = 0.0
        self.alarm = False
        self.trimmed = False
        self.run_t.clear()
        self.run_y.clear()


def fold_levels(level: np.ndarray, c: np.ndarray, y: np.ndarray, t: np.ndarray,
                busy: dict[int, LevelTracker], params: LevelParams) -> list[int]:
    """Feed a batch (sorted by channel, then time and arrival) to the channels' trackers;
    returns the channels whose level was confirmed anew (``level`` is updated in place).

    A channel not in ``busy`` is *quiet* (no alarm, empty run: its whole state is its
    level).  A quiet channel's sample with ``|y/L - 1| <= k`` leaves both CUSUM sums at 0,
    so it changes nothing but the time: those samples are checked at once on arrays.
    From a channel's first other sample on, its samples go through a
    :class:`LevelTracker` in order, which stays in ``busy`` until it is quiet again.
    The results are those of :meth:`LevelTracker.update` sample by sample."""
    k = params.k
    r = y / level[c]
    moved = ((1.0 - r) - k > 0.0) | ((r - 1.0) - k > 0.0)
    if busy:
        moved |= np.isin(c, np.fromiter(busy, dtype=np.int64, count=len(busy)))
    if not moved.any():
        return []
    pos = np.arange(len(c))
    starts = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
    first = np.minimum.reduceat(np.where(moved, pos, len(c)), starts)
    group = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, len(c))))
    changed = []
    touched = set()
    for i in np.flatnonzero(pos >= first[group]).tolist():
        cid = int(c[i])
        tracker = busy.get(cid)
        if tracker is None:
            tracker = busy[cid] = LevelTracker(float(level[cid]), params)
        touched.add(cid)
        if tracker.update(float(t[i]), float(y[i])):
            changed.append(cid)
        level[cid] = tracker.level
    for cid in touched:
        if not busy[cid].alarm and not busy[cid].run_y:
            del busy[cid]
    return changed
