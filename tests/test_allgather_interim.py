"""Intermediate schedules of a time-limited exact solve (:mod:`mccl_opt.allgather.interim`,
issue 25: a valid schedule first, then better ones).

The limit is made to pass at a chosen phase (that phase calls
:func:`mccl_opt.anytime.run_out`), so nothing is timed: the solve must return the best
schedule offered before it -- valid, status ``time_limit``, a certified bound at or
above the unlimited optimum, and a rate strictly above the first schedule's.
"""

from __future__ import annotations

import pytest

import mccl_opt as mo
from instances import hpn
from mccl_opt import anytime
from mccl_opt.allgather import chain, interim
from mccl_opt.allgather.canonical import canonical
from mccl_opt.allgather.first import first_schedule
from mccl_opt.report import Method, Termination

from .oracle_allgather import check_schedule


def _one_way_nic() -> mo.Topology:
    """HPN 1x4x8 (32 GPUs) with one NIC uplink at a quarter speed one way: unbalanced,
    solved exactly on its balanced restriction, whose optimum the weaker-direction
    fabric does not reach."""
    topo = hpn(1, 4, 8)
    gpu = topo.gpus[0]
    link = next(l for l in topo.links if l.src == gpu and "tor" in l.dst)
    return topo.with_capacity({(link.src, link.dst): link.capacity_gbps / 4})


def _stop_at(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """The limit passes when the chain calls ``chain.<name>``."""
    monkeypatch.setattr(chain, name, lambda *a, **k: anytime.run_out(f"a test: {name}"))


@pytest.fixture(scope="module")
def fabric() -> tuple[mo.Topology, float, float]:
    """The fabric, its unlimited optimum and its first schedule's rate."""
    topo = _one_way_nic()
    full = mo.solve_allgather(topo, max_chunks=None)
    assert full.report.termination is Termination.OPTIMAL
    return topo, full.rate_gbps, first_schedule(canonical(topo), None, None).rate_gbps


@pytest.mark.parametrize("stop, method", [
    ("solve_by_restriction", Method.BALANCED_RESTRICTION),   # after the restriction's LP
    ("restrict_recorded", Method.WEAKER_DIRECTIONS),         # before it
])
def test_a_limit_mid_solve_returns_the_best_intermediate_schedule(monkeypatch, fabric, stop,
                                                                  method):
    topo, optimum, first = fabric
    monkeypatch.setattr(interim, "INTERIM_FROM_GPUS", 0)     # offered at 32 GPUs too
    _stop_at(monkeypatch, stop)
    sched = mo.solve_allgather(topo, max_chunks=None, time_limit=600.0)
    report = sched.report
    assert report.termination is Termination.TIME_LIMIT
    assert sched.stats["status"] == "time_limit"
    assert report.method is method
    assert any(a.outcome.startswith("offered: an intermediate schedule") for a in report.attempts)
    check_schedule(topo, sched)
    assert mo.validate(topo, sched).rate_gbps == pytest.approx(sched.rate_gbps, rel=1e-9)
    assert report.bound_gbps >= optimum * (1 - 1e-9)
    assert report.bound_gbps >= sched.rate_gbps
    assert first < sched.rate_gbps <= optimum * (1 + 1e-9)


def test_the_restriction_s_schedule_beats_the_weaker_directions(monkeypatch, fabric):
    """Offered later, the restriction's schedule is the better one here (the weaker
    directions lose the faulty NIC's other direction too)."""
    topo, _, _ = fabric
    monkeypatch.setattr(interim, "INTERIM_FROM_GPUS", 0)
    _stop_at(monkeypatch, "restrict_recorded")
    weaker = mo.solve_allgather(topo, max_chunks=None, time_limit=600.0)
    monkeypatch.undo()
    monkeypatch.setattr(interim, "INTERIM_FROM_GPUS", 0)
    _stop_at(monkeypatch, "solve_by_restriction")
    restricted = mo.solve_allgather(topo, max_chunks=None, time_limit=600.0)
    assert restricted.rate_gbps > weaker.rate_gbps


def test_nothing_is_offered_without_a_limit_or_below_the_size(monkeypatch, fabric):
    """Without a limit (and, with one, below :data:`.interim.INTERIM_FROM_GPUS` GPUs)
    the chain builds no intermediate schedule: the exact solve costs what it did."""
    topo, optimum, _ = fabric
    built: list[str] = []
    monkeypatch.setattr(interim, "offer_on", lambda *a, **k: built.append("offer"))
    assert mo.solve_allgather(topo, max_chunks=None).rate_gbps == pytest.approx(optimum)
    assert mo.solve_allgather(topo, max_chunks=None, time_limit=600.0).rate_gbps \
        == pytest.approx(optimum)
    monkeypatch.setattr(interim, "INTERIM_FROM_GPUS", 0)
    mo.solve_allgather(topo, max_chunks=10)                   # a budget: the chain's own
    assert built == []
    mo.solve_allgather(topo, max_chunks=None, time_limit=600.0)
    assert built == ["offer", "offer"]
