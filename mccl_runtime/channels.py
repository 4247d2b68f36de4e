"""Telemetry channels as arrays: one estimate and one time per channel, folded a batch at once.

A *channel* is what one telemetry stream estimates (paper §3.2-3.3; the mapping of samples
onto channels is :mod:`mccl_runtime.samples`): one *direct* channel per link (``link`` and
``gpu`` samples; channel id = link index) and one channel per ordered GPU pair (``pair``
samples; ids after the links, registered on first sight).  Each holds a value (started at
the nominal capacity, the paper's startup probing) and the time of its last sample.

:meth:`Channels.fold_ewma` applies a batch of samples, already sorted by channel, time and
arrival, with the EWMA ``v <- (1-a) v + a y`` of each channel's samples in time order
(``(1-a)^n v + sum_k a (1-a)^(n-1-k) y_k``); a row of a front end's folded batch
(:mod:`mccl_runtime.columns`) that stands for ``w`` samples weighs ``1 - (1-a)^w`` and
decays the channel by ``(1-a)^w``, so folding ``n`` samples at a front end and their one
row here gives the same value (``folds`` counts the samples folded into each channel,
what a front end forwards as the row's weight).  The change-point estimator's batch fold is
:func:`mccl_runtime.level.fold_levels`.  :meth:`Channels.measured` builds ``M`` with the
rule of docs/runtime.md ("Telemetry"): the direct channel, else the largest pair channel
crossing the link, else nominal.  Everything is numpy over channels; Python runs per
channel only where a change-point tracker is busy.
"""

from __future__ import annotations

import math

import numpy as np

from mccl_opt.topology import Topology

__all__ = ["Channels", "reverse_links", "paired_cables", "MAX_KEYED_CHANNELS", "FULL"]

#: pair, host and front-end channels at most (beyond the links' own): a key holder choosing
#: GPU pairs and reporter ids (2^30 of them per link) opened one channel per new key, so
#: memory and the state file grew without bound (issue 27, eighth pass)
MAX_KEYED_CHANNELS = 1 << 20
#: the channel id :meth:`Channels.pair` gives a new key once that many are registered
FULL = -2


