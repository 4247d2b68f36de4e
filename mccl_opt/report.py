"""The typed record of one solve, shared by both synthesizers (``Schedule.report``).

A :class:`SolveReport` says which method produced the schedule, how the solve ended,
the certified bound and cut bound, how the warm start was used, the chunk budget, every
method tried on the way with its time (the fallback chain, in order) and the seconds of
each phase.  Code decides on these typed fields; ``Schedule.stats`` is the JSON view for
files and printing, never read for control flow (tests/test_architecture.py checks the
packages for ``stats`` reads).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, Mapping

from .errors import ScheduleError

__all__ = ["Method", "Termination", "WarmUse", "Attempt", "SolveReport", "stamp"]


class Method(str, Enum):
    """What built the returned schedule."""

    FORESTCOLL = "forestcoll"                          # paper §4.3 on a balanced fabric
    WEAKER_DIRECTIONS = "forestcoll-weaker-directions"  # ForestColl, each cable at its weaker side
    BALANCED_RESTRICTION = "forestcoll-balanced-restriction"   # ForestColl on c' <= c
    GENERAL = "general"                                # column generation over trees
    FIRST = "first"                                    # anytime first schedule (no optimum)
    COLUMN_GENERATION = "column-generation"            # AllToAll, paper §4.2


class Termination(str, Enum):
    """How the solve ended.  ``OPTIMAL``: the method's optimum at the chunk budget is
    certified (``bound_gbps`` is the optimum); the others stopped early with a valid
    schedule."""

    OPTIMAL = "optimal"
    TIME_LIMIT = "time_limit"
    ROUND_LIMIT = "round_limit"
    STALLED = "stalled"


class WarmUse(str, Enum):
    """What the warm start contributed."""

    COLD = "cold"                    # no previous schedule given
    KEPT = "kept"                    # the previous trees/paths as they were
    REROUTED = "rerouted"            # the previous trees, edges moved off overloaded links
    SHAPES = "shapes"                # a packing seeded with the previous tree shapes
    COLUMNS = "columns"              # column generation started from the previous columns
    BASIS = "basis"                  # ... and the previous LP basis (AllToAll)
    LOCAL = "local"                  # certified local re-optimisation of the changed pairs (AllToAll)
    DECLINED = "declined"            # the warm start did not pay within its budget: solved cold


@dataclass(frozen=True)
class Attempt:
    """One method tried by the solve, in order: how long it ran and what came of it
    (``"returned"``, ``"declined: <why>"``, ``"kept as fallback"``, ``"time limit"``...)."""

    method: Method
    seconds: float
    outcome: str


@dataclass(frozen=True)
class SolveReport:
    """One solve, typed (module doc).  ``bound_gbps``: a certified upper bound on the
    rate of any schedule of the method's model (AllToAll: the LP; AllGather: the
    forwarding-only optimum), ``None`` when the solve stopped before it had one;
    ``cut_bound_gbps``: Phase 1's cut bound where it lies above (no forwarding-only
    AllGather reaches it); ``k``: every share is a multiple of ``1/k``; ``cold_seconds``:
    what a cold solve of this fabric took in wall seconds (measured when cold, carried
    over by warm solves); ``cold_cpu_seconds``: the same solve in the solving thread's
    CPU seconds, the yardstick of the next warm start's allowance and rerouting cap
    (``None`` in files written before it: the wall time stands in); ``cold_costly``: whether
    that cold solve was known to be expensive (AllGather: it went past ForestColl on the
    fabric itself, to the weaker-direction fabric, the balanced restriction or the
    general method), carried with it (``None``: not known)."""

    collective: str
    method: Method
    termination: Termination
    bound_gbps: float | None
    warm: WarmUse
    max_chunks: int | None
    seconds: float
    cut_bound_gbps: float | None = None
    k: int | None = None
    attempts: tuple[Attempt, ...] = ()
    phases: tuple[tuple[str, float], ...] = field(default=())
    cold_seconds: float | None = None
    cold_costly: bool | None = None
    cold_cpu_seconds: float | None = None

    @property
    def cold_cpu(self) -> float | None:
        """The cold solve's CPU seconds: ``cold_cpu_seconds``, or the wall
        ``cold_seconds`` for a file written before it (never below the CPU time)."""
        return self.cold_seconds if self.cold_cpu_seconds is None else self.cold_cpu_seconds

    @property
    def optimal(self) -> bool:
        return self.termination is Termination.OPTIMAL

    def certified_gap(self, rate_gbps: float) -> float | None:
        """``1 - rate / bound``: what a schedule at ``rate_gbps`` may still lose to the
        optimum (``None`` without a bound)."""
        if self.bound_gbps is None or not 0 < self.bound_gbps < math.inf:
            return None
        return max(0.0, 1.0 - rate_gbps / self.bound_gbps)

    def with_attempts(self, attempts: tuple[Attempt, ...], seconds: float) -> "SolveReport":
        return replace(self, attempts=attempts, seconds=seconds)

    def to_dict(self) -> dict[str, Any]:
        """The JSON view (``mccl solve --json``, files' ``stats['report']``)."""
        return {
            "collective": self.collective, "method": self.method.value, "termination": self.termination.value,
            "bound_gbps": self.bound_gbps, "cut_bound_gbps": self.cut_bound_gbps,
            "warm": self.warm.value, "max_chunks": self.max_chunks, "k": self.k,
            "seconds": self.seconds,
            "attempts": [{"method": a.method.value, "seconds": a.seconds, "outcome": a.outcome}
                         for a in self.attempts],
            "phases": dict(self.phases),
            "cold_seconds": self.cold_seconds,
            "cold_costly": self.cold_costly,
            "cold_cpu_seconds": self.cold_cpu_seconds,
        }

    @classmethod
    def from_dict(cls, data: Any) -> "SolveReport":
        """Parse :meth:`to_dict`'s view (a schedule file's ``report``); raises
        :class:`ScheduleError` naming the bad field."""
        if not isinstance(data, Mapping):
            raise ScheduleError(f"'report' must be an object, got {type(data).__name__}")
        try:
            attempts = tuple(Attempt(Method(a["method"]), _seconds(a["seconds"]), str(a["outcome"]))
                             for a in data.get("attempts", ()))
            phases = tuple((str(k), _seconds(v)) for k, v in dict(data.get("phases", {})).items())
            return cls(collective=str(data.get("collective", "")),
                       method=Method(data["method"]), termination=Termination(data["termination"]),
                       bound_gbps=_optional_rate(data.get("bound_gbps")),
                       warm=WarmUse(data["warm"]), max_chunks=data.get("max_chunks"),
                       seconds=_seconds(data["seconds"]),
                       cut_bound_gbps=_optional_rate(data.get("cut_bound_gbps")),
                       k=data.get("k"), attempts=attempts, phases=phases,
                       cold_seconds=_optional_seconds(data.get("cold_seconds")),
                       cold_costly=_optional_bool(data.get("cold_costly")),
                       cold_cpu_seconds=_optional_seconds(data.get("cold_cpu_seconds")))
        except (KeyError, TypeError, ValueError) as e:
            raise ScheduleError(f"'report' is malformed ({type(e).__name__}: {e}); remove it or "
                                "write it with a current mccl") from None


def _seconds(value: Any) -> float:
    v = float(value)
    if not 0 <= v < math.inf:
        raise ScheduleError(f"'report': seconds must be finite and >= 0, got {value!r}")
    return v


def _optional_seconds(value: Any) -> float | None:
    return None if value is None else _seconds(value)


def _optional_bool(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise ScheduleError(f"'report': a flag must be true, false or null, got {value!r}")


def _optional_rate(value: Any) -> float | None:
    if value is None:
        return None
    v = float(value)
    if not 0 < v < math.inf:
        raise ScheduleError(f"'report': a rate must be finite and > 0, got {value!r}")
    return v


def stamp(schedule: Any) -> Any:
    """Write the report's ``status`` and ``seconds`` into ``schedule.stats`` (the JSON
    view), the same keys for both collectives; returns ``schedule``."""
    report = schedule.report
    if report is not None:
        schedule.stats["status"] = report.termination.value
        schedule.stats["seconds"] = report.seconds
    return schedule
