"""Tree-master columns as a tree table (mccl_opt.allgather.general.tree_table): the same
trees as the arcs say, edges parents first, depths, distinct paths once."""

from __future__ import annotations

import numpy as np
import pytest

from instances import hpn
from mccl_opt.allgather.general.tree_colgen import mwu_trees
from mccl_opt.allgather.general.tree_table import column_edges, distinct_rows, tree_chunks
from mccl_opt.errors import SolveError


def _edges_by_arcs(topo, arcs):
    """The node-id paths of a column's edges, cut where an arc reaches a GPU."""
    arr, ids = topo.arrays, [v.id for v in topo.nodes]
    out, cur = [], []
    for a in arcs.tolist():
        cur = cur or [ids[arr.tail[a]]]
        cur.append(ids[arr.head[a]])
        if not arr.is_switch[arr.head[a]]:
            out.append(tuple(cur))
            cur = []
    return out


@pytest.mark.parametrize("shape", [(1, 2, 4), (2, 2, 2)])
def test_tree_chunks_are_the_columns_trees_parents_first(shape):
    topo = hpn(*shape).with_capacity({("s0h0g1", "s0h0nvs"): 150.0})
    roots, trees = mwu_trees(topo, topo.arrays.capacity, 3)
    owner = np.asarray(roots, np.int64)
    lengths = np.array([t.size for t in trees])
    shares = np.linspace(0.1, 0.9, owner.size)
    chunks, depth = tree_chunks(topo, owner, lengths, np.concatenate(trees), shares)
    assert len(chunks) == len(trees)
    for c, r, t, f, d in zip(chunks, roots, trees, shares, depth.tolist()):
        assert c.src == topo.gpus[r] and c.share == f
        assert sorted(c.edges) == sorted(_edges_by_arcs(topo, t))
        depths = c.depths()
        assert len(depths) == topo.num_gpus and max(depths.values()) == d
        heads = [depths[e[-1]] for e in c.edges]
        assert heads == sorted(heads)                       # parents first
    paths = list(chunks.table.paths)
    assert len(set(paths)) == len(paths)                    # each path once


def test_a_column_that_is_no_spanning_tree_is_refused():
    topo = hpn(1, 2, 2)
    roots, trees = mwu_trees(topo, topo.arrays.capacity, 1)
    bad = np.concatenate([trees[0], trees[0]])            # every GPU reached twice
    with pytest.raises(SolveError):
        column_edges(topo, np.array(roots[:1]), np.array([bad.size]), bad)


@pytest.mark.parametrize("shape,high,n", [((400, 9), 160, 160), ((300, 20), 3, 3),
                                          ((50, 2), 2**40, 2**40), ((0, 3), 2, 2)])
def test_distinct_rows_as_numpy_unique(shape, high, n):
    rng = np.random.default_rng(0)
    rows = rng.integers(-1, high, shape)
    m = rows[1::3].shape[0]
    rows[::3][:m] = rows[1::3]                             # repeated rows
    _, first, which = np.unique(rows, axis=0, return_index=True, return_inverse=True)
    got_first, got_which = distinct_rows(rows, n)
    assert np.array_equal(got_first, first) and np.array_equal(got_which, which.reshape(-1))
