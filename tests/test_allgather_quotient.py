"""The tree master on the symmetry quotient (docs/allgather_history.md "Symmetric quotient"):
verified automorphisms, orbit rows, and an expansion whose every link carries its orbit's
average load.  Rates are checked against the general method's full master on small
shared-aggregation and HPN states with one link slowed one way, schedules by the validator
and the independent checker."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import mccl_opt as mo
from instances import hpn
from instances.aggregation import leaf_spine, scrambled, shared_aggregation, superpod
from mccl_opt.allgather import quotient_stages
from mccl_opt.allgather.canonical import canonical
from mccl_opt.allgather.general.method import solve_general
from mccl_opt.allgather.general.arborescence import min_arborescences
from mccl_opt.allgather.general.expansion import expand
from mccl_opt.allgather.general.method import rate_scale
from mccl_opt.allgather.general import cluster_lp, quotient
from mccl_opt.allgather.general.quotient import _Quotient, _column_generation, _price, solve_quotient
from mccl_opt.allgather.general.sparse_copies import (Copies, Marginals, _coupled, sparse_copies,
                                                      uniform_copies)
from mccl_opt.allgather.general.switch_paths import SwitchPaths
from mccl_opt.allgather.general.symmetry import find_symmetry
from mccl_opt.backends import get_backend
from mccl_opt.report import Termination
from tests.oracle_allgather import check_schedule


def _one_way(topo, src="s0h0g0", dst="s0tor0", gbps=200.0):
    return topo.with_capacity(src=src, dst=dst, gbps=gbps, both_directions=False)


STATES = {
    "shared-agg 2x3x4 NIC 150.8": lambda: _one_way(shared_aggregation(2, 3, 4), gbps=150.8),
    "shared-agg 2x2x8 NIC 272.6 in": lambda: _one_way(shared_aggregation(2, 2, 8), "s1tor1",
                                                      "s1h1g1", 272.6),
    "hpn 1x2x4 NVLink 1000": lambda: _one_way(hpn(1, 2, 4), "s0h0g1", "s0h0nvs", 1000.0),
    "superpod 2x2x4 NIC 200": lambda: _one_way(superpod(2, 2, 4), "u0h0g0", "u0leaf0"),
}


@pytest.mark.parametrize("state", sorted(STATES))
def test_the_quotient_reaches_the_full_masters_optimum_with_a_valid_schedule(state):
    topo = canonical(STATES[state]())
    full = solve_general(topo, max_chunks=None)
    sym = find_symmetry(topo)
    assert sym is not None and sym.num_link_orbits < topo.num_links
    s = solve_quotient(topo, sym=sym)
    assert s is not None and s.stats["seed"] == "symmetric quotient"
    assert s.lp_rate_gbps == pytest.approx(full.lp_rate_gbps, rel=1e-9)
    assert s.rate_gbps == pytest.approx(full.lp_rate_gbps, rel=1e-9)
    assert mo.validate(topo, s).rate_gbps == pytest.approx(s.rate_gbps, rel=1e-9)
    check_schedule(topo, s)


def test_the_colour_bound_rejects_only_quotients_the_rows_reject():
    """``find_symmetry(topo, too_big)`` may answer ``None`` before searching: only where
    the group it finds has too many rows as well (the colour classes bound them below),
    and it does so somewhere below the found group's rows; the pieces it tests are the
    group's."""
    topo = canonical(STATES["shared-agg 2x3x4 NIC 150.8"]())
    sym = find_symmetry(topo)
    rows = sym.num_link_orbits + sym.num_root_orbits
    early = []
    for limit in range(1, rows + 2):
        def too_big(r, roots, pieces, limit=limit):
            return r > limit
        if find_symmetry(topo, too_big) is None:
            early.append(limit)
            assert rows > limit                       # the search's rows fail it too
    assert early and max(early) < rows
    pieces = len(sym.pieces())             # asked before the elements are listed: the same
    assert find_symmetry(topo, lambda r, roots, p: p > pieces) is not None
    assert find_symmetry(topo, lambda r, roots, p: p >= pieces) is None


