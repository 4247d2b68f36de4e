"""The few-trees packing split along tight sets (:mod:`mccl_opt.allgather.forestcoll.
packing.contraction`; docs/allgather_history.md "Groups joined by tight links: the packing split
along tight sets").

Groups of GPUs whose ingress is exactly the trees rooted outside them (a dragonfly's
groups behind their global cables) must be found as tight sets, and the packing built
from the contracted (outer) packing and one inner packing per group must be a packing of
the whole graph: ``k`` spanning arborescences per root within every link's units; a graph
one unit short of admitting ``k`` gets ``None``."""

from __future__ import annotations

import numpy as np
import pytest

import mccl_opt as mo
from instances.aggregation import leaf_spine
from instances.designs import dragonfly
from mccl_opt.allgather.forestcoll.packing import few_trees as ft
from mccl_opt.allgather.forestcoll.packing.contraction import (Problem, maximal_tight_sets,
                                                                minimal_tight_sets)
from mccl_opt.allgather.forestcoll.packing.few_trees import few_trees_pack
from mccl_opt.allgather.forestcoll.removal.splitting import LogicalGraph
from tests.oracle_allgather import check_schedule, cut_bound
from tests.test_allgather_few_trees import _assert_packing, _exact_logical


def _grouped(groups: int, size: int, k: int, seed: int) -> LogicalGraph:
    """GPUs in ``groups`` groups of ``size``: every ordered pair inside a group linked with
    ample units, and from each group to each other one ``k·size`` units spread over a few
    random links, so every group's ingress is exactly ``k`` times the GPUs outside it."""
    rng = np.random.default_rng(seed)
    n = groups * size
    tail, head, units = [], [], []
    for g in range(groups):
        nodes = range(g * size, (g + 1) * size)
        for u in nodes:
            for v in nodes:
                if u != v:
                    tail.append(u), head.append(v), units.append(k * n)
        for h in range(groups):
            if h == g:
                continue
            cuts = np.sort(rng.choice(np.arange(1, k * size), 2, replace=False))
            for amount in np.diff(np.concatenate([[0], cuts, [k * size]])):
                tail.append(g * size + int(rng.integers(size)))
                head.append(h * size + int(rng.integers(size)))
                units.append(int(amount))
    arr = [np.array(x, np.int64) for x in (tail, head, units)]
    return LogicalGraph(n, arr[0], arr[1], arr[2], [[] for _ in tail])


def _problem(lg: LogicalGraph, k: int) -> Problem:
    return Problem(lg.num_gpus, lg.tail, lg.head, lg.units, np.full(lg.num_gpus, k, np.int64),
                   np.arange(lg.units.size, dtype=np.int64))


@pytest.mark.parametrize("k, seed", [(1, 0), (3, 1), (2, 2)])
def test_groups_are_found_and_their_packings_combine(k, seed, monkeypatch):
    """The groups are the tight sets; the combined packing is valid (classes cut into
    pieces where an entry link or an inner class runs out), with multiplicities."""
    lg = _grouped(3, 4, k, seed)
    sets = minimal_tight_sets(_problem(lg, k), np.zeros(2, np.int64))
    assert sorted(map(tuple, sets)) == [tuple(range(g * 4, g * 4 + 4)) for g in range(3)]
    grown: list[int] = []
    real = ft._grow
    monkeypatch.setattr(ft, "_grow",
                        lambda p, checks, near: grown.append(p.n) or real(p, checks, near))
    classes = few_trees_pack(lg.num_gpus, lg.tail, lg.head, lg.units, k)
    assert classes is not None
    assert sorted(grown) == [3, 5, 5, 5]          # the outer packing and three inner ones
    _assert_packing(lg, k, classes)


def test_a_group_one_unit_short_is_refused():
    """One unit less into a group: no packing exists (the rooted condition fails there),
    so neither the tight-set search nor the packing may return one."""
    lg = _grouped(3, 4, 2, 3)
    cross = np.flatnonzero(lg.tail // 4 != lg.head // 4)
    lg.units[cross[0]] -= 1
    assert not lg.admits(2)
    assert minimal_tight_sets(_problem(lg, 2), np.zeros(2, np.int64)) is None
    assert few_trees_pack(lg.num_gpus, lg.tail, lg.head, lg.units, 2) is None


def test_dragonfly_packs_exactly_at_the_cut_bound():
    """Dragonfly 4x2x1x8 (64 GPUs): one tree per root and every group's three global
    cables tight, so the repair packer gets stuck and the few-trees packing, split along
    the four groups, packs the schedule at the cut bound."""
    topo = dragonfly(4, 2, 1, 8)
    s = mo.solve_allgather(topo, max_chunks=None)
    assert s.stats["packing"] == "exact" and s.stats["k"] == 1
    check_schedule(topo, s, None)
    assert mo.validate(topo, s).rate_gbps == pytest.approx(s.rate_gbps, rel=1e-9)
    assert s.rate_gbps == pytest.approx(cut_bound(topo), rel=1e-9)


def test_a_tight_graph_is_split_along_its_largest_tight_sets(monkeypatch):
    """Leaf-spine 2x2x8's exact split at ``None`` (41 trees per root) is tight: every rank
    is its own minimal tight set, so :func:`minimal_tight_sets` finds nothing proper; its
    leaves have no slack and :func:`maximal_tight_sets` finds disjoint proper tight sets
    (slack computed here), along which the packing is grown in parts and combined into a
    packing of the whole graph."""
    lg, k = _exact_logical(leaf_spine(2, 2, 8), None)
    n = lg.num_gpus
    p = _problem(lg, k)
    assert minimal_tight_sets(p, np.zeros(2, np.int64)) == []
    sets = maximal_tight_sets(p, np.zeros(2, np.int64))
    assert len(sets) >= 2
    taken = np.zeros(n, bool)
    for members in sets:
        side = np.zeros(n, bool)
        side[members] = True
        assert 2 <= members.size <= n - 2 and not taken[members].any()
        taken |= side
        assert lg.units[side[lg.head] & ~side[lg.tail]].sum() == k * (n - members.size)
    grown: list[int] = []
    real = ft._grow
    monkeypatch.setattr(ft, "_grow",
                        lambda p, checks, near: grown.append(p.n) or real(p, checks, near))
    classes = few_trees_pack(n, lg.tail, lg.head, lg.units, k)
    assert classes is not None and max(grown) < n
    _assert_packing(lg, k, classes)
