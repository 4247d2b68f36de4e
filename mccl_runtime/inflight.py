"""A collective in flight in the closed loop (:mod:`.loop`): what its ranks know of
the work left when a new version is ready, to decide whether to abort it and re-run it
on the new version (docs/runtime.md, "Collectives stuck on a stale version")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["InFlight"]


@dataclass(frozen=True)
class InFlight:
    """A collective in flight: when its data movement began, its version, and the traffic
    (Gbit) each link has carried by each of the simulator's row times."""

    start: float
    version: int
    times: np.ndarray
    carried: np.ndarray

    @classmethod
    def of(cls, start: float, version: int, res: Any) -> "InFlight":
        gbit = res.link_gbps * np.diff(res.times)[:, None]
        return cls(start, version, np.asarray(res.times),
                   np.vstack([np.zeros(gbit.shape[1]), np.cumsum(gbit, axis=0)]))

    def left(self, t: float) -> np.ndarray:
        """Gbit each link still has to carry at ``t`` (what each rank's per-connection
        byte counters tell)."""
        if len(self.times) < 2:
            return np.zeros(self.carried.shape[1])
        x = min(max(t - self.start, 0.0), float(self.times[-1]))
        row = min(int(np.searchsorted(self.times, x, side="right")) - 1, len(self.times) - 2)
        span = self.times[row + 1] - self.times[row]
        frac = (x - self.times[row]) / span if span > 0 else 1.0
        done = self.carried[row] + frac * (self.carried[row + 1] - self.carried[row])
        return self.carried[-1] - done

    def load(self, t: float) -> np.ndarray:
        """Per link: the Gbps of this collective's traffic it carries at ``t`` (what each
        rank's per-connection counters tell over the last moment)."""
        row = int(np.searchsorted(self.times, t - self.start, side="right")) - 1
        if row < 0 or row >= len(self.times) - 1:
            return np.zeros(self.carried.shape[1])
        span = self.times[row + 1] - self.times[row]
        return (self.carried[row + 1] - self.carried[row]) / span if span > 0 else np.zeros(self.carried.shape[1])

    def remaining_s(self, t: float, m: np.ndarray) -> float:
        """A lower bound on its time left: every link must still carry what is left on it
        at its measured capacity ``m`` (Gbps)."""
        return float(np.max(self.left(t) / m, initial=0.0))

    def progress(self, t: float) -> float:
        """The share of its link traffic done at ``t``."""
        total = float(self.carried[-1].sum())
        return 1.0 - float(self.left(t).sum()) / total if total > 0 else 1.0
