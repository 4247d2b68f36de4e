"""The compiled independence check of the re-weighting to fewer trees
(:func:`mccl_opt.allgather.independence.independent_columns`) agrees with numpy: the
previous check (scipy's sparse Gram matrix, numpy's elimination) and the rank by SVD."""

from __future__ import annotations

import numpy as np
from scipy import sparse

from mccl_opt.allgather.independence import PIVOT_TOL, column_rank, independent_columns


def _columns(rng: np.random.Generator, cols: int, rows: int, roots: int, links: int):
    """``cols`` random trees: a root and 1-6 links (repeats allowed), a random subset of
    the links tight (rows after the roots')."""
    root = rng.integers(0, roots, cols)
    trees = [rng.integers(0, links, rng.integers(1, 7)) for _ in range(cols)]
    tight = rng.choice(links, size=rows - roots, replace=False)
    row = np.full(links, -1, np.int64)
    row[tight] = np.arange(tight.size) + roots
    return root, trees, row


def _dense(root, trees, row, rows: int) -> np.ndarray:
    matrix = np.zeros((rows, len(trees)))
    for c, (r, tree) in enumerate(zip(root, trees)):
        matrix[r, c] += 1
        for link in tree:
            if row[link] >= 0:
                matrix[row[link], c] += 1
    return matrix


def _numpy_check(matrix: np.ndarray) -> bool:
    """The previous check: scipy's sparse Gram matrix, then numpy's elimination."""
    m = sparse.csr_matrix(matrix)
    gram = (m.T @ m).toarray()
    tol = PIVOT_TOL * float(gram.diagonal().max(initial=0.0))
    for j in range(gram.shape[0]):
        pivot = gram[j, j]
        if not pivot > tol:
            return False
        below = gram[j + 1:, j]
        gram[j + 1:, j + 1:] -= np.multiply.outer(below / pivot, below)
    return True


def test_independence_agrees_with_numpy_and_the_rank():
    """200 random column sets (4-14 trees, 6-12 rows, links repeated), about half of them
    dependent: the compiled check, the numpy one and ``matrix_rank == columns`` agree, and
    the compiled rank is numpy's."""
    rng = np.random.default_rng(25)
    seen = set()
    for _ in range(200):
        rows = int(rng.integers(6, 13))
        cols = int(rng.integers(4, 15))
        root, trees, row = _columns(rng, cols, rows, 3, 16)
        ptr = np.concatenate([[0], np.cumsum([t.size for t in trees])])
        got = independent_columns(root, ptr, np.concatenate(trees), row, rows)
        matrix = _dense(root, trees, row, rows)
        assert got == _numpy_check(matrix) == (np.linalg.matrix_rank(matrix) == cols)
        assert column_rank(root, ptr, np.concatenate(trees), row, rows) == \
            np.linalg.matrix_rank(matrix)
        seen.add(got)
    assert seen == {True, False}


def test_a_repeated_tree_is_dependent():
    """Two copies of one tree are the same column; a root of its own separates them."""
    tree = np.array([0, 2, 2, 5], np.int64)
    row = np.array([2, -1, 3, -1, -1, 4], np.int64)
    ptr = np.array([0, 4, 8], np.int64)
    links = np.concatenate([tree, tree])
    assert not independent_columns(np.array([0, 0]), ptr, links, row, 5)
    assert independent_columns(np.array([0, 1]), ptr, links, row, 5)
