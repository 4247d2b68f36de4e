"""The column pool of the AllToAll master: path columns in CSR form (paper §4.2).

Depends on numpy only.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ColumnPool"]


class ColumnPool:
    """Path columns: column ``j`` routes pair ``pair[j]`` over links
    ``arcs[start[j]:start[j+1]]`` (in path order).  Duplicates (same pair and links,
    detected by a 64-bit hash of the column) are refused.  ``origin[j]`` is the column's
    index in the warm start it was carried over from (-1: new), so chunks that did not
    change can be reused."""

    def __init__(self) -> None:
        self.pair = np.zeros(0, dtype=np.int64)
        self.start = np.zeros(1, dtype=np.int64)
        self.arcs = np.zeros(0, dtype=np.int64)
        self.hash = np.zeros(0, dtype=np.uint64)
        self.origin = np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return int(self.pair.size)

    @staticmethod
    def _hash(pair: np.ndarray, start: np.ndarray, arcs: np.ndarray) -> np.ndarray:
        """Polynomial hash of (pair, arcs) per column, wrapping modulo 2^64."""
        lengths = np.diff(start)
        seg = np.repeat(np.arange(pair.size), lengths)
        pos = np.arange(arcs.size) - start[:-1][seg]
        with np.errstate(over="ignore"):
            mult = np.uint64(0x9E3779B97F4A7C15) ** (pos.astype(np.uint64) + np.uint64(1))
            terms = (arcs.astype(np.uint64) + np.uint64(1)) * mult
            h = np.zeros(pair.size, dtype=np.uint64)
            np.add.at(h, seg, terms)
            return h ^ (pair.astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F))

    def append(self, pair: np.ndarray, start: np.ndarray, arcs: np.ndarray,
               origin: np.ndarray | None = None) -> np.ndarray:
        """Add the new (non-duplicate) columns; returns the positions taken from the input."""
        pair = np.asarray(pair, dtype=np.int64)
        start = np.asarray(start, dtype=np.int64)
        arcs = np.asarray(arcs, dtype=np.int64)
        h = self._hash(pair, start, arcs)
        _, first = np.unique(h, return_index=True)
        fresh = np.zeros(pair.size, dtype=bool)
        fresh[first] = True
        if self.hash.size:
            known = np.sort(self.hash)
            pos = np.minimum(np.searchsorted(known, h), known.size - 1)
            fresh &= known[pos] != h
        idx = np.flatnonzero(fresh)
        if idx.size:
            lengths = np.diff(start)
            seg = np.repeat(np.arange(pair.size), lengths)
            self.pair = np.concatenate([self.pair, pair[idx]])
            self.start = np.concatenate([self.start, self.start[-1] + np.cumsum(lengths[idx])])
            self.arcs = np.concatenate([self.arcs, arcs[fresh[seg]]])
            self.hash = np.concatenate([self.hash, h[idx]])
            new_origin = np.full(idx.size, -1, dtype=np.int64) if origin is None else \
                np.asarray(origin, dtype=np.int64)[idx]
            self.origin = np.concatenate([self.origin, new_origin])
        return idx

    def select(self, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(pair, start, arcs)`` of the columns where ``mask`` is true (order kept)."""
        mask = np.asarray(mask, dtype=bool)
        lengths = np.diff(self.start)
        seg = np.repeat(np.arange(self.pair.size), lengths)
        return (self.pair[mask], np.concatenate([[0], np.cumsum(lengths[mask])]).astype(np.int64),
                self.arcs[mask[seg]])

    def keep(self, mask: np.ndarray) -> None:
        """Keep only the columns where ``mask`` is true (order preserved)."""
        mask = np.asarray(mask, dtype=bool)
        self.pair, self.start, self.arcs = self.select(mask)
        self.hash = self.hash[mask]
        self.origin = self.origin[mask]

    def path(self, j: int) -> np.ndarray:
        return self.arcs[self.start[j]:self.start[j + 1]]

    def loads(self, weights: np.ndarray, n_links: int) -> np.ndarray:
        """Per-link sum of ``weights[j]`` over the columns crossing it."""
        seg = np.repeat(np.arange(self.pair.size), np.diff(self.start))
        return np.bincount(self.arcs, weights=np.asarray(weights)[seg], minlength=n_links)

    def costs(self, price: np.ndarray) -> np.ndarray:
        """Price of every column: the sum of ``price`` over its links."""
        seg = np.repeat(np.arange(self.pair.size), np.diff(self.start))
        return np.bincount(seg, weights=np.asarray(price)[self.arcs], minlength=self.pair.size)

    def steps(self, is_step_arc: np.ndarray) -> np.ndarray:
        """Steps (arcs into a GPU) of every column."""
        seg = np.repeat(np.arange(self.pair.size), np.diff(self.start))
        return np.bincount(seg, weights=is_step_arc[self.arcs].astype(float),
                           minlength=self.pair.size).astype(np.int64)
