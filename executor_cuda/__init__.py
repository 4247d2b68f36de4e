"""MCCL executor on torch.distributed: communicator, passive telemetry, online
rescheduler (hot-swap) and fault injection.  The torch-free lowering it runs (schedule
compiler, MSCCL XML export) lives in :mod:`mccl_opt.lowering`; its names are also
reachable here (``executor_cuda.compile_schedule``, ``executor_cuda.to_msccl_xml``, ...).

Importing this package is cheap (no torch import); the torch-based parts load on
first attribute access.
"""

from __future__ import annotations

from mccl_opt.lazy import lazy_getattr

__all__ = ["Communicator", "Rescheduler", "SwapEvent", "Telemetry", "LinkSample",
           "FaultInjector", "CalibratedReporter", "compile_schedule", "direct_schedule",
           "to_msccl_xml", "check_msccl_xml", "run_ranks", "VersionFollower", "agree_first"]

_LAZY = {
    "Communicator": "executor_cuda.communicator",
    "Rescheduler": "executor_cuda.rescheduler",
    "SwapEvent": "executor_cuda.rescheduler",
    "CalibratedReporter": "executor_cuda.reporting",
    "run_ranks": "executor_cuda.launch",
    "Telemetry": "executor_cuda.telemetry",
    "LinkSample": "executor_cuda.telemetry",
    "FaultInjector": "executor_cuda.faults",
    "VersionFollower": "executor_cuda.follower",
    "agree_first": "executor_cuda.follower",
    "compile_schedule": "mccl_opt.lowering.program",
    "direct_schedule": "mccl_opt.lowering.program",
    "to_msccl_xml": "mccl_opt.lowering.msccl",
    "check_msccl_xml": "mccl_opt.lowering.msccl",
}


__getattr__ = lazy_getattr(__name__, _LAZY)