def test_every_generator_is_an_automorphism_and_the_coupling_is_uniform():
    topo = canonical(_one_way(shared_aggregation(2, 3, 4)))
    sym = find_symmetry(topo)
    arr = topo.arrays
    for nodes, links in zip(sym.nodes, sym.links):
        assert len({tuple(p) for p in nodes.tolist()}) == len(nodes)   # distinct elements
        for node, link in zip(nodes, links):
            assert np.array_equal(arr.tail[link], node[arr.tail])
            assert np.array_equal(arr.head[link], node[arr.head])
            assert np.array_equal(arr.capacity[link], arr.capacity)
    pieces = sym.pieces()
    assert sum(f for _, f in pieces) == pytest.approx(1.0, abs=1e-15)
    for c, nodes in enumerate(sym.nodes):
        marginal = np.bincount([e[c] for e, _ in pieces], weights=[f for _, f in pieces],
                               minlength=len(nodes))
        assert np.allclose(marginal, 1.0 / len(nodes), rtol=0, atol=1e-15)
    # the slowed NIC's link is alone in its orbit; its rank alone in its root orbit
    slow = int(np.flatnonzero(arr.capacity == 200.0)[0])
    assert np.sum(sym.link_orbit == sym.link_orbit[slow]) == 1
    assert np.sum(sym.root_orbit == sym.root_orbit[arr.rank_of[arr.tail[slow]]]) == 1


def test_node_names_and_order_do_not_change_the_quotient():
    topo = _one_way(shared_aggregation(2, 2, 8))
    rates = []
    for t in (canonical(topo), scrambled(topo, 3), canonical(scrambled(topo, 5))):
        sym = find_symmetry(t)
        assert (sym.num_link_orbits, sym.num_root_orbits) == (26, 5)
        rates.append(solve_quotient(t, sym=sym).rate_gbps)
    assert rates == pytest.approx([rates[0]] * 3, rel=1e-9)


def test_the_chain_takes_the_quotient_at_none_and_keeps_the_exact_rate(monkeypatch):
    topo = _one_way(shared_aggregation(2, 2, 8))
    before = mo.solve_allgather(topo, max_chunks=None)
    assert before.stats.get("seed") != "symmetric quotient"
    monkeypatch.setattr(quotient_stages, "QUOTIENT_MIN_GPUS", 2)
    monkeypatch.setattr(quotient_stages, "QUOTIENT_MIN_SHRINK", 1)
    after = mo.solve_allgather(topo, max_chunks=None)
    assert after.stats["seed"] == "symmetric quotient"
    assert after.report.termination is Termination.OPTIMAL
    assert after.rate_gbps == pytest.approx(before.rate_gbps, rel=1e-9)
    check_schedule(topo, after)


def test_paths_mapped_from_one_source_per_orbit_equal_all_pairs():
    """The quotient prices one Dijkstra per root orbit and maps it onto the other sources
    (``Symmetry.carriers``): at orbit-invariant prices the mapped costs equal the
    all-pairs ones exactly, and every mapped predecessor walk is a path of that cost; the
    certified sparse arborescences cost what the dense kernel's do."""
    topo = canonical(_one_way(shared_aggregation(2, 3, 4), gbps=150.8))
    arr = topo.arrays
    sym = find_symmetry(topo)
    rng = np.random.default_rng(7)
    with get_backend("highs") as lp:
        q = _Quotient(topo, sym, arr.capacity, lp)
        carried = q.node_map[np.arange(topo.num_gpus), arr.gpu_nodes[q.reps[sym.root_orbit]]]
        assert np.array_equal(carried, arr.gpu_nodes)
        pi = rng.uniform(0.5, 2.0, sym.num_link_orbits)
        costs, trees = _price(topo, q, pi)
    price = (pi / q.orbit_size)[sym.link_orbit]
    full = SwitchPaths(topo, price)
    _, want = min_arborescences(full.cost, q.reps)
    assert costs == pytest.approx(want, rel=1e-12)     # ties may pick other trees
    for i, (r, arcs) in enumerate(zip(q.reps.tolist(), trees)):
        assert price[arcs].sum() == pytest.approx(costs[i], rel=1e-12)
        assert np.all(np.isin(arr.rank_of[arr.head[arcs][~arr.is_switch[arr.head[arcs]]]],
                              np.delete(np.arange(topo.num_gpus), r)))


