"""The general method's column generation when the LP solver returns tree weights below
zero (within its feasibility tolerance): the returned trees must still reach the
returned rate (docs/allgather_history.md "General method", *weights below zero*).

Found by the AllGather fuzz (superpod 2x4x8 scrambled, one NIC uplink at 20 Gbps one
way, ``max_chunks=None``): a weight of -8e-8 clipped to zero on a tree crossing a
400 Gbps link many times left the cold schedule 1.2e-5 below its own LP rate, and below
a warm solve of the same fabric.  That solve takes 16 s, so the test makes a solver
return such a point on a small fabric.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from instances import hpn
from mccl_opt.allgather.general.method import rate_scale
from mccl_opt.allgather.general import tree_colgen
from mccl_opt.allgather.general.live_master import TreeMaster
from mccl_opt.allgather.general.tree_colgen import mwu_trees, tree_column_generation
from mccl_opt.backends import get_backend


class BelowZeroOnce:
    """A HiGHS backend whose first solve moves ``eps`` of weight from a tree of one root
    to another tree of that root crossing a saturated link, leaving ``-eps`` on the
    first: the rate and root totals are unchanged, only that link row moves by ``eps``
    times a crossing count (what a solver's feasibility tolerance allows)."""

    def __init__(self, capacity: np.ndarray, pool_of: list, eps: float) -> None:
        self.inner = get_backend("highs")
        self.capacity, self.pool_of, self.eps = capacity, pool_of, eps
        self.moved = False

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def solve(self, **kwargs):
        sol = self.inner.solve(**kwargs)
        if self.moved:
            return sol
        self.moved = True
        pool = self.pool_of[0]
        w = sol.x[1:]
        loads = pool.loads(np.maximum(w, 0.0), self.capacity.size)
        saturated = loads >= self.capacity * (1 - 1e-9)
        for i in np.flatnonzero(w > 0):
            crosses = pool.incidence(np.array([i]), self.capacity.size)[0]
            if not crosses[saturated].any():
                continue
            mates = np.flatnonzero((pool.root == pool.root[i]) & (w == 0))
            if mates.size:
                x = sol.x.copy()
                x[1 + i] += self.eps
                x[1 + mates[0]] -= self.eps
                return dataclasses.replace(sol, x=x)
        raise AssertionError("the test fabric has no tree to move weight to")


def test_trees_reach_the_rate_when_the_solver_returns_weights_below_zero(monkeypatch):
    topo = hpn(1, 2, 4).with_capacity(src="s0h1g3", dst="s0h1nvs", gbps=37.5)
    scale = rate_scale(topo)
    capacity = topo.arrays.capacity / scale
    roots, trees = mwu_trees(topo, capacity, rounds=50)
    first = tree_column_generation(topo, get_backend("highs"), capacity, roots, trees)
    start_roots = first.pool.root.tolist()
    start_trees = [first.pool.arcs[first.pool.start[j]:first.pool.start[j + 1]]
                   for j in range(len(first.pool))]
    pool_of: list = []
    backend = BelowZeroOnce(capacity, pool_of, eps=1e-6 * float(capacity.min()))

    def master(*args, **kwargs):                      # the pool the backend reads
        made = TreeMaster(*args, **kwargs)
        pool_of.append(made.pool)
        return made

    monkeypatch.setattr(tree_colgen, "TreeMaster", master)
    res = tree_column_generation(topo, backend, capacity, start_roots, start_trees)
    assert backend.moved
    loads = res.pool.loads(res.weights, capacity.size)
    assert (loads <= capacity * (1 + 1e-9)).all(), "the trees overload a link at the rate"
    totals = np.bincount(res.pool.root, weights=res.weights, minlength=topo.num_gpus)
    assert totals.min() >= res.rate * (1 - 1e-9)
    assert res.rate >= first.rate * (1 - 1e-9)


def test_round_cap_with_weights_below_zero_returns_the_trees_not_an_index_error(monkeypatch):
    """The round cap reached right after a round added columns: the re-solve without
    the trees below zero must use the mask of the grown pool (it raised ``IndexError``
    on a mask one round old), and the trees must still reach the returned rate."""
    topo = hpn(1, 4, 4).with_capacity(src="s0h1g3", dst="s0h1nvs", gbps=37.5)
    capacity = topo.arrays.capacity / rate_scale(topo)
    roots, trees = mwu_trees(topo, capacity, rounds=2)
    pool_of: list = []
    backend = BelowZeroOnce(capacity, pool_of, eps=1e-6 * float(capacity.min()))

    def master(*args, **kwargs):
        made = TreeMaster(*args, **kwargs)
        pool_of.append(made.pool)
        return made

    monkeypatch.setattr(tree_colgen, "TreeMaster", master)
    res = tree_column_generation(topo, backend, capacity, roots, trees,
                                 tree_colgen.TreeCGOptions(max_rounds=1))
    assert backend.moved and res.status == "round_limit"
    loads = res.pool.loads(res.weights, capacity.size)
    assert (loads <= capacity * (1 + 1e-9)).all()
    totals = np.bincount(res.pool.root, weights=res.weights, minlength=topo.num_gpus)
    assert totals.min() >= res.rate * (1 - 1e-9)
    assert res.bound >= res.rate
