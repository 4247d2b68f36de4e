"""Which AllGather method solves a fabric (docs/allgather.md "General method").

ForestColl (paper §4.3) is exact when every switch is balanced (in-capacity equals
out-capacity): directed splitting-off then preserves the cut optimum, and that optimum
is reached with forwarding-only switches.  Elsewhere the cut bound can lie above every
forwarding-only schedule and switch removal can fail, so the chain is:

1. unbalanced switches -> the general method (:mod:`.general`);
2. balanced -> ForestColl; if it raises (a :class:`SolveError`, typed by the
   orchestrator), gives up capacity while balancing (``stats['balanced_exactly']`` is
   false), or, with ``max_chunks=None``, needs more than :data:`EXACT_TREES_LIMIT` trees
   per root (exact multiplicities of arbitrary float capacities explode) -> the general
   method.

The general method never fails on a connected fabric with positive capacities.
"""

from __future__ import annotations

import numpy as np

from ..errors import MCCLError
from ..schedule import Schedule
from ..topology import Topology
from .fabric import fabric_of
from .general import solve_general
from .pipeline import gbps
from .throughput import optimal_rate

__all__ = ["EXACT_TREES_LIMIT", "switches_balanced", "cut_bound_gbps", "solve_by_general"]

#: above this many exact trees per root (``max_chunks=None``), the general method
#: solves instead of ForestColl's exact packing
EXACT_TREES_LIMIT = 4096

#: relative tolerance of the balance test (capacities summed in another order)
_BALANCE_TOL = 1e-12


def switches_balanced(topo: Topology) -> bool:
    """Whether every switch's in-capacity equals its out-capacity."""
    arr = topo.arrays
    out = np.bincount(arr.tail, weights=arr.capacity, minlength=topo.num_nodes)
    into = np.bincount(arr.head, weights=arr.capacity, minlength=topo.num_nodes)
    sw = arr.is_switch
    return bool(np.all(np.abs(out[sw] - into[sw]) <= _BALANCE_TOL * np.maximum(out[sw], into[sw])))


def cut_bound_gbps(topo: Topology) -> float | None:
    """Phase 1's cut bound (the optimum were switches able to copy), ``None`` if it
    cannot be computed."""
    try:
        fab, quantum = fabric_of(topo)
        return gbps(optimal_rate(fab), quantum)
    except (MCCLError, ArithmeticError, ValueError):
        return None


def solve_by_general(topo: Topology, warm: Schedule | None, backend: str,
                     max_chunks: int | None, reason: str) -> Schedule:
    """The general method, with the cut bound for ``stats['cut_bound_gbps']`` and
    ``stats['general_reason']`` saying why it ran."""
    sched = solve_general(topo, warm=warm, backend=backend, max_chunks=max_chunks,
                          cut_bound_gbps=cut_bound_gbps(topo))
    sched.stats["general_reason"] = reason
    return sched
