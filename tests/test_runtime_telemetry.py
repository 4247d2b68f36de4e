"""Telemetry ingest: validation counters, link mapping, EWMA behaviour, persistence."""

from __future__ import annotations

import math

import numpy as np
import pytest

from instances import hpn
from mccl_opt.errors import TelemetryError
from mccl_runtime.drift import detect, profile_schedule
from tests.test_runtime_manager import bfs_allgather
from mccl_runtime.telemetry import MeasurementStore


def _link(src, dst, gbps, t=0.0):
    return {"kind": "link", "src": src, "dst": dst, "gbps": gbps, "t": t}


def _pair(src, dst, gbps, t=0.0):
    return {"kind": "pair", "src": src, "dst": dst, "gbps": gbps, "t": t}


BAD = [
    ("nan", _link("s0h0g0", "s0tor0", math.nan)),
    ("nan", _link("s0h0g0", "s0tor0", math.inf)),
    ("negative", _link("s0h0g0", "s0tor0", -1.0)),
    ("unknown_link", _link("s0h0g0", "nowhere", 10.0)),
    ("unknown_link", _pair("s0h0g0", "s0h1g1", 10.0)),   # cross-rail: no switch-only path
    ("unknown_link", {"kind": "gpu", "gpu": "s0tor0", "gbps": 1.0, "t": 0.0}),
    ("future", _link("s0h0g0", "s0tor0", 10.0, t=100.0)),
    ("above_nominal", _link("s0h0g0", "s0tor0", 601.0)),
    ("malformed", {"kind": "teleport", "gbps": 1, "t": 0}),
    ("malformed", _link("s0h0g0", "s0tor0", "fast")),
    ("malformed", [1, 2, 3]),
]


def test_bad_samples_are_rejected_and_counted_without_raising():
    topo = hpn(1, 2, 4)
    store = MeasurementStore(topo, alpha=0.5)
    report = store.ingest([b for _, b in BAD] + [_link("s0h0g0", "s0tor0", 200.0)], now=1.0)
    expected: dict[str, int] = {}
    for reason, _ in BAD:
        expected[reason] = expected.get(reason, 0) + 1
    assert report.accepted == 1
    assert report.rejected == expected
    assert store.counters()["rejected"]["nan"] == 2
    a = topo.link_index("s0h0g0", "s0tor0")
    assert store.measured()[a] == pytest.approx(300.0)           # 0.5*400 + 0.5*200
    changed = np.flatnonzero(store.measured() != topo.arrays.capacity)
    assert changed.tolist() == [a]


def test_out_of_order_samples_are_stale():
    store = MeasurementStore(hpn(1, 2, 2), alpha=1.0)
    store.ingest([_link("s0h0g0", "s0tor0", 100.0, t=5.0)], now=10.0)
    rep = store.ingest([_link("s0h0g0", "s0tor0", 300.0, t=4.0)], now=10.0)
    assert rep.rejected == {"stale": 1}


def test_strict_api_raises_and_applies_nothing():
    topo = hpn(1, 2, 2)
    store = MeasurementStore(topo, alpha=1.0)
    with pytest.raises(TelemetryError, match="sample #1.*negative"):
        store.ingest_strict([_link("s0h0g0", "s0tor0", 100.0), _link("s0h0g0", "s0tor0", -3.0)], now=1.0)
    np.testing.assert_array_equal(store.measured(), topo.arrays.capacity)


def test_pair_samples_localise_the_degraded_nic():
    # three hosts per rail: pairs from the slow GPU are slow, every other pair is fast
    topo = hpn(1, 3, 2)
    store = MeasurementStore(topo, alpha=1.0)
    gpus = [g for g in topo.gpus if g.endswith("g0")]
    samples = [_pair(u, v, 50.0 if "s0h0g0" in (u, v) else 400.0) for u in gpus for v in gpus if u != v]
    assert store.ingest(samples, now=0.0).accepted == len(samples)
    m = dict(zip(((l.src, l.dst) for l in topo.links), store.measured()))
    assert m[("s0h0g0", "s0tor0")] == 50.0 and m[("s0tor0", "s0h0g0")] == 50.0
    assert m[("s0tor0", "s0h1g0")] == 400.0 and m[("s0h2g0", "s0tor0")] == 400.0


