"""AllGather synthesis: ForestColl tree packing, history-guided warm re-synthesis and
step-aware switch removal (paper §4.3 and App. C)."""

from .solve import solve_allgather
from .warm.kept import AllGatherWarmState

__all__ = ["solve_allgather", "AllGatherWarmState"]
