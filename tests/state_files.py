"""A manager's state written as the service writes it and read back as it reads it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mccl_opt.topology import Topology
from mccl_runtime.manager import ScheduleManager
from mccl_runtime.state import StateWriter, load_state
from mccl_runtime.telemetry import MeasurementStore


def saved_and_loaded(folder: Path, store: MeasurementStore, manager: ScheduleManager,
                     topo: Topology) -> dict[str, Any]:
    """``manager``'s and ``store``'s state through a state file in ``folder``
    (:class:`StateWriter`, then :func:`load_state`: checked, version files inlined)."""
    path = folder / "state.json"
    StateWriter(path, topo).write(store, manager, {})
    state = load_state(path, topo)
    assert state is not None
    return state
