"""The general AllGather method (mccl_opt.allgather.general.method): the forwarding-only optimum
on unbalanced fabrics, certified bound, rounding, warm start, agreement with ForestColl
on balanced fabrics."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy.optimize import linprog

import mccl_opt as mo
from instances import hpn
from instances.aggregation import leaf_spine
from mccl_opt.allgather.budget import EXACT_TREES_LIMIT
from mccl_opt.allgather.general.tree_colgen import TreeCGOptions
from mccl_opt.allgather.general.method import solve_general
from tests.oracle_allgather import check_schedule, cut_bound


def _topo(nodes, links, name="r") -> mo.Topology:
    return mo.Topology.from_dict({
        "format": "mccl-topology/1", "name": name,
        "nodes": [{"id": i, "kind": k} for i, k in nodes],
        "links": [{"src": a, "dst": b, "capacity_gbps": c, "latency_us": 1.0}
                  for a, b, c in links]})


REPRO_100 = ([("sp0", "switch"), ("sp1", "switch"), ("sp2", "switch"), ("h1g0", "gpu"),
              ("h1g1", "gpu")],
             [("h1g0", "sp0", 200.), ("sp0", "h1g0", 100.), ("h1g1", "sp2", 100.),
              ("sp2", "h1g1", 100.), ("sp0", "sp1", 3200.), ("sp1", "sp0", 3200.),
              ("sp1", "sp2", 800.), ("sp2", "sp1", 800.), ("sp2", "sp0", 200.)])
REPRO_9 = ([("sp0", "switch"), ("sp1", "switch"), ("sp2", "switch"), ("h0g1", "gpu"),
            ("h1g0", "gpu"), ("h1g1", "gpu")],
           [("h0g1", "sp1", 400.), ("sp1", "h0g1", 100.), ("h1g0", "sp1", 100.),
            ("sp1", "h1g0", 100.), ("h1g1", "sp2", 18.), ("sp2", "h1g1", 18.),
            ("sp0", "sp1", 200.), ("sp1", "sp0", 200.), ("sp1", "sp2", 800.),
            ("sp2", "sp1", 100.), ("sp2", "sp0", 100.)])


def _brute_optimum(topo: mo.Topology) -> float:
    """The forwarding-only optimum by enumeration (independent of the solver): every
    spanning arborescence over the GPUs, every simple switch-only path per edge, one LP
    column per combination (tiny fabrics only)."""
    nodes = [n.id for n in topo.nodes]
    gpus = list(topo.gpus)
    out = {u: [l.dst for l in topo.links if l.src == u] for u in nodes}

    def paths(u, v):
        found, stack = [], [(u, [u])]
        while stack:
            x, p = stack.pop()
            for y in out[x]:
                if y == v:
                    found.append(p + [y])
                elif not topo.is_gpu(y) and y not in p:
                    stack.append((y, p + [y]))
        return found

    pp = {(u, v): paths(u, v) for u in gpus for v in gpus if u != v}
    cols, col_root = [], []
    for r in gpus:
        others = [v for v in gpus if v != r]
        for par in itertools.product(gpus, repeat=len(others)):
            parent = dict(zip(others, par))
            if any(parent[v] == v for v in others):
                continue
            ok = True
            for v in others:
                u, s = v, 0
                while u != r and s <= len(gpus):
                    u, s = parent[u], s + 1
                ok &= u == r
            if not ok:
                continue
            for choice in itertools.product(*(pp[(parent[v], v)] for v in others)):
                load = np.zeros(topo.num_links)
                for p in choice:
                    for a, b in zip(p, p[1:]):
                        load[topo.link_index(a, b)] += 1
                cols.append(load)
                col_root.append(gpus.index(r))
    n = len(cols)
    g = len(gpus)
    # variables: x, w_1..w_n ; max x
    A = np.zeros((g + topo.num_links, n + 1))
    A[:g, 0] = 1.0
    for j, (load, r) in enumerate(zip(cols, col_root)):
        A[r, j + 1] = -1.0
        A[g:, j + 1] = load
    b = np.concatenate([np.zeros(g), topo.arrays.capacity])
    c = np.zeros(n + 1)
    c[0] = -1.0
    res = linprog(c, A_ub=A, b_ub=b, bounds=(0, None), method="highs")
    return -res.fun


@pytest.mark.parametrize("case,expected", [(REPRO_100, 100.0), (REPRO_9, 9.0)])
def test_reproducers_reach_the_forwarding_only_optimum(case, expected):
    topo = _topo(*case)
    for k in (10, None):
        s = solve_general(topo, max_chunks=k)
        mo.validate(topo, s)
        assert s.lp_rate_gbps == pytest.approx(expected, rel=1e-9)
        assert s.stats["bound_gbps"] >= s.lp_rate_gbps * (1 - 1e-12)
        assert s.stats["cg_gap"] <= 1e-8
    assert s.rate_gbps == pytest.approx(expected, rel=1e-9)       # fractional: the optimum


def test_hpn_one_direction_degradation():
    topo = hpn(1, 2, 8).with_capacity({("s0h0g1", "s0h0nvs"): 360.0})
    s = solve_general(topo, max_chunks=None)
    mo.validate(topo, s)
    assert s.lp_rate_gbps == pytest.approx(593.0 / 3.0, rel=1e-9)   # 197.67 Gbps
    rounded = solve_general(topo, max_chunks=10)
    mo.validate(topo, rounded)
    assert 0.9 * s.lp_rate_gbps <= rounded.rate_gbps <= rounded.lp_rate_gbps
    assert rounded.rounding_gap == pytest.approx(1 - rounded.rate_gbps / rounded.lp_rate_gbps)


@pytest.mark.parametrize("seed", range(4))
def test_matches_enumeration_on_tiny_unbalanced_fabrics(seed):
    rng = np.random.default_rng(seed)
    nodes = [("g0", "gpu"), ("g1", "gpu"), ("g2", "gpu"), ("s0", "switch"), ("s1", "switch")]
    links = []
    for u, v in [("g0", "s0"), ("g1", "s0"), ("g2", "s1"), ("s0", "s1"), ("g1", "s1")]:
        links.append((u, v, float(rng.choice([10.0, 25.0, 40.0, 100.0]))))
        links.append((v, u, float(rng.choice([10.0, 25.0, 40.0, 100.0]))))   # asymmetric
    if seed % 2:
        links.append(("g0", "g2", 15.0))                                      # a direct link
    topo = _topo(nodes, links)
    s = solve_general(topo, max_chunks=None)
    mo.validate(topo, s)
    assert s.lp_rate_gbps == pytest.approx(_brute_optimum(topo), rel=1e-7)


def test_rounding_respects_max_chunks():
    topo = hpn(1, 2, 4).with_capacity({("s0h0g1", "s0h0nvs"): 300.0})
    rates = []
    for kmax in range(1, 11):
        s = solve_general(topo, max_chunks=kmax)
        rep = mo.validate(topo, s)
        assert rep.rate_gbps == pytest.approx(s.rate_gbps)
        k = s.stats["k"]
        assert 1 <= k <= kmax
        for r in topo.gpus:
            shares = [c.share for c in s.chunks if c.src == r]
            assert len(shares) <= k and sum(shares) == pytest.approx(1.0)
            assert all(abs(x * k - round(x * k)) < 1e-9 for x in shares)
        rates.append(s.rate_gbps)
    # the best k <= K is kept, so more chunks never round worse (same LP solution)
    assert all(b >= a * (1 - 1e-12) for a, b in zip(rates, rates[1:]))
    assert rates[-1] > rates[0]


@pytest.mark.parametrize("shape", [(1, 2, 4), (1, 3, 2)])
def test_agrees_with_forestcoll_on_balanced_fabrics(shape):
    """On balanced fabrics ForestColl's cut optimum is reachable, so both methods find
    the same optimum, and neither rounded rate exceeds it."""
    from instances import fail1, fail2
    for topo in (hpn(*shape), fail2(hpn(*shape)), fail1(hpn(*shape))):
        fc = mo.solve_allgather(topo, max_chunks=10)
        s = solve_general(topo, max_chunks=10)
        mo.validate(topo, s)
        assert s.lp_rate_gbps == pytest.approx(fc.lp_rate_gbps, rel=1e-7)
        assert fc.rate_gbps <= s.lp_rate_gbps * (1 + 1e-9)
        assert 0.8 * s.lp_rate_gbps <= s.rate_gbps <= s.lp_rate_gbps * (1 + 1e-12)


def test_warm_start_after_one_link_change():
    topo = hpn(1, 2, 4).with_capacity({("s0h0g1", "s0h0nvs"): 300.0})
    first = solve_general(topo, max_chunks=10)
    changed = topo.with_capacity({("s0h1g2", "s0tor2"): 150.0})
    cold = solve_general(changed, max_chunks=10)
    warm = solve_general(changed, warm=first, max_chunks=10)
    mo.validate(changed, warm)
    assert warm.lp_rate_gbps == pytest.approx(cold.lp_rate_gbps, rel=1e-9)
    assert warm.stats["warm_columns"] > 0
    loaded = mo.Schedule.from_dict(first.to_dict())             # no warm state: from chunks
    again = solve_general(changed, warm=loaded, max_chunks=10)
    assert again.stats["warm_columns"] == len(first.chunks)
    assert again.lp_rate_gbps == pytest.approx(cold.lp_rate_gbps, rel=1e-9)
    other = solve_general(hpn(1, 3, 2), warm=first)             # other GPUs: nothing reused
    assert other.stats["warm_columns"] == 0


def test_node_order_does_not_change_the_optimum():
    nodes, links = REPRO_9
    a = solve_general(_topo(nodes, links), max_chunks=None)
    b = solve_general(_topo(nodes[::-1], links[::-1]), max_chunks=None)
    assert a.lp_rate_gbps == pytest.approx(b.lp_rate_gbps, rel=1e-9)


def test_time_limit_returns_a_valid_schedule_with_its_gap():
    topo = hpn(1, 3, 4).with_capacity({("s0h0g1", "s0h0nvs"): 300.0})
    s = solve_general(topo, max_chunks=None,
                      options=TreeCGOptions(seed_rounds=1, time_limit=0.0))
    mo.validate(topo, s)
    assert s.stats["cg_status"] in ("time_limit", "optimal")
    assert s.stats["bound_gbps"] >= s.lp_rate_gbps * (1 - 1e-12)


def test_chain_picks_the_method():
    """Balanced fabrics keep ForestColl; unbalanced switches go to the general method,
    with the (higher) cut bound reported apart; a balanced fabric whose exact tree count
    explodes (arbitrary float capacities, max_chunks=None) goes, at this size, to the
    general method seeded with ForestColl's own trees, certified at the cut bound
    (docs/allgather_history.md "Above the tree limit")."""
    healthy = hpn(1, 2, 4)
    assert mo.solve_allgather(healthy).stats.get("method") != "general"
    one_dir = hpn(1, 2, 8).with_capacity({("s0h0g1", "s0h0nvs"): 360.0})
    s = mo.solve_allgather(one_dir, max_chunks=None)
    assert s.stats["method"] == "forestcoll-balanced-restriction"      # certified, else general
    assert s.stats["cut_bound_gbps"] == pytest.approx(656.0 / 3.0, rel=1e-9)
    assert s.lp_rate_gbps == pytest.approx(593.0 / 3.0, rel=1e-9)
    odd = healthy.with_capacity(src="s0h0g1", dst="s0h0nvs", gbps=594.087, both_directions=True) \
        .with_capacity(src="s0h1g2", dst="s0tor2", gbps=445.565, both_directions=True)
    exact = mo.solve_allgather(odd, max_chunks=None)
    assert exact.report.method.value == "general" and exact.stats["seed"] == "forestcoll trees"
    assert f"more than {EXACT_TREES_LIMIT} exact trees" in exact.stats["general_reason"]
    assert exact.status == "optimal"
    assert exact.rate_gbps == pytest.approx(exact.lp_rate_gbps, rel=1e-9)
    assert exact.lp_rate_gbps == pytest.approx(mo.solve_allgather(odd).lp_rate_gbps, rel=1e-9)
    mo.validate(odd, exact)


def test_weaker_directions_balance_every_switch():
    from mccl_opt.allgather.chain import weaker_directions
    from mccl_opt.allgather.fabric import switches_balanced

    topo = hpn(2, 2, 4).with_capacity({("s0h0g1", "s0h0nvs"): 360.0, ("s1tor0", "s1h1g0"): 77.5})
    assert not switches_balanced(topo)
    sub = weaker_directions(topo)
    assert switches_balanced(sub)
    cap = {(l.src, l.dst): l.capacity_gbps for l in topo.links}
    for link in sub.links:
        expected = min(cap[(link.src, link.dst)], cap[(link.dst, link.src)])
        assert link.capacity_gbps == pytest.approx(expected)


def test_one_direction_nic_degradation_is_solved_exactly_on_the_weaker_fabric():
    """A one-direction NIC degradation: ForestColl on the weaker-direction fabric reaches
    the real fabric's cut bound, hence the forwarding-only optimum, which the general
    method computed on its own confirms; its trees are valid on the real fabric."""
    topo = hpn(1, 2, 8).with_capacity({("s0h0g0", "s0tor0"): 50.0})
    s = mo.solve_allgather(topo)
    mo.validate(topo, s)
    assert s.stats["method"] == "forestcoll-weaker-directions"
    assert s.lp_rate_gbps == pytest.approx(solve_general(topo, max_chunks=None).lp_rate_gbps,
                                           rel=1e-9)
    assert s.rate_gbps <= s.lp_rate_gbps * (1 + 1e-9)


def test_unbalanced_fabric_keeps_the_better_rounding():
    """Where the weaker-direction optimum stays below the cut bound the balanced
    restriction (rounded keeping switches balanced) or the general method solves; the
    kept schedule rounds no worse than the general method's own."""
    topo = hpn(2, 2, 8).with_capacity({("s0h0g0", "s0tor0"): 50.0})
    s = mo.solve_allgather(topo)
    mo.validate(topo, s)
    from mccl_opt.allgather.canonical import canonical

    own = solve_general(canonical(topo), max_chunks=10)       # the listing the chain solves
    assert s.stats["method"] in ("general", "forestcoll-balanced-restriction")
    assert s.lp_rate_gbps == pytest.approx(own.lp_rate_gbps, rel=1e-9)
    assert s.rate_gbps >= own.rate_gbps * (1 - 1e-9)


