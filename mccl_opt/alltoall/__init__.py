"""AllToAll synthesis by column generation (paper §4.2, App. D and G).

``solve_alltoall(topo, warm=None, backend="highs", max_chunks=10, max_steps=None,
time_limit=None)`` returns a :class:`mccl_opt.Schedule`.  Modules: :mod:`.pricing`
(step-bounded shortest paths, numba), :mod:`.master` (restricted master over a backend),
:mod:`.colgen` (the loop and its Farley bound), :mod:`.rounding` (largest remainder +
deep dive), :mod:`.warm` (column transfer), :mod:`.latency` (``max_steps="min"``),
:mod:`.solve` (the entry point).
"""

from __future__ import annotations

from .solve import solve_alltoall
from .warm import WarmState

__all__ = ["solve_alltoall", "WarmState"]
