"""AllGather on the aggregation families (:mod:`instances.aggregation`) and the guarded spread
split (:mod:`mccl_opt.allgather.forestcoll.removal.cut_guard`, :mod:`mccl_opt.allgather.forestcoll.removal.guarded_spread`).

* every family at small sizes: the schedule validates (``mccl_opt.validate`` and the
  independent checker), its rate equals the independent cut bound at ``max_chunks=None``
  and does not change when nodes are renamed and relisted (``scrambled``);
* the guard: on fabrics where the plain spread split breaks the rooted cut condition,
  the guarded split's logical graph admits ``k`` trees per root and the exact packer
  packs it; the exchange keeps every in- and out-link's units and repairs the set it
  is given;
* the generators refuse bad sizes with a ``TopologyError``.
"""

from __future__ import annotations

import numpy as np
import pytest

import mccl_opt as mo
from instances.aggregation import (host_ring, host_torus, leaf_spine, multi_spine, scrambled,
                                   shared_aggregation, superpod)
from mccl_opt.allgather.canonical import canonical
from mccl_opt.allgather.forestcoll.removal.cut_guard import (SweepGuard, exchange, violated_set,
                                                             zero_slack_sets)
from mccl_opt.allgather.forestcoll.packing.exact_packing import exact_pack
from mccl_opt.allgather.forestcoll.removal.guarded_spread import guarded_spread
from mccl_opt.allgather.forestcoll.pipeline import balanced_split, phase_one_budget
from mccl_opt.allgather.forestcoll.removal.spread import spread_split
from mccl_opt.errors import TopologyError
from tests.oracle_allgather import check_schedule, cut_bound
from tests.test_allgather import assert_packing

SMALL = [
    shared_aggregation(2, 2, 2),
    shared_aggregation(3, [1, 2, 1], 2, oversubscription=2.0),
    multi_spine(2, 2, 2, spines=3),
    leaf_spine(3, 1, 4),
    leaf_spine(2, [1, 2], 2, oversubscription=1.5),
    superpod(2, 2, 4, rails_per_leaf=2),
    host_ring(4, 2),
    host_ring(3, 2, weak_link_gbps=100.0),
    host_torus(2, 3, 2),
]
#: fabrics whose plain spread split fails the rooted cut test (checked below)
BREAKS_PLAIN = [leaf_spine(3, 2, 2), leaf_spine(3, 2, 4), leaf_spine(8, 2, 2)]
#: ... and those whose plain split failed it before sibling pairs went last
#: (:mod:`mccl_opt.allgather.forestcoll.removal.siblings`; checked below)
PLAIN_NOW = [shared_aggregation(2, 2, 8), multi_spine(2, 2, 8), leaf_spine(4, 2, 4),
             superpod(2, 4, 8)]


@pytest.mark.parametrize("topo", SMALL, ids=lambda t: t.name)
def test_family_rate_is_the_cut_bound_and_name_independent(topo):
    sched = mo.solve_allgather(topo, max_chunks=None)
    mo.validate(topo, sched)
    checked = check_schedule(topo, sched)
    bound = cut_bound(topo)
    assert sched.rate_gbps == pytest.approx(bound, rel=1e-6)
    assert checked.rate_gbps == pytest.approx(sched.rate_gbps, rel=1e-6)
    for seed in (1, 2):
        other = scrambled(topo, seed)
        assert mo.solve_allgather(other, max_chunks=None).rate_gbps == pytest.approx(
            sched.rate_gbps, rel=1e-9)


@pytest.mark.parametrize("topo", BREAKS_PLAIN, ids=lambda t: t.name)
def test_guarded_split_admits_k_where_the_plain_one_does_not(topo):
    topo = canonical(topo)
    arr = topo.arrays
    budget = phase_one_budget(topo, 10, {})
    split = balanced_split(budget.fab, arr.is_switch, budget.k, budget.y, 10).split
    k = split.k
    plain = spread_split(split, arr.rank_of)
    assert not plain.admits(k)                                   # the cliff this guards
    lg = guarded_spread(split, arr.rank_of, plain)
    assert lg is not None and lg.admits(k)
    swept = spread_split(split, arr.rank_of, SweepGuard(split.n, split.gpus, k))   # fallback
    assert swept is not None and swept.admits(k)
    if topo.num_gpus <= 16:
        assert_packing(lg.num_gpus, lg.tail, lg.head, lg.units, k,
                       exact_pack(lg.num_gpus, lg.tail, lg.head, lg.units, k))
    for b in lg.bundles:                                         # paths are real switch paths
        for path, units in b:
            assert units > 0
            for a, c in zip(path[:-1], path[1:]):
                assert topo.has_link(topo.nodes[a].id, topo.nodes[c].id)


def _in_units(inside, arcs):
    tail, head, units = arcs
    return int(units[inside[head] & ~inside[tail]].sum())


