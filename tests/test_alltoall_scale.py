"""AllToAll at 128 GPUs: the optimum proven independently of the solver (weak duality),
and the cut prices that certify degenerate fabrics early (docs/alltoall.md, *Scale*).

The compact LP takes minutes at this size, so the proof is checked directly: the
fractional schedule is primal feasible with the rate the validator recomputes, and the
run's certificate prices ``w`` give, by Dijkstra on the base graph (no step bound),
the lower bound ``t* >= sum_p SP_p(w) / max(1, cap·w)`` on ``t = 1/z``.  Both meeting
proves the LP optimum."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra

from instances import fail1, fail2, hpn
from mccl_opt import validate
from mccl_opt.alltoall import solve_alltoall
from mccl_opt.alltoall.colgen import column_generation, cut_prices
from mccl_opt.alltoall.driver import build_master
from mccl_opt.alltoall.problem import problem_for


def dual_bound_rate(topo, w: np.ndarray) -> float:
    """``1 / (sum_p SP_p(w) / max(1, cap·w))`` with SP by scipy's Dijkstra."""
    a = topo.arrays
    m = sp.coo_matrix((w + 1e-300, (a.tail, a.head)), shape=(topo.num_nodes,) * 2).tocsr()
    dist = dijkstra(m, indices=a.gpu_nodes)[:, a.gpu_nodes]
    t_lb = (dist.sum() - np.trace(dist)) / max(1.0, float(a.capacity @ w))
    return 1.0 / t_lb


@pytest.mark.parametrize("make, max_rounds", [(lambda t: t, 1), (fail1, 1), (fail2, 40)],
                         ids=["healthy", "fail1", "fail2"])
def test_128_gpu_optimum_is_proven_by_an_independent_dual(make, max_rounds):
    topo = make(hpn(1, 16, 8))
    sched = solve_alltoall(topo, max_chunks=None)
    assert sched.stats["status"] == "optimal"
    assert sched.stats["rounds"] <= max_rounds      # healthy and Fail1: cut prices, round 1
    rep = validate(topo, sched)
    assert rep.rate_gbps == pytest.approx(sched.lp_rate_gbps, rel=1e-6)
    upper = dual_bound_rate(topo, sched.warm_state.certificate.w)
    assert upper >= rep.rate_gbps * (1 - 1e-9)      # weak duality: never below a feasible rate
    assert upper <= rep.rate_gbps * (1 + 1e-6)      # ... and it meets it: proven optimal


def test_cut_prices_are_the_saturated_links_scaled_to_unit_capacity():
    prob = problem_for(hpn(1, 4, 8))
    steps = prob.topo.num_nodes - 1
    master, _ = build_master(prob, "highs", steps, None)
    sol = master.solve("test")
    w = cut_prices(master, sol)
    load = master.pool.loads(sol.y, prob.num_links)
    saturated = load >= prob.capacity * sol.t * (1 - 1e-6)
    assert saturated.any() and not saturated.all()
    np.testing.assert_array_equal(w > 0, saturated)
    assert float(prob.capacity @ w) == pytest.approx(1.0)
    assert np.unique(w[w > 0]).size == 1
    # the healthy fabric's first vertex dual proves nothing; the cut prices close the gap
    res = column_generation(master, prob, steps)
    assert res.rounds == 1 and res.bound_t == pytest.approx(sol.t, rel=1e-9)
    np.testing.assert_array_equal(res.cert_w, w)


