"""The steps that ran past a deadline without a check (issue 25: a limit that holds;
docs/allgather.md, "The leftovers past the deadline").

Each test moves a hand-held clock past the solve's deadline inside one step (switch
balancing, one Phase 2 switch, the mapping of Phase 3's trees) or to just before it
(an LP solve whose setup alone would outlast the time left), and checks that the step
stops there -- the work after that point is not done -- and that the solve returns a
valid schedule at status ``time_limit`` with a bound at or above the unlimited optimum.
Nothing is timed.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any, Callable

import pytest

import mccl_opt as mo
from instances import hpn
from instances.aggregation import leaf_spine, shared_aggregation
from mccl_opt import anytime
from mccl_opt.allgather import assemble
from mccl_opt.allgather.forestcoll.removal import balancing, spread
from mccl_opt.allgather.restriction import balanced
from mccl_opt.backends.highs import HighsBackend
from mccl_opt.report import Termination

from .oracle_allgather import check_schedule


class _Clock:
    """A ``perf_counter`` that moves only when a test moves it."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    """The limits' clock, by hand (the solve's thread CPU clock stays real)."""
    hand = _Clock()
    monkeypatch.setattr(anytime, "time", SimpleNamespace(perf_counter=hand,
                                                         thread_time=time.thread_time))
    return hand


def _moving(clock: _Clock, real: Callable[..., Any], calls: list[str],
            after: Callable[[], None] | None = None) -> Callable[..., Any]:
    """``real``, after whose first call the clock passes every deadline (``after``: how,
    instead), recorded in ``calls`` as ``"moved"``."""
    def call(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        if "moved" not in calls:
            if after is None:
                clock.now = float("inf")
            else:
                after()
            calls.append("moved")
        return out
    return call


def _recording(real: Callable[..., Any], calls: list[str], name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return real(*args, **kwargs)
    return call


def _stopped_valid(topo: mo.Topology, sched: mo.Schedule, where: str, optimum: float) -> None:
    report = sched.report
    assert report.termination is Termination.TIME_LIMIT
    assert where in report.attempts[-1].outcome
    check_schedule(topo, sched)
    assert mo.validate(topo, sched).rate_gbps == pytest.approx(sched.rate_gbps, rel=1e-9)
    assert report.bound_gbps >= optimum * (1 - 1e-9) >= sched.rate_gbps * (1 - 1e-9)


def test_switch_balancing_stops_at_the_deadline(monkeypatch, clock):
    """Leaf-spine 4x2x8 with one leaf uplink at half speed one way (K=10): the balanced
    restriction's switches are balanced by a planned reduction; the deadline passing in
    its rooted test stops the balancing before any reduction is made."""
    topo = leaf_spine(4, 2, 8)
    up = next(l for l in topo.links if "leaf" in l.src and "spine" in l.dst)
    topo = topo.with_capacity({(up.src, up.dst): up.capacity_gbps / 2})
    full = mo.solve_allgather(topo)
    calls: list[str] = []
    monkeypatch.setattr(balancing, "keeps_cuts", _moving(clock, balancing.keeps_cuts, calls))
    monkeypatch.setattr(balancing._Balancer, "_reduce",
                        _recording(balancing._Balancer._reduce, calls, "reduce"))
    sched = mo.solve_allgather(topo, time_limit=600.0)
    assert "reduce" not in calls[calls.index("moved"):]   # none after the deadline
    _stopped_valid(topo, sched, balancing.BALANCING, full.lp_rate_gbps)


@pytest.mark.parametrize("module, moved, after, where", [
    # one Phase 2 switch: its transport, then its split
    (spread, "_pair_amounts", "_split_switch", "Phase 2: switch removal"),
    # the mapping of Phase 3's classes, then the chunks and loads
    (assemble, "map_classes", "tree_chunks", assemble.MAPPING),
])
def test_a_step_of_forestcoll_stops_at_the_deadline(monkeypatch, clock, module, moved, after,
                                                    where):
    """HPN 1x2x8: the deadline passing in ``moved`` stops the step before ``after``."""
    topo = hpn(1, 2, 8)
    full = mo.solve_allgather(topo)
    calls: list[str] = []
    monkeypatch.setattr(module, moved, _moving(clock, getattr(module, moved), calls))
    monkeypatch.setattr(module, after, _recording(getattr(module, after), calls, after))
    sched = mo.solve_allgather(topo, time_limit=600.0)
    assert after not in calls[calls.index("moved"):]
    _stopped_valid(topo, sched, where, full.lp_rate_gbps)


def test_an_lp_whose_setup_outlasts_the_time_left_is_not_started(monkeypatch, clock):
    """HPN 1x4x8 with one NIC at a quarter speed one way, ``max_chunks=None``: the
    balanced restriction's cutting-plane LP.  With 1 ms left (less than
    :data:`mccl_opt.anytime.LP_SETUP_S` at any CPU share) the solver is not called: HiGHS
    at a 1 ms limit returned after 3-8 ms CPU at 1024 GPUs."""
    topo = hpn(1, 4, 8)
    nic = next(l for l in topo.links if l.src == topo.gpus[0] and "tor" in l.dst)
    topo = topo.with_capacity({(nic.src, nic.dst): nic.capacity_gbps / 4})
    full = mo.solve_allgather(topo, max_chunks=None)

    def one_ms_left() -> None:
        limit = anytime.current()
        while limit.parent is not None:
            limit = limit.parent
        clock.now = limit.deadline - 1e-3

    calls: list[str] = []
    monkeypatch.setattr(balanced._CutLP, "add_cuts",
                        _moving(clock, balanced._CutLP.add_cuts, calls, one_ms_left))
    monkeypatch.setattr(HighsBackend, "solve", _recording(HighsBackend.solve, calls, "lp"))
    sched = mo.solve_allgather(topo, max_chunks=None, time_limit=600.0)
    assert "lp" not in calls[calls.index("moved"):]
    _stopped_valid(topo, sched, "the LP at the time limit", full.lp_rate_gbps)
    # with time left the LP runs as without a limit
    assert anytime.limited(600.0, anytime.lp_room)[0] is True
    assert anytime.lp_room() is True


def test_the_quotient_s_first_round_stops_at_the_deadline(monkeypatch, clock):
    """Shared aggregation 2x2x8 with one NIC at 200 Gbps one way, ``max_chunks=None``,
    taken by the symmetric quotient: the deadline passing in its seed's pricing stops
    the column generation before its first master LP (one round was 0.34-0.54 s CPU
    without a check at 512 GPUs)."""
    from mccl_opt.allgather import quotient_stages
    from mccl_opt.allgather.general import quotient

    topo = shared_aggregation(2, 2, 8).with_capacity({("s0h0g0", "s0tor0"): 200.0})
    full = mo.solve_allgather(topo, max_chunks=None)
    monkeypatch.setattr(quotient_stages, "QUOTIENT_MIN_GPUS", 2)
    monkeypatch.setattr(quotient_stages, "QUOTIENT_MIN_SHRINK", 1)
    calls: list[str] = []
    monkeypatch.setattr(quotient, "_price", _moving(clock, quotient._price, calls))
    monkeypatch.setattr(quotient._Quotient, "solve",
                        _recording(quotient._Quotient.solve, calls, "master"))
    sched = mo.solve_allgather(topo, max_chunks=None, time_limit=600.0)
    assert "master" not in calls[calls.index("moved"):]
    _stopped_valid(topo, sched, quotient.QUOTIENT_CG, full.lp_rate_gbps)
