"""The argument checks both synthesizers run first: one error contract (issue 28).

``solve_alltoall`` and ``solve_allgather`` call these before any work, so the same bad
argument gets the same typed error from both (docs/architecture.md, "Errors"):

* not a :class:`~mccl_opt.Topology` -> :class:`TopologyError`;
* a chunk budget, step bound or time limit out of range -> :class:`InputError`;
* an unknown backend name, or one whose solver is not installed ->
  :class:`SolverNotAvailableError` (the message names the pip package);
* a warm start that is not a previous schedule of the same collective (or, where the
  synthesizer accepts one, its warm state) -> :class:`ScheduleError`.
"""

from __future__ import annotations

from typing import Any

from .backends import installed_class
from .errors import InputError, ScheduleError, SolverNotAvailableError, TopologyError
from .schedule import MAX_CHUNK_BUDGET, Schedule
from .topology import Topology

__all__ = ["check_topology", "check_max_chunks", "check_time_limit", "check_backend",
           "check_warm"]

_TITLES = {"alltoall": "AllToAll", "allgather": "AllGather"}


def check_topology(topo: Any) -> None:
    """:class:`TopologyError` unless ``topo`` is a :class:`Topology`."""
    if not isinstance(topo, Topology):
        raise TopologyError(f"expected a mccl_opt.Topology, got {type(topo).__name__} "
                            "(build one with Topology.load(path) or Topology.from_dict(...))")


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_max_chunks(max_chunks: Any) -> None:
    """:class:`InputError` unless ``max_chunks`` is an integer in ``[1, MAX_CHUNK_BUDGET]``
    (what a schedule file may name) or ``None``."""
    if max_chunks is not None and not (_positive_int(max_chunks) and max_chunks <= MAX_CHUNK_BUDGET):
        raise InputError(f"max_chunks must be a positive integer or None (the exact optimum), at most "
                         f"{MAX_CHUNK_BUDGET}; got {str(max_chunks)[:40]}")


def check_time_limit(time_limit: Any) -> None:
    """:class:`InputError` unless ``time_limit`` is ``None`` or a number of seconds > 0."""
    if time_limit is None:
        return
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)) or not time_limit > 0:
        raise InputError(f"time_limit must be None or a number of seconds > 0, got {time_limit!r}")


def check_backend(backend: Any) -> None:
    """:class:`SolverNotAvailableError` unless ``backend`` names a known LP backend whose
    solver package is installed (:func:`mccl_opt.backends.installed_class`)."""
    installed_class(backend)


def check_warm(warm: Any, collective: str, state_types: tuple[type, ...] = ()) -> None:
    """:class:`ScheduleError` unless ``warm`` is ``None``, a :class:`Schedule` of
    ``collective``, or an instance of one of ``state_types`` (the warm states the
    synthesizer accepts on their own)."""
    title = _TITLES[collective]
    if warm is None or isinstance(warm, state_types):
        return
    if not isinstance(warm, Schedule):
        accepted = "a previous Schedule" + (" or its warm_state" if state_types else "")
        raise ScheduleError(f"warm must be {accepted} of an {title}, got {type(warm).__name__}")
    if warm.collective != collective:
        raise ScheduleError(f"cannot warm-start {title} from a {warm.collective!r} schedule; "
                            f"pass a previous {title} schedule (or warm=None)")
