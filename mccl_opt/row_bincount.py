"""Weighted counts of a table's entries, one weight per row, in one compiled pass.

``np.bincount(index.ravel(), weights=np.repeat(weights, index.shape[1]))`` materialises a
float per entry and takes numpy's weighted path: 1.2 s for the 36 M edge entries of the
71 k trees of HPN 4x16x8's restriction at ``max_chunks=None`` (docs/allgather_history.md "Scaled
packing on the restriction"), where this loop takes ~0.05 s.  The sums are added in the
same order as ``np.bincount``'s (row by row, entry by entry), so the floats are the same.
Depends on numba (imported by the callers lazily: ``import mccl_opt`` does not load it).
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["row_bincount"]


def row_bincount(index: np.ndarray, weights: np.ndarray, minlength: int) -> np.ndarray:
    """Per value ``j``, the sum of ``weights[i]`` over the entries ``index[i, :] == j``
    (``minlength`` bins at least, as ``np.bincount``); ``index`` holds no negatives."""
    index = np.ascontiguousarray(index)
    length = max(int(minlength), int(index.max()) + 1 if index.size else 0)
    out = np.zeros(length, np.float64)
    _add_rows(index, np.ascontiguousarray(weights, np.float64), out)
    return out


@njit(cache=True)
def _add_rows(index, weights, out):
    for i in range(index.shape[0]):
        for j in range(index.shape[1]):
            out[index[i, j]] += weights[i]
