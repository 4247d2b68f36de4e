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
from mccl_opt.paths import switch_paths_batch
from mccl_opt.topology import Topology

from .columns import KIND_CODES, MAX_REPORTER, ColumnBatch

__all__ = ["HostReducer", "PairPaths"]

_SHIFT = 31


class PairPaths:
    """The switch paths of GPU pairs by rank (:func:`mccl_opt.paths.switch_paths_batch`,
    the controller's pair channels' links), computed a batch at once and kept: ``of``
    returns ``(arcs, hops)`` rows as that function does."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self._keys = np.zeros(0, dtype=np.int64)
        self._arcs = np.zeros((0, 1), dtype=np.int64)
        self._hops = np.zeros(0, dtype=np.int64)

    def of(self, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        key = np.asarray(a, dtype=np.int64) << _SHIFT | np.asarray(b, dtype=np.int64)
        pos = np.searchsorted(self._keys, key)
        known = pos < len(self._keys)
        known[known] = self._keys[pos[known]] == key[known]
        if not known.all():
            self._learn(np.unique(key[~known]))
            pos = np.searchsorted(self._keys, key)
        return self._arcs[pos], self._hops[pos]

    def _learn(self, keys: np.ndarray) -> None:
        nodes = self.topo.arrays.gpu_nodes
        arcs, hops = switch_paths_batch(self.topo, nodes[keys >> _SHIFT], nodes[keys & ((1 << _SHIFT) - 1)])
        width = max(arcs.shape[1], self._arcs.shape[1])
        pad = lambda x: np.pad(x, ((0, 0), (0, width - x.shape[1])), constant_values=-1)
        all_keys = np.concatenate([self._keys, keys])
        order = np.argsort(all_keys)
        self._keys = all_keys[order]
        self._arcs = np.concatenate([pad(self._arcs), pad(arcs)])[order]
        self._hops = np.concatenate([self._hops, hops])[order]


class HostReducer:
    """One host's reduction (module docstring); pair paths come from ``paths`` (shared
    between the hosts of one emulator), computed once per pair."""

    def __init__(self, topo: Topology, reporter: int, paths: PairPaths | None = None) -> None:
        if not 0 <= reporter < MAX_REPORTER:
            raise InputError(f"a reporter id is in [0, 2^30), got {reporter}")
        self.topo, self.reporter = topo, int(reporter)
        self.paths = paths or PairPaths(topo)

    def reduce(self, batch: ColumnBatch) -> ColumnBatch:
        """``batch`` with its ``pair`` samples replaced by this host's per-link maxima
        (other samples pass unchanged; a pair with no switch path is dropped)."""
        pair = np.asarray(batch.kind) == KIND_CODES["pair"]
        rest = np.flatnonzero(~pair)
        idx = np.flatnonzero(pair)
        arcs, _ = self.paths.of(batch.a[idx], batch.b[idx])
        row, col = np.nonzero(arcs >= 0)
        link, owner = arcs[row, col], idx[row]
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
