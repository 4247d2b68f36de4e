"""Fluid fabric simulator (paper §6.1, docs/sim.md).

``simulate(topo, schedule, message_bytes)`` runs a ``mccl-schedule/1`` schedule on a
fabric whose capacities may change over time and returns a :class:`SimResult`
(completion time, nccl-tests algbw, per-link throughput over time).
"""

from __future__ import annotations

from .engine import simulate
from .fairshare import max_min_rates
from .model import DEFAULT_SLICE_BYTES, SimulationError
from .result import SimResult

__all__ = ["simulate", "SimResult", "SimulationError", "max_min_rates", "DEFAULT_SLICE_BYTES"]
