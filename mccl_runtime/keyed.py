"""Channel ids of binary samples (:mod:`mccl_runtime.columns`), looked up a batch at once.

A binary sample names a pair by GPU ranks, a host reduction and a front end's link maximum
by (link, reporter) (:mod:`mccl_runtime.columns`).  :class:`KeyedChannels` packs each into one integer key and
keeps the known keys sorted, so a batch's channel ids are one ``searchsorted``; keys seen
for the first time are resolved like JSON samples (:class:`~mccl_runtime.samples.LinkMap`)
and registered in the same :class:`~mccl_runtime.channels.Channels`, so a pair has one
channel whichever format its samples came in (paper §3.2: one estimate per channel).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mccl_opt.paths import switch_paths_batch
from mccl_opt.topology import Topology

from .channels import FULL, Channels
from .columns import MAX_REPORTER, ColumnBatch
from .samples import LinkMap, RejectedSample, Sample

__all__ = ["KeyedChannels", "host_key"]

_SHIFT = 31          # a and b are non-negative int32: the key is kind << 62 | a << 31 | b
_MAX_FLAG = MAX_REPORTER     # in b of a keyed ``max`` row (reporters are below it)


def host_key(reporter: int, link: int, kind: str = "host") -> tuple[str, int, int]:
    """The channel key of a host's reduction (``kind`` ``"max"``: a front end's link
    maximum) over one link."""
    return (kind, int(reporter), int(link))


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
        keyed |= ((kind == 3) | (kind == 4)) & (a >= 0) & (a < L) & (b >= 0) & (b < MAX_REPORTER)
        if keyed.any():
            k, bk = kind[keyed], b[keyed]
            c[keyed] = self.ids(np.where(k == 4, 3, k), a[keyed], np.where(k == 4, bk | _MAX_FLAG, bk))
        return c, kind > 4

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
        rows = sorted((key[0], key[1], key[2], float(ch.value[cid]), float(ch.t[cid]))
                      for key, cid in ch.pair_id.items() if len(key) == 3 and math.isfinite(ch.t[cid]))
        return [{"kind": k, "reporter": r, "src": links[a].src, "dst": links[a].dst, "value": v, "t": t}
                for k, r, a, v, t in rows]

    def ids(self, kind: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Channel id of each (kind 1 pair or 3 host, a, b); -1 where the pair has no
        switch path, :data:`~mccl_runtime.channels.FULL` where a new key found the
        channels full.  Arguments are int64 arrays already range-checked."""
        key = (kind >> 1) << (2 * _SHIFT) | a << _SHIFT | b        # kind 1 -> 0, kind 3 -> 1
        pos = np.searchsorted(self._keys, key)
        hit = pos < len(self._keys)
        hit[hit] = self._keys[pos[hit]] == key[hit]
        if hit.all():
            return self._ids[pos]
        self._learn(np.unique(key[~hit]))
        if not len(self._keys):
            return np.full(len(key), FULL, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self._keys, key), len(self._keys) - 1)
        return np.where(self._keys[pos] == key, self._ids[pos], FULL)

    def _learn(self, keys: np.ndarray) -> None:
        """Register the channels of new keys; the switch paths of new pairs are found at
        once (:func:`mccl_opt.paths.switch_paths_batch`, the same paths as the JSON
        samples' :class:`~mccl_runtime.samples.LinkMap`)."""
        gpus, mask = self.topo.gpus, (1 << _SHIFT) - 1
        a_all, b_all = (keys >> _SHIFT) & mask, keys & mask
        pair = (keys >> (2 * _SHIFT)) == 0
        nodes, cap = self.topo.arrays.gpu_nodes, self.chan.capacity
        arcs, hops = switch_paths_batch(self.topo, nodes[a_all[pair]], nodes[b_all[pair]])
        paths = iter(zip(arcs.tolist(), hops.tolist()))
        ids = []
        for a, b, is_pair in zip(a_all.tolist(), b_all.tolist(), pair.tolist()):
            if not is_pair:                                         # a host reduction or maximum over link a
                kind = "max" if b & _MAX_FLAG else "host"
                ids.append(self.chan.pair(host_key(b & ~_MAX_FLAG, a, kind), (a,), float(cap[a])))
                continue
            row, n = next(paths)
            links = tuple(row[:n])
            ids.append(self.chan.pair((gpus[a], gpus[b]), links, float(cap[list(links)].min())) if n else -1)
        ids = np.array(ids, dtype=np.int64)
        kept = ids != FULL                          # refused keys are not remembered
        keys = np.concatenate([self._keys, keys[kept]])
        ids = np.concatenate([self._ids, ids[kept]])
        order = np.argsort(keys)
        self._keys, self._ids = keys[order], ids[order]
