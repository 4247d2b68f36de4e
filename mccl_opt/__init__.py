"""MCCL core: topology model, schedule synthesizers, validator and simulator.

``import mccl_opt`` is cheap: it imports no optional solver and compiles no numba
kernel; the synthesizers are loaded on first use.
"""

from __future__ import annotations

from . import process_exit
from .errors import (InputError, MCCLError, ScheduleError, SolveError, SolverLicenseError,
                     SolverNotAvailableError, TelemetryError, TopologyError,
                     WorkloadError)
from .lazy import lazy_getattr
from .schedule import BottleneckLink, PathChunk, Schedule, TreeChunk
from .topology import Link, Node, Topology
from .validate import ValidationReport, validate
from .check_result import CheckResult, check

__version__ = "0.1.0"

process_exit.install()

__all__ = [
    "MCCLError", "InputError", "TopologyError", "SolverNotAvailableError", "SolverLicenseError",
    "SolveError", "ScheduleError", "TelemetryError", "WorkloadError",
    "Topology", "Node", "Link", "Schedule", "PathChunk", "TreeChunk", "BottleneckLink",
    "validate", "ValidationReport", "check", "CheckResult", "solve_alltoall", "solve_allgather",
    "restore_warm_state",
    "__version__",
]

_LAZY = {
    "solve_alltoall": "mccl_opt.alltoall",
    "solve_allgather": "mccl_opt.allgather",
    "restore_warm_state": "mccl_opt.warm_restore",
}


#: subpackages reachable as attributes (``mo.backends``) without an explicit import
_SUBMODULES = ("backends", "baselines", "sim", "evaluate", "allgather", "alltoall", "lowering")


__getattr__ = lazy_getattr(__name__, _LAZY, _SUBMODULES)
