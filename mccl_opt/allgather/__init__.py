"""AllGather synthesis: ForestColl tree packing, history-guided warm re-synthesis and
step-aware switch removal (paper §4.3 and App. C)."""

from .solve import solve_allgather
from .warm.previous import WarmState, restore_warm_state

__all__ = ["solve_allgather", "restore_warm_state", "WarmState"]