def test_the_chain_declines_the_quotient_by_its_predicted_cost(monkeypatch):
    """HPN 1x2x4 with one NVLink slowed has a quotient (the test above) but a predicted
    cost (rows^2 x root orbits) above a lowered cap: the chain keeps its own path."""
    topo = _one_way(hpn(1, 2, 4), "s0h0g1", "s0h0nvs", 1000.0)
    sym = find_symmetry(topo)
    rows = sym.num_link_orbits + sym.num_root_orbits
    monkeypatch.setattr(quotient_stages, "QUOTIENT_MIN_GPUS", 2)
    monkeypatch.setattr(quotient_stages, "QUOTIENT_MIN_SHRINK", 1)
    monkeypatch.setattr(quotient_stages, "QUOTIENT_MAX_COST", rows * rows * sym.num_root_orbits - 1)
    assert mo.solve_allgather(topo, max_chunks=None).stats.get("seed") != "symmetric quotient"
    monkeypatch.setattr(quotient_stages, "QUOTIENT_MAX_COST", rows * rows * sym.num_root_orbits)
    assert mo.solve_allgather(topo, max_chunks=None).stats.get("seed") == "symmetric quotient"


def test_the_expansion_from_the_columns_equals_every_copy_mapped_and_merged():
    """The tree table is built from the quotient's columns and the pieces' maps
    (``general.expansion``): its trees, weights, depths and parents-first edge order equal
    those of every column copied by every piece's node map and merged by root and link
    multiset, done naively; its paths are distinct."""
    topo = canonical(STATES["shared-agg 2x3x4 NIC 150.8"]())
    arr = topo.arrays
    sym = find_symmetry(topo)
    with get_backend("highs") as lp:
        q = _Quotient(topo, sym, arr.capacity / rate_scale(topo), lp)
        _, z, _, _ = _column_generation(topo, q, np.inf, None)
    exp = expand(topo, sym, q.roots, q.trees, z)
    want: dict = {}
    for j in np.flatnonzero(z > 0).tolist():
        for element, frac in sym.pieces():
            node, link = sym.piece_maps(element)
            root = int(arr.rank_of[node[arr.gpu_nodes[q.roots[j]]]])
            key = (root, tuple(np.sort(link[q.trees[j]])))
            want[key] = want.get(key, 0.0) + frac * z[j]
    got = _table_trees(topo, exp)
    assert got.keys() == want.keys()
    assert all(got[k] == pytest.approx(want[k], rel=1e-12) for k in want)


def _table_trees(topo, exp):
    """``{(root, sorted links): weight}`` of an expansion, after checking that its paths
    are distinct and every tree's edges are parents first, a spanning tree of its depth
    and the pool's links."""
    arr = topo.arrays
    paths = [tuple(p) for p in exp.paths]
    assert len(set(paths)) == len(paths)
    got = {}
    for t in range(len(exp.pool)):
        root = int(exp.pool.root[t])
        key = (root, tuple(np.sort(exp.pool.column(t))))
        got[key] = exp.weights[t]
        reached, depth = {int(arr.gpu_nodes[root]): 0}, 0
        for e in exp.edges[t].tolist():
            p = paths[e]
            assert p[0] in reached and p[-1] not in reached      # parents first, a tree
            reached[p[-1]] = reached[p[0]] + 1
            depth = max(depth, reached[p[-1]])
        assert len(reached) == topo.num_gpus and depth == exp.depth[t]
        hops = [topo.link_index(topo.nodes[a].id, topo.nodes[b].id)
                for e in exp.edges[t].tolist() for a, b in zip(paths[e], paths[e][1:])]
        assert sorted(hops) == list(key[1])                       # the table is the pool's tree
    return got


def _restriction_seed_of(topo):
    """The chain's restriction seed of ``topo`` (a canonical listing) and its columns."""
    from mccl_opt.allgather.restriction.stages import restrict
    from mccl_opt.allgather.general.restriction_seed import restriction_seed
    from mccl_opt.allgather.solve import sub_forestcoll
    from mccl_opt.allgather.stage import Trail

    made = restriction_seed(restrict(topo, "highs"), sub_forestcoll("highs", Trail()))
    return made, made.columns(topo)


