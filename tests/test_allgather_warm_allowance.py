"""The AllGather warm allowance sized by this state's predicted cold cost
(``WarmRoute.expect_cold``; docs/allgather.md, *The warm allowance sized by this state's
cold cost*).

* the allowance is ``WARM_SHARE`` x the smaller of the previous cold time and this state's
  prediction (at least the floor), never raised, and a sub-fabric's prediction is ignored;
* a prediction made inside a warm step shortens the running stage;
* in a solve, the prediction at the budget guess's ``k`` stops a warm step that the
  previous state's (injected, long) cold time would have let finish: the schedule is
  cold's, valid, at cold's rate.

No test here times anything: a warm step made slow on purpose checks what is returned.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

import mccl_opt as mo
from instances import hpn
from mccl_opt import anytime
from mccl_opt.allgather import solve as ag_solve
from mccl_opt.allgather.warm import certify, route as warm_route
from mccl_opt.report import Method, WarmUse

from .oracle_allgather import check_schedule

#: the real floor of the allowance (tests/conftest.py raises it elsewhere)
pytestmark = pytest.mark.warm_budget

#: a two-way NVLink halving on HPN 1x2x4 whose warm solve reroutes the previous trees
HALVED = {("s0h0g0", "s0h0nvs"): 150.0, ("s0h0nvs", "s0h0g0"): 150.0}
#: CPU seconds a slow warm step burns unless its stage stops it (far above the floor)
BURN_S = 1.0


def _carrying(cold_cpu_s: float) -> tuple[mo.Topology, mo.Schedule]:
    """HPN 1x2x4 halved, and the healthy fabric's schedule carrying ``cold_cpu_s``."""
    base = hpn(1, 2, 4)
    old = mo.solve_allgather(base, max_chunks=None)
    old.report = dataclasses.replace(old.report, cold_seconds=cold_cpu_s,
                                     cold_cpu_seconds=cold_cpu_s)
    return base.with_capacity(HALVED), old


def _burn() -> bool:
    """Burn CPU until a stage stops it (``True`` if :data:`BURN_S` passed first)."""
    until = time.thread_time() + BURN_S
    while time.thread_time() < until:
        anytime.check("a warm step made slow on purpose")
    return True


def test_the_allowance_is_a_share_of_the_smaller_cold_time():
    topo, old = _carrying(10.0)
    route = warm_route.WarmRoute.plan(topo, old)
    share, floor = warm_route.WARM_SHARE, warm_route.WARM_FLOOR_S
    assert route.total == pytest.approx(share * 10.0)
    route.expect_cold(0.4, topo.with_capacity({}))            # another fabric: ignored
    assert route.total == pytest.approx(share * 10.0)
    route.expect_cold(0.4, topo)
    assert route.total == pytest.approx(share * 0.4) and route.allowance == route.total
    route.expect_cold(4.0, topo)                              # never raised again
    assert route.total == pytest.approx(share * 0.4)
    route.expect_cold(0.0, topo)
    assert route.total == floor
    cold = warm_route.WarmRoute.plan(topo, None)
    cold.expect_cold(0.0, topo)
    assert not cold.active and cold.total == 0.0


def test_a_prediction_inside_a_warm_step_shortens_its_stage():
    topo, old = _carrying(10.0)
    route = warm_route.WarmRoute.plan(topo, old)

    def warm_step(_):
        route.expect_cold(0.0, topo)                          # the floor: 5 ms
        return "warm" if _burn() else None

    assert route.attempt("a slow step", Method.FORESTCOLL, warm_step, lambda: "cold") == "cold"
    assert route.reason == f"the warm allowance of {warm_route.WARM_FLOOR_S:.3g} s CPU " \
        "was spent in a slow step"
    assert route.used < BURN_S


def test_the_budget_guess_sizes_the_allowance_by_its_predicted_cold(monkeypatch):
    """The previous cold time (1000 s) would let a slow rerouting finish; this state's
    prediction at the budget guess's ``k`` (injected: free, so the floor) stops it, and
    the solve goes on cold.  With the measured prediction nothing is injected and the
    route told is the solve's own, at the solved ``k``."""
    topo, old = _carrying(1000.0)
    cold = mo.solve_allgather(topo, max_chunks=None)
    told: list[float] = []
    real_expect = warm_route.WarmRoute.expect_cold

    def expect(route, cold_s, on):
        told.append(cold_s)
        real_expect(route, cold_s, on)

    monkeypatch.setattr(warm_route.WarmRoute, "expect_cold", expect)
    monkeypatch.setattr(ag_solve, "warm_guess", lambda run: None)   # straight to the budget
    warm = mo.solve_allgather(topo, warm=old, max_chunks=None)
    n = topo.num_gpus
    assert told and told[0] == pytest.approx(ag_solve.predicted_cold_seconds(warm.stats["k"], n))

    real_reroute = certify.reroute
    monkeypatch.setattr(certify, "predicted_cold_seconds", lambda k, n: 0.0)
    monkeypatch.setattr(certify, "reroute", lambda *args: _burn() and real_reroute(*args))
    warm = mo.solve_allgather(topo, warm=old, max_chunks=None)
    assert warm.stats["warm_route"] == "declined" and warm.report.warm is WarmUse.DECLINED
    assert warm.stats["warm_declined"].startswith(
        f"the warm allowance of {warm_route.WARM_FLOOR_S:.3g} s CPU was spent")
    assert warm.rate_gbps == pytest.approx(cold.rate_gbps, rel=1e-9)
    check_schedule(topo, warm)
