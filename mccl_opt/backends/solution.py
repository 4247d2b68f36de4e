"""The plain results every backend adapter returns: :class:`SolveStatus` (one status
enum mapped from each solver's codes), :class:`LPSolution` and :class:`Basis` (one
basis coding for all solvers).  Data only: the adapters (:mod:`.base`) and their shared
input checks (:mod:`._common`) both build on it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

__all__ = ["SolveStatus", "LPSolution", "Basis", "LPMethod"]


class SolveStatus(enum.Enum):
    """Outcome of a solve, mapped from each backend's status codes."""

    OPTIMAL = "optimal"
    INFEASIBLE = "infeasible"
    UNBOUNDED = "unbounded"
    INFEASIBLE_OR_UNBOUNDED = "infeasible_or_unbounded"
    TIME_LIMIT = "time_limit"
    ITERATION_LIMIT = "iteration_limit"
    NUMERICAL_ERROR = "numerical_error"
    NOT_SOLVED = "not_solved"
    OTHER = "other"

    @property
    def is_limit(self) -> bool:
        return self in (SolveStatus.TIME_LIMIT, SolveStatus.ITERATION_LIMIT)


LPMethod = str  # one of "auto", "primal", "dual", "ipm"


@dataclass
class LPSolution:
    """Result of :meth:`Backend.solve` / :meth:`Backend.solve_mip`.

    ``x``, ``row_duals`` and ``reduced_costs`` are ``None`` when the solver did not
    produce them (infeasible model, a limit hit before any solution, a MIP has no duals).
    ``row_duals`` follow the shadow-price convention described in the module docstring.
    """

    status: SolveStatus
    objective: float | None
    x: np.ndarray | None
    row_duals: np.ndarray | None
    reduced_costs: np.ndarray | None
    iterations: int
    seconds: float
    mip_bound: float | None = None
    mip_gap: float | None = None

    @property
    def has_primal(self) -> bool:
        return self.x is not None


@dataclass(frozen=True)
class Basis:
    """A simplex basis in one coding for every backend (the HiGHS/SoPlex codes).

    ``col_status[j]``/``row_status[i]`` are :attr:`LOWER` (nonbasic at the lower bound;
    for a row: activity at its lower side), :attr:`BASIC`, :attr:`UPPER` or :attr:`ZERO`
    (nonbasic free).  ``backend`` names the solver that produced it; a basis is plain
    data, so it survives the model it came from and can be set into a rebuilt one.
    """

    col_status: np.ndarray
    row_status: np.ndarray
    backend: str

    LOWER: ClassVar[int] = 0
    BASIC: ClassVar[int] = 1
    UPPER: ClassVar[int] = 2
    ZERO: ClassVar[int] = 3
