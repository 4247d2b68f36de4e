"""Paper Algorithm 1 (mccl_runtime.drift) against hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

from instances import fail1, fail2, hpn
from mccl_runtime.drift import ScheduleProfile, bottleneck_rate, detect, profile_schedule
from tests.test_runtime_manager import bfs_allgather


def _profile(n, cut, base):
    n = np.asarray(n, float)
    return ScheduleProfile(n, np.asarray(cut, np.int64), np.asarray(base, float), n)


def test_healthy_cut_is_saturated():
    # M/n = [50, 50, 100] -> x_min = 50; both cut links at zero slack.
    r = detect(np.array([100.0, 200.0, 300.0]), _profile([2, 4, 3], [0, 1], [0, 0]), gamma=0.1)
    assert r.x_min == 50.0
    np.testing.assert_allclose(r.slack, [0.0, 0.0])
    assert not r.flagged and r.max_delta == 0.0


def test_degraded_cut_link_flags_the_other_cut_link():
    # link 1 drops to 100: M/n = [50, 25, 100] -> x_min = 25;
    # slack_0 = (100 - 2*25)/100 = 0.5, slack_1 = 0.
    r = detect(np.array([100.0, 100.0, 300.0]), _profile([2, 4, 3], [0, 1], [0, 0]), gamma=0.1)
    assert r.x_min == 25.0
    np.testing.assert_allclose(r.slack, [0.5, 0.0])
    assert r.flagged and r.worst == 0 and r.max_delta == pytest.approx(0.5)


def test_uniformly_scaled_cut_does_not_flag():
    r = detect(np.array([50.0, 100.0, 300.0]), _profile([2, 4, 3], [0, 1], [0, 0]), gamma=0.01)
    assert r.x_min == 25.0 and not r.flagged


def test_link_outside_cut_matters_only_when_it_becomes_the_bottleneck():
    prof = _profile([2, 4, 3], [0, 1], [0, 0])
    # 300 -> 160: M/n = 53.3 > 50, x_min unchanged.
    assert not detect(np.array([100.0, 200.0, 160.0]), prof, gamma=0.01).flagged
    # 300 -> 120: x_min = 40; slack_0 = (100-80)/100 = 0.2, slack_1 = (200-160)/200 = 0.2.
    r = detect(np.array([100.0, 200.0, 120.0]), prof, gamma=0.1)
    np.testing.assert_allclose(r.slack, [0.2, 0.2])
    assert r.flagged
    assert not detect(np.array([100.0, 200.0, 120.0]), prof, gamma=0.25).flagged


def test_deviation_is_absolute_against_base_slack():
    # n_0 = 1.8 on 100 Gbps: base slack 0.1 at x_min = 50.
    prof = _profile([1.8, 4, 3], [0, 1], [0.1, 0.0])
    healthy = detect(np.array([100.0, 200.0, 300.0]), prof, gamma=0.05)
    np.testing.assert_allclose(healthy.slack, [0.1, 0.0])
    assert not healthy.flagged
    # link 0 loses its rounding slack (100 -> 90): slack_0 = 0, |0 - 0.1| = 0.1.
    r = detect(np.array([90.0, 200.0, 300.0]), prof, gamma=0.05)
    assert r.x_min == pytest.approx(50.0)
    assert r.max_delta == pytest.approx(0.1) and r.flagged


def test_unused_links_are_ignored_by_phase_one():
    assert bottleneck_rate(np.array([1.0, 100.0]), np.array([0.0, 2.0])) == 50.0
    assert bottleneck_rate(np.array([1.0]), np.array([0.0])) == float("inf")


def test_profile_of_a_real_schedule_on_hpn():
    topo = hpn(1, 2, 4)
    prof = profile_schedule(topo, bfs_allgather(topo))
    assert prof.cut.size > 0
    # every cut link is used; the healthy fabric shows no drift
    assert (prof.n[prof.cut] > 0).all()
    assert not detect(topo.arrays.capacity, prof, 0.05).flagged
    # Fail2 hits a NIC in the cut: flagged; Fail1 (NVSwitch 2880 -> 800) stays outside it
    assert detect(fail2(topo).arrays.capacity, prof, 0.1).flagged
    assert not detect(fail1(topo).arrays.capacity, prof, 0.1).flagged
