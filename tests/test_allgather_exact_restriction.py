"""Exact ForestColl on a balanced restriction whose chunk budget stops below the optimum
(mccl_opt.allgather.forestcoll.removal.unit_rounding.restriction_units, docs/allgather_history.md
"Exact restriction rounding"): an HPN host with one NVLink degraded one way solves at
``max_chunks=None`` by ForestColl on the restriction, at the forwarding-only optimum,
without the general method, whatever the node names and order."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

import mccl_opt as mo
from instances import hpn
from instances.aggregation import scrambled
from mccl_opt.allgather.budget import FEWEST_TRIES
from mccl_opt.allgather.forestcoll.removal.unit_rounding import exact_tries
from mccl_opt.allgather.forestcoll.throughput import Fabric
from mccl_opt.allgather.general.method import solve_general
from tests.oracle_allgather import check_schedule, forwarding_optimum


def _nvlink_one_way(shape: tuple[int, int, int], factor: float) -> mo.Topology:
    """``hpn(*shape)`` with GPU 0's NVLink into its NVSwitch at ``factor`` one way."""
    topo = hpn(*shape)
    link = next(l for l in topo.links if l.src == "s0h0g0" and l.dst.endswith("nvs"))
    return topo.with_capacity({(link.src, link.dst): link.capacity_gbps * factor})


def _methods(sched: mo.Schedule) -> list[str]:
    return [a.method.value for a in sched.report.attempts]


def test_small_host_reaches_the_oracle_optimum_on_the_restriction():
    topo = _nvlink_one_way((1, 2, 4), 0.37)      # 8 GPUs: the general method ran before
    optimum = forwarding_optimum(topo).rate_gbps
    sched = mo.solve_allgather(topo, max_chunks=None)
    check_schedule(topo, sched)
    assert sched.rate_gbps == pytest.approx(optimum, rel=1e-6)
    assert sched.stats["method"] == "forestcoll-balanced-restriction"
    assert "general" not in _methods(sched), sched.report.attempts
    for seed in (1, 2):                          # names and order do not matter
        other = mo.solve_allgather(scrambled(topo, seed), max_chunks=None)
        assert other.rate_gbps == pytest.approx(sched.rate_gbps, rel=1e-6)


@pytest.mark.parametrize("shape", [(2, 2, 8), (1, 4, 8)])
def test_one_way_nvlink_matches_the_general_method_without_running_it(shape):
    topo = _nvlink_one_way(shape, 0.5)
    sched = mo.solve_allgather(topo, max_chunks=None)
    check_schedule(topo, sched)
    assert "general" not in _methods(sched), sched.report.attempts
    general = solve_general(topo, max_chunks=None)     # column generation: exact too
    assert sched.rate_gbps == pytest.approx(general.rate_gbps, rel=1e-6)


def test_exact_tries_end_with_the_real_fabrics_exact_k():
    # two GPUs through one switch, capacities 6 and 4 quanta; at x = 97/5 every c·k/x is
    # an integer first at k = 97
    fab = Fabric.build(3, np.array([0, 2, 1, 2]), np.array([2, 1, 2, 0]),
                       np.array([6, 4, 6, 4]), np.array([0, 1]))
    x = Fraction(97, 5)
    headroom = [Fraction(1)] * 4
    tries = exact_tries(fab, x, 8, headroom, limit=4096)
    assert tries == list(range(9, FEWEST_TRIES + 1)) + [97]
    assert all((Fraction(int(c)) * tries[-1] / x).denominator == 1 for c in fab.cap.tolist())
    assert exact_tries(fab, x, 8, headroom, limit=90) == list(range(9, FEWEST_TRIES + 1))
    assert exact_tries(fab, x, 70, headroom, limit=4096) == [97]    # k0 above the scan
    assert exact_tries(fab, x, 97, headroom, limit=4096) == []      # the budget's own k


def test_a_lossy_balancing_declines_before_packing_where_only_the_optimum_is_kept() -> None:
    """``Goal.EXACT`` on a sub-fabric (the restriction at ``None``): where balancing the
    switches gives up capacity, ForestColl declines before Phases 2-3 instead of packing
    trees that rate below the optimum (docs/allgather_history.md "Lossy restriction balancing at
    None"); ``Goal.DECLINABLE`` (the weaker-direction fabric, which the chain compares with
    the next method) still makes the lossy packing."""
    from instances.designs import dragonfly
    from mccl_opt.allgather.canonical import canonical
    from mccl_opt.allgather.forestcoll.pack_plan import ForestCollAsk, Goal
    from mccl_opt.allgather.solve import sub_forestcoll
    from mccl_opt.allgather.stage import Declined, Trail
    from mccl_opt.report import Termination

    topo = canonical(dragonfly(3, 2, 1, 4).with_capacity(src="d0r0h0g0", dst="d0r0",
                                                         gbps=200.0, both_directions=False))
    forestcoll = sub_forestcoll("highs", Trail())
    declined = forestcoll(topo, None, None)                   # Goal.of(None): EXACT
    assert isinstance(declined, Declined) and "balancing" in declined.reason
    lossy = forestcoll(topo, None, None, ForestCollAsk(goal=Goal.DECLINABLE))
    assert isinstance(lossy, mo.Schedule) and lossy.stats["balanced_exactly"] is False
    sched = mo.solve_allgather(topo, max_chunks=None)        # the chain's certified optimum
    check_schedule(topo, sched)
    assert sched.report.termination is Termination.OPTIMAL
    assert lossy.rate_gbps < sched.rate_gbps * (1 - 1e-9)   # the lossy trees rate below it
