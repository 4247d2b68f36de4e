"""What every stage of the AllGather method chain shares (:mod:`.chain`, docs/allgather_history.md
"General method"): the :class:`Trail` of the methods a solve tried, a method's
:class:`Declined`, the type of the :data:`ForestColl` sub-solve, and :data:`REACH_TOL`."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, TypeVar

from .. import anytime
from ..errors import SolveError, TopologyError
from ..report import Attempt, Method

if TYPE_CHECKING:
    from ..schedule import Schedule

__all__ = ["Declined", "Trail", "ForestColl", "REACH_TOL"]

#: relative tolerance of "a rate reaches a bound" (e.g. the weaker-direction optimum the
#: cut bound: both are exact rationals of the quantized capacities; this only absorbs the
#: Gbps conversion)
REACH_TOL = 1e-9

T = TypeVar("T")


@dataclass(frozen=True)
class Declined:
    """A method that chose not to solve a fabric, and why (the next method runs)."""

    reason: str


#: ForestColl on a (canonically listed, balanced) topology, on a warm route (:class:`.warm.
#: route.WarmRoute`), at a chunk limit, as a :class:`.forestcoll.pack_plan.ForestCollAsk` says
#: (each link's headroom on the real fabric for a balanced restriction, the split, the goal;
#: see :func:`.solve._forestcoll`); raises SolveError
ForestColl = Callable[..., "Schedule | Declined"]


@dataclass
class Trail:
    """The methods one solve tried, in order, with their times and outcomes
    (``SolveReport.attempts``)."""

    attempts: list[Attempt] = field(default_factory=list)

    def add(self, attempt: Attempt) -> None:
        self.attempts.append(attempt)

    def general(self, started: float, sched: Schedule | None, declined: str,
                reason: str) -> Schedule | None:
        """A one-shot general-method try begun at ``started`` (``perf_counter``): recorded
        as declined with ``declined`` when ``sched`` is ``None``, else as returned, with
        ``stats["general_reason"] = reason``, and offered to the time limit."""
        if sched is None:
            self.add(Attempt(Method.GENERAL, time.perf_counter() - started,
                             f"declined: {declined}"))
            return None
        self.add(Attempt(Method.GENERAL, time.perf_counter() - started, "returned"))
        sched.stats["general_reason"] = reason
        anytime.offer(sched)
        return sched

    def run(self, method: Method, attempt: Callable[[], T], outcome: str) -> T:
        """``attempt()``, recorded as ``method`` with ``outcome`` (a failure is recorded
        with its error and re-raised)."""
        t = time.perf_counter()
        try:
            result = attempt()
        except (SolveError, TopologyError) as e:
            self.add(Attempt(method, time.perf_counter() - t, f"failed: {e}"))
            raise
        self.add(Attempt(method, time.perf_counter() - t,
                         f"declined: {result.reason}" if isinstance(result, Declined) else outcome))
        return result