def test_gpu_samples_are_the_nvswitch_link():
    topo = hpn(1, 2, 2)
    store = MeasurementStore(topo, alpha=1.0)
    store.ingest([{"kind": "gpu", "gpu": "s0h0g1", "gbps": 800.0, "t": 0.0},
                  {"kind": "gpu", "gpu": "s0h0g1", "dir": "in", "gbps": 700.0, "t": 0.0}], now=0.0)
    m = store.measured()
    assert m[topo.link_index("s0h0g1", "s0h0nvs")] == 800.0
    assert m[topo.link_index("s0h0nvs", "s0h0g1")] == 700.0


def test_ewma_filters_a_short_burst_and_follows_a_persistent_drop():
    topo = hpn(1, 2, 4)
    prof = profile_schedule(topo, bfs_allgather(topo))
    a = topo.link_index("s0h0g0", "s0tor0")
    store = MeasurementStore(topo, alpha=0.012)
    t = 0.0
    for _ in range(5):                                   # a 5-sample microburst at 50 Gbps
        t += 0.001
        store.ingest([_link("s0h0g0", "s0tor0", 50.0, t)], now=t)
    assert store.measured()[a] > 0.94 * 400
    assert not detect(store.measured(), prof, gamma=0.1).flagged
    for _ in range(100):                                 # recovers
        t += 0.001
        store.ingest([_link("s0h0g0", "s0tor0", 400.0, t)], now=t)
    assert store.measured()[a] > 390
    for _ in range(500):                                 # persistent drop
        t += 0.001
        store.ingest([_link("s0h0g0", "s0tor0", 50.0, t)], now=t)
    assert store.measured()[a] == pytest.approx(50.0, abs=2.0)
    assert detect(store.measured(), prof, gamma=0.1).flagged


def test_state_round_trip():
    topo = hpn(1, 3, 2)
    store = MeasurementStore(topo, alpha=0.3)
    store.ingest([_pair("s0h0g0", "s0h1g0", 100.0), _link("s0h0g1", "s0h0nvs", 1000.0),
                  _link("s0h0g1", "s0h0nvs", -1.0)], now=0.0)
    again = MeasurementStore(topo, alpha=0.3)
    again.restore(store.to_dict())
    np.testing.assert_array_equal(again.measured(), store.measured())
    assert again.counters() == store.counters()


def test_measured_capacity_never_reaches_zero():
    topo = hpn(1, 2, 2)
    store = MeasurementStore(topo, alpha=1.0)
    store.ingest([_link("s0h0g0", "s0tor0", 0.0)], now=0.0)
    assert store.measured().min() > 0
    store.measured_topology()                      # a valid Topology


def test_level_mode_gives_both_directions_of_a_failed_cable_one_level():
    from mccl_runtime.level import LevelParams

    topo = hpn(1, 2, 2)
    store = MeasurementStore(topo, estimator="level", level_params=LevelParams(n_min=4, hold_s=0.0))
    for i in range(6):
        t = 1.0 + 0.01 * i
        store.ingest([{"kind": "link", "src": "s0h0g0", "dst": "s0tor0", "gbps": 49.5, "t": t},
                      {"kind": "link", "src": "s0tor0", "dst": "s0h0g0", "gbps": 50.5, "t": t},
                      {"kind": "link", "src": "s0h0g1", "dst": "s0tor1", "gbps": 100.0, "t": t}], now=t)
    m = store.measured()
    up, down = topo.link_index("s0h0g0", "s0tor0"), topo.link_index("s0tor0", "s0h0g0")
    assert m[up] == m[down] == pytest.approx(49.5)             # noise apart: one cable level, the lower
    # a one-direction degradation stays one-directional
    assert m[topo.link_index("s0h0g1", "s0tor1")] == pytest.approx(100.0)
    assert m[topo.link_index("s0tor1", "s0h0g1")] == 400.0