@pytest.mark.parametrize("smoothing", [0.0, 0.5, 0.99])
def test_dual_smoothing_reaches_the_same_certified_optimum(smoothing):
    """Pricing between the best-bound prices and the master's duals (Wentges smoothing)
    changes the route, not the answer: the same optimum as the enumeration on a tiny
    unbalanced fabric, and on HPN with one NIC degraded in one direction the same
    optimum with and without smoothing, each certified (gap within the tolerance)."""
    _assert_same_certified_optimum(TreeCGOptions(smoothing=smoothing),
                                   TreeCGOptions(smoothing=0.0))


def _assert_same_certified_optimum(opts: TreeCGOptions, plain_opts: TreeCGOptions) -> None:
    """``opts`` certify the plain options' optimum on a one-way NIC fault of HPN 1x4x8,
    and reach the enumerated optimum of a tiny unbalanced fabric."""
    one_way = hpn(1, 4, 8).with_capacity(src="s0h0g0", dst="s0tor0", gbps=100.0,
                                         both_directions=False)
    plain = solve_general(one_way, max_chunks=None, options=plain_opts)
    s = solve_general(one_way, max_chunks=None, options=opts)
    assert s.stats["cg_status"] == "optimal" and s.stats["cg_gap"] <= 1e-8
    assert s.lp_rate_gbps == pytest.approx(plain.lp_rate_gbps, rel=1e-9)
    tiny = _topo([("g0", "gpu"), ("g1", "gpu"), ("g2", "gpu"), ("s0", "switch")],
                 [("g0", "s0", 40.0), ("s0", "g0", 10.0), ("g1", "s0", 25.0),
                  ("s0", "g1", 100.0), ("g2", "s0", 10.0), ("s0", "g2", 40.0),
                  ("g1", "g2", 15.0)])
    assert solve_general(tiny, max_chunks=None, options=opts).lp_rate_gbps == \
        pytest.approx(_brute_optimum(tiny), rel=1e-7)


