"""A telemetry front end's fold: a flush interval of hosts' samples as one folded batch
(docs/scale.md, "Telemetry front ends").

At 10,000 GPUs the controller's cost is per request (~180 µs each, one per host per flush:
5.3 cores), not per sample.  A front end serves one pod or communicator group: it takes its
hosts' requests (JSON or binary columns), checks and folds them with the controller's own
code (a :class:`~mccl_runtime.telemetry.MeasurementStore`: the same ``malformed``, ``nan``,
``negative``, ``unknown_link``, ``future``, ``too_old``, ``stale``, ``above_nominal``
rules and the same channels), and at the end of each interval hands the controller one
batch with one row per channel that received samples.

Paper §3.2's EWMA of ``n`` samples is ``v <- (1-a)^n v + S`` with ``S`` the fold of those
samples from zero, whatever ``v`` was.  The front end's store starts each interval's
channels from ``base`` (their values at its start), so ``S = v - (1-a)^n base``; the row
it forwards carries ``count = n`` and ``gbps = S / (1 - (1-a)^n)``, which the controller
folds as ``n`` samples (:meth:`~mccl_runtime.channels.Channels.fold_ewma`): ``M`` and every
decision are those of the samples sent directly, to rounding (tested).  A channel must get
its samples through one front end (the hosts of a pod do); the change-point estimator
needs every sample and is not folded (the front end refuses to start against it).

**Link maxima** (``reporter`` given): ``M`` of a link without a direct channel is the
largest estimate of the pair (and host-reduction) channels crossing it.  Every pair channel
is folded by exactly one front end, with the controller's EWMA from the same nominal start,
so its estimate here *is* the controller's; the front end then forwards, for each link
crossed by a channel that got samples, one ``max`` row (:mod:`mccl_runtime.columns`): the
largest estimate over its channels crossing that link.  The controller keeps one channel
per (front end, link), replaced by each row, and takes the largest over front ends: the
largest over all pair channels, the same ``M`` exactly, with one row per link instead of
one per pair (63 peers of 64 hosts: ~32,000 pairs, a few thousand links).  Direct channels
are still folded rows.  The id must stay the same across a front end's restarts (its
channels would otherwise stay at the controller with their last values); a restarted front
end starts its pair estimates from nominal again.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mccl_opt.errors import InputError
from mccl_opt.topology import Topology

from .columns import KIND_CODES, MAX_REPORTER, ColumnBatch
from .samples import IngestReport
from .telemetry import MeasurementStore

__all__ = ["FrontEndFold"]


class FrontEndFold:
    """One front end's checks and fold (module docstring); ``alpha``: the controller's;
    ``reporter``: forward pair and host channels as link maxima under this id."""

    def __init__(self, topo: Topology, alpha: float, reporter: int | None = None, **store_options: Any) -> None:
        if reporter is not None and not 0 <= reporter < MAX_REPORTER:
            raise InputError(f"a front end's id is in [0, 2^30), got {reporter}")
        self.reporter = reporter
        self.store = MeasurementStore(topo, alpha=alpha, **store_options)
        self.store.watch_early = True           # hosts' early estimates ride with their rows
        self.keep = 1.0 - self.store.alpha
        self._base = self.store.chan.value.copy()
        self._rank = {g: r for r, g in enumerate(topo.gpus)}
        self._wire = np.zeros((0, 3), dtype=np.int64)       # channel id -> (kind, a, b) on the wire

    def ingest(self, samples: list[Any], now: float | None = None) -> IngestReport:
        """A host's JSON samples (the controller's ``telemetry`` request)."""
        return self._fresh(lambda: self.store.ingest(samples, now))

    def ingest_columns(self, batch: ColumnBatch, now: float | None = None) -> IngestReport:
        """A host's binary batch (``telemetry_columns``); a folded batch or ``max`` rows are
        refused (a front end takes hosts' samples, not another front end's rows)."""
        if batch.count is not None or (np.asarray(batch.kind) == KIND_CODES["max"]).any():
            raise InputError("a front end takes hosts' samples; send folded batches and max rows to the controller")
        return self._fresh(lambda: self.store.ingest_columns(batch, now))

    def _fresh(self, ingest: Any) -> IngestReport:
        """Run an ingest; channels it registered start the interval at their nominal value."""
        before = self.store.chan.count
        report = ingest()
        chan = self.store.chan
        if chan.count > before or len(self._base) < len(chan.value):
            base = np.empty(len(chan.value))
            base[:len(self._base)] = self._base[:len(base)]
            base[before:chan.count] = chan.nominal[before:chan.count]
            self._base = base
        return report

    def interval(self) -> ColumnBatch:
        """The folded batch of every channel that received samples since the last call
        (empty if none), and a new interval started."""
        chan = self.store.chan
        touched = np.flatnonzero(chan.folds[:chan.count] > 0)
        keyed = touched[touched >= chan.num_links] if self.reporter is not None else touched[:0]
        folded = touched[touched < chan.num_links] if self.reporter is not None else touched
        n = chan.folds[folded]
        decay = self.keep ** n
        gbps = (chan.value[folded] - decay * self._base[folded]) / (1.0 - decay)
        wire = self._wire_keys(folded)
        links, best, t = self._maxima(keyed)
        batch = self._rows(np.r_[wire[:, 0], np.full(len(links), KIND_CODES["max"])],
                           np.r_[wire[:, 1], links], np.r_[wire[:, 2], np.full(len(links), self.reporter or 0)],
                           np.r_[gbps, best], np.r_[chan.t[folded], t])
        early = self._early(folded, wire, links, best, t)
        chan.folds[touched] = 0
        self._base[touched] = chan.value[touched]
        return ColumnBatch(batch.kind, batch.a, batch.b, batch.gbps, batch.t, links=batch.links, gpus=batch.gpus,
                           count=np.r_[n, np.ones(len(links), dtype=np.int64)].astype(np.uint32),
                           alpha=self.store.alpha, early=early)

    def _rows(self, kind: Any, a: Any, b: Any, gbps: Any, t: Any) -> ColumnBatch:
        return ColumnBatch.build(self.store.topo, kind, a, b, gbps, t)

    def _early(self, folded: np.ndarray, wire: np.ndarray, links: np.ndarray, best: np.ndarray,
               t: np.ndarray) -> ColumnBatch | None:
        """The interval's early estimates (hosts' drops still being confirmed, kept by the
        store until a newer sample of their pair arrives without one), each beside its
        channel's row: a folded pair row's own, or, with link maxima, the ``max`` row of
        each link whose largest estimate the early values lower (those values in place of
        their channels')."""
        early = self.store.early_estimates()
        if not early:
            return None
        chan = self.store.chan
        own = np.array([cid in early for cid in folded.tolist()], dtype=bool)
        kind, a, b = (list(x) for x in wire[own].T) if own.any() else ([], [], [])
        gbps = [early[cid][0] for cid in folded[own].tolist()]
        times = chan.t[folded[own]].tolist()
        if len(links):
            value = chan.value.copy()
            for cid, (e, _) in early.items():
                value[cid] = e
            all_links, lowered = chan.keyed_max(value)
            lowered = lowered[np.searchsorted(all_links, links)]
            lower = np.flatnonzero(lowered < best)
            kind += [KIND_CODES["max"]] * len(lower)
            a += links[lower].tolist()
            b += [self.reporter or 0] * len(lower)
            gbps += lowered[lower].tolist()
            times += t[lower].tolist()
        return self._rows(kind, a, b, gbps, times) if kind else None

    def _maxima(self, keyed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each link crossed by a channel of ``keyed`` (pair or host channels that got
        samples): the largest estimate over all this front end's keyed channels crossing
        it, and the latest sample time of those in ``keyed``."""
        if not len(keyed):
            return np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0)
        chan = self.store.chan
        ch, link = chan.incidence()
        hit = np.isin(ch, keyed)
        links = np.unique(link[hit])
        t = np.full(len(links), -np.inf)
        np.maximum.at(t, np.searchsorted(links, link[hit]), chan.t[ch[hit]])
        all_links, best = chan.keyed_max()
        return links, best[np.searchsorted(all_links, links)], t

    def _wire_keys(self, cids: np.ndarray) -> np.ndarray:
        """``(kind, a, b)`` naming each channel in a binary batch: a link (a ``gpu``
        sample's channel is its link), a pair by GPU ranks, a host reduction."""
        chan = self.store.chan
        if len(self._wire) < chan.count:
            L, rows = chan.num_links, []
            for cid in range(len(self._wire), chan.count):
                if cid < L:
                    rows.append((KIND_CODES["link"], cid, 0))
                else:
                    key = chan.pair_key[cid - L]
                    rows.append((KIND_CODES["host"], key[2], key[1]) if len(key) == 3
                                else (KIND_CODES["pair"], self._rank[key[0]], self._rank[key[1]]))
            self._wire = np.concatenate([self._wire, np.array(rows, dtype=np.int64).reshape(-1, 3)])
        return self._wire[cids]
