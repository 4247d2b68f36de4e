"""MCCL controller (paper §3): telemetry EWMA, drift detection (Algorithm 1), the
schedule manager / optimizer wrapper, the ZeroMQ service and client, the closed-loop
simulation and the workload speedup estimate.  See docs/runtime.md.

Importing this package is cheap: zmq, matplotlib and the synthesizers load on first use.
"""

from __future__ import annotations

from mccl_opt.lazy import lazy_getattr

from .drift import DriftReport, ScheduleProfile, detect, profile_schedule
from .manager import Collective, Event, Policy, ScheduleManager
from .synthesizer import solver_synthesizer
from .telemetry import IngestReport, MeasurementStore

__all__ = ["MeasurementStore", "IngestReport", "detect", "profile_schedule", "DriftReport",
           "ScheduleProfile", "ScheduleManager", "Policy", "Collective", "Event", "solver_synthesizer",
           "ControllerService", "ControllerClient", "run_loop", "LoopConfig"]

#: names whose modules import zmq or the synthesizers, loaded on first use
_LAZY = {
    "ControllerService": "mccl_runtime.service",
    "ControllerClient": "mccl_runtime.client",
    "run_loop": "mccl_runtime.loop",
    "LoopConfig": "mccl_runtime.loop",
}


__getattr__ = lazy_getattr(__name__, _LAZY)
