"""A loaded schedule's warm state rebuilt, for either collective (README "Python API").

A schedule read from a file (a restarted controller, ``mccl solve --warm``) carries its
chunks but not the solver state a warm re-synthesis reuses.  :func:`restore_warm_state`
rebuilds it from the chunks on the fabric the schedule was made for: AllGather's trees
(:func:`mccl_opt.allgather.warm.previous.restore_forest_state`, so a warm start reroutes
them) and AllToAll's columns (:func:`mccl_opt.alltoall.restore.restore_column_state`, so
a warm start takes the certified local path).  Done when a schedule is loaded, not when a
failure strikes.
"""

from __future__ import annotations

from .errors import ScheduleError
from .schedule import Schedule
from .topology import Topology

__all__ = ["restore_warm_state"]


def restore_warm_state(schedule: Schedule, topo: Topology) -> Schedule:
    """``schedule`` with the warm state of its collective rebuilt on ``topo`` (the fabric
    it was synthesized for); the schedule itself if it already has one or if its chunks
    do not fit ``topo`` (other GPUs, a hop that is not a link).  Raises
    :class:`ScheduleError` if ``schedule`` is not a :class:`Schedule`."""
    if not isinstance(schedule, Schedule):
        raise ScheduleError(f"restore_warm_state needs a Schedule, got {type(schedule).__name__}")
    if not isinstance(topo, Topology):
        raise ScheduleError(f"restore_warm_state needs the schedule's Topology, got "
                            f"{type(topo).__name__}")
    if schedule.collective == "alltoall":
        from .alltoall.restore import restore_column_state
        return restore_column_state(schedule, topo)
    from .allgather.warm.previous import restore_forest_state
    return restore_forest_state(schedule, topo)
