"""Starting trees and a certified upper bound for the general method from the best
balanced restriction (docs/allgather.md "General method: restriction seed").

On a fabric with unbalanced switches the forwarding-only optimum is the cut bound of
the best balanced restriction ``c' <= c`` (:mod:`..restriction.balanced`, docs
"Balanced restriction"): its certified rate is an *upper bound* the column generation
can stop at, with no Lagrangian tail.  ForestColl (paper §4.3) on ``c'`` with a few
chunks per root rounds a little below that optimum (the exact optimum would need
thousands of trees per root), but its trees, valid on ``c >= c'`` and re-weighted by the
tree master, start the column generation at or next to the optimum: HPN 4x8x8 with one
NIC at a quarter of its speed one way reaches it in the master's first solve, where
the multiplicative-weights start crept from 11.65 to 12.24 of 12.83 Gbps in 96 rounds.
"""

from __future__ import annotations

from dataclasses import dataclass


from mccl_opt.errors import SolveError, TopologyError
from mccl_opt.schedule import Schedule
from mccl_opt.topology import Topology
from ..assemble import Optimum, Run, packed
from ..canonical import canonical
from ..forestcoll.pipeline import balanced_split, pack, phase_one_budget
from ..fabric import switches_balanced
from ..restriction.balanced import balanced_restriction, restricted_topology

__all__ = ["RestrictionSeed", "restriction_seed", "SEED_CHUNKS"]

#: chunks per root asked of ForestColl on the restriction (4 left HPN 4x16x8 stuck 0.25 % below
#: the optimum for 28 rounds; 10 reached it in the first master solve): enough trees that the master's
#: re-weighting reaches the optimum (or next to it) at 256-512 GPUs, few enough that the
#: first master solve stays cheap
SEED_CHUNKS = 10


@dataclass(frozen=True)
class RestrictionSeed:
    """The restriction's certified optimum ``rate_gbps`` (an upper bound on every
    forwarding-only schedule of the fabric) and ForestColl's trees on it, as GPU ids:
    ``chunks`` of a schedule on the restricted fabric (same node ids)."""

    rate_gbps: float
    schedule: Schedule


def _forestcoll(sub: Topology, k: int) -> Schedule:
    """ForestColl's cold pipeline (paper §4.3: Phase 1 and the chunk budget, switch
    balancing, switch removal, tree packing) on the balanced ``sub`` at ``k`` chunks,
    keeping what balancing loses (the master re-weights the trees anyway)."""
    run = Run.start(sub, None, k)
    budget = phase_one_budget(sub, k, run.stats, run.hint_cuts, run.cuts)
    arr = sub.arrays
    balanced = balanced_split(budget.fab, arr.is_switch, budget.k, budget.y, k)
    result = pack(balanced.split, arr.rank_of, balanced.k, run.guides, run.stats, run.shapes)
    return packed(run, Optimum.of(budget), result)


def restriction_seed(topo: Topology, backend: str = "highs",
                     chunks: int = SEED_CHUNKS) -> RestrictionSeed | None:
    """The balanced restriction of ``topo`` and ForestColl's schedule on it with at most
    ``chunks`` chunks per root (fewer while ForestColl fails, as the method chain does);
    ``None`` when every switch is balanced (the restriction is the fabric, whose
    ForestColl the chain already declined), the restriction is not certified or
    ForestColl packs no chunk count (the general method then starts from its own trees)."""
    if switches_balanced(topo):
        return None
    try:
        found = balanced_restriction(topo, backend)
        if found is None or not found.rate_gbps > 0:
            return None
        sub = canonical(restricted_topology(topo, found)[0])
    except (SolveError, TopologyError):
        return None
    for k in range(chunks, 0, -1):
        try:
            return RestrictionSeed(found.rate_gbps, _forestcoll(sub, k))
        except (SolveError, TopologyError, KeyError, IndexError, AssertionError,
                ZeroDivisionError):    # as the chain treats ForestColl failing: next k
            continue
    return None
