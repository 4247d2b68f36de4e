"""Numba kernels over CSR column lists (column ``j`` crosses ``arcs[start[j]:start[j+1]]``).

They replace ``np.bincount`` over a per-entry expansion (``weights[seg]`` with ``seg``
the column of every entry), which allocates and page-faults an array as long as
``arcs`` (5M entries at 1024 GPUs) per call.  Sums run in entry order, as
``np.bincount`` does, so the results are the same floats.  The ``rows`` argument
selects rows of a shared list in place (``None``: every row), so a layered list
(:class:`~.rows.Rows`) is summed without being copied.  Imported on first use.
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["column_loads", "column_sums", "add_loads", "put_sums", "take_rows"]


@njit(cache=True)
def add_loads(start, arcs, rows, weight, offset, out):
    """``out[a] += weight[offset + i]`` for every link ``a`` of the ``i``-th selected
    row: row ``rows[i]`` (row ``i`` when ``rows`` is None)."""
    if rows is None:
        for i in range(start.size - 1):
            w = weight[offset + i]
            if w != 0.0:
                for e in range(start[i], start[i + 1]):
                    out[arcs[e]] += w
    else:
        for i in range(rows.size):
            w = weight[offset + i]
            if w != 0.0:
                j = rows[i]
                for e in range(start[j], start[j + 1]):
                    out[arcs[e]] += w


@njit(cache=True)
def put_sums(start, arcs, rows, value, offset, out):
    """``out[offset + i]`` = the sum of ``value`` over the links of the ``i``-th selected
    row (as in :func:`add_loads`)."""
    n = start.size - 1 if rows is None else rows.size
    for i in range(n):
        j = i
        if rows is not None:
            j = rows[i]
        s = 0.0
        for e in range(start[j], start[j + 1]):
            s += value[arcs[e]]
        out[offset + i] = s


def column_loads(start: np.ndarray, arcs: np.ndarray, weight: np.ndarray, n_links: int) -> np.ndarray:
    """Per-link sum of ``weight[j]`` over the columns ``j`` crossing it."""
    out = np.zeros(n_links)
    add_loads(start, arcs, None, np.asarray(weight, dtype=float), 0, out)
    return out


def column_sums(start: np.ndarray, arcs: np.ndarray, value: np.ndarray) -> np.ndarray:
    """Per column, the sum of ``value`` over its links (e.g. its price)."""
    out = np.zeros(start.size - 1)
    put_sums(start, arcs, None, np.asarray(value, dtype=float), 0, out)
    return out


@njit(cache=True)
def take_rows(start, arcs, idx, new_start):
    """The entries of rows ``idx`` of ``start/arcs``, in that order (``new_start``:
    where each lands), one compiled pass (:func:`.rows.csr_take`)."""
    out = np.empty(new_start[-1], np.int64)
    for r in range(idx.size):
        src = start[idx[r]]
        for i in range(new_start[r], new_start[r + 1]):
            out[i] = arcs[src + i - new_start[r]]
    return out
