"""AllToAll synthesis by column generation (paper §4.2, App. D and G).

``solve_alltoall(topo, warm=None, backend="highs", max_chunks=10, max_steps=None,
time_limit=None)`` returns a :class:`mccl_opt.Schedule`.  Modules, bottom up:
:mod:`.problem` (instance arrays), :mod:`.pricing` (step-bounded shortest paths, numba),
:mod:`.master` (restricted master over a backend), :mod:`.colgen` (the loop, its Farley
bound and :class:`~.colgen.CGStatus`), :mod:`.rounding` (largest remainder + deep dive),
:mod:`.state` (the typed :class:`AllToAllWarmState`), :mod:`.warm` (column transfer, basis
reuse), :mod:`.assemble` (outcome -> schedule, typed run report), :mod:`.driver` (the full
column-generation run), :mod:`.latency` (``max_steps="min"``), :mod:`.local` (certified
reuse and local re-optimisation), :mod:`.restore` (a warm state from a loaded
schedule's chunks), :mod:`.solve` (the entry point, orchestration only).
"""

from __future__ import annotations

from .solve import solve_alltoall
from .state import AllToAllWarmState

__all__ = ["solve_alltoall", "AllToAllWarmState"]
