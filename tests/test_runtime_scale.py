"""The array-based decision (channels folded a batch at once, Algorithm 1 stacked over every
collective) flags exactly what the per-sample logic flags: a reference that applies each
sample to a per-channel EWMA or :class:`LevelTracker` in time order, builds ``M`` with
Python loops and runs :func:`detect` collective by collective (docs/runtime.md)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from instances import hpn
from mccl_opt.baselines import direct_alltoall, pxn_alltoall, rail_allgather, ring_allgather
from mccl_runtime.drift import detect
from mccl_runtime.level import LevelParams, LevelTracker
from mccl_runtime.manager import Policy, ScheduleManager
from mccl_runtime.samples import LinkMap, RejectedSample, parse_sample
from mccl_runtime.telemetry import MeasurementStore

TOPO = hpn(1, 4, 8)
NOW = 100.0
GAMMA = 0.1
PARAMS = LevelParams(hold_s=0.002)


class Reference:
    """The per-sample store: one channel dict entry per link or pair, samples in time order."""

    def __init__(self, estimator: str, alpha: float) -> None:
        self.estimator, self.alpha = estimator, alpha
        self.map = LinkMap(TOPO)
        self.direct: dict[int, tuple[float, float]] = {}
        self.pairs: dict[tuple[str, str], tuple[float, float]] = {}
        self.pair_links: dict[tuple[str, str], tuple[int, ...]] = {}
        self.trackers: dict[object, LevelTracker] = {}
        self.accepted = 0

    def ingest(self, batch: list[dict], now: float) -> None:
        good = []
        for i, raw in enumerate(batch):
            try:
                s = parse_sample(raw)
                links, nominal = self.map.resolve(s)
            except RejectedSample:
                continue
            if s.t <= now + 0.5 and s.gbps <= 1.5 * nominal:
                good.append((s.t, i, s, links, nominal))
        for _, _, s, links, nominal in sorted(good, key=lambda g: g[:2]):
            table, key = (self.pairs, (s.src, s.dst)) if s.kind == "pair" else (self.direct, links[0])
            value, last = table.get(key, (nominal, -math.inf))
            if s.t < last:
                continue
            self.accepted += 1
            if s.kind == "pair":
                self.pair_links[key] = links
            if self.estimator == "level":
                tracker = self.trackers.setdefault(key, LevelTracker(value, PARAMS))
                tracker.update(s.t, s.gbps)
                table[key] = (tracker.level, s.t)
            else:
                table[key] = ((1 - self.alpha) * value + self.alpha * s.gbps, s.t)

    def measured(self, store: MeasurementStore) -> np.ndarray:
        nominal = TOPO.arrays.capacity
        best = np.full(TOPO.num_links, -np.inf)
        for key, (v, _) in self.pairs.items():
            for link in self.pair_links[key]:
                best[link] = max(best[link], v)
        m = np.where(np.isfinite(best), best, nominal)
        for a, (v, _) in self.direct.items():
            m[a] = v
        m = np.maximum(m, 1e-3 * nominal)
        return store._pair_cables(m) if self.estimator == "level" else m

    def pending(self) -> set[int]:
        out: set[int] = set()
        for key, tracker in self.trackers.items():
            if tracker.pending:
                out.update(self.pair_links[key] if isinstance(key, tuple) else (key,))
        return out


def _batches(seed: int, rounds: int = 60, layout: bool = False) -> list[tuple[float, list[dict]]]:
    """Link, gpu and pair samples at 2 % noise; some links degrade for a while (to 5-60 %),
    with out-of-order, stale, future and above-nominal samples mixed in.  ``layout``: every
    batch names the same channels in the same order (``link`` and ``pair`` samples only),
    as an executor flushing the same links does."""
    rng = np.random.default_rng(seed)
    links = [(l.src, l.dst, l.capacity_gbps) for l in TOPO.links]
    gpus = list(TOPO.gpus)
    pairs = [(u, v) for u in gpus for v in gpus if u != v and u[-1] == v[-1]]
    factor = np.ones(len(links))
    out = []
    for r in range(rounds):
        if rng.random() < 0.3:                          # a failure starts, or one clears
            factor[int(rng.integers(len(links)))] = rng.choice([1.0, 0.05, 0.3, 0.6])
        t0 = 0.001 * r
        batch = []
        keys = np.random.default_rng(seed + 100) if layout else rng
        for _ in range(400):
            t = t0 + 0.001 * rng.random()
            kind = keys.choice([0, 2]) if layout else keys.integers(3)
            if kind == 0:
                a = int(keys.integers(len(links)))
                s, d, cap = links[a]
                y = cap * factor[a]
                sample = {"kind": "link", "src": s, "dst": d}
            elif kind == 1:
                g = gpus[int(rng.integers(len(gpus)))]
                y = 2880.0
                sample = {"kind": "gpu", "gpu": g, "dir": ["out", "in"][int(rng.integers(2))]}
            else:
                u, v = pairs[int(keys.integers(len(pairs)))]
                y = 400.0 * (0.5 if rng.random() < 0.1 else 1.0)
                sample = {"kind": "pair", "src": u, "dst": v}
            sample.update(gbps=float(y * (1 + 0.02 * rng.standard_normal())), t=t)
            roll = rng.random()
            if roll < 0.02:
                sample["t"] = t0 - 0.01                 # stale for channels sampled since
            elif roll < 0.03:
                sample["t"] = NOW + 5.0
            elif roll < 0.04:
                sample["gbps"] = 1e6
            batch.append(sample)
        out.append((t0 + 0.001, batch))
    return out


def _manager(estimator: str, alpha: float) -> tuple[MeasurementStore, ScheduleManager]:
    store = MeasurementStore(TOPO, alpha=alpha, estimator=estimator, level_params=PARAMS)
    mgr = ScheduleManager(store, lambda *a: pytest.fail("check() must not synthesize"),
                          Policy(gamma=GAMMA, min_dwell_s=0.0, settle_max_s=0.0))
    for i, schedule in enumerate((ring_allgather(TOPO), rail_allgather(TOPO), direct_alltoall(TOPO),
                                  pxn_alltoall(TOPO))):
        mgr.register(f"comm{i}", "c", schedule.collective, schedule)
    return store, mgr


@pytest.mark.parametrize("estimator,alpha,seed,layout", [("ewma", 0.3, 0, False), ("ewma", 1.0, 1, True),
                                                         ("level", 0.012, 2, False), ("level", 0.012, 3, True)])
def test_vectorised_decision_flags_what_the_per_sample_logic_flags(estimator, alpha, seed, layout):
    store, mgr = _manager(estimator, alpha)
    ref = Reference(estimator, alpha)
    flag_counts = []
    for now, batch in _batches(seed, layout=layout):
        store.ingest(batch, now)
        ref.ingest(batch, now)
        m_ref = ref.measured(store)
        m = store.measured()
        if estimator == "level":
            assert np.array_equal(m, m_ref)
            assert set(store.pending_links().tolist()) == ref.pending()
        else:
            assert np.allclose(m, m_ref, rtol=1e-12, atol=0)
        got = sorted(c.key for c, _ in mgr.check(now))
        want = sorted(c.key for c in mgr.collectives()
                      if detect(m_ref, c.profile, GAMMA).flagged
                      or bool(np.any(m_ref > (1 + GAMMA) * c.synth_capacity)))
        assert got == want
        flag_counts.append(len(got))
    assert store.accepted == ref.accepted
    assert (store._layout is not None) == layout          # the repeated layout took the cached ids
    assert 0 < sum(flag_counts) < len(flag_counts) * 4      # some batches flag, not all of them
    mgr.close()


def test_stack_follows_a_changed_profile():
    """After a collective's profile changes (a new version), the stacked check uses it."""
    store, mgr = _manager("ewma", 1.0)
    nic = TOPO.link_index("s0h0g0", "s0tor0")
    m = TOPO.arrays.capacity.copy()
    m[nic] = 40.0
    store.ingest_links(np.array([nic]), np.array([1.0]), np.array([40.0]))
    before = {c.key for c, _ in mgr.check(2.0)}
    assert ("comm0", "c") in before
    coll = mgr.get("comm0", "c")
    # the same schedule, its cut re-derived on the degraded fabric (as after a no-gain abort)
    mgr._install(coll, replace(coll.schedule, bottleneck=()), m, coll.version + 1)
    after = {c.key for c, _ in mgr.check(3.0)}
    assert ("comm0", "c") not in after and after == before - {("comm0", "c")}
    mgr.close()
