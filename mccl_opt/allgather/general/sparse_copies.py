"""Fewer copies of the symmetric quotient's trees at the same rate (docs/allgather_history.md
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
   re-solved on the rows it holds, so that the LP solver's tolerance costs no rate.  A
   large cluster's LP is solved on the cosets of a subgroup first, then on the positive
   cosets' elements only (:mod:`.cluster_lp`);
2. per column, the north-west-corner coupling of its marginals: at most
   ``sum_c |support_c| - clusters + 1`` copies, every link load at most its capacity and
   every root's share the uniform expansion's, so the same rate (fat-tree 4x2x2x8: 534
   copies).

The caller re-rates the schedule from its own loads and keeps the uniform copies when
it falls short (:func:`.quotient.solve_quotient`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mccl_opt.topology import Topology
from .cluster_lp import Marginals, cluster_marginals
from .symmetry import Symmetry

__all__ = ["Copies", "Marginals", "uniform_copies", "sparse_copies"]

#: cut points of one column's marginals closer than this (relative) are one cut
_CUT_TOL = 1e-12


@dataclass(frozen=True)
class Copies:
    """Copies of the positive quotient columns: copy ``i`` is column ``column[i]``
    (non-decreasing) moved by the element ``elements[which[i]]`` (one index per cluster),
    at ``frac[i]`` of the column's weight (each column's fractions sum to 1)."""

    column: np.ndarray
    elements: np.ndarray
    which: np.ndarray
    frac: np.ndarray


def uniform_copies(columns: int, pieces: list[tuple[tuple[int, ...], float]]) -> Copies:
    """Every column over every piece of :meth:`.symmetry.Symmetry.pieces`."""
    n = len(pieces)
    elements = np.array([e for e, _ in pieces], np.int64).reshape(n, -1)
    weight = np.array([f for _, f in pieces])
    return Copies(np.repeat(np.arange(columns), n), elements, np.tile(np.arange(n), columns),
                  np.tile(weight, columns))


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
    docstring); ``None`` when a cluster's LP is not solved (:mod:`.cluster_lp`)."""
    per_cluster = []
    for c in range(len(sym.nodes)):
        found = cluster_marginals(topo, sym, c, roots, trees, z, capacity, backend)
        if found is None:
            return None
        per_cluster.append(found)
    column, picks, frac = _coupled(per_cluster, len(trees))
    elements, which = np.unique(picks, axis=0, return_inverse=True)
    return Copies(column, elements, which.reshape(-1), frac)
