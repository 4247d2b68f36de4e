"""Depths of trees given by parent ranks: the one depth routine of the AllGather phases.

A tree over ``n`` GPU ranks is a row ``parent[v]`` (the parent rank of ``v``, ``-1`` at
the root); an edge runs at the depth of its tail (docs/modelling.md, paper §4.2), so a
tree's depth is the largest number of hops from its root.  Logical classes
(:mod:`.packing.trees`), mapped physical trees (:mod:`.mapping`) and rerouted forests
(:mod:`~mccl_opt.allgather.warm.previous.forest`) all reduce to such rows.  (The validator keeps its own depth count,
``TreeChunk.depths``, so that it stays independent of the synthesizer.)
"""

from __future__ import annotations

import numpy as np
from numba import njit

__all__ = ["rank_depths", "max_depths", "spanning_depths", "parent_ranks"]


@njit(cache=True)
def fill_depths(parents, depth):
    """Fill ``depth`` with every rank's hops below the parentless rank its parent
    links lead to; ``False`` if some rank's links run in a cycle instead."""
    n = parents.size
    depth[:] = -1
    for v in range(n):
        d, w = 0, v                      # climb to a rank of known depth
        while w >= 0 and depth[w] < 0:
            d += 1
            if d > n:
                return False
            w = parents[w]
        base, w = (-1 if w < 0 else depth[w]), v
        while w >= 0 and depth[w] < 0:   # write the depths on the way up
            depth[w] = base + d
            d -= 1
            w = parents[w]
    return True


@njit(cache=True)
def _all_depths(parents):
    out = np.empty(parents.shape, parents.dtype)
    for t in range(parents.shape[0]):
        fill_depths(parents[t], out[t])
    return out


@njit(cache=True)
def _spanning(parents, roots):
    num_trees, n = parents.shape
    out = np.full(num_trees, -1, np.int64)
    depth = np.empty(n, np.int64)
    for t in range(num_trees):
        if (parents[t] < 0).sum() == 1 and parents[t, roots[t]] < 0 \
                and fill_depths(parents[t], depth):
            out[t] = depth.max()
    return out


def rank_depths(parents: np.ndarray) -> np.ndarray:
    """Depth of every rank in every tree (rows of parent ranks, ``-1`` at the root;
    int32 rows stay int32)."""
    parents = np.ascontiguousarray(parents)
    return _all_depths(parents if parents.dtype == np.int32 else parents.astype(np.int64))


def max_depths(parents: np.ndarray) -> np.ndarray:
    """Depth of every tree (rows of parent ranks)."""
    return rank_depths(parents).max(axis=1)


def spanning_depths(parents: np.ndarray, roots: np.ndarray) -> np.ndarray:
    """Per tree: its depth, or -1 unless every rank reaches ``roots[t]`` through parent
    links (a rank without a parent or on a cycle, or a root with a parent)."""
    return _spanning(np.ascontiguousarray(parents, np.int64), np.asarray(roots, np.int64))


def parent_ranks(parent_arcs: np.ndarray, tail: np.ndarray) -> np.ndarray:
    """Parent ranks of trees given by the logical links into every rank (``-1``: none;
    the dtype of ``tail``)."""
    parent_arcs = np.asarray(parent_arcs)
    return np.where(parent_arcs >= 0, tail[np.maximum(parent_arcs, 0)], -1)