class Channels:
    """Per-channel values and times (direct channels first), and the pair -> link incidence."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.num_links = topo.num_links
        self.capacity = np.asarray(topo.arrays.capacity, dtype=float)
        size = max(16, 2 * self.num_links)
        self.value = np.empty(size)
        self.value[:self.num_links] = self.capacity
        self.t = np.full(size, -math.inf)
        self.nominal = np.empty(size)
        self.nominal[:self.num_links] = self.capacity
        self.folds = np.zeros(size, dtype=np.int64)
        self.count = self.num_links
        self.max_keyed = MAX_KEYED_CHANNELS
        self.pair_id: dict[tuple[str, str], int] = {}          # pair -> channel id
        self.pair_key: list[tuple[str, str]] = []              # channel id - num_links -> pair
        self.pair_links: list[tuple[int, ...]] = []             # channel id - num_links -> its links
        self._entry_channel: list[int] = []                     # (pair channel, link) incidence
        self._entry_link: list[int] = []
        self._incidence: tuple[np.ndarray, np.ndarray] | None = None

    # ------------------------------------------------------------------ registry
    def pair(self, key: tuple[str, str], links: tuple[int, ...], nominal: float) -> int:
        """The channel id of an ordered GPU pair (or a host's or front end's key) measuring
        ``links``, registered on first sight; :data:`FULL` for a new key once ``max_keyed``
        are registered (its samples are refused as ``too_many_channels``)."""
        cid = self.pair_id.get(key)
        if cid is not None:
            return cid
        if self.count - self.num_links >= self.max_keyed:
            return FULL
        cid = self.count
        if cid == len(self.value):
            grow = len(self.value)
            self.value = np.concatenate([self.value, np.empty(grow)])
            self.t = np.concatenate([self.t, np.full(grow, -math.inf)])
            self.nominal = np.concatenate([self.nominal, np.empty(grow)])
            self.folds = np.concatenate([self.folds, np.zeros(grow, dtype=np.int64)])
        self.value[cid] = self.nominal[cid] = nominal
        self.t[cid] = -math.inf
        self.count += 1
        self.pair_id[key] = cid
        self.pair_key.append(key)
        self.pair_links.append(tuple(links))
        self._entry_channel.extend([cid] * len(links))
        self._entry_link.extend(links)
        self._incidence = None
        return cid

    def links_of_pair(self, cid: int) -> tuple[int, ...]:
        """The links a pair channel measures."""
        return self.pair_links[cid - self.num_links]

    def clear(self) -> None:
        """Forget every sample and pair channel (before a restore)."""
        max_keyed = self.max_keyed
        self.__init__(self.topo)
        self.max_keyed = max_keyed

    # ------------------------------------------------------------------ folding
    def split(self, c: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For samples sorted by channel then time: the channels, each sample's group index
        and the mask of fresh samples (not older than the channel's last sample)."""
        first = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
        chans = c[first]
        if len(first) == len(c):                             # one sample per channel
            return chans, np.arange(len(c)), t >= self.t[chans]
        group = np.repeat(np.arange(len(chans)), np.diff(np.append(first, len(c))))
        return chans, group, t >= self.t[chans][group]

    def fold_ewma(self, c: np.ndarray, y: np.ndarray, t: np.ndarray, alpha: float,
                  w: np.ndarray | None = None) -> tuple[int, int]:
        """EWMA of each channel's samples in order (sorted by channel, time, arrival);
        ``w``: samples per row of a folded batch (module docstring; default one each).
        Returns ``(applied, stale)``: applied samples, stale rows (a stale folded row counts
        once, whatever its weight)."""
        if not len(c):
            return 0, 0
        chans, group, fresh = self.split(c, t)
        y, t, group = y[fresh], t[fresh], group[fresh]
        n = np.bincount(group, minlength=len(chans))
        end = np.cumsum(n)
        keep = 1.0 - alpha
        if w is None:
            weight = n
            decay = keep ** (end[group] - 1 - np.arange(len(y)))
            gain = alpha
        else:
            w_all, w = w.astype(np.int64), w[fresh].astype(np.int64)
            cum = np.cumsum(w)
            weight = np.bincount(group, weights=w, minlength=len(chans)).astype(np.int64)
            decay = keep ** (cum[end[group] - 1] - cum)            # samples after each row in its channel
            gain = 1.0 - keep ** w
        v = keep ** weight * self.value[chans] + np.bincount(group, weights=gain * decay * y, minlength=len(chans))
        hit = n > 0
        self.value[chans[hit]] = v[hit]
        self.t[chans[hit]] = t[end[hit] - 1]
        self.folds[chans[hit]] += weight[hit]
        if w is None:
            return len(y), int(len(fresh) - len(y))
        return int(w.sum()), int(len(w_all) - len(w))

    # ------------------------------------------------------------------ outputs
    def measured(self, value: np.ndarray | None = None) -> np.ndarray:
        """``M`` before the floor: direct channel, else the largest sampled pair crossing
        the link, else nominal (docs/runtime.md); ``value`` replaces the channel values
        (the store's provisional estimate)."""
        value = self.value if value is None else value
        L = self.num_links
        m = self.capacity.copy()
        links, best = self.keyed_max(value)
        m[links] = best
        direct = np.isfinite(self.t[:L])
        m[direct] = value[:L][direct]
        return m

    def keyed_max(self, value: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(links, largest)``: each link crossed by a pair (or host, or max) channel that
        has a sample, and the largest such channel's value (``value`` replaces theirs)."""
        value = self.value if value is None else value
        if not self._entry_channel:
            return np.zeros(0, dtype=np.int64), np.zeros(0)
        ch, link = self.incidence()
        vals = np.where(np.isfinite(self.t[ch]), value[ch], -math.inf)
        starts = np.flatnonzero(np.r_[True, link[1:] != link[:-1]])
        best = np.maximum.reduceat(vals, starts)
        seen = np.isfinite(best)
        return link[starts[seen]], best[seen]

    def incidence(self) -> tuple[np.ndarray, np.ndarray]:
        """``(channel, link)`` of every keyed channel's link, sorted by link (built once per
        new channel)."""
        if self._incidence is None:
            ch = np.asarray(self._entry_channel, dtype=np.int64)
            link = np.asarray(self._entry_link, dtype=np.int64)
            order = np.argsort(link, kind="stable")
            self._incidence = (ch[order], link[order])
        return self._incidence



def reverse_links(topo: Topology) -> np.ndarray:
    """Index of each link's reverse direction (-1 where there is none)."""
    return np.array([topo.link_index(l.dst, l.src) if topo.has_link(l.dst, l.src) else -1
                     for l in topo.links], dtype=np.int64)


def paired_cables(m: np.ndarray, nominal: np.ndarray, rev: np.ndarray, k: float) -> np.ndarray:
    """A cable whose two directions moved off ``nominal`` to levels within ``k`` of each
    other gets the lower level on both.  The two confirmed levels of one failure differ
    only by noise; left apart they would describe a slightly unbalanced cable, which some
    synthesizer paths treat very differently from a balanced one."""
    moved = np.abs(m - nominal) > k * nominal
    a = np.flatnonzero(moved & (rev >= 0))
    a = a[moved[rev[a]]]
    a = a[np.abs(m[a] - m[rev[a]]) <= k * np.maximum(m[a], m[rev[a]])]
    out = m.copy()
    out[a] = np.minimum(m[a], m[rev[a]])
    return out
