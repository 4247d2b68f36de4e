"""Phase 2's array split (``mccl_opt.allgather.forestcoll.removal.spread``) against the dictionary form.

The oracle below splits every switch pair by pair with ``SplitGraph.split`` (the
spread proposal's amounts computed here with plain dictionaries and sets, siblings
included); the array split must
give the same logical graph: the same links, units and bundles (paths and units, in
order).  Independently of the oracle, every bundle segment must be a real switch path
from its link's tail GPU to its head GPU, and no physical link may carry more units
than it had.  Fabrics: HPN with its failures, and random ones with switch-to-switch
links (bundles of several paths), direct GPU links and one-way links (unbalanced
switches, with and without balancing first).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from instances import fail1, fail2, fail3, hpn
from mccl_opt.allgather.forestcoll.maxflow import INF
from mccl_opt.allgather.forestcoll.removal.bundles import Bundles
from mccl_opt.allgather.forestcoll.pipeline import balanced_split, phase_one_budget
from mccl_opt.allgather.forestcoll.removal.balancing import balance_switches
from mccl_opt.allgather.forestcoll.removal.splitting import (LogicalGraph, SplitGraph, simple_path,
                                                             switch_order)
from mccl_opt.allgather.forestcoll.removal.siblings import SwitchNeighbours
from mccl_opt.allgather.forestcoll.removal.spread import _walk, spread_split
from mccl_opt.allgather.forestcoll.removal.transport import transport


def reference_spread(g: SplitGraph, rank_of: np.ndarray) -> LogicalGraph:
    """The spread proposal on a copy of ``g``, one ``SplitGraph.split`` per pair;
    sibling pairs (ends cabled to a common switch other than ``w`` in ``g`` as given)
    held back to the last two stages."""
    g = g.copy()
    switches: dict[int, set[int]] = {v: set() for v in range(g.n)}
    for a, b in g.units:
        for v, x in ((a, b), (b, a)):
            if g.is_switch[x]:
                switches[v].add(x)
    for w in switch_order(g):
        ins, outs = g.in_arcs(w), g.out_arcs(w)
        us, ts = [a for a, _ in ins], [b for _, b in outs]
        a_u = np.array([g.units[a] for a in ins], np.int64)
        b_t = np.array([g.units[b] for b in outs], np.int64)
        pairs = [(i, j) for i in range(len(us)) for j in range(len(ts)) if us[i] != ts[j]]
        tail = np.array([i for i, _ in pairs], np.int64)
        col = np.array([j for _, j in pairs], np.int64)
        out_of = {t: j for j, t in enumerate(ts)}
        rest = np.array([max(int(a_u.sum()) - (b_t[out_of[u]] if u in out_of else 0), 1)
                         for u in us], np.int64)
        first = [-(-int(a_u[i]) * int(b_t[j]) // int(rest[i])) for i, j in pairs]
        sib = [bool((switches[us[i]] & switches[ts[j]]) - {w}) for i, j in pairs]
        stages = [np.array(first, np.int64), None]
        if any(sib):
            apart = [np.array([0 if s else x for s, x in zip(sib, first)], np.int64),
                     np.array([0 if s else INF for s in sib], np.int64)]
            stages = apart + stages
        supply, demand = a_u.copy(), b_t.copy()
        amounts = transport(len(us), len(ts), tail, col, supply, demand, stages,
                            np.array([out_of.get(u, -1) for u in us], np.int64))
        for (i, j), amount in zip(pairs, amounts.tolist()):
            g.split(us[i], w, ts[j], amount)
        for u in us:                             # loops and unpaired units vanish
            if (u, w) in g.units:
                g.reduce((u, w), g.units[(u, w)])
        for t in ts:
            if (w, t) in g.units:
                g.reduce((w, t), g.units[(w, t)])
    return LogicalGraph.from_split(g, rank_of)


def assert_same(lg: LogicalGraph, ref: LogicalGraph) -> None:
    assert isinstance(lg.bundles, Bundles)
    np.testing.assert_array_equal(lg.tail, ref.tail)
    np.testing.assert_array_equal(lg.head, ref.head)
    np.testing.assert_array_equal(lg.units, ref.units)
    assert list(lg.bundles) == list(ref.bundles)


def assert_physical(lg: LogicalGraph, g: SplitGraph, rank_of: np.ndarray) -> None:
    """Every segment a simple switch path tail GPU -> head GPU over links of ``g``
    (physical ones: ``g`` as it was before the split), within every link's units; a
    link's units are its segments' sum."""
    b = lg.bundles
    np.testing.assert_array_equal(np.add.reduceat(b.units, b.start[:-1]) if b.units.size
                                  else b.units, lg.units)
    assert (b.units > 0).all()
    load: dict[tuple[int, int], int] = {}
    paths = b.paths()
    for i in range(len(b)):
        for s in range(b.start[i], b.start[i + 1]):
            path = paths[s]
            assert rank_of[path[0]] == lg.tail[i] and rank_of[path[-1]] == lg.head[i]
            assert len(set(path)) == len(path) and g.is_switch[list(path[1:-1])].all()
            for hop in zip(path[:-1], path[1:]):
                load[hop] = load.get(hop, 0) + int(b.units[s])
    assert all(hop in g.units and amount <= g.units[hop] for hop, amount in load.items())


def split_of(topo) -> tuple[SplitGraph, np.ndarray]:
    budget = phase_one_budget(topo, 10, {})
    balanced = balanced_split(budget.fab, topo.arrays.is_switch, budget.k, budget.y, 10)
    return balanced.split, topo.arrays.rank_of


@pytest.mark.parametrize("topo", [hpn(1, 2, 8), fail1(hpn(2, 2, 4)), fail2(hpn(2, 3, 4)),
                                  fail3(hpn(2, 2, 4))], ids=lambda t: t.name)
def test_array_split_equals_reference_on_hpn(topo):
    g, rank_of = split_of(topo)
    before = g.copy()
    lg = spread_split(g, rank_of)
    assert g.units == before.units and g.bundles == before.bundles      # input untouched
    assert_same(lg, reference_spread(g, rank_of))
    assert_physical(lg, g, rank_of)


def random_split(seed: int) -> tuple[SplitGraph, np.ndarray]:
    """GPUs on random switches (switch-to-switch cables, so logical links can ride
    several paths), a few direct GPU links, random units per direction, some one-way."""
    rng = np.random.default_rng(seed)
    n_gpu, n_sw = int(rng.integers(3, 9)), int(rng.integers(1, 5))
    n = n_gpu + n_sw
    units: dict[tuple[int, int], int] = {}

    def cable(a: int, b: int) -> None:
        for x, y in ((a, b), (b, a)):
            if rng.random() < 0.9:
                units[(x, y)] = int(rng.integers(1, 10))

    for v in range(n_gpu):
        for s in rng.choice(n_sw, size=int(rng.integers(1, n_sw + 1)), replace=False):
            cable(v, n_gpu + int(s))
    for s in range(n_sw):
        for r in range(s + 1, n_sw):
            if rng.random() < 0.6:
                cable(n_gpu + s, n_gpu + r)
    for _ in range(int(rng.integers(0, 3))):
        a, b = rng.choice(n_gpu, size=2, replace=False)
        cable(int(a), int(b))
    keys = sorted(units)
    is_switch = np.arange(n) >= n_gpu
    g = SplitGraph.from_links(n, np.array([a for a, _ in keys]), np.array([b for _, b in keys]),
                              np.array([units[x] for x in keys]), is_switch,
                              np.arange(n_gpu), int(rng.integers(1, 4)))
    rank_of = np.where(is_switch, -1, np.arange(n))
    return g, rank_of


@pytest.mark.parametrize("seed", range(40))
def test_array_split_equals_reference_on_random_fabrics(seed):
    g, rank_of = random_split(seed)
    if seed % 2:
        balance_switches(g)                 # even seeds: unbalanced switches kept
    lg = spread_split(g, rank_of)
    assert_same(lg, reference_spread(g, rank_of))
    assert_physical(lg, g, rank_of)


def test_random_fabrics_exercise_multipath_bundles():
    """The random fabrics above do reach bundles of several paths and merged pieces."""
    multi = 0
    for seed in range(40):
        g, rank_of = random_split(seed)
        lg = spread_split(g, rank_of)
        multi += int((np.diff(lg.bundles.start) > 1).sum())
    assert multi > 0


def test_bundles_list_view_round_trips():
    lists = [[[(0, 5, 1), 2], [(0, 6, 7, 1), 3]], [[(1, 5, 0), 4]], []]
    b = Bundles.from_lists(lists)
    assert len(b) == 3 and list(b) == lists and b[1] == lists[1]
    assert b.paths() == [(0, 5, 1), (0, 6, 7, 1), (1, 5, 0)]
    np.testing.assert_array_equal(b.start, [0, 2, 3, 3])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 6), min_size=1, max_size=4),
       st.lists(st.integers(0, 6), min_size=1, max_size=4))
def test_walk_cuts_cycles_like_simple_path(head, tail):
    """The kernel's walk through switch 9 is the simple path of the concatenation."""
    p_in, p_out = tuple(head) + (9,), (9,) + tuple(tail)
    buf = np.array(p_in + p_out + (-1,) * (len(p_in) + len(p_out)), np.int64)
    top = len(p_in) + len(p_out)
    length = _walk(buf, top, 0, len(p_in), len(p_in), len(p_out))
    assert tuple(buf[top: top + length].tolist()) == simple_path(p_in + p_out[1:])