def test_every_pricing_point_reaches_the_same_certified_optimum():
    """Adding the trees of every pricing point of a round (smoothed, tie-broken, the
    duals), not only those priced at the master's duals (the one point left with
    smoothing and the tie-break off), changes the route, not the answer."""
    _assert_same_certified_optimum(TreeCGOptions(),
                                   TreeCGOptions(smoothing=0.0, tie_break=0.0))


@pytest.mark.parametrize("tie", [0.0, 1e-3, 1.0])
def test_tie_break_pricing_reaches_the_same_certified_optimum(tie):
    """The 1/capacity tie-break term changes which trees are found, never the answer:
    even a large weight (1.0, far from a tie-break) ends at the same certified optimum,
    because a round falls back to the master's own duals when the perturbed point finds
    no column the master wants; and the tiny fabric's enumerated optimum is reached."""
    _assert_same_certified_optimum(TreeCGOptions(smoothing=0.0, tie_break=tie),
                                   TreeCGOptions(smoothing=0.0, tie_break=0.0))


def testpricing_points_end_at_the_duals_and_break_ties_by_capacity():
    """A round prices the smoothed point, then the duals plus a term that grows as the
    capacity shrinks (so of two links at the same dual price the roomier is cheaper),
    and last the duals themselves (what makes the loop's end exact); no tie point when
    the duals are all zero (nothing to scale it by)."""
    from mccl_opt.allgather.general.tree_colgen import pricing_points

    pi = np.array([0.0, 0.0, 2.0])
    cap = np.array([1.0, 4.0, 1.0])
    centre = np.array([1.0, 1.0, 1.0])
    points = list(pricing_points(centre, pi, cap, 0.5, 1e-3))
    assert len(points) == 3
    assert np.allclose(points[0], 0.5 * centre + 0.5 * pi)
    assert points[1][0] > points[1][1] > 0 and np.all(points[1] > pi)
    assert np.array_equal(points[-1], pi)
    assert [p.tolist() for p in pricing_points(None, np.zeros(3), cap, 0.5, 1e-3)] == [[0.0] * 3]


