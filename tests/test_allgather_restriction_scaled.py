"""ForestColl on the balanced restriction above the tree limit by the scaled packing
(mccl_opt.allgather.restriction.stages.solve_by_restriction, docs/allgather_history.md "Scaled packing on the
restriction"): at ``max_chunks=None`` an unbalanced fabric whose restriction needs more
than ``EXACT_TREES_LIMIT`` trees per root gets the restriction's certified optimum from
ForestColl on ``c'`` instead of the general method.  The path starts at
``SCALED_RESTRICTION_FROM`` GPUs; the tests lower it to reach it on small fabrics."""

from __future__ import annotations

import pytest

import mccl_opt as mo

from instances import hpn
from mccl_opt.allgather.restriction import stages
from mccl_opt.allgather.budget import EXACT_TREES_LIMIT
from mccl_opt.allgather.canonical import canonical
from tests.oracle_allgather import check_schedule, forwarding_optimum

#: one link slowed one way to an odd speed: the restriction's exact packing needs
#: thousands to ~150 000 trees per root (HPN 1x2x8 with a NIC slowed one way no longer
#: reaches the restriction: the weaker direction seeds the general method first,
#: docs/allgather_history.md "Weaker direction past the exact tree count")
FAULTS = [((1, 2, 8), "s0h0g2", "s0h0nvs", 1776.7), ((2, 2, 4), "s0h0g0", "s0tor0", 125.48),
          ((1, 2, 8), "s0h0g1", "s0h0nvs", 222.5)]


def _faulty(shape: tuple[int, int, int], src: str, dst: str, gbps: float) -> mo.Topology:
    return canonical(hpn(*shape).with_capacity(src=src, dst=dst, gbps=gbps,
                                               both_directions=False))


@pytest.mark.parametrize("shape,src,dst,gbps", FAULTS)
def test_scaled_restriction_reaches_the_independent_forwarding_optimum(monkeypatch, shape, src,
                                                                       dst, gbps):
    """With the path on, the balanced restriction answers by the scaled packing above the
    tree limit, at the forwarding-only optimum of an independent compact LP
    (tests/oracle_allgather.py), certified optimal, in a schedule the validator accepts at
    that rate; with the path off the same fabric goes on to the general method and lands
    on the same optimum."""
    topo = _faulty(shape, src, dst, gbps)
    opt = forwarding_optimum(topo).rate_gbps
    monkeypatch.setattr(stages, "SCALED_RESTRICTION_FROM", 0)
    s = mo.solve_allgather(topo, max_chunks=None)
    assert s.stats["method"] == "forestcoll-balanced-restriction"
    assert s.stats["k"] > EXACT_TREES_LIMIT and s.stats["scaled_tries"] >= 1
    assert s.report.termination.value == "optimal"
    assert s.lp_rate_gbps == pytest.approx(opt, rel=1e-9)
    assert s.report.bound_gbps == pytest.approx(opt, rel=1e-9)
    assert check_schedule(topo, s).rate_gbps == pytest.approx(opt, rel=1e-6)

    monkeypatch.setattr(stages, "SCALED_RESTRICTION_FROM", topo.num_gpus + 1)
    general = mo.solve_allgather(topo, max_chunks=None)
    assert general.stats["method"] == "general"
    assert general.lp_rate_gbps == pytest.approx(opt, rel=1e-7)


def test_scaled_restriction_only_at_max_chunks_none(monkeypatch):
    """With a chunk budget the restriction keeps its chunk-count loop (no scaled packing:
    ``k <= max_chunks``), and the schedule stays within that budget."""
    monkeypatch.setattr(stages, "SCALED_RESTRICTION_FROM", 0)
    topo = _faulty(*FAULTS[0])
    s = mo.solve_allgather(topo, max_chunks=10)
    assert "scaled_tries" not in s.stats
    check_schedule(topo, s, max_chunks=10)
