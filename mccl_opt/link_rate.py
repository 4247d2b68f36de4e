"""The rate of a schedule's link loads: ``min_a cap_a / L_a`` over the loaded links (paper
§3.2, ``x_min = min_a M_a / n_a``).

One function for every place that rates loads against capacities (AllToAll's rounding,
kept schedule and local re-solve, :func:`.schedule.schedule_rate`, the simulator's fluid
rate, the stale schedule's cut check); the callers differ only in what counts as loaded
and in the rate of a schedule that loads no link.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["rate_of_loads", "LOAD_NOISE"]

#: share loads at or below this are float noise of shares that sum to nothing (a route
#: added and taken away), not a load
LOAD_NOISE = 1e-12


def rate_of_loads(capacity: np.ndarray, loads: np.ndarray, *, noise: float = 0.0,
                  idle: float = math.inf) -> float:
    """``min_a capacity_a / loads_a`` over the links whose load is above ``noise``
    (``0``: every positive load; :data:`LOAD_NOISE` for share loads summed in floats);
    ``idle`` when no link is loaded.  A NaN load compares false, so its link counts as
    unloaded; a NaN capacity on a loaded link makes the rate NaN; a zero capacity on a
    loaded link makes it ``0``."""
    used = loads > noise
    if not used.any():
        return idle
    return float(np.min(capacity[used] / loads[used]))
