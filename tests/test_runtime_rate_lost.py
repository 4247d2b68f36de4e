"""Capacity lost without a deviation (docs/runtime.md, "Capacity lost: one-link cuts";
issue 26): Algorithm 1 compares the cut's slacks, and a cut of one link keeps slack 0
however far that link falls, so a schedule whose bottleneck is one link lost 80 % of
its rate with no flag.  A collective whose rate under ``M`` is more than ``rate_loss``
below its built-for rate is now flagged on that alone; the synthesizer decides whether
another schedule does better (a new version) or not (``no_gain``, recorded once)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import mccl_opt as mo
from mccl_runtime.drift import ProfileStack, detect, profile_schedule
from mccl_runtime.manager import Policy, ScheduleManager
from mccl_runtime.synthesizer import solver_synthesizer
from mccl_runtime.telemetry import MeasurementStore
from tests.state_files import saved_and_loaded
from tests.test_runtime_rate_cleared import _drive
from tests.test_runtime_manager import TOPO, bfs_allgather

NIC = ("s0h0g0", "s0tor0")


def _rate(m: np.ndarray, loads: np.ndarray) -> float:
    used = loads > 1e-12
    return float(np.min(m[used] / loads[used]))


def _one_link_cut(gbps: float) -> tuple[MeasurementStore, ScheduleManager]:
    """The BFS AllGather of HPN 1x2x2 registered on a fabric whose NIC ``s0h0g0 ->
    s0tor0`` reads ``gbps``: its cut is that one link."""
    store = MeasurementStore(TOPO, alpha=1.0)
    store.ingest([{"kind": "link", "src": NIC[0], "dst": NIC[1], "gbps": gbps, "t": 1.0}], now=1.0)
    mgr = ScheduleManager(store, solver_synthesizer(), Policy(gamma=0.1, min_dwell_s=0.0))
    mgr.register("world", "ag", "allgather", replace(bfs_allgather(TOPO), bottleneck=()))
    return store, mgr


def test_a_one_link_cut_that_loses_80_percent_gets_a_new_version_at_the_fabric_optimum():
    store, mgr = _one_link_cut(250.0)
    coll = mgr.get("world", "ag")
    nic = TOPO.link_index(*NIC)
    assert list(coll.profile.cut) == [nic]                             # the cut: one link
    assert _drive(mgr, 1.0, 3) == []                                   # nothing changed since
    store.ingest([{"kind": "link", "src": NIC[0], "dst": NIC[1], "gbps": 50.0, "t": 2.0}], now=2.0)
    m = store.measured()
    assert detect(m, coll.profile, 0.1).max_delta == pytest.approx(0.0)   # Algorithm 1 sees nothing
    old_rate = _rate(m, coll.profile.loads)
    assert old_rate == pytest.approx(0.2 * _rate(coll.synth_capacity, coll.profile.loads))
    events = _drive(mgr, 2.0)
    assert [e.action.value for e in events] == ["resynthesis", "published"]
    assert events[0].detail["capacity"] == "lost"
    assert coll.version == 2
    # the new version is as fast as a cold solve of the degraded fabric, far above the old one
    best = mo.solve_allgather(TOPO.with_capacities(m)).rate_gbps
    new_rate = _rate(m, coll.profile.loads)
    assert new_rate == pytest.approx(best, rel=0.02) and new_rate > 4 * old_rate
    assert _drive(mgr, 3.0) == []                                      # and nothing flags again
    mgr.close()


def test_a_loss_no_schedule_can_avoid_is_decided_once_as_no_gain():
    store = MeasurementStore(TOPO, alpha=1.0)
    mgr = ScheduleManager(store, solver_synthesizer(), Policy(gamma=0.1, min_dwell_s=0.0))
    mgr.register("world", "ag", "allgather", mo.solve_allgather(TOPO))      # optimal on the fabric
    coll = mgr.get("world", "ag")
    m = TOPO.arrays.capacity * 0.5                                     # every link at half: no way round
    store.ingest([{"kind": "link", "src": l.src, "dst": l.dst, "gbps": float(g), "t": 2.0}
                  for l, g in zip(TOPO.links, m)], now=2.0)
    events = _drive(mgr, 2.0)
    assert [e.action.value for e in events] == ["resynthesis", "aborted"]
    assert events[1].detail["reason"] == "no_gain" and coll.version == 1
    assert _drive(mgr, 3.0) == []                                      # re-based: the loss flags once
    mgr.close()


def test_a_schedule_re_based_by_no_gain_is_profiled_the_same_after_a_restart(tmp_path):
    """A rail's group is a star through its ToR: a member's NIC that drops is its one way
    out, so the loss ends ``no_gain`` and the cut is re-derived (that NIC alone); the saved
    state must give the same cut back.  The single-vertex cut bound shows no schedule can
    gain, so no job is started for it (``gain_bound``)."""
    store = MeasurementStore(TOPO, alpha=1.0)
    mgr = ScheduleManager(store, solver_synthesizer(), Policy(gamma=0.1, min_dwell_s=0.0))
    mgr.register("rail0", "ag", "allgather", gpus=["s0h0g0", "s0h1g0"])
    assert _drive(mgr, 1.0, 2)[0].action.value == "published"
    coll = mgr.get("rail0", "ag")
    nic = TOPO.link_index(*NIC)
    before = list(coll.profile.cut)
    store.ingest([{"kind": "link", "src": NIC[0], "dst": NIC[1], "gbps": 100.0, "t": 2.0}], now=2.0)
    jobs = mgr.counters["resyntheses"]
    events = _drive(mgr, 2.0)
    assert [e.detail.get("reason") for e in events] == ["no_gain"]
    assert mgr.counters["resyntheses"] == jobs and events[0].detail["bound"] == pytest.approx(100.0)
    assert list(coll.profile.cut) == [nic] != before                   # re-based on the NIC alone
    data = saved_and_loaded(tmp_path, store, mgr, TOPO)["manager"]
    again = ScheduleManager(MeasurementStore(TOPO, alpha=1.0), solver_synthesizer(), Policy())
    again.restore(data)
    b = again.get("rail0", "ag")
    assert np.array_equal(coll.synth_capacity, b.synth_capacity)
    assert np.array_equal(coll.profile.cut, b.profile.cut) and np.allclose(coll.profile.base_slack, b.profile.base_slack)
    mgr.close()
    again.close()


def test_a_loss_without_a_deviation_flags_beyond_gamma_and_smaller_ones_do_not():
    sched = bfs_allgather(TOPO)
    prof = profile_schedule(TOPO, sched)
    cap = TOPO.arrays.capacity.copy()
    plain = ProfileStack([prof], [cap], 0.1)
    lossy = ProfileStack([prof], [cap], 0.1, rate_loss=0.05, lost_gamma=0.05)
    m = cap * 0.8                                        # every link -20 %: rate lost, no deviation
    assert detect(m, prof, 0.1).max_delta == pytest.approx(0.0)
    assert not plain.flags(m)[0] and lossy.flags(m)[0]
    m = cap * 0.93                                       # -7 %: less than Gamma, and no deviation
    assert not lossy.flags(m)[0]
    m = cap.copy()
    m[prof.cut[0]] *= 0.92                               # one cut link, -8 %: deviation ~0.08
    assert not plain.flags(m)[0] and lossy.flags(m)[0]
    assert not ProfileStack([prof], [cap], 0.1, rate_loss=1.0).flags(cap * 0.1)[0]   # rate_loss 1: off
