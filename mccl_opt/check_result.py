"""``mccl_opt.check``: the library's ``mccl check``, one contract (docs/interop.md
"Library and command line agree").

A schedule is *valid* on a fabric when it is structurally sound there (its GPUs are the
fabric's ranks, every block delivered, every hop a link, trees spanning, shares summing
to one; :func:`mccl_opt.validate`).  Its rate is recomputed on the fabric's capacities:
a schedule synthesized before a capacity change stays valid and is reported with the
rate it runs at here (``rate_as_stated`` false).  ``strict=True`` also requires that
rate to be the stated one, as :func:`mccl_opt.validate` does by default.  :func:`check`
never raises for an invalid schedule: it says why in ``problems``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .schedule import Schedule
from .topology import Topology
from .validate import inspect

__all__ = ["check", "CheckResult"]


@dataclass(frozen=True)
class CheckResult:
    """What ``mccl check --json`` prints (``problems`` empty when ``valid``)."""

    valid: bool
    collective: str
    fabric: str
    problems: tuple[str, ...]
    rate_gbps: float | None
    schedule_rate_gbps: float
    rate_as_stated: bool | None
    lp_rate_gbps: float
    rounding_gap: float
    chunks: int
    max_steps: int | None
    max_link_utilisation: float | None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["problems"] = list(self.problems)
        return d


def check(topo: Topology, schedule: Schedule, *, strict: bool = False, tol: float = 1e-6) -> CheckResult:
    """Check ``schedule`` on ``topo`` without raising (module docstring)."""
    report, problems = inspect(topo, schedule, tol=tol, strict=False)
    if report is not None and strict and not report.rate_as_stated:
        problems = [f"recomputed rate {report.rate_gbps:.9g} Gbps differs from rate_gbps "
                    f"{schedule.rate_gbps:.9g} (the rate it runs at on this fabric; re-synthesize for it)"]
    valid = report is not None and not problems
    return CheckResult(
        valid=valid, collective=schedule.collective, fabric=topo.name, problems=tuple(problems),
        rate_gbps=None if report is None else report.rate_gbps,
        schedule_rate_gbps=schedule.rate_gbps,
        rate_as_stated=None if report is None else report.rate_as_stated,
        lp_rate_gbps=schedule.lp_rate_gbps, rounding_gap=schedule.rounding_gap,
        chunks=len(schedule.chunks), max_steps=None if report is None else report.max_steps,
        max_link_utilisation=None if report is None else report.max_utilisation)