@pytest.mark.parametrize("seed", range(4))
def test_siblings_are_ends_cabled_to_a_common_other_switch(seed):
    """:class:`SwitchNeighbours` against sets of each node's switches, on random graphs
    (repeated cables, switch-switch links, nodes with no switch)."""
    rng = np.random.default_rng(seed)
    for _ in range(25):
        n = int(rng.integers(3, 25))
        is_switch = rng.random(n) < 0.4
        tail, head = rng.integers(0, n, 60), rng.integers(0, n, 60)
        tail, head = tail[tail != head], head[tail != head]
        switches: dict[int, set[int]] = {v: set() for v in range(n)}
        for a, b in zip(tail.tolist(), head.tolist()):
            for v, x in ((a, b), (b, a)):
                if is_switch[x]:
                    switches[v].add(x)
        w = int(rng.integers(0, n))
        us = rng.choice(n, int(rng.integers(1, n)), replace=False)
        ts = rng.choice(n, int(rng.integers(1, n)), replace=False)
        i, j = np.nonzero(np.ones((us.size, ts.size), bool))
        got = SwitchNeighbours(n, tail, head, is_switch).siblings(w, us, ts, i, j)
        want = [bool((switches[int(us[a])] & switches[int(ts[b])]) - {w}) for a, b in zip(i, j)]
        assert got.tolist() == want


def test_a_failing_sample_of_sinks_proves_the_rooted_test_fails():
    """``admits(k, stride)`` tests every ``stride``-th rank only: a ``False`` holds for the
    whole test (the sampled sink's cut is a cut), and a graph that passes passes it;
    ``passed=stride`` after a sample that passed tests the other sinks, which together
    decide the whole test."""
    sampled_fails = rest_fails = 0
    for seed in range(10):
        g, rank_of = random_split(seed)
        lg = spread_split(g, rank_of)
        for k in (1, 2, 3, 5):
            whole = lg.admits(k)
            for stride in (2, 3):
                sample = lg.admits(k, stride)
                assert sample or not whole
                sampled_fails += not sample
                if sample:
                    assert lg.admits(k, passed=stride) == whole
                    rest_fails += not whole
            assert lg.admits(k, passed=1)            # every sink passed already
    assert sampled_fails > 0 and rest_fails > 0
