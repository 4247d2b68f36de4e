"""Telemetry ingest: samples -> validated channel EWMAs -> measured capacities ``M_a``.

Paper §3.2-3.3: executors report *inter-node* throughput per ordered GPU pair and
*intra-node* cumulative throughput per GPU; the controller smooths every sample with an
EWMA of factor ``alpha`` into ``M``.  A sample is a mapping (the wire format, also
accepted by :meth:`MeasurementStore.ingest`)::

    {"kind": "pair", "src": GPU, "dst": GPU, "gbps": y, "t": seconds}
    {"kind": "gpu",  "gpu": GPU, "dir": "out" | "in", "gbps": y, "t": seconds}
    {"kind": "link", "src": NODE, "dst": NODE, "gbps": y, "t": seconds}

Mapping onto topology links (see docs/runtime.md):

* ``link`` names one directed link directly.
* ``gpu`` is the GPU's cumulative NVLink injection (``out``, the default) or reception
  (``in``) throughput: the link between the GPU and its intra-node switch, i.e. its
  lowest-latency switch neighbour (ties broken by id).
* ``pair`` measures the GPU pair's *overlay link*: the switch-only path ``src -> dst``
  with the fewest hops (then the lowest latency, then node order).  A pair sample bounds
  every link of that path from below (the link carried that much); a link's measured
  capacity is the largest bound of the pairs crossing it, so the fastest pair through a
  shared link clears it and the degraded link is the one only slow pairs cross.

``link`` and ``gpu`` samples are *direct* channels (one per link); ``pair`` samples are
channels per ordered pair.  Each channel holds an estimate started at the nominal
capacity (the paper's startup probing): an EWMA (``estimator="ewma"``, the paper's) or
the confirmed level of a change-point tracker (``estimator="level"``,
:mod:`mccl_runtime.level`), which a re-synthesis can trust right after a change.  ``M_a`` is the direct channel of ``a`` if there is one,
else the largest pair channel crossing ``a``, else the nominal capacity.  ``M_a`` never
drops below ``floor_ratio`` of nominal, so the measured topology stays valid.

Rejected samples are counted per reason (:data:`REASONS`) and never raise out of
:meth:`MeasurementStore.ingest`; :meth:`MeasurementStore.ingest_strict` raises
:class:`~mccl_opt.errors.TelemetryError` instead, applying nothing.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from mccl_opt.errors import TelemetryError
from mccl_opt.topology import Topology

from .level import LevelParams, LevelTracker
from .samples import (KINDS, REASONS, IngestReport, LinkMap, RejectedSample, Sample,
                      parse_sample)

__all__ = ["Sample", "RejectedSample", "IngestReport", "LinkMap", "MeasurementStore", "REASONS",
           "parse_sample"]

#: the plain number types a vectorised batch accepts
_NUMBERS = {float, int}
ESTIMATORS = ("ewma", "level")


class MeasurementStore:
    """EWMA store of telemetry channels and the measured capacities ``M`` (paper §3.2).

    ``alpha`` is the EWMA smoothing factor (paper Fig. 13 uses 0.012), ``max_ratio`` the
    largest believable sample relative to nominal, ``future_tolerance_s`` the clock skew
    allowed before a timestamp counts as from the future.  ``clock`` gives "now" when
    :meth:`ingest` is not told.  ``estimator="level"`` replaces each channel's EWMA by a
    :class:`~mccl_runtime.level.LevelTracker` with ``level_params``.
    """

    def __init__(self, topo: Topology, *, alpha: float = 0.012, max_ratio: float = 1.5,
                 future_tolerance_s: float = 0.5, floor_ratio: float = 1e-3,
                 clock: Callable[[], float] = time.time, estimator: str = "ewma",
                 level_params: LevelParams | None = None) -> None:
        if not 0.0 < alpha <= 1.0:
            raise TelemetryError(f"EWMA alpha must be in (0, 1], got {alpha!r}")
        if estimator not in ESTIMATORS:
            raise TelemetryError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
        self.estimator = estimator
        self.level_params = level_params or LevelParams()
        self._trackers: dict[Any, LevelTracker] = {}             # channel key -> tracker (level mode)
        self._rev: np.ndarray | None = None
        if max_ratio <= 1.0:
            raise TelemetryError(f"max_ratio must be > 1 (a sample may exceed nominal slightly), got {max_ratio!r}")
        self.topo = topo
        self.alpha = float(alpha)
        self.max_ratio = float(max_ratio)
        self.future_tolerance_s = float(future_tolerance_s)
        self.floor_ratio = float(floor_ratio)
        self.clock = clock
        self.map = LinkMap(topo)
        self._direct: dict[int, tuple[float, float]] = {}          # link -> (value, t)
        self._pairs: dict[tuple[str, str], tuple[float, float]] = {}  # pair -> (value, t)
        self._pair_slot: dict[tuple[str, str], int] = {}             # pair -> row of _entry_*
        self._entry_slot: list[int] = []                             # (slot, link) incidence
        self._entry_link: list[int] = []
        self.accepted = 0
        self.rejected: Counter[str] = Counter()
        self._measured: np.ndarray | None = None
        # the vectorised ingest's channels: wire key (kind, a, b) -> channel id -> (is pair,
        # key in _pairs or _direct, links), nominal capacity per channel
        self._channel_of_wire: dict[tuple[Any, Any, Any], int] = {}
        self._channel_of_key: dict[tuple[bool, Any], int] = {}
        self._channels: list[tuple[bool, Any, tuple[int, ...]]] = []
        self._channel_nominal: list[float] = []

    # ------------------------------------------------------------------ ingest
    def ingest(self, samples: Iterable[Any], now: float | None = None) -> IngestReport:
        """Validate and apply a batch; bad samples are counted, never raised.  An EWMA
        store takes a batch of well-formed wire samples in numpy
        (:meth:`_ingest_columns`); anything else goes sample by sample."""
        now = self.clock() if now is None else float(now)
        if self.estimator == "ewma":
            samples = samples if isinstance(samples, list) else list(samples)
            report = self._ingest_columns(samples, now)
            if report is not None:
                return report
        good: list[tuple[float, int, Sample, tuple[int, ...], float]] = []
        rejected: Counter[str] = Counter()
        for i, raw in enumerate(samples):
            try:
                s, links, nominal = self._check(raw, now)
            except RejectedSample as exc:
                rejected[exc.reason] += 1
                continue
            good.append((s.t, i, s, links, nominal))
        good.sort(key=lambda g: (g[0], g[1]))
        applied = 0
        for _, _, s, links, nominal in good:
            if self._apply(s, links, nominal):
                applied += 1
            else:
                rejected["stale"] += 1
        self.accepted += applied
        self.rejected.update(rejected)
        return IngestReport(applied, {r: rejected[r] for r in REASONS if rejected[r]})

    def _channel_id(self, wire: tuple[Any, Any, Any]) -> int | None:
        """The channel of a wire key ``(kind, a, b)``, registered on first sight; ``None``
        for a key the sample-by-sample path must reject."""
        kind, a, b = wire
        if kind not in KINDS or not isinstance(a, str) or not isinstance(b, str) \
                or (kind == "gpu" and b not in ("out", "in")):
            return None
        try:
            links, nominal = self.map.resolve(Sample(kind, a, b, 0.0, 0.0))
        except RejectedSample:
            return None
        key = (kind == "pair", (a, b) if kind == "pair" else links[0])
        cid = self._channel_of_key.get(key)
        if cid is None:
            cid = self._channel_of_key[key] = len(self._channels)
            self._channels.append((*key, links))
            self._channel_nominal.append(nominal)
        self._channel_of_wire[wire] = cid
        return cid

    def _ingest_columns(self, batch: list[Any], now: float) -> IngestReport | None:
        """Vectorised EWMA ingest (paper §3.2), the same result as sample by sample:
        the batch's columns are pulled out once, the checks run on arrays, and each
        channel's samples, in time order, fold into ``(1-a)^n v + sum a (1-a)^(n-1-k) y_k``.
        ``None`` if a sample is not a plain wire object with numbers and a known channel
        (the sample-by-sample path then words its rejection)."""
        try:
            wire = [(k, d["gpu"], d.get("dir", "out")) if (k := d["kind"]) == "gpu"
                    else (k, d["src"], d["dst"]) for d in batch]
            ys, ts = [d["gbps"] for d in batch], [d["t"] for d in batch]
        except (KeyError, TypeError):
            return None
        if not set(map(type, ys)) <= _NUMBERS or not set(map(type, ts)) <= _NUMBERS:
            return None
        ids = list(map(self._channel_of_wire.get, wire))
        if None in ids:
            ids = [self._channel_id(w) for w in wire]
            if None in ids:
                return None
        try:
            y, t = np.array(ys, dtype=float), np.array(ts, dtype=float)
        except OverflowError:
            return None
        c = np.array(ids, dtype=np.int64)
        nan = ~(np.isfinite(y) & np.isfinite(t))
        negative = ~nan & (y < 0)
        future = ~nan & ~negative & (t > now + self.future_tolerance_s)
        nominal_of = self._channel_nominal
        nominal = np.array([nominal_of[i] for i in ids], dtype=float)
        above = ~nan & ~negative & ~future & (y > self.max_ratio * nominal)
        rejected = Counter({r: int(m.sum()) for r, m in (("nan", nan), ("negative", negative),
                                                         ("future", future), ("above_nominal", above))})
        good = np.flatnonzero(~(nan | negative | future | above))
        order = good[np.lexsort((good, t[good], c[good]))]            # by channel, time, arrival
        c, y, t = c[order], y[order], t[order]
        chans, first = np.unique(c, return_index=True)
        channels, tables = self._channels, (self._direct, self._pairs)
        start = [tables[channels[cid][0]].get(channels[cid][1], (self._channel_nominal[cid], -math.inf))
                 for cid in chans.tolist()]
        v0, t0 = np.array([x[0] for x in start]), np.array([x[1] for x in start])
        group = np.repeat(np.arange(len(chans)), np.diff(np.append(first, len(c))))
        fresh = t >= t0[group]                                         # older than the channel: stale
        rejected["stale"] = int(len(c) - fresh.sum())
        y, t, group = y[fresh], t[fresh], group[fresh]
        n = np.bincount(group, minlength=len(chans))
        end = np.cumsum(n)
        keep = 1.0 - self.alpha
        v = keep ** n * v0 + np.bincount(group, weights=self.alpha * keep ** (end[group] - 1 - np.arange(len(y))) * y,
                                         minlength=len(chans))
        last_t = t[np.maximum(end - 1, 0)] if len(y) else t0
        for cid, nj, vj, tj in zip(chans.tolist(), n.tolist(), v.tolist(), last_t.tolist()):
            if nj:
                is_pair, key, links = channels[cid]
                if is_pair and key not in self._pair_slot:
                    self._register_pair(key, links)
                tables[is_pair][key] = (vj, tj)
        if len(y):
            self._measured = None
        rejected = +rejected                                           # drop the zero counts
        self.accepted += len(y)
        self.rejected.update(rejected)
        return IngestReport(len(y), {r: rejected[r] for r in REASONS if rejected[r]})

    def ingest_strict(self, samples: Iterable[Any], now: float | None = None) -> IngestReport:
        """Like :meth:`ingest`, but any bad sample raises :class:`TelemetryError` and
        nothing of the batch is applied."""
        now = self.clock() if now is None else float(now)
        batch = list(samples)
        for i, raw in enumerate(batch):
            try:
                self._check(raw, now)
            except RejectedSample as exc:
                raise RejectedSample(exc.reason, f"sample #{i}: {exc} (reason: {exc.reason})") from None
        return self.ingest(batch, now)

    def _check(self, raw: Any, now: float) -> tuple[Sample, tuple[int, ...], float]:
        s = parse_sample(raw)
        links, nominal = self.map.resolve(s)
        if s.t > now + self.future_tolerance_s:
            raise RejectedSample("future", f"sample time {s.t} is after now ({now}); check the executor clock")
        if s.gbps > self.max_ratio * nominal:
            raise RejectedSample("above_nominal",
                                 f"{s.gbps} Gbps on {s.src}->{s.dst} exceeds {self.max_ratio} x nominal {nominal}")
        return s, links, nominal

    def _apply(self, s: Sample, links: tuple[int, ...], nominal: float) -> bool:
        if s.kind == "pair":
            table: dict = self._pairs
            key: Any = (s.src, s.dst)
            if key not in self._pair_slot:
                self._register_pair(key, links)
        else:
            table, key = self._direct, links[0]
        value, last_t = table.get(key, (nominal, -math.inf))
        if s.t < last_t:
            return False
        if self.estimator == "level":
            tracker = self._trackers.get(key)
            if tracker is None:
                tracker = self._trackers[key] = LevelTracker(value, self.level_params)
            changed = tracker.update(s.t, s.gbps)
            table[key] = (tracker.level, s.t)
            if changed:
                self._measured = None
            return True
        table[key] = ((1.0 - self.alpha) * value + self.alpha * s.gbps, s.t)
        self._measured = None
        return True

    def ingest_links(self, links: np.ndarray, t: np.ndarray, gbps: np.ndarray) -> int:
        """Fast path for trusted in-process telemetry (the closed-loop simulator): ``link``
        samples given as link indices, times and Gbps, applied in time order.  Returns
        the number applied (stale ones are counted as rejected)."""
        order = np.lexsort((np.arange(len(t)), t))
        nominal = self.topo.arrays.capacity
        applied = 0
        for a, ti, y in zip(np.asarray(links)[order].tolist(), np.asarray(t)[order].tolist(),
                            np.asarray(gbps)[order].tolist()):
            if self._apply(Sample("link", "", "", y, ti), (a,), nominal[a]):
                applied += 1
            else:
                self.rejected["stale"] += 1
        self.accepted += applied
        return applied

    def last_sample_t(self) -> np.ndarray:
        """Time of each link's latest direct sample (``-inf`` where none)."""
        out = np.full(self.topo.num_links, -np.inf)
        for a, (_, t) in self._direct.items():
            out[a] = t
        return out

    def pending_links(self) -> np.ndarray:
        """Links whose estimate has an unconfirmed change (level mode; empty for EWMA)."""
        out = set()
        for key, tracker in self._trackers.items():
            if tracker.pending:
                if isinstance(key, tuple):
                    slot = self._pair_slot[key]
                    out.update(l for s_, l in zip(self._entry_slot, self._entry_link) if s_ == slot)
                else:
                    out.add(key)
        return np.array(sorted(out), dtype=np.int64)

    def _register_pair(self, key: tuple[str, str], links: tuple[int, ...]) -> None:
        slot = len(self._pair_slot)
        self._pair_slot[key] = slot
        self._entry_slot.extend([slot] * len(links))
        self._entry_link.extend(links)

    # ------------------------------------------------------------------ outputs
    def measured(self) -> np.ndarray:
        """``M_a`` per link (link order), Gbps; a fresh read-only array."""
        if self._measured is None:
            nominal = self.topo.arrays.capacity
            pair_max = np.full(self.topo.num_links, -np.inf)
            if self._pair_slot:
                values = np.empty(len(self._pair_slot))
                for key, slot in self._pair_slot.items():
                    values[slot] = self._pairs[key][0]
                np.maximum.at(pair_max, np.asarray(self._entry_link, dtype=np.int64),
                              values[np.asarray(self._entry_slot, dtype=np.int64)])
            m = np.where(np.isfinite(pair_max), pair_max, nominal)
            for a, (value, _) in self._direct.items():
                m[a] = value
            m = np.maximum(m, self.floor_ratio * nominal)
            if self.estimator == "level":
                m = self._pair_cables(m)
            m.setflags(write=False)
            self._measured = m
        return self._measured

    def _pair_cables(self, m: np.ndarray) -> np.ndarray:
        """Level mode: a cable whose two directions moved off nominal to levels within
        ``k`` of each other gets the lower level on both.  The two confirmed levels of one
        failure differ only by noise; left apart they would describe a slightly unbalanced
        cable, which some synthesizer paths treat very differently from a balanced one."""
        rev = self._reverse_links()
        moved = np.abs(m - self.topo.arrays.capacity) > self.level_params.k * self.topo.arrays.capacity
        a = np.flatnonzero(moved & (rev >= 0))
        a = a[moved[rev[a]]]
        close = np.abs(m[a] - m[rev[a]]) <= self.level_params.k * np.maximum(m[a], m[rev[a]])
        a = a[close]
        out = m.copy()
        out[a] = np.minimum(m[a], m[rev[a]])
        return out

    def _reverse_links(self) -> np.ndarray:
        """Index of each link's reverse direction (-1 where there is none), built once."""
        if self._rev is None:
            topo = self.topo
            self._rev = np.array([topo.link_index(l.dst, l.src) if topo.has_link(l.dst, l.src) else -1
                                  for l in topo.links], dtype=np.int64)
        return self._rev

    def measured_topology(self, name: str | None = None) -> Topology:
        """The topology with ``M`` as capacities (the optimizer's input, paper §3.1)."""
        return self.topo.with_capacities(self.measured(), name=name or f"{self.topo.name}-measured")

    def counters(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "rejected": {r: self.rejected[r] for r in REASONS}}

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        links = self.topo.links
        return {
            "alpha": self.alpha,
            "direct": [{"src": links[a].src, "dst": links[a].dst, "value": v, "t": t}
                       for a, (v, t) in sorted(self._direct.items())],
            "pairs": [{"src": k[0], "dst": k[1], "value": v, "t": t}
                      for k, (v, t) in sorted(self._pairs.items())],
            "accepted": self.accepted,
            "rejected": dict(self.rejected),
        }

    def restore(self, data: Mapping[str, Any]) -> None:
        """Load channels and counters written by :meth:`to_dict` (same topology)."""
        try:
            self._direct = {self.topo.link_index(d["src"], d["dst"]): (float(d["value"]), float(d["t"]))
                            for d in data.get("direct", [])}
            self._pairs = {}
            self._pair_slot, self._entry_slot, self._entry_link = {}, [], []
            for d in data.get("pairs", []):
                s = parse_sample({"kind": "pair", "src": d["src"], "dst": d["dst"], "gbps": 0.0, "t": 0.0})
                self._register_pair((s.src, s.dst), self.map.resolve(s)[0])
                self._pairs[(s.src, s.dst)] = (float(d["value"]), float(d["t"]))
            self.accepted = int(data.get("accepted", 0))
            self.rejected = Counter({str(k): int(v) for k, v in dict(data.get("rejected", {})).items()})
        except (KeyError, TypeError, ValueError) as exc:
            raise TelemetryError(f"telemetry state is corrupt ({exc}); delete the state file to start fresh") from None
        self._measured = None
