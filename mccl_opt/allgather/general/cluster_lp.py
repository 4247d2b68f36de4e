"""One cluster's LP of the sparse copies: a vertex of the column fractions over the
cluster's elements (docs/allgather_history.md "Fewer copies of the quotient's trees" and
"The cluster LP on cosets, then on their elements").

Cluster ``c`` moves disjoint links, so a copy's load on a moved link, and its root where
``c`` moves it, depend on the copy's element of ``c`` alone.  The LP over masses
``f[T, e] >= 0`` (``sum_e f[T, e] = 1``) asks every moved link's load to stay at most its
capacity (or the uniform marginal's load where that is higher) and every moved rank's
share to equal the uniform marginal's.  Two facts make it cheap:

* *Cosets.*  The uniform marginal is invariant under any subgroup ``K`` of the cluster's
  group, so the LP restricted to ``K``-invariant masses (uniform on each coset ``eK``) is
  feasible, and its rows are one per ``K``-orbit of links and ranks: a coset ``eK`` puts
  ``z_T |{a in T: e(a) in O}| / |O|`` on every link of the orbit ``O``.  Shared
  aggregation 2x32x8, a cluster ``Z_31 x Z_7`` with ``K = Z_7``: 329 x 372 with 5 k
  nonzeros instead of 1 301 x 2 604 with 1.16 M.  Its vertex is exact (the rows are the
  full LP's, merged where equal); each positive coset is ``|K|`` copies.
* *Majority entries.*  A column's fractions sum to 1, so subtracting ``m`` times that
  row from a link row (``m``: the entry most of the column's variables share there, a
  tree that crosses most links of an orbit in most images) changes no solution and
  clears most of the row: 350 k -> 64 k nonzeros on shared aggregation 2x16x8.

The full LP is then solved on the elements of the positive cosets only, which holds the
coset vertex, so it is feasible, and its vertex has no more positive masses than rows.
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
from .permutation_group import cycle_order
from .symmetry import Symmetry

__all__ = ["Marginals", "cluster_marginals", "MAX_CLUSTER_NONZEROS"]

#: a vertex that holds every scaled row within this is kept as the LP solver gives it
_POLISH_TOL = 1e-12
#: a scaled row within this of its bound is held by the re-solve (:func:`_polished`)
_HELD_TOL = 1e-9
_SEED = 0x5EED
#: the LP on the positive cosets' elements is not solved past this many nonzeros (after
#: the majority entries are cleared): the coset vertex's copies are kept then
#: (docs/allgather.md "The cluster LP on cosets, then on their elements")
MAX_CLUSTER_NONZEROS = 200_000
#: an LP with more nonzeros than this is *large*: the LPs on cosets run before it and its
#: majority entries are cleared (each step costs some milliseconds, more than it saves
#: on fat-tree 4x2x2x8's nine clusters of ~20 k nonzeros)
LARGE_NONZEROS = 50_000


class Marginals(NamedTuple):
    """One cluster's positive masses, by column: column, element of the cluster, mass."""

    col: np.ndarray
    elem: np.ndarray
    mass: np.ndarray


@dataclass(frozen=True)
class _Images:
    """Cluster ``c``'s images of every column: the links and ranks it moves, per column
    how many of its links are moved ones, every element's image of those links (columns
    in order; ``(elements, crossings)``) and of every column's root (``(elements,
    columns)``), and the uniform marginal's load on every link and share of every rank."""

    moved: np.ndarray
    moved_rank: np.ndarray
    lengths: np.ndarray
    image: np.ndarray
    root_image: np.ndarray
    load: np.ndarray
    share: np.ndarray

    @property
    def starts(self) -> np.ndarray:
        return np.cumsum(self.lengths) - self.lengths


class _Rows(NamedTuple):
    """The rows of an LP over a subgroup ``K``'s cosets: per link and rank its row (-1
    where the cluster does not move it) and its ``K``-orbit's size."""

    link_row: np.ndarray
    link_size: np.ndarray
    rank_row: np.ndarray
    rank_size: np.ndarray
    links: int
    ranks: int


