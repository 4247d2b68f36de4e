"""With a chunk budget, the weaker-direction fabric below the cut bound is packed after
the balanced restriction, and not at all where the restriction's schedule reaches the
cut bound (docs/allgather.md "One-way faults at K=10: the weaker direction after the
restriction").  No schedule exceeds the cut bound, so the answer is the one packing
both would give; the rates are checked against the independent oracle."""

from __future__ import annotations

import mccl_opt as mo
from instances import hpn
from instances.designs import dragonfly
from mccl_opt.allgather.chain import cut_bound_gbps, weaker_directions
from mccl_opt.report import Method
from tests.oracle_allgather import check_schedule, cut_bound


def _weaker(sched: mo.Schedule) -> list[str]:
    return [a.outcome for a in sched.report.attempts if a.method is Method.WEAKER_DIRECTIONS]


def test_the_restriction_at_the_cut_bound_skips_the_weaker_direction() -> None:
    topo = hpn(1, 2, 4).with_capacity(src="s0h0g0", dst="s0h0nvs", gbps=1440.0,
                                      both_directions=False)
    bound = cut_bound(topo)
    assert cut_bound_gbps(weaker_directions(topo)) < bound * (1 - 1e-6)   # cannot certify
    sched = mo.solve_allgather(topo, max_chunks=10)
    check_schedule(topo, sched)
    assert sched.report.method is Method.BALANCED_RESTRICTION
    assert abs(sched.rate_gbps - bound) <= 1e-9 * bound
    assert [o.split(":")[0] for o in _weaker(sched)] == ["skipped"]
    order = [a.method for a in sched.report.attempts]
    assert order.index(Method.BALANCED_RESTRICTION) < order.index(Method.WEAKER_DIRECTIONS)


def test_a_restriction_short_of_the_cut_bound_still_weighs_the_weaker_direction() -> None:
    topo = dragonfly(3, 2, 1, 4).with_capacity(src="d0r0h0g0", dst="d0r0", gbps=200.0,
                                               both_directions=False)
    sched = mo.solve_allgather(topo, max_chunks=10)
    check_schedule(topo, sched)
    assert sched.rate_gbps < cut_bound(topo) * (1 - 1e-6)
    assert _weaker(sched) == ["returned"]                 # packed, after the restriction
    weaker = mo.solve_allgather(weaker_directions(topo), max_chunks=10)
    on_topo = mo.validate(topo, weaker).rate_gbps         # its trees are valid on the fabric
    assert sched.rate_gbps >= on_topo * (1 - 1e-9)        # never below the weaker direction
