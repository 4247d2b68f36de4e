"""Certified sparse minimum arborescences (mccl_opt.allgather.general.sparse_arborescence)
against the dense kernel: the same minimum cost, a spanning tree of the dense digraph,
and the certificate rejecting what the kept in-edges cannot settle."""

from __future__ import annotations

import numpy as np
import pytest

from mccl_opt.allgather.general.arborescence import min_arborescences
from mccl_opt.errors import InputError
from mccl_opt.allgather.general.sparse_arborescence import (
    _candidates, _edmonds, _sparse_trees, _stride, _violations, min_arborescences_sparse)


def _tied(rng: np.random.Generator, g: int) -> np.ndarray:
    """Hosts of 4 GPUs: free inside a host, a few priced levels across, many ties, some
    missing edges (the quotient's pricing matrices look like this)."""
    host = np.arange(g) // 4
    D = np.where(host[:, None] == host[None, :], 0.0,
                 rng.integers(0, 3, (g, g)).astype(float) * 0.25 + (host[:, None] % 2) * 0.5)
    D[rng.random((g, g)) < 0.05] = np.inf
    np.fill_diagonal(D, 0.0)
    return D


@pytest.mark.parametrize("seed", range(6))
def test_equals_the_dense_minimum_and_spans(seed):
    rng = np.random.default_rng(seed)
    g = int(rng.integers(6, 40))
    D = _tied(rng, g) if seed % 2 else rng.random((g, g)) * (rng.random((g, g)) > 0.1)
    roots = np.arange(g)
    _, dense = min_arborescences(D, roots)
    for k in (1, 3):
        parents, costs = min_arborescences_sparse(D.T, roots, k)
        for i, r in enumerate(roots):
            assert costs[i] == pytest.approx(dense[i], rel=1e-12, abs=1e-12)
            if not np.isfinite(dense[i]):
                continue
            assert parents[i, r] == -1
            assert sum(D[parents[i, v], v] for v in range(g) if v != r) == \
                pytest.approx(costs[i], rel=1e-12, abs=1e-12)
            for v in range(g):                   # every node walks up to the root
                u, steps = v, 0
                while u != r and steps <= g:
                    u, steps = parents[i, u], steps + 1
                assert u == r


def test_the_sparse_search_settles_most_roots_and_its_duals_certify():
    rng = np.random.default_rng(7)
    D = _tied(rng, 32)
    DT = np.ascontiguousarray(D.T)
    _, raw = _sparse_trees(DT, np.arange(32), 3, _stride(32))
    _, dense = min_arborescences(D, np.arange(32))
    settled = raw >= 0
    assert settled.sum() >= 16                   # the dense kernel is the exception
    assert np.allclose(raw[settled], dense[settled], rtol=1e-12, atol=1e-12)


def test_a_dual_from_too_few_edges_is_not_certified_and_names_the_edge_it_breaks():
    """At ``k = 1`` the kept in-edges (and the root's) miss the cheap way into {2, 3}:
    Edmonds on them pays 9 to enter, its dual's ``Y(2) = 9`` exceeds node 2's cheapest
    left-out edge (``1 -> 2`` at 2), and the violation check names that edge."""
    D = np.array([[0, 5, 9, 9], [5, 0, 2, 9], [9, 9, 0, 1], [9, 9, 1, 0]], float)
    DT = np.ascontiguousarray(D.T)
    src, w, thresh = _candidates(DT, 1, _stride(4))
    assert src[2, 0] == 3 and thresh[2] == 2.0
    keep = [(int(src[t, 0]), t, float(w[t, 0])) for t in (1, 2, 3)] + [(0, 2, 9.0), (0, 3, 9.0)]
    ea, eb, ew = (np.array(c) for c in zip(*keep))
    parent, setpar, ytop = np.empty(4, np.int64), np.empty(9, np.int64), np.empty(9)
    assert _edmonds(ea.astype(np.int64), eb.astype(np.int64), ew.astype(float), 4, 0,
                    parent, setpar, ytop)
    assert ytop[2] == pytest.approx(9.0) and ytop[2] > thresh[2]
    ex_src, ex_n = np.full((4, 2), -1, np.int64), np.zeros(4, np.int64)
    assert _violations(DT, src, thresh, 0, setpar, ytop, ex_src, ex_n) >= 1
    assert ex_n[2] == 1 and ex_src[2, 0] == 1
    _, costs = min_arborescences_sparse(DT, np.array([0]), 1)
    assert costs[0] == pytest.approx(5 + 2 + 1)


def test_negative_costs_go_to_the_dense_kernel_and_bad_input_is_rejected():
    D = np.array([[0, -1.0, 2], [3, 0, -2], [1, 4, 0]])
    parents, costs = min_arborescences_sparse(D.T, np.arange(3), 1)
    _, dense = min_arborescences(D, np.arange(3))
    assert np.array_equal(costs, dense)
    with pytest.raises(InputError):
        min_arborescences_sparse(np.full((3, 3), np.nan), np.arange(3))
    with pytest.raises(InputError):
        min_arborescences_sparse(np.ones((3, 3)), np.array([3]))
