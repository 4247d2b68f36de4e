"""The rank of trees as columns of the tree master's tight rows, and whether they are
linearly independent (:func:`.fewer_trees.master_pays`, paper §4.3's tree packing LP),
compiled: the Gram matrix of the columns from their sparse rows and its symmetric
elimination, a column whose pivot vanishes skipped as dependent (docs/allgather_history.md
"Exact split in batches; the independence check compiled", "A master only for a
quarter's gain").

Elementwise loops, not BLAS: OpenBLAS's threads spin on after a call (0.1-0.6 s CPU on a
shared 2-core machine for a 366-tree Cholesky of ~3 ms), and the numpy elimination with
scipy's sparse Gram took 80-115 ms on leaf-spine 8x2x8's 328-366 trees."""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["independent_columns", "column_rank", "PIVOT_TOL"]

#: a pivot of the elimination counts as zero at or below this share of the Gram
#: matrix's largest diagonal entry
PIVOT_TOL = 1e-9


def column_rank(roots: np.ndarray, tree_ptr: np.ndarray, tree_links: np.ndarray,
                row_of_link: np.ndarray, num_rows: int) -> int:
    """The rank over the reals of the columns (one per tree ``c``: 1 at row ``roots[c]``,
    plus 1 at row ``row_of_link[l]`` for each link ``l`` of
    ``tree_links[tree_ptr[c]:tree_ptr[c+1]]`` whose row is not -1, repeats summed): the
    pivots of the Gram matrix's symmetric elimination above :data:`PIVOT_TOL` of its
    largest diagonal entry."""
    gram = _gram(np.asarray(roots, np.int64), np.asarray(tree_ptr, np.int64),
                 np.asarray(tree_links, np.int64), np.asarray(row_of_link, np.int64),
                 int(num_rows))
    return int(_rank(gram, PIVOT_TOL))


def independent_columns(roots: np.ndarray, tree_ptr: np.ndarray, tree_links: np.ndarray,
                        row_of_link: np.ndarray, num_rows: int) -> bool:
    """Whether the columns of :func:`column_rank` are linearly independent (their rank
    is their number)."""
    return column_rank(roots, tree_ptr, tree_links, row_of_link, num_rows) == len(roots)


@njit(cache=True)
def _gram(roots, tree_ptr, tree_links, row_of_link, num_rows):
    """The lower triangle (and diagonal) of ``Mᵀ M`` for the columns of
    :func:`independent_columns`, from the rows' entries (columns in order, counts)."""
    cols = roots.size
    count = np.zeros(num_rows + 1, np.int64)
    for c in range(cols):
        count[roots[c] + 1] += 1
        for p in range(tree_ptr[c], tree_ptr[c + 1]):
            r = row_of_link[tree_links[p]]
            if r >= 0:
                count[r + 1] += 1
    start = np.cumsum(count)
    fill = start[:-1].copy()
    col = np.empty(start[-1], np.int64)
    for c in range(cols):                       # every row's entries in column order
        col[fill[roots[c]]] = c
        fill[roots[c]] += 1
        for p in range(tree_ptr[c], tree_ptr[c + 1]):
            r = row_of_link[tree_links[p]]
            if r >= 0:
                col[fill[r]] = c
                fill[r] += 1
    gram = np.zeros((cols, cols))
    ids = np.empty(cols, np.int64)
    vals = np.empty(cols)
    for r in range(num_rows):
        size = 0
        for p in range(start[r], start[r + 1]):  # a column's repeats are adjacent: summed
            if size > 0 and ids[size - 1] == col[p]:
                vals[size - 1] += 1.0
            else:
                ids[size] = col[p]
                vals[size] = 1.0
                size += 1
        for a in range(size):
            for b in range(a + 1):
                gram[ids[a], ids[b]] += vals[a] * vals[b]
    return gram


@njit(cache=True)
def _rank(gram, tol_share):
    """The rank of the symmetric positive semi-definite ``gram`` (its lower triangle;
    overwritten): the pivots of its elimination, in order, above ``tol_share`` of its
    largest diagonal entry.  A pivot at or below that is skipped: the column is then a
    combination of the earlier ones (in a semi-definite matrix a zero pivot's column is
    zero below it, so nothing is eliminated with it)."""
    n = gram.shape[0]
    top = 0.0
    for j in range(n):
        top = max(top, gram[j, j])
    tol = tol_share * top
    below = np.empty(n)
    rank = 0
    for j in range(n):
        pivot = gram[j, j]
        if not pivot > tol:
            continue
        rank += 1
        for a in range(j + 1, n):
            below[a] = gram[a, j]
        for a in range(j + 1, n):
            f = below[a] / pivot
            for b in range(j + 1, a + 1):
                gram[a, b] -= f * below[b]
    return rank