@pytest.mark.parametrize("shape, optimum", [
    ((2, 1, 8), None), ((4, 1, 4), None),
    ((2, 2, 4), 132.5)])    # tests/oracle_allgather.forwarding_optimum (cut bound 133.3)
def test_leaf_spine_one_way_nic_does_not_cycle_when_trees_are_dropped(shape, optimum):
    """Leaf-spine with one NIC at 0.9 one way, from one tree per root and the most eager
    column dropping: the master is degenerate (its x stays flat while the duals move), and
    dropping zero-weight trees on such rounds cycled at the starting rate, 1/4 of the
    optimum, until the round cap.  Now the column generation certifies the optimum, the
    schedule validates, and its rate is the independent optimum (the oracle's cut bound,
    or its forwarding-only optimum where the two differ)."""
    leaves, hosts, gpus = shape
    topo = leaf_spine(leaves, hosts, gpus).with_capacity(
        src=f"u0h{hosts - 1}g{gpus - 1}", dst="u0leaf0", gbps=360.0, both_directions=False)
    eager = TreeCGOptions(seed_rounds=1, drop_after=1, drop_min_pool=1, max_rounds=400)
    s = solve_general(topo, max_chunks=None, options=eager)
    assert s.stats["cg_status"] == "optimal"
    expected = cut_bound(topo) if optimum is None else optimum
    assert check_schedule(topo, s).rate_gbps == pytest.approx(expected, rel=1e-7)
    assert mo.validate(topo, s).rate_gbps == pytest.approx(expected, rel=1e-7)


