"""The MCCL error hierarchy (README "Python API", docs/architecture.md "Errors").

Every error the packages raise on bad input or solver trouble derives from
:class:`MCCLError`, so callers (and the CLI, which prints the message and exits
with status 2) can catch one type.  Messages say what is wrong *and* what to fix.
The root itself is defined in the bottom layer (:mod:`formulations.errors`, so that
the model builders' ``FormulationError`` is an ``MCCLError`` too) and re-exported here.
Every type but the root also derives from the built-in type an older caller may
catch (``ValueError``, ``ImportError``, ``RuntimeError``).
"""

from __future__ import annotations

from formulations.errors import FormulationError, MCCLError

__all__ = [
    "MCCLError",
    "InputError",
    "FormulationError",
    "TopologyError",
    "SolverNotAvailableError",
    "SolverLicenseError",
    "SolveError",
    "ScheduleError",
    "TelemetryError",
    "WorkloadError",
]


class InputError(MCCLError, ValueError):
    """A parameter a function cannot use (a chunk budget, step bound, time limit,
    tolerance or option out of range, a wrong type); the message names the parameter
    and what it accepts."""


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


class WorkloadError(MCCLError, ValueError):
    """A training workload (``mccl-workload/1``) that cannot be used: a missing or
    malformed field, a parallel group that does not divide the GPU count, an unknown
    built-in model; the message names the entry and what to fix."""
