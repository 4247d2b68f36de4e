"""The column pool of the AllToAll master: path columns in CSR form (paper §4.2).

Depends on numpy only.
"""

from __future__ import annotations

import numpy as np

from ..ragged import RaggedColumns, column_hash

__all__ = ["ColumnPool"]


class ColumnPool(RaggedColumns):
    """Path columns: column ``j`` routes pair ``pair[j]`` over links
    ``arcs[start[j]:start[j+1]]`` (in path order).  Duplicates (same pair and links,
    detected by a 64-bit hash of the column) are refused.  ``origin[j]`` is the column's
    index in the warm start it was carried over from (-1: new), so chunks that did not
    change can be reused."""

    _extras = ("origin",)

    @property
    def pair(self) -> np.ndarray:
        return self.owner

    def append(self, pair: np.ndarray, start: np.ndarray, arcs: np.ndarray,
               origin: np.ndarray | None = None) -> np.ndarray:
        """Add the new (non-duplicate) columns; returns the positions taken from the input."""
        pair = np.asarray(pair, dtype=np.int64)
        start = np.asarray(start, dtype=np.int64)
        arcs = np.asarray(arcs, dtype=np.int64)
        origin = np.full(pair.size, -1, dtype=np.int64) if origin is None else \
            np.asarray(origin, dtype=np.int64)
        return self._add(pair, start, arcs, column_hash(pair, start, arcs), origin=origin)

    def path(self, j: int) -> np.ndarray:
        return self.column(j)

    def costs(self, price: np.ndarray) -> np.ndarray:
        """Price of every column: the sum of ``price`` over its links."""
        from ._segments import column_sums       # compiled; the same floats as a bincount
        return column_sums(self.start, self.arcs, price)

    def steps(self, is_step_arc: np.ndarray) -> np.ndarray:
        """Steps (arcs into a GPU) of every column."""
        return np.bincount(self.column_of_arc(), weights=is_step_arc[self.arcs].astype(float),
                           minlength=len(self)).astype(np.int64)
