"""Equal-rate AllGather schedules robust to tiny capacity errors
(:mod:`mccl_opt.allgather.unit_tolerance`, ``solver_synthesizer(unit_tolerance=...)``).

Irregular fabric 7 with its ``h1g2 - spine`` NIC cable at 50 Gbps (issue 26's "further"
event): the budget's tree bandwidth is 66.67 / 8 Gbps, so a NIC measured at 49.9 gives
one tree unit fewer; without the tolerance that forest simulated at 0.912 of the one
solved at 50.0 on the true fabric, at the same rate (``unit_tolerance=None``).
"""

from __future__ import annotations

import dataclasses

import pytest

import mccl_opt
from instances import irregular
from mccl_opt.allgather.unit_tolerance import tolerant_allgather, unit_snapped
from mccl_opt.errors import InputError
from mccl_opt.schedule import schedule_rate, share_loads
from mccl_opt.sim import simulate
from mccl_runtime.manager import solver_synthesizer

NIC = {("h1g2", "spine"), ("spine", "h1g2")}
MB = 16 * 2**20


def _nic_at(gbps: float) -> mccl_opt.Topology:
    topo = irregular(7)
    return topo.with_capacities([gbps if (l.src, l.dst) in NIC else l.capacity_gbps for l in topo.links])


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
    sched = mccl_opt.solve_allgather(measured, max_chunks=10)
    snapped = unit_snapped(measured, sched)
    assert snapped is not None
    for before, after in zip(measured.links, snapped.links):
        if (before.src, before.dst) in NIC:
            assert after.capacity_gbps == pytest.approx(50.0, rel=1e-9)
        else:
            assert after.capacity_gbps == before.capacity_gbps
    true = _nic_at(50.0)
    assert unit_snapped(true, mccl_opt.solve_allgather(true, max_chunks=10)) is None
    assert unit_snapped(measured, sched, tol=0.001) is None       # 0.2 % below: outside 0.1 %


def test_picked_schedule_is_rated_on_the_measured_fabric() -> None:
    """The snapped fabric's forest, when kept, states its rate on the capacities it was
    asked for (a NIC at 49.9 carries six trees of 8.33 at 0.2 % below the budget rate)."""
    measured = _nic_at(49.9)
    sched = mccl_opt.solve_allgather(measured, max_chunks=10)
    solve = (lambda t: mccl_opt.solve_allgather(t, max_chunks=10))
    picked = tolerant_allgather(measured, sched, solve)
    assert picked is not sched and picked.stats["unit_snapped"] == 2
    assert [c.edges for c in picked.chunks] == [c.edges for c in solve(_nic_at(50.0)).chunks]
    rate = schedule_rate(measured, share_loads(measured, picked.chunks))
    assert picked.rate_gbps == pytest.approx(rate, rel=1e-12)
    assert sched.rate_gbps * (1 - 0.02) <= picked.rate_gbps <= picked.lp_rate_gbps == sched.lp_rate_gbps
    assert mccl_opt.validate(measured, picked).rate_as_stated       # strict: raises if invalid
    # the simulated tie-break keeps it: it also runs faster on the measured 49.9
    assert simulate(measured, picked, MB).completion_s < simulate(measured, sched, MB).completion_s
    assert tolerant_allgather(measured, sched, solve, message_bytes=MB).chunks == picked.chunks


def test_simulated_tie_break_keeps_the_faster() -> None:
    """With ``message_bytes``, a snapped forest that simulates slower is not taken."""
    measured = _nic_at(49.9)
    slow = mccl_opt.solve_allgather(measured, max_chunks=10)
    fast = mccl_opt.solve_allgather(_nic_at(50.0), max_chunks=10)
    # pretend ``fast`` was solved on the measured fabric and the snap gives ``slow``
    kept = tolerant_allgather(measured, dataclasses.replace(fast, rate_gbps=slow.rate_gbps),
                              lambda t: slow, message_bytes=MB)
    assert kept.chunks == fast.chunks


def test_nothing_near_a_multiple_keeps_the_schedule() -> None:
    true = _nic_at(50.0)
    sched = mccl_opt.solve_allgather(true, max_chunks=10)
    calls = []
    assert tolerant_allgather(true, sched, lambda t: calls.append(t) or sched) is sched
    assert not calls


@pytest.mark.parametrize("tol, size", [(-0.1, MB), (1.0, MB), (0.02, 0.0), (0.02, float("nan"))])
def test_bad_arguments_say_what_to_fix(tol: float, size: float) -> None:
    measured = _nic_at(49.9)
    sched = mccl_opt.solve_allgather(measured, max_chunks=10)
    with pytest.raises(InputError, match="tolerance|message_bytes"):
        tolerant_allgather(measured, sched, lambda t: sched, tol=tol, message_bytes=size)


def test_snapped_schedule_still_flags_a_further_drop() -> None:
    """The kept forest's bottleneck cut is not just the raised NIC (which bounds its rate
    on the measured fabric): the NIC falling further moves the cut's slacks, so drift
    detection (Algorithm 1) flags it, as for any other schedule."""
    from mccl_runtime.drift import detect, profile_schedule

    measured = _nic_at(49.9)
    picked = tolerant_allgather(measured, mccl_opt.solve_allgather(measured, max_chunks=10),
                                lambda t: mccl_opt.solve_allgather(t, max_chunks=10))
    cut = {(b.src, b.dst) for b in picked.bottleneck}
    assert ("spine", "h1g2") in cut and len(cut) > 1          # the raised link that bounds it, and more
    profile = profile_schedule(measured, picked)
    assert not detect(measured.arrays.capacity, profile, 0.1).flagged
    assert detect(_nic_at(12.5).arrays.capacity, profile, 0.1).flagged
