"""The MCCL error hierarchy (README "Python API").

Every error the package raises on bad input or solver trouble derives from
:class:`MCCLError`, so callers (and the CLI, which prints the message and exits
with status 2) can catch one type.  Messages say what is wrong *and* what to fix.
"""

from __future__ import annotations

__all__ = [
    "MCCLError",
    "TopologyError",
    "SolverNotAvailableError",
    "SolverLicenseError",
    "SolveError",
    "ScheduleError",
    "TelemetryError",
]


class MCCLError(Exception):
    """Base class of every error raised by MCCL."""


class TopologyError(MCCLError, ValueError):
    """Bad topology: malformed file, unknown or duplicate ids, bad capacities,
    or GPUs that cannot reach each other."""


class SolverNotAvailableError(MCCLError, ImportError):
    """The requested LP/MIP backend is not installed; the message names the pip package."""


class SolverLicenseError(MCCLError, RuntimeError):
    """The backend is installed but its licence cannot solve a model of this size."""


class SolveError(MCCLError, RuntimeError):
    """Numerical trouble, or a limit was hit before any feasible schedule existed."""


class ScheduleError(MCCLError, ValueError):
    """An invalid schedule (file or object), or one that does not match its topology."""


class TelemetryError(MCCLError, ValueError):
    """Telemetry samples that cannot be used (NaN, negative, unknown link, ...)."""
