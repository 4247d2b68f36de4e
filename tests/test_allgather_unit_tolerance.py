"""Equal-rate AllGather schedules robust to tiny capacity errors
(:mod:`mccl_opt.allgather.unit_tolerance`, ``solver_synthesizer(unit_tolerance=...)``).

Irregular fabric 7 with its ``h1g2 - spine`` NIC cable at 50 Gbps (issue 26's "further"
event): the budget's tree bandwidth is 66.67 / 8 Gbps, so a NIC measured at 49.9 gives
one tree unit fewer; without the tolerance (``unit_tolerance=None``) that forest
simulated at 0.912 of the one solved at 50.0 on the true fabric, at the same rate.
"""

from __future__ import annotations

import pytest

import mccl_opt
from instances import irregular
from mccl_opt.allgather.unit_tolerance import tolerant_allgather, unit_snapped
from mccl_opt.errors import InputError
from mccl_opt.schedule import schedule_rate, share_loads
from mccl_opt.sim import simulate
from mccl_runtime.synthesizer import solver_synthesizer

NIC = {("h1g2", "spine"), ("spine", "h1g2")}
MB = 16 * 2**20


def _nic_at(gbps: float) -> mccl_opt.Topology:
    topo = irregular(7)
    return topo.with_capacities([gbps if (l.src, l.dst) in NIC else l.capacity_gbps for l in topo.links])


def _solve(topo: mccl_opt.Topology) -> mccl_opt.Schedule:
    return mccl_opt.solve_allgather(topo, max_chunks=10)


@pytest.fixture(scope="module")
def true_time() -> float:
    true = _nic_at(50.0)
    return simulate(true, solver_synthesizer()("allgather", true, None, None), MB).completion_s


@pytest.mark.parametrize("factor", [0.9995, 0.998, 0.996, 0.9951, 1.004])
def test_perturbed_nic_simulates_like_the_true_one(true_time: float, factor: float) -> None:
    """A NIC measured < 0.5 % off its true 50 Gbps gives a schedule that runs on the true
    fabric within 2 % of the one synthesized on the true capacities."""
    true = _nic_at(50.0)
    sched = solver_synthesizer()("allgather", _nic_at(50.0 * factor), None, None)
    assert simulate(true, sched, MB).completion_s <= 1.02 * true_time


def test_snap_raises_only_the_near_capacities() -> None:
    measured = _nic_at(49.9)
    snap = unit_snapped(measured, 10)
    assert (snap.k, snap.y_gbps) == (8, pytest.approx(66.667 / 8, rel=1e-4))
    for before, after in zip(measured.links, snap.fabric.links):
        if (before.src, before.dst) in NIC:
            assert after.capacity_gbps == pytest.approx(50.0, rel=1e-9)
        else:
            assert after.capacity_gbps == before.capacity_gbps
    assert snap.x_star_gbps == pytest.approx(_solve(measured).lp_rate_gbps, rel=1e-9)
    assert unit_snapped(_nic_at(50.0), 10) is None
    assert unit_snapped(measured, 10, tol=0.001) is None       # 0.2 % below: outside 0.1 %
    assert unit_snapped(measured, None) is None                # the exact optimum: no budget


def test_snapped_schedule_is_the_true_forest_rated_on_the_measured_fabric() -> None:
    """The forest of the true 50, stating its rate on the capacities it was asked for
    (six trees of 8.33 on a NIC at 49.9: 0.2 % below the budget rate), and valid there."""
    measured = _nic_at(49.9)
    plain = _solve(measured)
    picked = tolerant_allgather(measured, _solve, 10)
    assert picked.stats["unit_snapped"] == 2
    assert [c.edges for c in picked.chunks] == [c.edges for c in _solve(_nic_at(50.0)).chunks]
    rate = schedule_rate(measured, share_loads(measured, picked.chunks))
    assert picked.rate_gbps == pytest.approx(rate, rel=1e-12)
    assert plain.rate_gbps * (1 - 0.015) <= picked.rate_gbps <= picked.lp_rate_gbps == plain.lp_rate_gbps
    assert mccl_opt.validate(measured, picked).rate_as_stated       # strict: raises if invalid


def test_nothing_near_a_multiple_solves_the_fabric_as_given() -> None:
    true = _nic_at(50.0)
    seen: list[mccl_opt.Topology] = []
    sched = tolerant_allgather(true, lambda t: seen.append(t) or _solve(t), 10)
    assert seen == [true] and sched.stats.get("unit_snapped") is None


def test_snapped_schedule_still_flags_a_further_drop() -> None:
    """The kept forest's bottleneck cut is not just the raised NIC (which bounds its rate
    on the measured fabric): the NIC falling further moves the cut's slacks, so drift
    detection (Algorithm 1) flags it, as for any other schedule."""
    from mccl_runtime.drift import detect, profile_schedule

    measured = _nic_at(49.9)
    picked = tolerant_allgather(measured, _solve, 10)
    cut = {(b.src, b.dst) for b in picked.bottleneck}
    assert cut & NIC and len(cut) > 1          # a raised NIC direction that bounds it, and more
    profile = profile_schedule(measured, picked)
    assert not detect(measured.arrays.capacity, profile, 0.1).flagged
    assert detect(_nic_at(12.5).arrays.capacity, profile, 0.1).flagged


@pytest.mark.parametrize("tol", [-0.1, 1.0])
def test_bad_tolerance_says_what_to_fix(tol: float) -> None:
    with pytest.raises(InputError, match="tolerance must be in"):
        tolerant_allgather(_nic_at(49.9), _solve, 10, tol=tol)
