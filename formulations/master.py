"""The restricted master problem of AllToAll column generation (paper §4.2, App. G.4).

We use *path* columns (one ``s -> d`` route each) and the rate's reciprocal ``t = 1/z``
as the objective (Charnes-Cooper form of ``max z``)::

    min  t
    s.t. sum_{j in P(p)} y_j              >= 1      for every ordered GPU pair p   (pair rows)
         sum_j beta_aj y_j - cap_a · t    <= 0      for every link a             (capacity rows)
         y, t >= 0

``y_j`` is the share of pair ``p``'s block routed on path ``j``; a pair's shares are
``y_j / sum y``.  Why this form:

* path columns are sparse (one pair row plus the path's links), where the paper's tree
  columns are dense (``N-1`` paths each) and make warm simplex pivots expensive; the
  pair-row master has the same LP optimum as the tree master, since a tree's weight
  splits into its ``N-1`` paths and paths of one source combine back into trees
  (both describe the per-source arc-flow polytope of App. G.4);
* in ``t``-form, fixing a whole number of chunks during rounding is a column *bound*
  (``y_j >= k/K``), not a row involving the rate, so the same model serves column
  generation and the deep dive;
* the pair rows have right-hand side 1, so ``z = 1/t`` comes out directly.

Column 0 is ``t``; rows ``0..P-1`` are pair rows, rows ``P..P+L-1`` capacity rows.
Depends on numpy/scipy only.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .errors import FormulationError
from .lp import LinearProgram
from .names import FabricLabels, numbered

__all__ = ["build_master_lp", "path_columns"]


def path_columns(n_pairs: int, col_pair: np.ndarray, col_start: np.ndarray,
                 col_arcs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSC block (starts, row indices, values) of path columns: a 1 in the pair row and a
    1 in the capacity row of each link on the path (``beta_aj = 1``: paths are simple)."""
    col_pair = np.asarray(col_pair, dtype=np.int64)
    col_start = np.asarray(col_start, dtype=np.int64)
    col_arcs = np.asarray(col_arcs, dtype=np.int64)
    k = col_pair.size
    if col_start.shape != (k + 1,) or col_start[-1] != col_arcs.size:
        raise FormulationError("col_start must have one entry per column plus the end offset")
    if k and (col_pair.min() < 0 or col_pair.max() >= n_pairs):
        raise FormulationError(f"column pair index outside 0..{n_pairs - 1}")
    lengths = np.diff(col_start)
    starts = col_start + np.arange(k + 1)            # one extra entry (the pair row) per column
    indices = np.empty(col_arcs.size + k, dtype=np.int64)
    pos = starts[:-1]
    indices[pos] = col_pair
    mask = np.ones(indices.size, dtype=bool)
    mask[pos] = False
    # row indices sorted inside each column: the pair row first, then the links sorted
    order = np.lexsort((col_arcs, np.repeat(np.arange(k), lengths)))
    indices[mask] = n_pairs + col_arcs[order]
    return starts, indices, np.ones(indices.size)


def build_master_lp(n_pairs: int, capacities: np.ndarray, col_pair: np.ndarray,
                    col_start: np.ndarray, col_arcs: np.ndarray,
                    col_lo: np.ndarray | None = None,
                    background: np.ndarray | None = None,
                    labels: FabricLabels | None = None) -> LinearProgram:
    """The restricted master LP above over the given path columns (``col_lo``: lower
    bounds of the path shares, e.g. chunks fixed by rounding; default 0).

    ``background`` (per link, default 0) gives the capacity rows
    ``sum beta y - cap_a t <= -background_a``: a master over some pairs only (numbered
    ``0..n_pairs-1`` here), the other pairs' fixed routes loading the links (warm local
    re-optimisation).

    ``labels`` (:mod:`formulations.names`; a master over every ordered pair): rows
    ``d_<src>_<dst>`` (a pair's demand) and ``cap_<tail>_<head>``, columns ``t`` and
    ``p_<src>_<dst>_<k>`` (the pair's ``k``-th path column, in column order)."""
    capacities = np.asarray(capacities, dtype=float)
    if (capacities <= 0).any():
        raise FormulationError("capacities must be > 0")
    n_links = capacities.size
    starts, indices, values = path_columns(n_pairs, col_pair, col_start, col_arcs)
    k = starts.size - 1
    t_rows = n_pairs + np.arange(n_links)
    all_starts = np.concatenate([[0], n_links + starts])
    A = sp.csc_matrix((np.concatenate([-capacities, values]),
                       np.concatenate([t_rows, indices]), all_starts),
                      shape=(n_pairs + n_links, k + 1)).tocsr()
    c = np.zeros(k + 1)
    c[0] = 1.0
    lo = np.zeros(k + 1)
    if col_lo is not None:
        lo[1:] = np.asarray(col_lo, dtype=float)
    link_hi = np.zeros(n_links) if background is None else -np.asarray(background, dtype=float)
    row_lo = np.concatenate([np.ones(n_pairs), np.full(n_links, -np.inf)])
    row_hi = np.concatenate([np.full(n_pairs, np.inf), link_hi])
    lp = LinearProgram(c, A, row_lo, row_hi, lo, np.full(k + 1, np.inf), sense="min",
                       name="alltoall-master")
    if labels is not None:
        lp.col_names, lp.row_names = _names(labels, n_pairs, n_links, col_pair)
    return lp


def _names(labels: FabricLabels, n_pairs: int, n_links: int,
           col_pair: np.ndarray) -> tuple[list[str], list[str]]:
    """Column and row names of :func:`build_master_lp` (its docstring)."""
    pairs = labels.ordered_pairs()
    if len(pairs) != n_pairs or len(labels.link) != n_links:
        raise FormulationError(f"labels name {len(pairs)} pairs and {len(labels.link)} links, "
                               f"the master has {n_pairs} pair rows and {n_links} links")
    return ["t"] + numbered("p", pairs, col_pair), [f"d_{p}" for p in pairs] + labels.capacity_rows()
