"""Channel ids of binary samples (:mod:`mccl_runtime.columns`), looked up a batch at once.

A binary sample names a pair by GPU ranks and a host reduction by (link, reporter)
(:mod:`mccl_runtime.columns`).  :class:`KeyedChannels` packs each into one integer key and
keeps the known keys sorted, so a batch's channel ids are one ``searchsorted``; keys seen
for the first time are resolved like JSON samples (:class:`~mccl_runtime.samples.LinkMap`)
and registered in the same :class:`~mccl_runtime.channels.Channels`, so a pair has one
channel whichever format its samples came in (paper §3.2: one estimate per channel).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mccl_opt.topology import Topology

from .channels import Channels
from .columns import ColumnBatch
from .samples import LinkMap, RejectedSample, Sample

__all__ = ["KeyedChannels", "host_key"]

_SHIFT = 31          # a and b are non-negative int32: the key is kind << 62 | a << 31 | b


def host_key(reporter: int, link: int) -> tuple[str, int, int]:
    """The channel key of a host's reduction over one link."""
    return ("host", int(reporter), int(link))


class KeyedChannels:
    """Sorted integer keys of the pair and host channels seen in binary batches."""

    def __init__(self, chan: Channels, links: LinkMap, topo: Topology) -> None:
        self.chan, self.map, self.topo = chan, links, topo
        self.reset()

    def reset(self) -> None:
        """Forget the keys (the channels were cleared)."""
        self._keys = np.zeros(0, dtype=np.int64)
        self._ids = np.zeros(0, dtype=np.int64)
        self._gpu_link: np.ndarray | None = None

    def channels(self, batch: ColumnBatch) -> tuple[np.ndarray, np.ndarray]:
        """Each sample's channel id (-1: unknown, or an index outside the fabric) and the
        mask of unknown kinds."""
        kind, a, b = (np.asarray(x, dtype=np.int64) for x in (batch.kind, batch.a, batch.b))
        L, G = self.topo.num_links, self.topo.num_gpus
        c = np.full(len(kind), -1, dtype=np.int64)
        link = (kind == 0) & (a >= 0) & (a < L) & (b == 0)
        c[link] = a[link]
        gpu = (kind == 2) & (a >= 0) & (a < G) & ((b == 0) | (b == 1))
        if gpu.any():
            c[gpu] = self._gpu_links()[a[gpu], b[gpu]]
        keyed = (kind == 1) & (a >= 0) & (a < G) & (b >= 0) & (b < G) & (a != b)
        keyed |= (kind == 3) & (a >= 0) & (a < L) & (b >= 0)
        if keyed.any():
            c[keyed] = self.ids(kind[keyed], a[keyed], b[keyed])
        return c, kind > 3

    def _gpu_links(self) -> np.ndarray:
        """Per GPU rank, the link of a ``gpu`` sample out (column 0) and in (column 1),
        -1 where the GPU has no intra-node switch; built on first use."""
        if self._gpu_link is None:
            table = np.full((self.topo.num_gpus, 2), -1, dtype=np.int64)
            for r, g in enumerate(self.topo.gpus):
                for d, direction in enumerate(("out", "in")):
                    try:
                        table[r, d] = self.map.resolve(Sample("gpu", g, direction, 0.0, 0.0))[0][0]
                    except RejectedSample:
                        pass
            self._gpu_link = table
        return self._gpu_link

    def to_list(self) -> list[dict[str, Any]]:
        """The host channels that have a sample, for the state file (sorted)."""
        ch, links = self.chan, self.topo.links
        rows = sorted((key[1], key[2], float(ch.value[cid]), float(ch.t[cid])) for key, cid in ch.pair_id.items()
                      if len(key) == 3 and math.isfinite(ch.t[cid]))
        return [{"reporter": r, "src": links[a].src, "dst": links[a].dst, "value": v, "t": t} for r, a, v, t in rows]

    def ids(self, kind: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Channel id of each (kind 1 pair or 3 host, a, b); -1 where the pair has no
        switch path.  Arguments are int64 arrays already range-checked."""
        key = (kind >> 1) << (2 * _SHIFT) | a << _SHIFT | b        # kind 1 -> 0, kind 3 -> 1
        pos = np.searchsorted(self._keys, key)
        hit = pos < len(self._keys)
        hit[hit] = self._keys[pos[hit]] == key[hit]
        if not hit.all():
            self._learn(np.unique(key[~hit]))
            pos = np.searchsorted(self._keys, key)
        return self._ids[pos]

    def _learn(self, keys: np.ndarray) -> None:
        gpus, mask = self.topo.gpus, (1 << _SHIFT) - 1
        new = []
        for key in keys.tolist():
            a, b = (key >> _SHIFT) & mask, key & mask
            if key >> (2 * _SHIFT):                                 # a host reduction over link a
                cid = self.chan.pair(host_key(b, a), (a,), float(self.chan.capacity[a]))
            else:
                try:
                    links, nominal = self.map.resolve(Sample("pair", gpus[a], gpus[b], 0.0, 0.0))
                    cid = self.chan.pair((gpus[a], gpus[b]), links, nominal)
                except RejectedSample:
                    cid = -1
            new.append((key, cid))
        keys = np.concatenate([self._keys, np.array([k for k, _ in new], dtype=np.int64)])
        ids = np.concatenate([self._ids, np.array([c for _, c in new], dtype=np.int64)])
        order = np.argsort(keys)
        self._keys, self._ids = keys[order], ids[order]
