"""Host-side reduction of ``pair`` telemetry to one sample per link (docs/scale.md).

Paper §3.3: a ``pair`` sample bounds every link of the pair's switch path from below, and
the controller takes, per link, the largest pair crossing it (:mod:`mccl_runtime.channels`).
A host that received samples of many pairs can take that maximum itself: per link on
their paths, the largest value (and the latest time) of the pairs it received in the
flush.  It sends one ``host`` sample per link (:mod:`mccl_runtime.columns`, kind 3, its
reporter id in ``b``); the controller keeps one channel per (reporter, link) and takes the
largest over reporters, which is the largest over all pairs again.  With the EWMA the
maximum is taken before the smoothing instead of after, so ``M`` is equal whenever each
pair's value is steady (and always with ``alpha = 1``); the volume falls by the number of
received pairs crossing each link (63 pairs per GPU NIC downlink in an expert group of 64).
"""

from __future__ import annotations

import numpy as np

from mccl_opt.errors import InputError
from mccl_opt.topology import Topology

from .columns import KIND_CODES, ColumnBatch
from .samples import LinkMap, RejectedSample, Sample

__all__ = ["HostReducer"]


class HostReducer:
    """One host's reduction (module docstring); the switch path of each pair is resolved
    once and kept."""

    def __init__(self, topo: Topology, reporter: int) -> None:
        if not 0 <= reporter < 1 << 31:
            raise InputError(f"a reporter id is in [0, 2^31), got {reporter}")
        self.topo, self.reporter = topo, int(reporter)
        self._map = LinkMap(topo)
        self._paths: dict[tuple[int, int], tuple[int, ...]] = {}

    def _path(self, a: int, b: int) -> tuple[int, ...]:
        path = self._paths.get((a, b))
        if path is None:
            gpus = self.topo.gpus
            try:
                path = self._map.resolve(Sample("pair", gpus[a], gpus[b], 0.0, 0.0))[0]
            except RejectedSample:
                path = ()                       # no switch path: the controller would reject it
            self._paths[(a, b)] = path
        return path

    def reduce(self, batch: ColumnBatch) -> ColumnBatch:
        """``batch`` with its ``pair`` samples replaced by this host's per-link maxima
        (other samples pass unchanged; a pair with no switch path is dropped)."""
        pair = np.asarray(batch.kind) == KIND_CODES["pair"]
        rest = np.flatnonzero(~pair)
        idx = np.flatnonzero(pair)
        links, owner = [], []
        for i, (a, b) in zip(idx.tolist(), zip(batch.a[idx].tolist(), batch.b[idx].tolist())):
            path = self._path(a, b)
            links.extend(path)
            owner.extend([i] * len(path))
        link = np.asarray(links, dtype=np.int64)
        owner = np.asarray(owner, dtype=np.int64)
        used = np.unique(link)
        slot = np.searchsorted(used, link)
        gbps = np.full(len(used), -np.inf)
        t = np.full(len(used), -np.inf)
        np.maximum.at(gbps, slot, np.asarray(batch.gbps, dtype=float)[owner])
        np.maximum.at(t, slot, np.asarray(batch.t, dtype=float)[owner])
        n = len(used)
        return ColumnBatch.build(
            self.topo, np.r_[batch.kind[rest], np.full(n, KIND_CODES["host"])],
            np.r_[batch.a[rest], used], np.r_[batch.b[rest], np.full(n, self.reporter)],
            np.r_[batch.gbps[rest], gbps], np.r_[batch.t[rest], t])