def test_a_master_point_is_cut_to_the_rate_its_trees_reach():
    """The LP solver meets the link rows only within its tolerance: a point whose
    weights overload a link (here: one tree's weight raised by 5 % of ``x``) comes back at the rate its trees reach as the fractional schedule
    recomputes it: every link within its capacity, one at it, every root at ``x``."""
    from mccl_opt.allgather.general.live_master import TreeMaster, TreePool
    from mccl_opt.allgather.general.master_solve import reached
    from mccl_opt.allgather.general.tree_colgen import mwu_trees
    from mccl_opt.allgather.general.method import rate_scale
    from mccl_opt.backends import get_backend

    topo = hpn(1, 2, 4).with_capacity({("s0h0g1", "s0tor1"): 61.7})
    capacity = topo.arrays.capacity / rate_scale(topo)
    pool = TreePool()
    pool.append(*mwu_trees(topo, capacity, rounds=20))
    with get_backend("highs") as lp:
        master = TreeMaster(lp, topo.num_gpus, capacity, pool)
        exact = reached(master, master.solve("test"))
        pt = master.solve("test")
    assert exact.x == pytest.approx(pt.x, rel=1e-12)
    x = pt.x
    support = np.bincount(pool.root, weights=pt.w > 0, minlength=topo.num_gpus)
    tree = np.flatnonzero((pool.root == np.argmax(support)) & (pt.w > 0))[0]
    pt.w[tree] += 0.05 * x                  # more on one of a root's trees: its links overloaded
    pt = reached(master, pt)
    loads = pool.loads(pt.w, topo.num_links)
    assert loads.max() > 0 and (loads <= capacity * (1 + 1e-12)).all()
    assert (loads >= capacity * (1 - 1e-12)).any()
    per_root = np.bincount(pool.root, weights=pt.w, minlength=topo.num_gpus)
    np.testing.assert_allclose(per_root, pt.x, rtol=1e-12)
    assert pt.x < x
