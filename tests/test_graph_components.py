"""Weak and strong components of the synthesizers' own kernels against scipy's
``connected_components`` (an independent implementation) on random directed graphs."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

from mccl_opt.graph_components import strong_components, weak_components


def _random_graph(seed: int) -> tuple[int, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    m = int(rng.integers(0, 3 * n))
    return n, rng.integers(0, n, m), rng.integers(0, n, m)


def _same_partition(a: np.ndarray, b: np.ndarray) -> bool:
    """Do two labelings group the nodes the same way?"""
    pairs = set(zip(a.tolist(), b.tolist()))
    return len(pairs) == len(set(a.tolist())) == len(set(b.tolist()))


def _first_node_order(label: np.ndarray) -> bool:
    """Are the labels numbered in the order of each component's smallest node?"""
    _, first = np.unique(label, return_index=True)
    return bool(np.all(np.diff(first) > 0)) and label[0] == 0


@pytest.mark.parametrize("seed", range(60))
def test_components_match_scipy(seed):
    n, tail, head = _random_graph(seed)
    adj = coo_matrix((np.ones(tail.size), (tail, head)), shape=(n, n))
    want_weak = connected_components(adj, directed=True, connection="weak")[1]
    count, want_strong = connected_components(adj, directed=True, connection="strong")
    weak = weak_components(n, tail, head)
    got_count, strong = strong_components(n, tail, head)
    np.testing.assert_array_equal(weak, want_weak)      # both number by smallest node
    assert got_count == count
    assert _same_partition(strong, want_strong)
    assert _first_node_order(strong) and _first_node_order(weak)


def test_cycle_and_chain():
    # 0 -> 1 -> 2 -> 0 is one strong component; 3 -> 4 is two; 5 is alone
    tail, head = np.array([0, 1, 2, 3]), np.array([1, 2, 0, 4])
    count, strong = strong_components(6, tail, head)
    assert count == 4 and strong.tolist() == [0, 0, 0, 1, 2, 3]
    assert weak_components(6, tail, head).tolist() == [0, 0, 0, 1, 1, 2]


def test_deep_path_does_not_recurse():
    n = 200_000                        # a recursive search would overflow the stack
    tail, head = np.arange(n - 1), np.arange(1, n)
    count, _ = strong_components(n, np.append(tail, n - 1), np.append(head, 0))
    assert count == 1
    assert weak_components(n, tail, head).max() == 0