def test_the_seeded_quotient_certifies_only_at_the_restrictions_optimum():
    """From the restriction seed's trees the quotient reaches the restriction's certified
    optimum (the full master's) and stops there; from one seed tree per root orbit and a
    single round it does not, and declines rather than return a rate below it."""
    topo = canonical(_one_way(hpn(1, 4, 4), gbps=391.337))
    sym = find_symmetry(topo)
    made, (roots, trees) = _restriction_seed_of(topo)
    full = solve_general(topo, max_chunks=None)
    s = solve_quotient(topo, upper_gbps=made.rate_gbps, sym=sym, seed=(roots, trees), max_rounds=3)
    assert s is not None and s.stats["seed"] == "seeded symmetric quotient"
    assert s.rate_gbps == pytest.approx(full.lp_rate_gbps, rel=1e-9)
    assert made.rate_gbps == pytest.approx(full.lp_rate_gbps, rel=1e-9)
    check_schedule(topo, s)
    first = {}
    for r, t in zip(roots, trees):
        first.setdefault(int(sym.root_orbit[r]), (r, t))
    one = ([r for r, _ in first.values()], [t for _, t in first.values()])
    assert solve_quotient(topo, upper_gbps=made.rate_gbps, sym=sym, seed=one, max_rounds=1) is None


def test_the_chain_seeds_the_quotient_past_its_cost_cap(monkeypatch):
    """A quotient over the cost cap (HPN 1x4x4, one NIC one way) is solved from the
    restriction seed once the restriction is known, at the rate of the path it replaces;
    with no round left it declines and the general method runs."""
    topo = _one_way(hpn(1, 4, 4), gbps=391.337)
    before = mo.solve_allgather(topo, max_chunks=None)
    monkeypatch.setattr(quotient_stages, "QUOTIENT_MIN_GPUS", 2)
    monkeypatch.setattr(quotient_stages, "QUOTIENT_MAX_COST", 0)
    after = mo.solve_allgather(topo, max_chunks=None)
    assert before.stats.get("seed") != "seeded symmetric quotient"
    assert after.stats["seed"] == "seeded symmetric quotient"
    assert after.report.termination is Termination.OPTIMAL
    assert after.rate_gbps == pytest.approx(before.rate_gbps, rel=1e-9)
    check_schedule(topo, after)
    monkeypatch.setattr(quotient_stages, "SEEDED_QUOTIENT_ROUNDS", 0)
    fallback = mo.solve_allgather(topo, max_chunks=None)
    assert fallback.stats.get("seed") != "seeded symmetric quotient"
    assert fallback.rate_gbps == pytest.approx(before.rate_gbps, rel=1e-9)


def test_the_seeded_quotient_expands_thousands_of_copies_exactly():
    """Leaf-spine 4x2x8 with one NIC at 360 Gbps one way (`--only 4x2x8` of the narrow
    bench): the seeded quotient's expansion copies more than the old 2,048-copy cap
    (24 columns x 134 pieces); the schedule is valid and at the balanced restriction's
    certified optimum (the rate of the ForestColl path it replaces)."""
    topo = leaf_spine(4, 2, 8).with_capacity(src="u0h0g0", dst="u0leaf0", gbps=360.0,
                                             both_directions=False)
    s = mo.solve_allgather(topo, max_chunks=None)
    assert s.stats["seed"] == "seeded symmetric quotient"
    assert s.stats["quotient_columns"] * s.stats["group_pieces"] > 2048
    assert s.report.termination is Termination.OPTIMAL
    assert s.rate_gbps == pytest.approx(52.053571428, rel=1e-9)
    assert len(s.chunks) <= topo.num_gpus + topo.num_links     # sparse copies: 253, were 3,037
    check_schedule(topo, s)


def _quotient_columns(topo):
    """The unseeded quotient's columns of ``topo``: ``(sym, q, z, capacity)``."""
    sym = find_symmetry(topo)
    capacity = topo.arrays.capacity / rate_scale(topo)
    with get_backend("highs") as lp:
        q = _Quotient(topo, sym, capacity, lp)
        _, z, _, _ = _column_generation(topo, q, np.inf, None)
    return sym, q, z, capacity


