"""Fewer copies of the symmetric quotient's trees at the same rate (docs/allgather.md
"Fewer copies of the quotient's trees").

The expansion (:mod:`.expansion`) copies every positive quotient column ``T`` (weight
``z``) over the group's pieces, a coupling of every cluster's uniform distribution:
``|pieces|`` trees per column (fat-tree 4x2x2x8 one way: 69 columns x 134 pieces,
9 174 trees).  Clusters move disjoint links and a GPU at most once, so a copy
``h(T)``'s load on a link moved by cluster ``c`` and, where ``c`` moves the root, its
root depend on ``h``'s element of ``c`` alone: the link loads and root shares depend on
each cluster's *marginal* only, not on how the marginals are coupled.  So:

1. per cluster ``c``, a vertex of the LP over masses ``mu[T, e] >= 0`` on ``c``'s
   elements (one variable per distinct image of ``T``'s links moved by ``c`` and root;
   ``sum_e mu[T, e] = z_T``; every moved link's load at most its capacity, or the
   uniform marginal's load where that is higher; every moved root's share equal to the
   uniform marginal's).  The uniform marginal is feasible, so the LP is; a vertex has at
   most as many positive masses as rows (moved links + moved roots + columns); it is
   re-solved on the rows it holds, so that the LP solver's tolerance costs no rate;
2. per column, the north-west-corner coupling of its marginals: at most
   ``sum_c |support_c| - clusters + 1`` copies, every link load at most its capacity and
   every root's share the uniform expansion's, so the same rate (fat-tree 4x2x2x8: 534
   copies).

The caller re-rates the schedule from its own loads and keeps the uniform copies when
it falls short (:func:`.quotient.solve_quotient`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
from scipy.sparse.linalg import splu

from formulations.lp import LinearProgram
from mccl_opt import anytime
from mccl_opt.backends import SolveStatus, get_backend
from mccl_opt.topology import Topology
from .symmetry import Symmetry

__all__ = ["Copies", "uniform_copies", "sparse_copies"]

#: cut points of one column's marginals closer than this (relative) are one cut
_CUT_TOL = 1e-12
#: a vertex that holds every scaled row within this is kept as the LP solver gives it
_POLISH_TOL = 1e-12
_SEED = 0x5EED
#: a cluster LP with more nonzeros than this is not solved (the uniform copies then):
#: its dual simplex grows faster than the trees it saves (shared aggregation one way,
#: NIC 50 Gbps: 2x8x8 110 k nonzeros 0.09 s; 2x16x8 258 k 0.9 s, 3 320 -> 865 trees;
#: 2x32x8 1.16 M 5.2 s + 954 k 3.1 s, 4 424 -> 1 514 trees on a 0.44 s solve;
#: docs/allgather.md "Sparse copies past 200 000 nonzeros")
MAX_CLUSTER_NONZEROS = 200_000


@dataclass(frozen=True)
class Copies:
    """Copies of the positive quotient columns: copy ``i`` is column ``column[i]``
    (non-decreasing) moved by the element ``elements[which[i]]`` (one index per cluster),
    at ``frac[i]`` of the column's weight (each column's fractions sum to 1)."""

    column: np.ndarray
    elements: np.ndarray
    which: np.ndarray
    frac: np.ndarray


class Marginals(NamedTuple):
    """One cluster's positive masses, by column: column, element of the cluster, mass."""

    col: np.ndarray
    elem: np.ndarray
    mass: np.ndarray


def uniform_copies(columns: int, pieces: list[tuple[tuple[int, ...], float]]) -> Copies:
    """Every column over every piece of :meth:`.symmetry.Symmetry.pieces`."""
    n = len(pieces)
    elements = np.array([e for e, _ in pieces], np.int64).reshape(n, -1)
    weight = np.array([f for _, f in pieces])
    return Copies(np.repeat(np.arange(columns), n), elements, np.tile(np.arange(n), columns),
                  np.tile(weight, columns))


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The positions ``starts[i] .. starts[i] + lengths[i] - 1``, concatenated."""
    offset = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return np.arange(int(lengths.sum())) + offset


def _images(topo: Topology, sym: Symmetry, c: int, roots: np.ndarray, trees: list[np.ndarray]
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Cluster ``c``'s images of every column: ``(links and ranks the cluster moves,
    per column how many of its links are moved ones, every element's image of those
    links (columns in order), every element's image of every column's root)``."""
    arr, n_links = topo.arrays, topo.num_links
    nodes, links = sym.nodes[c], sym.links[c]
    moved = np.flatnonzero((links != np.arange(n_links)).any(axis=0))
    is_moved = np.zeros(n_links, bool)
    is_moved[moved] = True
    moved_rank = np.flatnonzero((nodes[:, arr.gpu_nodes] != arr.gpu_nodes).any(axis=0))
    own = [t[is_moved[t]] for t in trees]
    lengths = np.array([t.size for t in own], np.int64)
    return (moved, moved_rank, lengths, links[:, np.concatenate(own)],
            arr.rank_of[nodes[:, arr.gpu_nodes[roots]]])


