"""Column pools of link lists in CSR form, with duplicate columns refused by a hash.

The base of both column generations' pools: AllToAll path columns (paper §4.2,
:class:`mccl_opt.alltoall.pool.ColumnPool`) and the general AllGather method's tree
columns (:class:`mccl_opt.allgather.general.live_master.TreePool`).  Depends on numpy and numba.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["RaggedColumns", "column_hash"]

_MULT = np.uint64(0x9E3779B97F4A7C15)
_OWNER_MIX = np.uint64(0xC2B2AE3D27D4EB4F)


def column_hash(owner: np.ndarray, start: np.ndarray, arcs: np.ndarray) -> np.ndarray:
    """A 64-bit polynomial hash of ``(owner[j], arcs[start[j]:start[j+1]])`` per column,
    ``sum_i (arcs_i + 1) * MULT^(i+1)`` wrapping modulo 2^64, mixed with the owner (the
    arcs' order counts: sort each column first for a hash of its arc multiset).  One
    compiled pass: the array form (a power per entry, ``np.add.at``) took 3 s on the
    4M columns of a 2,048-GPU AllToAll start."""
    return _hash_columns(np.ascontiguousarray(owner, np.int64),
                         np.ascontiguousarray(start, np.int64),
                         np.ascontiguousarray(arcs, np.int64))


@njit(cache=True)
def _hash_columns(owner, start, arcs):
    h = np.empty(owner.size, np.uint64)
    mult, mix, one = np.uint64(_MULT), np.uint64(_OWNER_MIX), np.uint64(1)
    for j in range(owner.size):
        acc, power = np.uint64(0), mult
        for i in range(start[j], start[j + 1]):
            acc += (np.uint64(arcs[i]) + one) * power
            power *= mult
        h[j] = acc ^ (np.uint64(owner[j]) * mix)
    return h


class RaggedColumns:
    """Column ``j`` belongs to ``owner[j]`` (an AllToAll pair, an AllGather root) and
    uses the links ``arcs[start[j]:start[j+1]]``; ``hash[j]`` identifies it.  Subclasses
    name the owner and list further per-column arrays in ``_extras`` (kept in step by
    :meth:`keep` and :meth:`_add`)."""

    _extras: tuple[str, ...] = ()

    def __init__(self) -> None:
        self.owner = np.zeros(0, dtype=np.int64)
        self.start = np.zeros(1, dtype=np.int64)
        self.arcs = np.zeros(0, dtype=np.int64)
        self.hash = np.zeros(0, dtype=np.uint64)
        for name in self._extras:
            setattr(self, name, np.zeros(0, dtype=np.int64))

    def __len__(self) -> int:
        return int(self.owner.size)

    def column(self, j: int) -> np.ndarray:
        """The links of column ``j``."""
        return self.arcs[self.start[j]:self.start[j + 1]]

    def columns(self, idx: np.ndarray | range) -> list[np.ndarray]:
        """The links of the columns ``idx``, in that order."""
        start = self.start
        return [self.arcs[start[j]:start[j + 1]] for j in np.asarray(idx, np.int64).tolist()]

    def incidence(self, idx: np.ndarray, num_links: int) -> np.ndarray:
        """Per column of ``idx`` (rows, in that order), how often it uses each link."""
        idx = np.asarray(idx, np.int64)
        lengths = self.start[idx + 1] - self.start[idx]
        row = np.repeat(np.arange(idx.size), lengths)
        pos = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        out = np.zeros((idx.size, num_links))
        np.add.at(out, (row, self.arcs[np.repeat(self.start[idx], lengths) + pos]), 1.0)
        return out

    def column_of_arc(self) -> np.ndarray:
        """Per entry of ``arcs``: the column it belongs to."""
        return np.repeat(np.arange(self.owner.size), np.diff(self.start))

    def _add(self, owner: np.ndarray, start: np.ndarray, arcs: np.ndarray,
             hashes: np.ndarray, **extras: np.ndarray) -> np.ndarray:
        """Append the columns whose hash is new (the first of equal ones in the input);
        returns their positions in the input.  ``extras``: a value per input column for
        each name in ``_extras``."""
        if owner.size and np.bincount(owner).max() > 1:
            _, first = np.unique(hashes, return_index=True)
            fresh = np.zeros(owner.size, dtype=bool)
            fresh[first] = True
        else:                   # one column per owner: no two of them are equal
            fresh = np.ones(owner.size, dtype=bool)
        if self.hash.size:
            known = np.sort(self.hash)
            pos = np.minimum(np.searchsorted(known, hashes), known.size - 1)
            fresh &= known[pos] != hashes
        idx = np.flatnonzero(fresh)
        if idx.size == owner.size and not self.owner.size:
            # a first fill shares the input arrays (no 20M-entry copies at 2,048 GPUs):
            # a pool never writes into its arrays, it replaces them
            self.owner, self.hash = owner, hashes
            self.start, self.arcs = start - start[0], arcs[start[0]:start[-1]]
            for name in self._extras:
                setattr(self, name, np.asarray(extras[name], dtype=np.int64))
        elif idx.size:
            lengths = np.diff(start)
            seg = np.repeat(np.arange(owner.size), lengths)
            self.owner = np.concatenate([self.owner, owner[idx]])
            self.start = np.concatenate([self.start, self.start[-1] + np.cumsum(lengths[idx])])
            self.arcs = np.concatenate([self.arcs, arcs[fresh[seg]]])
            self.hash = np.concatenate([self.hash, hashes[idx]])
            for name in self._extras:
                setattr(self, name, np.concatenate([getattr(self, name), extras[name][idx]]))
        return idx

    def select(self, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(owner, start, arcs)`` of the columns where ``mask`` is true (order kept)."""
        mask = np.asarray(mask, dtype=bool)
        lengths = np.diff(self.start)
        return (self.owner[mask], np.concatenate([[0], np.cumsum(lengths[mask])]).astype(np.int64),
                self.arcs[mask[self.column_of_arc()]])

    def keep(self, mask: np.ndarray) -> None:
        """Keep only the columns where ``mask`` is true (order preserved)."""
        mask = np.asarray(mask, dtype=bool)
        self.owner, self.start, self.arcs = self.select(mask)
        self.hash = self.hash[mask]
        for name in self._extras:
            setattr(self, name, getattr(self, name)[mask])

    def loads(self, weights: np.ndarray, n_links: int) -> np.ndarray:
        """Per-link sum of ``weights[j]`` times the crossings of column ``j`` (summed in
        entry order, as ``np.bincount`` would: the same floats)."""
        weights = np.ascontiguousarray(weights, float)
        if weights.size < self.owner.size:
            raise ValueError(f"{weights.size} weights for {self.owner.size} columns")
        return _column_loads(self.start, self.arcs, weights, n_links)


@njit(cache=True)
def _column_loads(start, arcs, weights, n_links):
    out = np.zeros(n_links)
    for j in range(start.size - 1):
        w = weights[j]
        for i in range(start[j], start[j + 1]):
            out[arcs[i]] += w
    return out
