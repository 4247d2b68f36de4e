"""Numba kernels over CSR column lists (column ``j`` crosses ``arcs[start[j]:start[j+1]]``).

They replace ``np.bincount`` over a per-entry expansion (``weights[seg]`` with ``seg``
the column of every entry), which allocates and page-faults an array as long as
``arcs`` (5M entries at 1024 GPUs) per call.  Sums run in entry order, as
``np.bincount`` does, so the results are the same floats.  Imported on first use.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["column_loads", "column_sums"]


@njit(cache=True)
def column_loads(start, arcs, weight, n_links):
    """Per-link sum of ``weight[j]`` over the columns ``j`` crossing it."""
    out = np.zeros(n_links)
    for j in range(weight.size):
        w = weight[j]
        if w != 0.0:
            for e in range(start[j], start[j + 1]):
                out[arcs[e]] += w
    return out


@njit(cache=True)
def column_sums(start, arcs, value):
    """Per column, the sum of ``value`` over its links (e.g. its price)."""
    n = start.size - 1
    out = np.zeros(n)
    for j in range(n):
        s = 0.0
        for e in range(start[j], start[j + 1]):
            s += value[arcs[e]]
        out[j] = s
    return out