def test_fixed_single_column_pairs_give_the_full_master_optimum_duals_and_basis():
    """A master whose single-column pairs stay out of the solver (fixed at y = 1) reaches
    the same optimum as the full master, and its basis, reported over every pair, is
    optimal for the full master over the same columns (zero pivots from it)."""
    from mccl_opt.alltoall.colgen import farley_bound
    from mccl_opt.alltoall.initial import initial_columns
    from mccl_opt.alltoall.master import ColumnPool, RestrictedMaster
    from mccl_opt.backends import get_backend

    prob = problem_for(fail2(hpn(1, 4, 8)))
    steps = prob.topo.num_nodes - 1
    init = initial_columns(prob, steps, np.ones(prob.num_pairs, dtype=bool))

    def master(fix: bool, pool: ColumnPool | None = None) -> RestrictedMaster:
        if pool is None:
            pool = ColumnPool()
            pool.append(prob.pair_index(init.src, init.dst), init.start, init.arcs)
        return RestrictedMaster(get_backend("highs"), prob.num_pairs, prob.capacity, pool,
                                fix_single_pairs=fix)

    fixed, full = master(True), master(False)
    res_fixed = column_generation(fixed, prob, steps)
    res_full = column_generation(full, prob, steps)
    assert res_fixed.rounds > 1 and 0 < fixed.n_rows < prob.num_pairs
    assert res_fixed.solution.t == pytest.approx(res_full.solution.t, rel=1e-9)
    sol = res_fixed.solution
    single = np.bincount(fixed.pool.pair, minlength=prob.num_pairs)[fixed.pool.pair] == 1
    np.testing.assert_array_equal(sol.y[single], 1.0)
    # the reported duals are dual feasible for every column with equality on used ones
    seg = np.repeat(np.arange(len(fixed.pool)), np.diff(fixed.pool.start))
    price = np.bincount(seg, weights=sol.w[fixed.pool.arcs], minlength=len(fixed.pool))
    assert (price >= sol.sigma[fixed.pool.pair] - 1e-9).all()
    np.testing.assert_allclose(price[sol.y > 1e-9], sol.sigma[fixed.pool.pair][sol.y > 1e-9],
                               atol=1e-9)
    assert sol.sigma.sum() == pytest.approx(sol.t, rel=1e-9)
    # its basis over every pair starts the full master over the same columns at the optimum
    basis = fixed.get_basis()
    n_rows = prob.num_pairs + prob.num_links
    assert basis.col_status.size == len(fixed.pool) + 1 and basis.row_status.size == n_rows
    assert (basis.col_status == 1).sum() + (basis.row_status == 1).sum() == n_rows
    same = ColumnPool()
    same.append(fixed.pool.pair, fixed.pool.start, fixed.pool.arcs)
    check = master(False, same)
    check.start_from(basis)
    again = check.solve("check")
    assert check.basis_used and again.iterations == 0
    assert again.t == pytest.approx(sol.t, rel=1e-9)
    assert farley_bound(res_fixed.shortest, sol.w, prob.capacity, prob) <= sol.t * (1 + 1e-9)


def test_layered_rows_equal_the_copied_list_and_numpy_bit_for_bit():
    """The warm state's layered link lists (``Rows``: kept rows of a shared base plus new
    rows, chained twice) hold the same rows as masking and concatenating copies, and
    their numba sums give the same floats as ``np.bincount`` over the per-entry
    expansion of the copy (empty rows, zero weights and an empty tail included)."""
    from mccl_opt.alltoall._segments import column_loads, column_sums
    from mccl_opt.alltoall.rows import Rows, csr_take
    rng = np.random.default_rng(7)

    def random_rows(n):
        lengths = rng.integers(0, 6, n)
        start = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return start, rng.integers(0, 37, int(start[-1])).astype(np.int64)

    def check(rows, start, arcs):
        assert rows.count == start.size - 1
        assert np.array_equal(rows.flat[0], start) and np.array_equal(rows.flat[1], arcs)
        n = start.size - 1
        seg = np.repeat(np.arange(n), np.diff(start))
        weight = np.where(rng.random(n) < 0.3, 0.0, rng.random(n) / 3)
        price = rng.random(37) / 7
        want = np.bincount(arcs, weights=weight[seg], minlength=37)
        assert np.array_equal(rows.loads(weight, 37), want)
        assert np.array_equal(column_loads(start, arcs, weight, 37), want)
        sums = np.bincount(seg, weights=price[arcs], minlength=n)
        assert np.array_equal(rows.sums(price), sums)
        assert np.array_equal(column_sums(start, arcs, price), sums)
        for idx in (np.flatnonzero(rng.random(n) < 0.2), np.arange(max(n - 3, 0), n),
                    np.array([n - 1, 0, 2])):
            got, want_take = rows.take(idx), csr_take(start, arcs, idx)
            assert np.array_equal(got[0], want_take[0]) and np.array_equal(got[1], want_take[1])

    start, arcs = random_rows(400)
    rows = Rows(start, arcs)
    check(rows, start, arcs)
    for tail in (5, 0, 9):                               # three generations, one adds nothing
        mask = rng.random(rows.count) < 0.8
        s2, a2 = random_rows(tail)
        new = rows.keep_then(mask, s2, np.concatenate([a2, [99]]))   # a2's slack ignored
        kept = csr_take(start, arcs, np.flatnonzero(mask))
        start = np.concatenate([kept[0], kept[0][-1] + s2[1:]])
        arcs = np.concatenate([kept[1], a2])
        assert new.base_arcs is rows.base_arcs           # shared, not copied
        rows = new
        check(rows, start, arcs)
