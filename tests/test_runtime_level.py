"""Change-point level estimator (mccl_runtime.level): confirmed steps, rejected dips,
no alarm on noise, the newest level after a second change."""

from __future__ import annotations

import numpy as np
import pytest

from mccl_opt.errors import TelemetryError
from mccl_runtime.level import LevelParams, LevelTracker


def feed(tr: LevelTracker, ys, t0: float = 0.0, dt: float = 0.001) -> list[float]:
    """Feed samples ``dt`` apart; returns the times at which a level was confirmed."""
    out = []
    for i, y in enumerate(ys):
        t = t0 + i * dt
        if tr.update(t, float(y)):
            out.append(t)
    return out


def test_step_is_confirmed_at_the_new_level_after_the_hold_time():
    rng = np.random.default_rng(1)
    tr = LevelTracker(400.0)
    ys = np.r_[np.full(50, 400.0), np.full(50, 50.0)] * (1 + 0.01 * rng.standard_normal(100))
    confirmed = feed(tr, ys)
    assert len(confirmed) == 1
    # needs n_min samples spanning hold_s after the change at t = 0.050
    assert 0.050 + tr.params.hold_s - 1e-9 <= confirmed[0] <= 0.050 + 0.015
    assert tr.level == pytest.approx(50.0, rel=0.02)       # the new level, not an average with 400
    assert tr.changed_at == pytest.approx(0.050, abs=0.002)


def test_dip_shorter_than_the_hold_time_is_rejected():
    tr = LevelTracker(400.0)
    ys = np.r_[np.full(20, 400.0), np.full(5, 40.0), np.full(60, 400.0)]   # 5 ms at 10 %
    assert feed(tr, ys) == []
    assert tr.level == 400.0 and tr.rejected == 1 and not tr.pending


@pytest.mark.parametrize("noise", [0.01, 0.05])
def test_noise_raises_no_confirmed_change(noise):
    rng = np.random.default_rng(7)
    tr = LevelTracker(400.0)
    ys = 400.0 * (1 + noise * rng.standard_normal(20_000))
    assert feed(tr, ys, dt=1e-4) == [] and tr.level == 400.0


def test_further_drop_while_pending_confirms_the_newest_level():
    tr = LevelTracker(400.0, LevelParams(hold_s=0.02))
    ys = np.r_[np.full(10, 400.0), np.full(12, 200.0), np.full(40, 50.0)]
    confirmed = feed(tr, ys)
    assert len(confirmed) == 1 and tr.level == pytest.approx(50.0)


def test_recovery_is_an_upward_change():
    tr = LevelTracker(50.0)
    assert len(feed(tr, np.full(20, 400.0))) == 1 and tr.level == pytest.approx(400.0)


def test_bad_parameters_are_a_telemetry_error():
    with pytest.raises(TelemetryError, match="n_min"):
        LevelParams(n_min=1)


def test_a_long_hold_is_reached_even_when_the_run_is_trimmed():
    tr = LevelTracker(400.0, LevelParams(hold_s=0.05, max_run=32))
    confirmed = feed(tr, np.r_[np.full(10, 400.0), np.full(200, 300.0)], dt=0.001)   # 25 % drop
    assert len(confirmed) == 1 and confirmed[0] >= 0.010 + 0.05 - 1e-9
    assert tr.level == pytest.approx(300.0)
