"""At ``max_chunks=None``, a weaker-direction fabric that reaches the cut bound but whose
exact packing needs too many trees per root is not packed: the general method, seeded
with its trees at a few chunks per root and stopped at the cut bound, gives the same
certified rate on few trees, with no balanced restriction (docs/allgather_history.md "Weaker
direction past the exact tree count")."""

from __future__ import annotations

import mccl_opt as mo
from instances import hpn
from mccl_opt.allgather.chain import cut_bound_gbps, weaker_directions
from mccl_opt.report import Method
from tests.oracle_allgather import check_schedule, cut_bound


def test_a_weaker_direction_past_the_tree_limit_seeds_the_general_method() -> None:
    topo = hpn(1, 2, 4).with_capacity(src="s0h0g0", dst="s0tor0", gbps=123.457,
                                      both_directions=False)
    bound = cut_bound(topo)
    assert cut_bound_gbps(weaker_directions(topo)) >= bound * (1 - 1e-9)   # it certifies
    sched = mo.solve_allgather(topo, max_chunks=None)
    check_schedule(topo, sched)
    assert sched.report.method is Method.GENERAL
    assert abs(sched.rate_gbps - bound) <= 1e-9 * bound
    methods = [a.method for a in sched.report.attempts]
    assert methods == [Method.WEAKER_DIRECTIONS, Method.GENERAL]      # no restriction
    assert sched.report.attempts[0].outcome.startswith("declined")
    assert len(sched.chunks) <= topo.num_gpus + topo.num_links        # a basic optimum's
