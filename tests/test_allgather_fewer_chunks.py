"""ForestColl with fewer chunks when the chunk budget's packing fails (issue 25, no
structure-dependent cliff; docs/allgather_history.md "Leaf-spine at K=10").

On a leaf-spine fabric with every NIC of a host on one leaf and four spines, the
budget's 7 trees per root admit a packing (the rooted cut test passes) that the fast
packers do not find; the general method then took seconds to minutes.  ForestColl is
asked for fewer chunks instead and its schedule kept when it rounds within
``RESTRICTION_ROUNDING_GAP`` of the optimum."""

from __future__ import annotations

import pytest

import mccl_opt as mo
from instances.aggregation import leaf_spine
from mccl_opt.allgather.chain import RESTRICTION_ROUNDING_GAP
from mccl_opt.report import Method
from tests.oracle_allgather import check_schedule, cut_bound


def test_leaf_spine_budget_that_does_not_pack_takes_fewer_chunks():
    topo = leaf_spine(6, 2, 8, spines=4)
    s = mo.solve_allgather(topo, max_chunks=10)
    check_schedule(topo, s)
    bound = cut_bound(topo)              # balanced fabric: the forwarding-only optimum
    assert s.report.method is Method.FORESTCOLL
    assert s.stats["k"] < s.stats["k_exact"] and s.stats["k"] <= 10
    assert s.rate_gbps <= bound * (1 + 1e-9)
    assert s.rate_gbps >= bound * (1 - RESTRICTION_ROUNDING_GAP)



def test_weaker_direction_trees_keep_their_own_chunk_budget():
    """One NIC at 0.9 one way on leaf-spine 2x2x8 at K=10: the balanced restriction's
    ForestColl rounds with 2 chunks per root, the weaker-direction trees (9 per root) round
    better and replace them; the schedule must name their budget, not the restriction's
    (it said ``max_chunks=2`` with shares of 1/9: invalid)."""
    topo = leaf_spine(2, 2, 8).with_capacity(src="u1h0g2", dst="u1leaf0", gbps=360.0,
                                             both_directions=False)
    s = mo.solve_allgather(topo, max_chunks=10)
    assert mo.validate(topo, s).rate_gbps == pytest.approx(s.rate_gbps, rel=1e-9)
    check_schedule(topo, s)
    assert s.max_chunks is not None and s.max_chunks <= 10
    assert s.rate_gbps <= cut_bound(topo) * (1 + 1e-9)