@pytest.mark.parametrize("topo", BREAKS_PLAIN[:2], ids=lambda t: t.name)
def test_tight_sets_have_no_slack(topo):
    """The guard's starting sets: each holds more than one node and has in-units exactly
    ``k`` per GPU outside it; with every unit doubled no set is tight."""
    topo = canonical(topo)
    budget = phase_one_budget(topo, 10, {})
    split = balanced_split(budget.fab, topo.arrays.is_switch, budget.k, budget.y, 10).split
    keys = list(split.units)
    arcs = (np.array([a for a, _ in keys]), np.array([b for _, b in keys]),
            np.array([split.units[key] for key in keys], np.int64))
    for tail, head, units, k in [(*arcs, split.k),                        # the split graph
                                 (np.array([0, 1, 2, 3, 3, 3]), np.array([3, 3, 3, 0, 1, 2]),
                                  np.array([1, 1, 1, 2, 2, 2]), 1)]:      # 3 GPUs, 1 switch
        n = max(int(tail.max()), int(head.max())) + 1
        gpus = split.gpus if n == split.n else np.arange(3)
        sets = zero_slack_sets(n, gpus, k, (tail, head, units), gpus.size)
        assert len(sets) > 0
        for inside in sets:
            assert inside.sum() > 1
            assert _in_units(inside, (tail, head, units)) == k * int((~inside[gpus]).sum())
        assert len(zero_slack_sets(n, gpus, k, (tail, head, 2 * units), gpus.size)) == 0


def _plain_split(topo):
    topo = canonical(topo)
    budget = phase_one_budget(topo, 10, {})
    split = balanced_split(budget.fab, topo.arrays.is_switch, budget.k, budget.y, 10).split
    return topo, split, spread_split(split, topo.arrays.rank_of)


@pytest.mark.parametrize("topo", PLAIN_NOW, ids=lambda t: t.name)
def test_plain_split_admits_k_with_siblings_paired_last(topo):
    """Pairs whose ends share another switch go last, so no unit between two GPUs of one
    host leaves the host (it took host ingress the cut condition needs), and the plain
    split passes the rooted test where it used to fail."""
    topo, split, lg = _plain_split(topo)
    assert lg.admits(split.k)
    host = [topo.nodes[v].id.rsplit("g", 1)[0] for v in topo.arrays.gpu_nodes.tolist()]
    same = 0
    for u, t, bundle in zip(lg.tail.tolist(), lg.head.tolist(), lg.bundles):
        if host[u] == host[t]:
            same += 1
            assert all(len(path) == 3 for path, _ in bundle)      # over their NVSwitch only
    assert same > 0


@pytest.mark.parametrize("topo", BREAKS_PLAIN + PLAIN_NOW + [scrambled(PLAIN_NOW[0], 5)],
                         ids=lambda t: t.name)
def test_guarded_fabrics_solve_at_the_budget_optimum(topo):
    """The solve takes the spread split (guarded where the plain one fails; a renamed
    fabric may list its switches in an order where it does not) and the repair packer,
    no exact fallback."""
    sched = mo.solve_allgather(topo)
    mo.validate(topo, sched)
    check_schedule(topo, sched, max_chunks=10)
    assert sched.stats["split"] in ("guarded", "spread")
    assert sched.stats["packing"] == "repair"


def _random_pairing(rng, n_in, n_out):
    us = rng.permutation(n_in + n_out)[:n_in]
    ts = rng.permutation(n_in + n_out)[:n_out]
    A = rng.integers(0, 4, (n_in, n_out)) * (us[:, None] != ts[None, :])
    return us, ts, A.astype(np.int64)


@pytest.mark.parametrize("seed", range(20))
def test_exchange_keeps_link_units_and_repairs_the_set(seed):
    rng = np.random.default_rng(seed)
    us, ts, A = _random_pairing(rng, 6, 7)
    inside = rng.random(13) < 0.5
    before = A.copy()
    enter = lambda M: int(M[~inside[us]][:, inside[ts]].sum())          # noqa: E731
    inner = int(A[inside[us]][:, inside[ts]].sum())
    outer = int(A[~inside[us]][:, ~inside[ts]].sum())
    want = int(rng.integers(1, 10))
    moved = exchange(A, inside[us], inside[ts], want)
    assert moved == min(want, inner, outer)
    np.testing.assert_array_equal(A.sum(axis=1), before.sum(axis=1))
    np.testing.assert_array_equal(A.sum(axis=0), before.sum(axis=0))
    assert (A >= 0).all() and not A[us[:, None] == ts[None, :]].any()
    assert enter(A) == enter(before) + moved


def test_violated_set_finds_a_real_deficit():
    # a directed 3-cycle with 2 units per arc: one tree per root fits (every set of
    # nodes has 2 units entering, at most 2 roots outside), two trees do not
    tail, head, units = np.array([0, 1, 2]), np.array([1, 2, 0]), np.full(3, 2, np.int64)
    gpus = np.arange(3)
    assert violated_set(3, gpus, 1, (tail, head, units)) is None
    inside, deficit, sink = violated_set(3, gpus, 2, (tail, head, units))
    assert inside[sink] and not inside.all()
    entering = int(units[inside[head] & ~inside[tail]].sum())
    assert deficit == 2 * int((~inside).sum()) - entering > 0


@pytest.mark.parametrize("make", [
    lambda: shared_aggregation(0, 2, 8), lambda: shared_aggregation(2, [1], 8),
    lambda: multi_spine(2, 2, 8, spines=0), lambda: leaf_spine(2, 2, 8, oversubscription=0),
    lambda: superpod(2, 2, 8, rails_per_leaf=3), lambda: host_ring(1, 8),
    lambda: host_torus(1, 1, 8), lambda: shared_aggregation(1, 1, 1),
    lambda: host_ring(4, 2, nic_gbps=float("nan")), lambda: shared_aggregation(2, "2", 8),
])
def test_generators_refuse_bad_sizes(make):
    with pytest.raises(TopologyError):
        make()
