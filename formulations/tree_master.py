"""The restricted master of the general AllGather method: tree columns (paper §4.3,
forwarding-only switches; see docs/allgather_history.md "General method")::

    max  x
    s.t. x - sum_{T rooted at r} w_T            <= 0       for every root GPU r   (root rows)
         sum_T load_T(a) w_T                     <= cap_a   for every link a      (link rows)
         x, w >= 0

``w_T`` is the rate (capacity units) carried by spanning arborescence ``T`` of the GPU
graph whose edges are switch-only paths; ``load_T(a)`` counts the edges of ``T`` whose
path crosses link ``a`` (a switch forwards, it never duplicates, so two edges of one
tree through one link load it twice).  Column 0 is ``x``; rows ``0..R-1`` are root rows,
rows ``R..R+L-1`` link rows.  Duals (shadow prices, >= 0 for these ``<=`` rows of a max
problem): ``sigma_r`` of the root rows, link prices ``pi_a`` of the link rows, with
``sum_r sigma_r = 1`` at an optimum.  Depends on numpy/scipy only.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .errors import FormulationError
from .lp import LinearProgram
from .names import FabricLabels, numbered

__all__ = ["build_tree_master_lp", "tree_columns"]


def tree_columns(n_roots: int, col_root: np.ndarray, col_start: np.ndarray,
                 col_arcs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSC block (starts, row indices, values) of tree columns: ``-1`` in the root row
    and, in link row ``a``, the number of the tree's edge paths crossing ``a``
    (column ``j``'s arcs are ``col_arcs[col_start[j]:col_start[j+1]]``, repeats allowed)."""
    col_root = np.asarray(col_root, dtype=np.int64)
    col_start = np.asarray(col_start, dtype=np.int64)
    col_arcs = np.asarray(col_arcs, dtype=np.int64)
    k = col_root.size
    if col_start.shape != (k + 1,) or col_start[-1] != col_arcs.size:
        raise FormulationError("col_start must have one entry per column plus the end offset")
    if k and (col_root.min() < 0 or col_root.max() >= n_roots):
        raise FormulationError(f"column root index outside 0..{n_roots - 1}")
    seg = np.repeat(np.arange(k), np.diff(col_start))
    width = int(col_arcs.max(initial=0)) + 1
    keys, counts = np.unique(seg * width + col_arcs, return_counts=True)
    col_of, arc_of = keys // width, keys % width
    per_col = np.bincount(col_of, minlength=k)
    starts = np.concatenate([[0], np.cumsum(per_col + 1)]).astype(np.int64)
    indices = np.empty(starts[-1], dtype=np.int64)
    values = np.empty(starts[-1])
    head = starts[:-1]
    indices[head] = col_root
    values[head] = -1.0
    body = np.ones(starts[-1], dtype=bool)
    body[head] = False
    indices[body] = n_roots + arc_of            # sorted by column, then link
    values[body] = counts
    return starts, indices, values


def build_tree_master_lp(n_roots: int, capacity: np.ndarray, col_root: np.ndarray,
                         col_start: np.ndarray, col_arcs: np.ndarray,
                         labels: FabricLabels | None = None) -> LinearProgram:
    """The master over the given tree columns (module docstring); ``capacity`` per link.

    ``labels`` (:mod:`formulations.names`, every GPU a root): rows ``r_<root>`` and
    ``cap_<tail>_<head>``, columns ``x`` and ``t_<root>_<k>`` (the root's ``k``-th tree
    column, in column order)."""
    capacity = np.asarray(capacity, dtype=float)
    if (capacity <= 0).any() or not np.isfinite(capacity).all():
        raise FormulationError("link capacities must be positive and finite")
    n_links = capacity.size
    starts, indices, values = tree_columns(n_roots, col_root, col_start, col_arcs)
    if indices.size and indices.max() >= n_roots + n_links:
        raise FormulationError("a tree column crosses a link index outside the capacity vector")
    k = starts.size - 1
    x_col = (np.arange(n_roots), np.ones(n_roots))
    data = np.concatenate([x_col[1], values])
    rows = np.concatenate([x_col[0], indices])
    ptr = np.concatenate([[0], n_roots + starts]).astype(np.int64)
    A = sp.csc_matrix((data, rows, ptr), shape=(n_roots + n_links, k + 1)).tocsr()
    c = np.zeros(k + 1)
    c[0] = 1.0
    cols = rows = None
    if labels is not None:
        if len(labels.gpu) != n_roots or len(labels.link) != n_links:
            raise FormulationError(f"labels name {len(labels.gpu)} GPUs and {len(labels.link)} "
                                   f"links, the master has {n_roots} roots and {n_links} links")
        cols = ["x"] + numbered("t", labels.gpu, col_root)
        rows = [f"r_{g}" for g in labels.gpu] + labels.capacity_rows()
    return LinearProgram(
        c=c, A=A, row_lo=np.full(n_roots + n_links, -np.inf),
        row_hi=np.concatenate([np.zeros(n_roots), capacity]),
        col_lo=np.zeros(k + 1), col_hi=np.full(k + 1, np.inf), sense="max",
        col_names=cols, row_names=rows, name="allgather_tree_master")