def check_copies(topo, sym, q, z, capacity, copies):
    """Asserts that each column's fractions of ``copies`` sum to 1, every root keeps the
    uniform expansion's share and every link at most its capacity (or the uniform load);
    returns the uniform and the sparse expansions."""
    uniform, few = expand(topo, sym, q.roots, q.trees, z), expand(topo, sym, q.roots, q.trees, z, copies)
    assert np.bincount(copies.column, weights=copies.frac) == pytest.approx(np.ones(int((z > 0).sum())), rel=1e-12)
    share = [np.bincount(e.pool.root, weights=e.weights, minlength=topo.num_gpus) for e in (uniform, few)]
    assert share[1] == pytest.approx(share[0], rel=1e-12)
    loads = [e.pool.loads(e.weights, topo.num_links) for e in (uniform, few)]
    assert (loads[1] <= np.maximum(capacity, loads[0]) * (1 + 1e-12)).all()
    return uniform, few


def test_sparse_copies_keep_every_root_share_and_capacity_on_fewer_trees():
    """The copies on sparse per-cluster marginals (``general.sparse_copies``) give every
    root the uniform expansion's share and every link at most its capacity (or the
    uniform load), on fewer trees than the uniform copies and at most one per row of the
    clusters' LPs plus one per column; each column's fractions sum to 1."""
    topo = canonical(STATES["shared-agg 2x3x4 NIC 150.8"]())
    sym, q, z, capacity = _quotient_columns(topo)
    pos = np.flatnonzero(z > 0)
    copies = sparse_copies(topo, sym, np.asarray(q.roots)[pos], [q.trees[j] for j in pos],
                           z[pos], capacity, "highs")
    uniform, few = check_copies(topo, sym, q, z, capacity, copies)
    rows = sum(int((links != np.arange(topo.num_links)).any(axis=0).sum()) + int(
        (nodes[:, topo.arrays.gpu_nodes] != topo.arrays.gpu_nodes).any(axis=0).sum())
        for nodes, links in zip(sym.nodes, sym.links))
    assert len(few.pool) < len(uniform.pool) and len(few.pool) <= rows + pos.size
    assert len(_table_trees(topo, few)) == len(few.pool)       # each copy's own path images


def test_a_cluster_lp_past_the_nonzero_cap_leaves_the_uniform_copies(monkeypatch):
    """A cluster LP with more nonzeros than ``MAX_CLUSTER_NONZEROS``, and no LP on cosets
    before it (``LARGE_NONZEROS`` not reached), is not solved: the quotient keeps the
    uniform copies (every positive column over every piece), at the rate the sparse
    copies reach, where under the cap it copies fewer trees."""
    topo = canonical(STATES["shared-agg 2x3x4 NIC 150.8"]())
    sym, q, z, capacity = _quotient_columns(topo)
    monkeypatch.setattr(quotient, "SPARSE_COPIES_MIN_RATIO", 0)     # copies this small one
    few = solve_quotient(topo, sym=sym)
    monkeypatch.setattr(cluster_lp, "MAX_CLUSTER_NONZEROS", 0)
    monkeypatch.setattr(cluster_lp, "LARGE_NONZEROS", np.inf)
    pos = np.flatnonzero(z > 0)
    assert sparse_copies(topo, sym, np.asarray(q.roots)[pos], [q.trees[j] for j in pos],
                         z[pos], capacity, "highs") is None
    s = solve_quotient(topo, sym=sym)
    assert s.stats["columns"] == len(expand(topo, sym, q.roots, q.trees, z).pool) > few.stats["columns"]
    assert s.rate_gbps == pytest.approx(few.rate_gbps, rel=1e-12)
    check_schedule(topo, s)


