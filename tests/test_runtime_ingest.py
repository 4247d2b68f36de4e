"""The vectorised EWMA ingest gives what the sample-by-sample path gives: the same
accepted and rejected counts, channel values and times, and ``M``."""

from __future__ import annotations

import numpy as np
import pytest

from instances import hpn
from mccl_runtime.telemetry import MeasurementStore

TOPO = hpn(1, 2, 4)
NOW = 950.0


def _batch(seed: int, n: int = 1500) -> list[dict]:
    """Link, gpu and pair samples (link and gpu ones sharing channels), with NaN,
    negative, future, above-nominal, integer and out-of-order times mixed in."""
    rng = np.random.default_rng(seed)
    links = [(l.src, l.dst, l.capacity_gbps) for l in TOPO.links]
    gpus = list(TOPO.gpus)
    pairs = [(u, v) for u in gpus for v in gpus if u != v and u[-1] == v[-1] and u[:4] != v[:4]]
    out = []
    for i in range(n):
        t = float(900 + rng.integers(0, 40))
        kind = i % 3
        if kind == 0:
            a, b, cap = links[int(rng.integers(0, len(links)))]
            d = {"kind": "link", "src": a, "dst": b, "gbps": cap * rng.uniform(0.1, 1.2), "t": t}
        elif kind == 1:
            d = {"kind": "gpu", "gpu": gpus[int(rng.integers(0, len(gpus)))], "dir": ["out", "in"][i % 2],
                 "gbps": 2000 * rng.uniform(0.1, 1.2), "t": t}
        else:
            u, v = pairs[int(rng.integers(0, len(pairs)))]
            d = {"kind": "pair", "src": u, "dst": v, "gbps": 400 * rng.uniform(0.1, 1.2), "t": t}
        r = rng.random()
        if r < 0.03:
            d["gbps"] = float("nan")
        elif r < 0.06:
            d["gbps"] = -1.0
        elif r < 0.09:
            d["t"] = NOW + 10.0
        elif r < 0.12:
            d["gbps"] = 1e9
        elif r < 0.14:
            d["t"] = 950                                 # an integer time
        elif r < 0.16:
            d["t"] = [0.0, -1e300, NOW - 61.0][i % 3]   # older than the oldest accepted
        out.append(d)
    return out


def _state(store: MeasurementStore) -> dict:
    return {"direct": dict(store._direct), "pairs": dict(store._pairs), "accepted": store.accepted,
            "rejected": +store.rejected}


@pytest.mark.parametrize("alpha", [0.012, 0.5, 1.0])
def test_vectorised_and_per_sample_ingest_agree(alpha):
    fast, slow = MeasurementStore(TOPO, alpha=alpha), MeasurementStore(TOPO, alpha=alpha)
    for seed in range(4):                       # later batches meet stored times: stale ones
        batch = _batch(seed)
        got = fast.ingest(batch, NOW)
        # one malformed sample sends the whole batch down the per-sample path
        want = slow.ingest(batch + [{"kind": "link", "src": "x", "gbps": "1"}], NOW)
        assert want.rejected.pop("malformed") == 1 and got.to_dict() == want.to_dict()
    slow.rejected["malformed"] -= 4
    assert fast._channels and not slow._channels      # each took the path it was meant to
    f, s = _state(fast), _state(slow)
    assert f["accepted"] == s["accepted"] and f["rejected"] == s["rejected"]
    for table in ("direct", "pairs"):
        assert f[table].keys() == s[table].keys()
        for key, (v, t) in s[table].items():
            assert f[table][key][0] == pytest.approx(v, rel=1e-12) and f[table][key][1] == t
    assert np.allclose(fast.measured(), slow.measured(), rtol=1e-12, atol=0)


def test_vectorised_ingest_folds_a_channel_in_time_order():
    """Three samples of one link out of order: ``v = (1-a)^3 c + a(1-a)^2 y1 + a(1-a) y2 + a y3``
    in time order; a later batch's sample older than the stored time is stale."""
    store = MeasurementStore(TOPO, alpha=0.5)
    link = TOPO.links[0]
    c = link.capacity_gbps
    ys = {3.0: 0.3 * c, 1.0: 0.1 * c, 2.0: 0.2 * c}
    rep = store.ingest([{"kind": "link", "src": link.src, "dst": link.dst, "gbps": y, "t": t}
                        for t, y in ys.items()], 10.0)
    assert rep.accepted == 3
    want = 0.125 * c + 0.125 * 0.1 * c + 0.25 * 0.2 * c + 0.5 * 0.3 * c
    assert store._direct[0] == (pytest.approx(want, rel=1e-12), 3.0)
    rep = store.ingest([{"kind": "link", "src": link.src, "dst": link.dst, "gbps": c, "t": 2.5}], 10.0)
    assert rep.to_dict() == {"accepted": 0, "rejected": {"stale": 1}}