def _images(topo: Topology, sym: Symmetry, c: int, roots: np.ndarray, trees: list[np.ndarray],
            z: np.ndarray) -> _Images:
    """:class:`_Images` of cluster ``c`` for the columns ``trees`` of weights ``z``."""
    arr, n_links = topo.arrays, topo.num_links
    nodes, links = sym.nodes[c], sym.links[c]
    moved = np.flatnonzero((links != np.arange(n_links)).any(axis=0))
    is_moved = np.zeros(n_links, bool)
    is_moved[moved] = True
    moved_rank = np.flatnonzero((nodes[:, arr.gpu_nodes] != arr.gpu_nodes).any(axis=0))
    own = [t[is_moved[t]] for t in trees]
    lengths = np.array([t.size for t in own], np.int64)
    image = links[:, np.concatenate(own)]
    root_image = arr.rank_of[nodes[:, arr.gpu_nodes[roots]]]
    return _Images(moved, moved_rank, lengths, image, root_image,
                   _spread(links.min(axis=0), image[0], np.repeat(z, lengths)),
                   _spread(arr.rank_of[nodes[:, arr.gpu_nodes].min(axis=0)], root_image[0], z))


def _spread(orbit: np.ndarray, items: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """The uniform marginal's total ``weight`` of ``items`` on each member of their orbits
    (``orbit``: each one's least member): the group's elements carry an item onto every
    member of its orbit equally often."""
    total = np.bincount(orbit[items], weight, orbit.size)
    return total[orbit] / np.bincount(orbit, minlength=orbit.size)[orbit]


def _rows(im: _Images, link_orbit: np.ndarray, rank_orbit: np.ndarray) -> _Rows:
    """One row per orbit (labelled by its least member) of the moved links and ranks."""
    def numbered(orbit: np.ndarray, moved: np.ndarray, offset: int) -> tuple[np.ndarray, int]:
        heads = np.unique(orbit[moved])
        row = np.full(orbit.size, -1, np.int64)
        row[moved] = offset + np.searchsorted(heads, orbit[moved])
        return row, heads.size

    link_row, links = numbered(link_orbit, im.moved, 0)
    rank_row, ranks = numbered(rank_orbit, im.moved_rank, links)
    return _Rows(link_row, np.bincount(link_orbit, minlength=link_orbit.size)[link_orbit],
                 rank_row, np.bincount(rank_orbit, minlength=rank_orbit.size)[rank_orbit],
                 links, ranks)


def _variables(im: _Images, link_key: np.ndarray, rank_key: np.ndarray, allowed: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
    """One variable per column and distinct image among the ``allowed`` (columns,
    elements) pairs (its moved crossings' multiset of ``link_key`` values and its root's
    ``rank_key``, told apart by additive random 64-bit hashes): ``(column, element)``,
    by column."""
    rng = np.random.default_rng(_SEED)                  # sums wrap mod 2^64
    link_values = rng.integers(0, 2**63, int(link_key.max()) + 1, dtype=np.uint64)
    rank_values = rng.integers(0, 2**63, int(rank_key.max()) + 2, dtype=np.uint64)
    col, elem = np.nonzero(allowed)
    sig = rank_values[rank_key[im.root_image[elem, col]] + 1]       # -1: a rank not moved
    if im.lengths.sum():
        used = np.flatnonzero(allowed.any(axis=0))
        image = im.image if used.size == im.image.shape[0] else im.image[used]
        crossing = link_values[link_key][image]               # (used elements, crossings)
        row = np.searchsorted(used, elem)
        some = im.lengths > 0
        per = np.zeros((crossing.shape[0], im.lengths.size), np.uint64)
        per[:, some] = np.add.reduceat(crossing, im.starts[some], axis=1)
        sig = sig + per[row, col]
    order = np.lexsort((sig, col))
    first = np.ones(order.size, bool)
    first[1:] = (col[order][1:] != col[order][:-1]) | (sig[order][1:] != sig[order][:-1])
    keep = np.sort(order[first])
    return col[keep], elem[keep]


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The positions ``starts[i] .. starts[i] + lengths[i] - 1``, concatenated."""
    offset = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return np.arange(int(lengths.sum())) + offset


def _matrix(im: _Images, rows: _Rows, z: np.ndarray, col: np.ndarray, elem: np.ndarray
            ) -> sp.csr_matrix:
    """The LP's matrix in load units: a variable's load on its link rows (``z_T`` per
    crossing over the orbit's size), share on its root row, and 1 on its column's row."""
    lengths = im.lengths[col]
    var_of = np.repeat(np.arange(col.size), lengths)
    link = im.image[elem[var_of], _ranges(im.starts[col], lengths)]
    root = im.root_image[elem, col]
    root_row = rows.rank_row[root]
    has_root = np.flatnonzero(root_row >= 0)
    free = rows.links + rows.ranks
    return sp.csr_matrix(
        (np.concatenate([z[col[var_of]] / rows.link_size[link],
                         z[col[has_root]] / rows.rank_size[root[has_root]], np.ones(col.size)]),
         (np.concatenate([rows.link_row[link], root_row[has_root], free + col]),
          np.concatenate([var_of, has_root, np.arange(col.size)]))),
        shape=(free + im.lengths.size, col.size))


def _majority_cleared(a: sp.csr_matrix, links: int, col: np.ndarray) -> tuple[sp.csr_matrix, np.ndarray]:
    """``a`` with, per column ``T`` and link row, the entry that most of ``T``'s variables
    share there (more than half, zeros counted) subtracted times ``T``'s row of
    fractions (module docstring), and per link row the total subtracted."""
    coo = a.tocoo()
    on = coo.row < links
    r, v, x = coo.row[on], coo.col[on], coo.data[on]
    t = col[v]
    order = np.lexsort((x, t * links + r))
    t, r, x = t[order], r[order], x[order]
    new = np.ones(t.size, bool)
    new[1:] = (t[1:] != t[:-1]) | (r[1:] != r[:-1]) | (x[1:] != x[:-1])
    start = np.flatnonzero(new)
    count = np.diff(np.append(start, t.size))
    size = np.bincount(col, minlength=int(col.max(initial=-1)) + 1)
    major = start[2 * count > size[t[start]]]
    shift = np.bincount(r[major], x[major], a.shape[0])
    if major.size == 0:
        return a, shift
    first = np.searchsorted(col, t[major])                   # ``col`` sorted: T's variables
    n = size[t[major]]
    clear = sp.csr_matrix((np.repeat(-x[major], n), (np.repeat(r[major], n), _ranges(first, n))),
                          shape=a.shape)
    out = (a + clear).tocsr()
    out.eliminate_zeros()
    return out, shift


def _solved(im: _Images, rows: _Rows, z: np.ndarray, capacity: np.ndarray, col: np.ndarray,
            elem: np.ndarray, backend: str, max_nonzeros: float) -> np.ndarray | None:
    """The fractions of a vertex of the LP over the variables ``(col, elem)`` on ``rows``,
    its rows scaled to their bounds near 1, re-solved on the rows it holds (the LP
    solver's 1e-7 tolerance would cost rate); ``None`` past ``max_nonzeros`` or when the
    LP solver returns no vertex."""
    a = _matrix(im, rows, z, col, elem)
    shift = np.zeros(a.shape[0])
    if a.nnz > LARGE_NONZEROS:
        a, shift = _majority_cleared(a, rows.links, col)
    if a.nnz > max_nonzeros:
        return None
    head = np.full(rows.links + rows.ranks, -1, np.int64)     # a member link / rank per row
    head[rows.link_row[im.moved]] = im.moved
    head[rows.rank_row[im.moved_rank]] = im.moved_rank
    link, rank = head[:rows.links], head[rows.links:]
    scale = np.concatenate([1.0 / capacity[link], 1.0 / np.where(im.share[rank] > 0, im.share[rank], 1.0),
                            np.ones(im.lengths.size)])
    hi = np.concatenate([(np.maximum(capacity[link], im.load[link]) - shift[:rows.links]),
                         im.share[rank], np.ones(im.lengths.size)]) * scale
    lo = np.concatenate([np.full(rows.links, -np.inf), hi[rows.links:]])
    a = (sp.diags(scale) @ a).tocsr()
    f = _vertex(a, lo, hi, backend)
    return None if f is None else _polished(a, hi, rows.links, f)


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
    held = np.concatenate([load[:free] >= hi[:free] - _HELD_TOL, np.ones(hi.size - free, bool)])
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


def _factor_orders(nodes: np.ndarray) -> list[int]:
    """The orders ``k_1, k_2, ...`` of the generators whose products
    :func:`.permutation_group.elements` listed as ``nodes``: element ``sum_i e_i
    k_1 ... k_(i-1)`` is ``g_1^e_1 g_2^e_2 ...``, so ``g_i`` is the element at index
    ``k_1 ... k_(i-1)``."""
    out, step = [], 1
    while step < nodes.shape[0]:
        out.append(cycle_order(nodes[step]))
        step *= out[-1]
    return out


def _coset_rows(topo: Topology, sym: Symmetry, c: int, im: _Images, members: np.ndarray) -> _Rows:
    """The rows of the LP on the cosets of the subgroup of elements ``members``."""
    link_orbit = sym.links[c][members].min(axis=0)
    rank_orbit = topo.arrays.rank_of[sym.nodes[c][members][:, topo.arrays.gpu_nodes]].min(axis=0)
    return _rows(im, link_orbit, rank_orbit)


def _on_cosets(topo: Topology, sym: Symmetry, c: int, im: _Images, z: np.ndarray,
               capacity: np.ndarray, backend: str) -> Marginals | None:
    """The masses of the vertex with the fewest positive ones (each coset's spread over
    its elements) of the LPs on the cosets of each generator's cyclic subgroup ``K``
    (module docstring); ``None`` when the cluster has one generator or no LP is solved."""
    orders = _factor_orders(sym.nodes[c])
    index = np.arange(sym.nodes[c].shape[0])
    best: Marginals | None = None
    for i, k in enumerate(orders if len(orders) > 1 else []):
        stride = int(np.prod(orders[:i]))
        members = np.arange(k) * stride                     # K = <g_i>
        rows = _coset_rows(topo, sym, c, im, members)
        heads = np.zeros((im.lengths.size, index.size), bool)
        heads[:, index // stride % k == 0] = True           # a coset by its element e_i = 0
        col, elem = _variables(im, rows.link_row, rows.rank_row, heads)
        f = _solved(im, rows, z, capacity, col, elem, backend, np.inf)
        if f is None:
            continue
        pos = np.flatnonzero(f > 0)
        if best is None or pos.size * k < best.col.size:
            best = Marginals(np.repeat(col[pos], k), (elem[pos][:, None] + members).ravel(),
                             np.repeat(f[pos] * z[col[pos]] / k, k))
    return best


def cluster_marginals(topo: Topology, sym: Symmetry, c: int, roots: np.ndarray,
                      trees: list[np.ndarray], z: np.ndarray, capacity: np.ndarray,
                      backend: str) -> Marginals | None:
    """The positive masses (summing to each column's weight ``z``) of a vertex of cluster
    ``c``'s LP (module docstring) on the elements of the best coset vertex's positive
    cosets (all elements where the cluster has one generator); the coset vertex's when
    that LP has more than :data:`MAX_CLUSTER_NONZEROS` nonzeros or is not solved;
    ``None`` when neither is."""
    im = _images(topo, sym, c, roots, trees, z)
    rows = _rows(im, np.arange(topo.num_links), np.arange(topo.num_gpus))
    allowed = np.ones((len(trees), sym.nodes[c].shape[0]), bool)
    col, elem = _variables(im, rows.link_row, rows.rank_row, allowed)
    coarse = None
    if int(im.lengths[col].sum()) > LARGE_NONZEROS:
        coarse = _on_cosets(topo, sym, c, im, z, capacity, backend)
    if coarse is not None:
        allowed[:] = False
        allowed[coarse.col, coarse.elem] = True
        col, elem = _variables(im, rows.link_row, rows.rank_row, allowed)
    f = _solved(im, rows, z, capacity, col, elem, backend, MAX_CLUSTER_NONZEROS)
    if f is None:
        return coarse
    on = np.flatnonzero(f > 0)
    return Marginals(col[on], elem[on], f[on] * z[col[on]])