def test_the_coupling_keeps_every_cluster_marginal_on_few_copies():
    """The north-west-corner coupling of all columns at once (``sparse_copies._coupled``):
    per column the fractions sum to 1, each cluster's element gets exactly its marginal's
    share (cut points shared by two clusters exactly or within the tolerance included),
    and a column has at most ``sum_c |support| - clusters + 1`` copies."""
    rng = np.random.default_rng(7)
    columns = 6
    col = np.repeat(np.arange(columns), rng.integers(1, 5, columns))
    first = Marginals(col, rng.permutation(100)[:col.size], rng.uniform(0.1, 1.0, col.size))
    marginals = [first, first._replace(elem=rng.permutation(100)[:col.size],
                                       mass=first.mass * (1 + 1e-14 * (col % 2)))]
    col = np.repeat(np.arange(columns), rng.integers(1, 5, columns))
    marginals.append(Marginals(col, rng.permutation(100)[:col.size], rng.uniform(0.1, 1.0, col.size)))
    column, picks, frac = _coupled(marginals, columns)
    assert (np.diff(column) >= 0).all() and (frac > 0).all()
    assert np.bincount(column, frac, columns) == pytest.approx(np.ones(columns), rel=1e-12)
    for c, m in enumerate(marginals):
        for e, j, mass in zip(m.elem, m.col, m.mass):
            got = frac[(column == j) & (picks[:, c] == e)].sum()
            assert got == pytest.approx(mass / m.mass[m.col == j].sum(), abs=1e-12)
    for j in range(columns):
        bound = sum(int((m.col == j).sum()) for m in marginals) - len(marginals) + 1
        assert 1 <= int((column == j).sum()) <= bound


def test_copies_that_fall_short_give_way_to_the_uniform_ones(monkeypatch):
    """Copies whose schedule falls short of the quotient's rate (every piece, at weights
    growing with its index: the roots' shares and the loads are no longer the orbit
    averages) or leave a root without a tree (the identity alone) are replaced by the
    uniform copies, at the quotient's optimum (the full master's: the first test)."""
    topo = canonical(STATES["shared-agg 2x3x4 NIC 150.8"]())
    sym = find_symmetry(topo)
    want = solve_quotient(topo, sym=sym).lp_rate_gbps

    def skewed(topo, sym, q, z, capacity, backend):
        even = uniform_copies(int((z > 0).sum()), sym.pieces())
        frac = even.frac * (1 + even.which)
        return dataclasses.replace(even, frac=frac / np.bincount(even.column, frac)[even.column])

    def identity(topo, sym, q, z, capacity, backend):
        n = int((z > 0).sum())
        return Copies(np.arange(n), np.zeros((1, len(sym.nodes)), np.int64),
                      np.zeros(n, np.int64), np.ones(n))

    for bad in (skewed, identity):
        monkeypatch.setattr(quotient, "_fewer_copies", bad)
        s = solve_quotient(topo, sym=sym)
        assert s is not None and "copies_short" in s.stats
        assert s.rate_gbps == pytest.approx(want, rel=1e-9)
        check_schedule(topo, s)


def _columns_run(topo, sym, tie, monkeypatch):
    """The quotient's column generation at tie-break weight ``tie``: ``(x, rounds, the
    columns as (root, sorted links) keys)``."""
    monkeypatch.setattr(quotient, "QUOTIENT_TIE_BREAK", tie)
    with get_backend("highs") as lp:
        q = _Quotient(topo, sym, topo.arrays.capacity / rate_scale(topo), lp)
        x, _, bound, rounds = _column_generation(topo, q, np.inf, None)
    assert bound - x <= quotient.REL_TOL * x
    return x, rounds, [(r, np.sort(t).tobytes()) for r, t in zip(q.roots, q.trees)]


def test_the_tie_broken_pricing_certifies_the_same_optimum_in_fewer_rounds(monkeypatch):
    """Half-uplinks multi-spine 2x2x8 (a ToR without one spine) with a NIC slowed one way
    (docs/allgather_history.md "Half-uplinks 2x8x8 one way: the quotient's tie-break"): the
    rounds price at the tie-broken duals and then at the duals, and reach the plain
    rounds' certified optimum in fewer rounds (9 against 18), adding a tree found at
    both points once."""
    from bench.fabric_variants import without_cables
    from instances.aggregation import multi_spine

    topo = canonical(_one_way(without_cables(multi_spine(2, 2, 8, spines=2), "s0tor0",
                                             ["spine1"]), "s0h0g1", "s0tor1", 168.223))
    sym = find_symmetry(topo)
    x_tie, rounds_tie, keys = _columns_run(topo, sym, 1e-3, monkeypatch)
    x_plain, rounds_plain, _ = _columns_run(topo, sym, 0.0, monkeypatch)
    assert x_tie == pytest.approx(x_plain, rel=1e-9)
    assert rounds_tie < rounds_plain
    assert len(set(keys)) == len(keys)