def _variables(image: np.ndarray, root_image: np.ndarray, lengths: np.ndarray,
               n_values: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One LP variable per column and distinct image (its moved crossings' multiset and
    root, told apart by additive random 64-bit hashes): ``(column, element, how many
    elements give that image)``."""
    values = np.random.default_rng(_SEED).integers(0, 2**63, n_values + root_image.max() + 1,
                                                   dtype=np.uint64)     # sums wrap mod 2^64
    sig = values[n_values + root_image].T                   # (columns, elements)
    some = np.flatnonzero(lengths > 0)
    if some.size:                                           # each column's run of crossings
        starts = np.cumsum(lengths)[some] - lengths[some]
        sig[some] += np.add.reduceat(values[image], starts, axis=1).T
    order = np.argsort(sig, axis=1, kind="stable")          # per column, its elements by image
    ranked = np.take_along_axis(sig, order, axis=1)
    new = np.ones(ranked.shape, bool)
    new[:, 1:] = ranked[:, 1:] != ranked[:, :-1]
    col, at = np.nonzero(new)                               # the first element of each image
    bounds = np.append(np.flatnonzero(new.ravel()), new.size)
    return col, order[col, at], np.diff(bounds)


def _cluster_marginals(topo: Topology, sym: Symmetry, c: int, roots: np.ndarray,
                       trees: list[np.ndarray], z: np.ndarray, capacity: np.ndarray,
                       backend: str) -> Marginals | None:
    """The positive masses of a vertex of cluster ``c``'s LP (module docstring, step 1) on
    column fractions, every row scaled to its bound near 1 (the LP solver's tolerances
    relative), masses summing to each column's weight; ``None`` when the LP has more than
    :data:`MAX_CLUSTER_NONZEROS` nonzeros or the LP solver does not return a vertex."""
    moved, moved_rank, lengths, image, root_image = _images(topo, sym, c, roots, trees)
    col, elem, count = _variables(image, root_image, lengths, topo.num_links)
    link_row = np.full(topo.num_links, -1, np.int64)
    link_row[moved] = np.arange(moved.size)
    root_row = np.full(topo.num_gpus, -1, np.int64)
    root_row[moved_rank] = moved.size + np.arange(moved_rank.size)
    free = moved.size + moved_rank.size                     # then the columns' own rows
    at = _ranges(np.cumsum(lengths)[col] - lengths[col], lengths[col])
    var_of = np.repeat(np.arange(col.size), lengths[col])
    root_at = root_row[root_image[elem, col]]
    has_root = np.flatnonzero(root_at >= 0)
    rows = np.concatenate([link_row[image[elem[var_of], at]], root_at[has_root], free + col])
    cols = np.concatenate([var_of, has_root, np.arange(col.size)])
    a = sp.csr_matrix((np.where(rows >= free, 1.0, z[col][cols]), (rows, cols)),
                      shape=(free + lengths.size, col.size))
    if a.nnz > MAX_CLUSTER_NONZEROS:
        return None
    uniform = a @ (count / image.shape[0])
    scale = np.ones(uniform.size)
    scale[:moved.size] = 1.0 / capacity[moved]
    scale[moved.size:free] = 1.0 / np.where(uniform[moved.size:free] > 0,
                                            uniform[moved.size:free], 1.0)
    a = (sp.diags(scale) @ a).tocsr()
    uniform *= scale
    hi = np.concatenate([np.maximum(1.0, uniform[:moved.size]), uniform[moved.size:]])
    lo = np.concatenate([np.full(moved.size, -np.inf), uniform[moved.size:]])
    f = _vertex(a, lo, hi, backend)
    if f is None:
        return None
    mass = _polished(a, hi, moved.size, f) * z[col]
    on = np.flatnonzero(mass > 0)                           # by column (``col`` sorted)
    return Marginals(col[on], elem[on], mass[on])


def _vertex(a: sp.csr_matrix, lo: np.ndarray, hi: np.ndarray, backend: str
            ) -> np.ndarray | None:
    """A vertex of ``{f >= 0: lo <= a f <= hi}``: a zero objective by the dual simplex
    (every basis is dual feasible), no presolve (0.07 s against 0.2-0.3 s with it, or
    0.12 s by the primal simplex, on a cluster of shared aggregation 2x8x8 one way:
    361 rows, 1 568 columns); ``None`` when the solver does not return one (also
    at a time limit: the uniform copies are exact, this is a finishing touch)."""
    if not anytime.lp_room():                  # it would return past the limit
        return None
    with get_backend(backend, presolve=False) as lp:
        lp.load(LinearProgram(c=np.zeros(a.shape[1]), A=a, row_lo=lo, row_hi=hi,
                              col_lo=np.zeros(a.shape[1]), col_hi=np.full(a.shape[1], np.inf),
                              sense="min"))
        sol = lp.solve(method="dual", time_limit=anytime.lp_time_limit())
    if sol.status is not SolveStatus.OPTIMAL or sol.x is None:
        return None
    return np.maximum(np.asarray(sol.x, float), 0.0)


def _polished(a: sp.csr_matrix, hi: np.ndarray, free: int, f: np.ndarray) -> np.ndarray:
    """The vertex ``f`` of ``{f >= 0: a f <= hi, rows from free on: a f = hi}`` with its
    positive entries re-solved on the rows it holds at their bound (least squares by
    the normal equations, sparse LU and one refinement step): the LP solver meets rows
    within its tolerance (1e-7), and HPN 2x8x8 one way lost 9e-11 of its rate to it.
    ``f`` itself where it already holds every row within :data:`_POLISH_TOL` (7 of the 9
    clusters of fat-tree 4x2x2x8 one way), or when the re-solve is singular or breaks a
    row or a sign."""
    load = a @ f
    if _row_error(load - hi, free) <= _POLISH_TOL:
        return f
    on = np.flatnonzero(f > 0)
    held = np.concatenate([load[:free] >= hi[:free] * (1 - 1e-9), np.ones(hi.size - free, bool)])
    m = a[held][:, on].tocsc()
    try:
        lu = splu((m.T @ m).tocsc())
    except RuntimeError:                   # singular: not a vertex's support
        return f
    out = f.copy()
    for _ in range(2):                     # the solve, then one refinement step
        out[on] += lu.solve(m.T @ (hi[held] - m @ out[on]))
    if (out[on] < 0).any():
        return f
    return out if _row_error(a @ out - hi, free) <= _row_error(load - hi, free) else f


def _row_error(excess: np.ndarray, free: int) -> float:
    """The largest excess of a row over its bound: rows before ``free`` may be below it,
    the others are equalities."""
    return max(float(np.max(excess[:free], initial=0.0)), float(np.abs(excess[free:]).max(initial=0.0)))


def _grouped_searchsorted(group: np.ndarray, values: np.ndarray, q_group: np.ndarray,
                          q_values: np.ndarray) -> np.ndarray:
    """Per query, ``np.searchsorted`` (left) of ``q_values[i]`` among the entries of group
    ``q_group[i]`` of ``values`` (sorted by group, then value), as an index into
    ``values``."""
    is_entry = np.concatenate([np.zeros(q_group.size, np.int64), np.ones(group.size, np.int64)])
    order = np.lexsort((is_entry, np.concatenate([q_values, values]),
                        np.concatenate([q_group, group])))
    before = np.cumsum(is_entry[order]) - is_entry[order]
    out = np.empty(q_group.size, np.int64)
    query = order[is_entry[order] == 0]
    out[query] = before[is_entry[order] == 0]
    return out


def _coupled(marginals: list[Marginals], columns: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The north-west-corner coupling of every column's per-cluster marginals: ``(column
    per copy, element per copy and cluster, fraction per copy)``, copies by column."""
    cums, ends = [], []
    for m in marginals:                                     # per column fractions, cumulated
        size = np.bincount(m.col, minlength=columns)
        running = np.cumsum(m.mass / np.bincount(m.col, weights=m.mass, minlength=columns)[m.col])
        end = np.cumsum(size)
        before = np.concatenate([[0.0], running])[end - size]       # the earlier columns'
        cums.append(running - before[m.col])
        ends.append(end)
    inner = [np.flatnonzero(np.diff(m.col) == 0) for m in marginals]   # a column's last: 1
    group = np.concatenate([np.arange(columns), np.arange(columns),
                            *[m.col[i] for m, i in zip(marginals, inner)]])
    value = np.concatenate([np.zeros(columns), np.ones(columns),
                            *[cs[i] for cs, i in zip(cums, inner)]])
    order = np.lexsort((value, group))
    group, value = group[order], value[order]
    first = np.concatenate([[True], group[1:] != group[:-1]])
    keep = first | (np.concatenate([[0.0], np.diff(value)]) > _CUT_TOL)
    group, value = group[keep], value[keep]
    last = np.concatenate([group[1:] != group[:-1], [True]])
    value[last] = 1.0
    seg = np.flatnonzero(~last)                             # a cut and the next, one column
    column, mid = group[seg], (value[seg] + value[seg + 1]) / 2
    picks = [m.elem[np.minimum(_grouped_searchsorted(m.col, cs, column, mid), end[column] - 1)]
             for m, cs, end in zip(marginals, cums, ends)]
    return column, np.stack(picks, axis=1), value[seg + 1] - value[seg]


def sparse_copies(topo: Topology, sym: Symmetry, roots: np.ndarray, trees: list[np.ndarray],
                  z: np.ndarray, capacity: np.ndarray, backend: str) -> Copies | None:
    """Copies of the columns ``trees`` (roots ``roots``, weights ``z > 0``, capacities
    ``capacity`` in ``z``'s units) on sparse marginals coupled per column (module
    docstring); ``None`` when a cluster's LP is too large or not solved."""
    per_cluster = []
    for c in range(len(sym.nodes)):
        found = _cluster_marginals(topo, sym, c, roots, trees, z, capacity, backend)
        if found is None:
            return None
        per_cluster.append(found)
    column, picks, frac = _coupled(per_cluster, len(trees))
    elements, which = np.unique(picks, axis=0, return_inverse=True)
    return Copies(column, elements, which.reshape(-1), frac)
