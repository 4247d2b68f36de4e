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

A sample older than ``max_age_s`` before now (``too_old``: ``t`` 0 or -1e300 on a live
controller) or not newer than its channel's last sample (``stale``: also an equal-``t``
repeat, a batch sent twice) is never applied.

Rejected samples are counted per reason (:data:`REASONS`) and never raise out of
:meth:`MeasurementStore.ingest`; :meth:`MeasurementStore.ingest_strict` raises
:class:`~mccl_opt.errors.TelemetryError` instead, applying nothing.

Longer than ~400 lines on purpose: every way in (JSON samples, binary columns, a front
end's folded batches and link maxima, links set directly) must screen, order and fold
into the same channel state with the same replay rules; one class keeps that invariant in
one place (parsing lives in :mod:`.samples`, :mod:`.columns`; state files in
:mod:`.telemetry_state`).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from operator import itemgetter
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from mccl_opt.errors import TelemetryError
from mccl_opt.topology import Topology

from .channels import FULL, Channels, paired_cables, reverse_links
from .columns import COLUMNS, KIND_CODES, ColumnBatch, check_fold_counts
from .keyed import KeyedChannels
from .telemetry_state import restore_store, store_to_dict
from .level import LevelParams, LevelTracker, fold_levels
from .rises import RiseTracker
from .samples import (KINDS, REASONS, Early, IngestReport, LinkMap, RejectedSample, Sample, early_column,
                      parse_sample)

__all__ = ["Sample", "RejectedSample", "IngestReport", "LinkMap", "MeasurementStore", "REASONS",
           "parse_sample"]

#: the oldest sample accepted, in seconds before now (the protocol's replay window)
MAX_AGE_S = 60.0
#: the plain number types a vectorised batch accepts
_NUMBERS = {float, int}
_KIND, _SRC, _DST = itemgetter("kind"), itemgetter("src"), itemgetter("dst")
_GBPS, _T = itemgetter("gbps"), itemgetter("t")
ESTIMATORS = ("ewma", "level")
CLI_ESTIMATOR = "level"  # --estimator of `mccl controller serve` and `mccl loop` (docs/runtime.md)


class MeasurementStore:
    """EWMA store of telemetry channels and the measured capacities ``M`` (paper §3.2).

    ``alpha`` is the EWMA smoothing factor (paper Fig. 13 uses 0.012), ``max_ratio`` the
    largest believable sample relative to nominal, ``future_tolerance_s`` the clock skew
    allowed before a timestamp counts as from the future, ``max_age_s`` the oldest sample
    accepted (seconds before now).  ``clock`` gives "now" when
    :meth:`ingest` is not told.  ``estimator="level"`` replaces each channel's EWMA by a
    :class:`~mccl_runtime.level.LevelTracker` with ``level_params``.  The channels live in
    arrays (:class:`~mccl_runtime.channels.Channels`) and a batch is folded at once.
    """

    def __init__(self, topo: Topology, *, alpha: float = 0.012, max_ratio: float = 1.5,
                 future_tolerance_s: float = 0.5, max_age_s: float = MAX_AGE_S, floor_ratio: float = 1e-3,
                 clock: Callable[[], float] = time.time, estimator: str = "ewma",
                 level_params: LevelParams | None = None) -> None:
        if not 0.0 < alpha <= 1.0:
            raise TelemetryError(f"EWMA alpha must be in (0, 1], got {alpha!r}")
        if estimator not in ESTIMATORS:
            raise TelemetryError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
        self.estimator = estimator
        self.level_params = level_params or LevelParams()
        self._trackers: dict[int, LevelTracker] = {}             # busy channel -> tracker (level mode)
        self.rises = RiseTracker()                               # rises not settled yet (EWMA at alpha 1)
        self._rev: np.ndarray | None = None
        if max_ratio <= 1.0:
            raise TelemetryError(f"max_ratio must be > 1 (a sample may exceed nominal slightly), got {max_ratio!r}")
        self.topo = topo
        self.alpha = float(alpha)
        self.max_ratio = float(max_ratio)
        self.future_tolerance_s = float(future_tolerance_s)
        if not max_age_s > 0:
            raise TelemetryError(f"max_age_s must be > 0, got {max_age_s!r}")
        self.max_age_s = float(max_age_s)
        self.floor_ratio = float(floor_ratio)
        self.clock = clock
        self.map = LinkMap(topo)
        self.chan = Channels(topo)
        self.accepted = 0
        self.rejected: Counter[str] = Counter()
        self._now_seen = -math.inf                               # the latest ``now`` of a batch
        self._measured: np.ndarray | None = None
        self._measured_topo: tuple[np.ndarray, Topology] | None = None
        # wire key (kind, a, b) -> channel id, for the wire keys the vectorised parse resolved
        self._channels: dict[tuple[Any, Any, Any], int] = {}
        self._layout: tuple[tuple[list, list, list], np.ndarray] | None = None   # the last batch's columns, ids
        self.keyed = KeyedChannels(self.chan, self.map, topo)    # binary samples' channels
        #: EWMA: keep the ``early`` estimates of ``pair`` samples (drops an executor is still
        #: confirming, :meth:`early`); set by a controller that speculates
        self.watch_early = False
        self._early: dict[int, tuple[float, float]] = {}         # pair channel -> (early Gbps, its t)
        self._early_m: tuple[np.ndarray, np.ndarray] | None = None   # (the M it was built beside, :meth:`early`)

    @property
    def _direct(self) -> dict[int, tuple[float, float]]:
        """Direct channels that have a sample: link -> (value, time)."""
        ch = self.chan
        seen = np.flatnonzero(np.isfinite(ch.t[:ch.num_links])).tolist()
        return {a: (float(ch.value[a]), float(ch.t[a])) for a in seen}

    @property
    def _pairs(self) -> dict[tuple[str, str], tuple[float, float]]:
        """Pair channels that have a sample: (src, dst) -> (value, time)."""
        ch = self.chan
        return {key: (float(ch.value[cid]), float(ch.t[cid])) for key, cid in ch.pair_id.items()
                if len(key) == 2 and math.isfinite(ch.t[cid])}

    # ------------------------------------------------------------------ ingest
    def ingest(self, samples: Iterable[Any], now: float | None = None) -> IngestReport:
        """Validate and apply a batch; bad samples are counted, never raised.  A batch of
        well-formed wire samples is parsed as columns (:meth:`_parse_columns`); anything
        else is checked sample by sample, which words each rejection.  Either way the
        accepted samples are folded into their channels at once (:meth:`_fold`).  A
        sample with a malformed ``early`` is rejected whole, as for any other field
        (:func:`~mccl_runtime.samples.early_problem`); the accepted ones' early values are
        kept with :attr:`watch_early` (EWMA)."""
        now = self._follow_clock(self.clock() if now is None else float(now))
        samples = samples if isinstance(samples, list) else list(samples)
        parsed = self._parse_columns(samples, now)
        if parsed is None:
            parsed = self._parse_each(samples, now)
        c, y, t, rejected, early = parsed
        report = self._apply(c, y, t, rejected)
        if self.watch_early and self.estimator == "ewma":        # also drops the ones newer samples overtook
            has = np.flatnonzero(~np.isnan(early)) if early is not None else np.zeros(0, dtype=np.int64)
            self._keep_early(list(zip(c[has].tolist(), early[has].tolist(), t[has].tolist())) if has.size else [])
        return report

    def _note_early_columns(self, batch: ColumnBatch) -> None:
        """EWMA with :attr:`watch_early`: keep a binary batch's ``early`` rows
        (:mod:`~mccl_runtime.columns`; one naming no row of the batch is skipped here and
        refused off the wire), each until a newer sample of its channel arrives without one."""
        rows: list[tuple[int | None, Any, Any]] = []
        e = batch.early
        if e is not None and len(e):
            keys = set(zip(batch.kind.tolist(), batch.a.tolist(), batch.b.tolist()))
            mine = np.array([k in keys for k in zip(e.kind.tolist(), e.a.tolist(), e.b.tolist())])
            cids = np.full(len(e), -1, dtype=np.int64)
            if mine.any():
                cids[mine] = self.keyed.channels(ColumnBatch(*(getattr(e, n)[mine] for n, _ in COLUMNS),
                                                             links=e.links, gpus=e.gpus))[0]
            rows = [(int(c) if c >= 0 else None, float(g), float(t)) for c, g, t in zip(cids, e.gbps, e.t)]
        self._keep_early(rows)

    def _keep_early(self, rows: list[tuple[int | None, Any, Any]]) -> None:
        """Drop the early estimates a newer sample of their channel overtook, then keep
        each ``(channel, early Gbps, its t)`` below its channel's value whose sample is its
        channel's latest (``t`` equal: a sample refused as ``future``, ``stale``... leaves
        none behind)."""
        t = self.chan.t
        self._early_m = None
        self._early = {cid: e for cid, e in self._early.items() if t[cid] <= e[1]}
        for cid, e, te in rows:
            if cid is None or type(e) not in _NUMBERS or not (0 <= e < self.chan.value[cid]) \
                    or type(te) not in _NUMBERS or t[cid] != te:
                continue
            self._early[cid] = (float(e), float(te))

    def early_estimates(self) -> dict[int, tuple[float, float]]:
        """The kept early estimates: channel -> (early Gbps, its t) (a copy)."""
        return dict(self._early)

    def ingest_columns(self, batch: ColumnBatch, now: float | None = None) -> IngestReport:
        """Apply a binary batch (:class:`~mccl_runtime.columns.ColumnBatch`): the same
        checks and fold as :meth:`ingest`, on arrays; a sample of an unknown kind is
        ``malformed``, an index outside the fabric ``unknown_link``.  A folded batch (a
        front end's, :mod:`mccl_runtime.frontend`) must name this store's ``alpha`` and
        needs the EWMA (:class:`~mccl_opt.errors.TelemetryError` otherwise); its applied
        rows count as the samples they stand for (bounded by
        :func:`~mccl_runtime.columns.check_fold_counts`), a refused row once, whatever its
        ``count`` (a key holder's ``count`` cannot inflate the ``rejected`` counters)."""
        now = self._follow_clock(self.clock() if now is None else float(now))
        if batch.count is not None and (self.estimator != "ewma" or batch.alpha != self.alpha):
            raise TelemetryError(f"a folded batch (alpha {batch.alpha}) needs the EWMA estimator with the same "
                                 f"alpha; this controller runs {self.estimator} with alpha {self.alpha}")
        c, malformed = self.keyed.channels(batch)
        y, t = np.asarray(batch.gbps, dtype=float), np.asarray(batch.t, dtype=float)
        w = None if batch.count is None else np.asarray(batch.count, dtype=np.int64)
        nan = ~malformed & ~(np.isfinite(y) & np.isfinite(t))
        negative = ~malformed & ~nan & (y < 0)
        unknown = ~malformed & ~nan & ~negative & (c == -1)
        full = ~malformed & ~nan & ~negative & (c == FULL)
        good = ~(malformed | nan | negative | unknown | full)
        is_max = np.asarray(batch.kind) == KIND_CODES["max"]
        keep = np.flatnonzero(good & ~is_max)
        c_max, y_max, t_max, rejected_max, _ = self._screen(*(x[good & is_max] for x in (c, y, t)), now)
        c, y, t, rejected, w = self._screen(c[keep], y[keep], t[keep], now, None if w is None else w[keep])
        if w is not None:
            check_fold_counts(c, t, w, self.chan.t[c], now - self.max_age_s)
        rejected.update(malformed=int(malformed.sum()), nan=int(nan.sum()), negative=int(negative.sum()),
                        unknown_link=int(unknown.sum()), too_many_channels=int(full.sum()))
        rejected.update(rejected_max)
        replaced = self._replace(c_max, y_max, t_max)
        report = self._apply(c, y, t, rejected, w)
        self.accepted += replaced
        if self.watch_early and self.estimator == "ewma":
            self._note_early_columns(batch)
        return IngestReport(report.accepted + replaced, report.rejected)

    def _follow_clock(self, now: float) -> float:
        """``now``; when it is earlier than a previous batch's (the wall clock stepped
        back, e.g. an NTP correction), channel times after it are taken as the oldest time
        a sample may have (``now - max_age_s``), so any new sample is newer: kept, they
        made every new sample ``stale`` until the clock caught up (an hour back: an hour
        blind; issue 27, eighth pass)."""
        if now < self._now_seen:
            t = self.chan.t
            t[t > now] = now - self.max_age_s
        self._now_seen = now
        return now

    def _replace(self, c: np.ndarray, y: np.ndarray, t: np.ndarray) -> int:
        """A front end's ``max`` rows: each replaces its channel's value (the front end
        folded the samples; its rows arrive in order, the last one of a channel wins)."""
        if not len(c):
            return 0
        last = np.unique(c[::-1], return_index=True)[1]
        rows = len(c) - 1 - last
        self.chan.value[c[rows]] = y[rows]
        self.chan.t[c[rows]] = np.maximum(self.chan.t[c[rows]], t[rows])
        self._measured = None
        return len(c)

    def _apply(self, c: np.ndarray, y: np.ndarray, t: np.ndarray, rejected: Counter,
               w: np.ndarray | None = None) -> IngestReport:
        """Sort accepted samples by channel, time and arrival, drop repeats, fold
        (``w``: a folded batch's samples per row)."""
        order = np.argsort(c, kind="stable")
        if len(c) > 1 and not (c[order[1:]] > c[order[:-1]]).all():  # a channel sampled twice
            order = np.lexsort((np.arange(len(c)), t, c))            # by channel, time, arrival
        c, y, t = c[order], y[order], t[order]
        repeat = self._repeats(c, t)
        applied, stale = self._fold(c[~repeat], y[~repeat], t[~repeat], None if w is None else w[order][~repeat])
        rejected["stale"] = stale + int(repeat.sum())
        rejected = +rejected                                           # drop the zero counts
        self.accepted += applied
        self.rejected.update(rejected)
        return IngestReport(applied, {r: rejected[r] for r in REASONS if rejected[r]})

    def _parse_each(self, samples: list[Any], now: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, Counter,
                                                                   np.ndarray | None]:
        """Sample-by-sample checks: the accepted samples' channels, values, times and early
        values (NaN where none)."""
        c, y, t, e = [], [], [], []
        rejected: Counter[str] = Counter()
        for raw in samples:
            try:
                s, links, nominal = self._check(raw, now)
            except RejectedSample as exc:
                rejected[exc.reason] += 1
                continue
            cid = self._channel_of(s.kind, s.src, s.dst, links, nominal)
            if cid == FULL:
                rejected["too_many_channels"] += 1
                continue
            c.append(cid)
            y.append(s.gbps)
            t.append(s.t)
            e.append(math.nan if s.early is None else s.early)
        return (np.array(c, dtype=np.int64), np.array(y, dtype=float), np.array(t, dtype=float), rejected,
                np.array(e, dtype=float))

    def _channel_of(self, kind: str, a: str, b: str, links: tuple[int, ...], nominal: float) -> int:
        return self.chan.pair((a, b), links, nominal) if kind == "pair" else links[0]

    def _wire_channel(self, wire: tuple[Any, Any, Any]) -> int | None:
        """The channel of a wire key ``(kind, a, b)``, cached; ``None`` for a key the
        sample-by-sample path must reject."""
        kind, a, b = wire
        if kind not in KINDS or not isinstance(a, str) or not isinstance(b, str) \
                or (kind == "gpu" and b not in ("out", "in")):
            return None
        try:
            links, nominal = self.map.resolve(Sample(kind, a, b, 0.0, 0.0))
        except RejectedSample:
            return None
        cid = self._channel_of(kind, a, b, links, nominal)
        if cid == FULL:                             # refused sample by sample, never cached
            return None
        self._channels[wire] = cid
        return cid

    def _batch_channels(self, batch: list[Any]) -> np.ndarray | None:
        """Each sample's channel id, or ``None`` if one has no known channel.  Executors
        send the same channels in the same order every flush: when the kind, src and dst
        columns equal the previous batch's, its ids are reused without a lookup."""
        try:                                        # no gpu sample: the columns read in C
            cols = (list(map(_KIND, batch)), list(map(_SRC, batch)), list(map(_DST, batch)))
        except KeyError:
            cols = None
        if cols is not None and self._layout is not None and cols == self._layout[0]:
            return self._layout[1]
        if cols is not None and "gpu" not in cols[0]:
            wire = list(zip(*cols))
        else:
            wire = [(k, d["gpu"], d.get("dir", "out")) if (k := d["kind"]) == "gpu"
                    else (k, d["src"], d["dst"]) for d in batch]
        ids = list(map(self._channels.get, wire))
        if None in ids:
            ids = [self._wire_channel(w) for w in wire]
            if None in ids:
                return None
        c = np.array(ids, dtype=np.int64)
        c.setflags(write=False)
        self._layout = (cols, c) if cols is not None else None
        return c

    def _parse_columns(self, batch: list[Any], now: float
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, Counter, np.ndarray | None] | None:
        """Vectorised checks: the batch's columns are pulled out once, each sample's
        channel comes from a cache, and ``nan``, ``negative``, ``future`` and
        ``above_nominal`` are tested on arrays; the accepted samples' early values come
        along (NaN where none; ``None`` when no sample has one,
        :func:`~mccl_runtime.samples.early_column`).  ``None`` if a sample is not a plain
        wire object with numbers and a known channel, or carries a malformed ``early``."""
        try:
            ys, ts = list(map(_GBPS, batch)), list(map(_T, batch))
            c = self._batch_channels(batch)
            column = early_column(batch)
        except (KeyError, TypeError, AttributeError, ValueError):
            return None
        if column.state is Early.MALFORMED:         # rejected whole, sample by sample
            return None
        early = column.values
        if c is None or not set(map(type, ys)) <= _NUMBERS or not set(map(type, ts)) <= _NUMBERS:
            return None
        try:
            y, t = np.array(ys, dtype=float), np.array(ts, dtype=float)
        except OverflowError:
            return None
        nan = ~(np.isfinite(y) & np.isfinite(t))
        negative = ~nan & (y < 0)
        good = np.flatnonzero(~(nan | negative))
        c, y, t, rejected, early = self._screen(c[good], y[good], t[good], now, None if early is None else early[good])
        rejected.update(nan=int(nan.sum()), negative=int(negative.sum()))
        return c, y, t, rejected, early

    def _screen(self, c: np.ndarray, y: np.ndarray, t: np.ndarray, now: float, w: np.ndarray | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, Counter, np.ndarray | None]:
        """The time and size checks of finite, non-negative samples on known channels:
        ``future``, ``too_old``, ``above_nominal`` (``w``: a column kept with the rows, a
        folded batch's samples per row or JSON samples' early values; a refused row counts
        once, whatever its ``count``: issue 27).  A time within
        the clock-skew tolerance after ``now`` is taken as ``now``: kept as sent, it made
        every sample of its channel until then ``stale``, so a sender dated 0.49 s ahead
        (a skewed clock, or a key holder every 0.49 s) hid the others' samples."""
        future = t > now + self.future_tolerance_s
        old = t < now - self.max_age_s
        above = ~future & ~old & (y > self.max_ratio * self.chan.nominal[c])
        rejected = Counter({r: int(m.sum()) for r, m in (("future", future), ("too_old", old), ("above_nominal", above))})
        good = np.flatnonzero(~(future | old | above))
        return c[good], y[good], np.minimum(t[good], now), rejected, None if w is None else w[good]

    def _repeats(self, c: np.ndarray, t: np.ndarray) -> np.ndarray:
        """For samples sorted by channel and time: those whose time equals the channel's
        last sample's (stored, or earlier in the batch), so a batch sent twice is applied
        once."""
        if not len(c):
            return np.zeros(0, dtype=bool)
        same_as_previous = np.r_[False, (c[1:] == c[:-1]) & (t[1:] == t[:-1])]
        return same_as_previous | (t == self.chan.t[c])

    def _fold(self, c: np.ndarray, y: np.ndarray, t: np.ndarray, w: np.ndarray | None = None) -> tuple[int, int]:
        """Apply samples sorted by channel, time and arrival: ``(applied, stale)``.  A
        sample older than its channel's last one is stale.  ``w``: a folded batch's samples
        per row (EWMA only); at ``alpha`` 1 its rows are readings too, so a front end's rows
        feed the rise tracker as the samples sent directly do."""
        if not len(c):
            return 0, 0
        if self.estimator == "ewma":
            readings = self.alpha == 1.0                         # each sample a sender's reading
            chans = c[np.r_[True, c[1:] != c[:-1]]] if readings else c
            before = self.chan.value[chans] if readings else None   # a copy: fancy indexing
            applied, stale = self.chan.fold_ewma(c, y, t, self.alpha, w)
            if applied:
                self._measured = None
                if readings:
                    self.rises.update(chans, before, self.chan.value[chans], self.chan.nominal[chans],
                                      float(t.max()))
            return applied, stale
        chans, group, fresh = self.chan.split(c, t)
        c, y, t = c[fresh], y[fresh], t[fresh]
        if fold_levels(self.chan.value, c, y, t, self._trackers, self.level_params):
            self._measured = None
        last = np.flatnonzero(np.r_[c[1:] != c[:-1], True]) if len(c) else np.zeros(0, dtype=np.int64)
        self.chan.t[c[last]] = t[last]
        return len(c), int(len(fresh) - len(c))

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
        if s.t < now - self.max_age_s:
            raise RejectedSample("too_old", f"sample time {s.t:g} is more than {self.max_age_s:g} s before now "
                                            f"({now:g}); send current samples (seconds on the controller's clock)")
        if s.gbps > self.max_ratio * nominal:
            raise RejectedSample("above_nominal",
                                 f"{s.gbps} Gbps on {s.src}->{s.dst} exceeds {self.max_ratio} x nominal {nominal}")
        return s, links, nominal

    def ingest_links(self, links: np.ndarray, t: np.ndarray, gbps: np.ndarray) -> int:
        """Fast path for trusted in-process telemetry (the closed-loop simulator): ``link``
        samples given as link indices, times and Gbps, applied in time order.  Returns
        the number applied (stale ones are counted as rejected)."""
        c, t, y = (np.asarray(x) for x in (links, t, gbps))
        order = np.lexsort((np.arange(len(t)), t, c))
        applied, stale = self._fold(c[order].astype(np.int64), y[order].astype(float), t[order].astype(float))
        self.rejected["stale"] += stale
        self.accepted += applied
        return applied

    def last_sample_t(self) -> np.ndarray:
        """Time of each link's latest direct sample (``-inf`` where none)."""
        return self.chan.t[:self.topo.num_links].copy()

    def unheard_links(self, since: float, recent_s: float) -> np.ndarray:
        """Links measured by a channel (direct or pair) whose latest sample is from the
        ``recent_s`` before ``since``: channels sampled regularly that have not been heard
        from since then (sorted, unique)."""
        ch = self.chan
        t = ch.t[:ch.count]
        waiting = (t < since) & (t >= since - recent_s)
        pair_ch, pair_link = ch.incidence()
        links = np.concatenate([np.flatnonzero(waiting[:ch.num_links]), pair_link[waiting[pair_ch]]])
        return np.unique(links).astype(np.int64)

    def heard_links(self, since: float) -> np.ndarray:
        """Links measured by a channel (direct or pair) with a sample newer than ``since``
        (sorted, unique)."""
        ch = self.chan
        fresh = ch.t[:ch.count] > since
        pair_ch, pair_link = ch.incidence()
        return np.unique(np.concatenate([np.flatnonzero(fresh[:ch.num_links]), pair_link[fresh[pair_ch]]])
                         ).astype(np.int64)

    def moving_links(self, swings: bool = False) -> np.ndarray:
        """Links of channels whose latest rise is not settled yet (EWMA at ``alpha`` 1,
        where each sample is a sender's reading, :class:`~mccl_runtime.rises.RiseTracker`;
        empty otherwise: a smaller ``alpha`` is its own smoothing, and in level mode
        :meth:`pending_links` says it), sorted; ``swings``: only those moving by a drop
        right after a recovery."""
        out: set[int] = set()
        for cid in self.rises.moving(self._now_seen):
            if not swings or cid in self.rises.swings:
                out.update(self.chan.links_of_pair(cid) if cid >= self.chan.num_links else (cid,))
        return np.array(sorted(out), dtype=np.int64)

    def pending_links(self) -> np.ndarray:
        """Links whose estimate has an unconfirmed change: level mode, a pending tracker's;
        EWMA, the links an executor's ``early`` estimates move (:meth:`early`)."""
        if self._early:
            return np.flatnonzero(self.early() < self.measured()).astype(np.int64)
        out: set[int] = set()
        for cid, tracker in self._trackers.items():
            if tracker.pending:
                out.update(self.chan.links_of_pair(cid) if cid >= self.chan.num_links else (cid,))
        return np.array(sorted(out), dtype=np.int64)

    # ------------------------------------------------------------------ outputs
    def measured(self) -> np.ndarray:
        """``M_a`` per link (link order), Gbps; a fresh read-only array."""
        if self._measured is None:
            self._measured = self._links_of(self.chan.value)
        return self._measured

    def provisional(self) -> np.ndarray:
        """``M`` with every pending change taken at its newest estimate (the mean of its
        post-change run, :attr:`LevelTracker.provisional`): everything known now,
        confirmed or still being confirmed.  Equal to :meth:`measured` when nothing is
        pending (and always with the EWMA)."""
        pending = [(cid, tr.provisional) for cid, tr in self._trackers.items() if tr.pending and tr.run_y]
        return self._links_with(*zip(*pending)) if pending else self.measured()

    def early(self) -> np.ndarray | None:
        """``M`` with every pending change at its early estimate
        (:attr:`LevelTracker.early`: confirmed but for ``hold_s``; EWMA, the executors'
        ``early`` pair estimates); ``None`` when nothing is pending or some pending change
        has no early estimate yet.  EWMA: built once per ``M`` and set of early estimates
        (a controller decision reads it, and :meth:`pending_links` with it)."""
        if self.estimator == "ewma":
            if not self._early:
                return None
            m = self.measured()
            if self._early_m is None or self._early_m[0] is not m:
                n = len(self._early)
                self._early_m = (m, self._links_with(np.fromiter(self._early, np.int64, n),
                                                     np.fromiter((e for e, _ in self._early.values()), float, n)))
            return self._early_m[1]
        early = [(cid, tr.early) for cid, tr in self._trackers.items() if tr.pending]
        if not early or any(e is None for _, e in early):
            return None
        return self._links_with(*zip(*early))

    def _links_with(self, channels: Iterable[int], values: Iterable[float]) -> np.ndarray:
        """``M`` with ``channels`` (distinct) at ``values``."""
        value = self.chan.value.copy()
        value[np.asarray(channels, dtype=np.int64)] = np.asarray(values, dtype=float)
        return self._links_of(value)

    def _links_of(self, value: np.ndarray) -> np.ndarray:
        """``M`` from channel values: per link, floored, cables paired (level mode)."""
        m = np.maximum(self.chan.measured(value), self.floor_ratio * self.topo.arrays.capacity)
        if self.estimator == "level":
            m = self._pair_cables(m)
        m.setflags(write=False)
        return m

    def _pair_cables(self, m: np.ndarray) -> np.ndarray:
        """Level mode: :func:`.channels.paired_cables` with the tracker's tolerance."""
        if self._rev is None:
            self._rev = reverse_links(self.topo)
        return paired_cables(m, self.topo.arrays.capacity, self._rev, self.level_params.k)

    def measured_topology(self, name: str | None = None) -> Topology:
        """The topology with ``M`` as capacities (the optimizer's input, paper §3.1); built
        once per ``M`` (the jobs a decision starts share it)."""
        m = self.measured()
        if name is not None:
            return self.topo.with_capacities(m, name=name)
        if self._measured_topo is None or self._measured_topo[0] is not m:
            self._measured_topo = (m, self.topo.with_capacities(m, name=f"{self.topo.name}-measured"))
        return self._measured_topo[1]

    def counters(self) -> dict[str, Any]:
        return {"accepted": self.accepted, "rejected": {r: self.rejected[r] for r in REASONS}}

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, Any]:
        """The channels and counters for the state file (:mod:`.telemetry_state`)."""
        return store_to_dict(self)

    def restore(self, data: Mapping[str, Any]) -> None:
        """Load channels and counters written by :meth:`to_dict` (same topology)."""
        restore_store(self, data)
        self._measured = None
