"""AllToAll column generation: LP optimum against the compact arc-flow LP (App. G),
certified bound, every backend, schedules that validate, warm start, bottleneck cut,
time limit and step bounds."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
import scipy.sparse as sp
from scipy.optimize import linprog
from scipy.sparse.csgraph import dijkstra

from formulations.compact import build_compact_lp
from instances import dgx, fail1, fail2, fail3, hpn, irregular, ring
from mccl_opt import Schedule, SolverLicenseError, TopologyError, validate
from mccl_opt.alltoall import solve_alltoall
from mccl_opt.alltoall.pricing import PricingGraph, price_paths
from mccl_opt.backends import available_backends

REL = 1e-6


def compact_optimum(topo, max_steps=None) -> float:
    """The compact arc-flow LP optimum, solved by scipy (independent of our backends)."""
    a = topo.arrays
    lp = build_compact_lp(topo.num_nodes, a.tail, a.head, a.capacity, a.is_switch, a.gpu_nodes,
                          max_steps=max_steps, commodities="source")
    res = linprog(-lp.c, bounds=list(zip(lp.col_lo, lp.col_hi)), method="highs", **_rows(lp))
    assert res.status == 0, res.message
    return -res.fun


def _rows(lp):
    eq = lp.row_lo == lp.row_hi
    ub = ~eq
    return {"A_eq": lp.A[eq], "b_eq": lp.row_lo[eq], "A_ub": lp.A[ub], "b_ub": lp.row_hi[ub]}


def check_schedule(topo, sched, z_star):
    rep = validate(topo, sched)
    assert sched.lp_rate_gbps == pytest.approx(z_star, rel=REL)
    assert sched.rate_gbps <= sched.lp_rate_gbps * (1 + 1e-9)
    assert rep.rate_gbps == pytest.approx(sched.rate_gbps, rel=1e-9)
    assert sched.stats["lp_bound_gbps"] >= z_star * (1 - 1e-9)
    return rep


CASES = [f(hpn(1, h, g)) for h, g in ((2, 4), (2, 8), (4, 8)) for f in (fail1, fail2, fail3)]
CASES += [hpn(1, 2, 4), dgx(), ring(4), ring(5)]


@pytest.mark.parametrize("topo", CASES, ids=lambda t: t.name)
def test_cg_optimum_equals_compact_lp_and_schedule_validates(topo):
    z_star = compact_optimum(topo)
    sched = solve_alltoall(topo)
    check_schedule(topo, sched, z_star)
    assert sched.stats["status"] == "optimal"
    # the certified bound never drops below the optimum and ends on it
    ubs = [ub for _, ub in sched.stats["bound_history"]]
    assert all(ub >= z_star * (1 - 1e-9) for ub in ubs)
    assert ubs[-1] == pytest.approx(z_star, rel=REL)
    # chunks are whole multiples of 1/K
    assert all(abs(c.share * 10 - round(c.share * 10)) < 1e-9 for c in sched.chunks)


def test_pair_and_source_compact_models_agree():
    topo = fail2(hpn(1, 2, 4))
    a = topo.arrays
    args = (topo.num_nodes, a.tail, a.head, a.capacity, a.is_switch, a.gpu_nodes)
    vals = []
    for comm in ("pair", "source"):
        lp = build_compact_lp(*args, commodities=comm)
        res = linprog(-lp.c, bounds=list(zip(lp.col_lo, lp.col_hi)), method="highs", **_rows(lp))
        vals.append(-res.fun)
    assert vals[0] == pytest.approx(vals[1], rel=1e-9)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(min_value=0, max_value=10_000))
def test_irregular_fabrics_match_compact(seed):
    topo = irregular(seed)
    sched = solve_alltoall(topo)
    check_schedule(topo, sched, compact_optimum(topo))


@pytest.mark.parametrize("name", available_backends())
def test_every_backend_reaches_the_same_optimum(name):
    topo = fail2(hpn(1, 2, 4))
    try:
        sched = solve_alltoall(topo, backend=name)
    except SolverLicenseError as exc:
        pytest.skip(f"{name}: {exc}")
    check_schedule(topo, sched, compact_optimum(topo))
    assert sched.solver["backend"] == name


def time_expanded_arcs(topo, steps):
    """The time-expanded graph of paper §4.2, built here independently of the package:
    copy ``i`` of every node for ``i = 0..steps``; an arc into a switch stays in its copy,
    any other arc moves one copy up.  Returns (tail, head, physical link) and node count."""
    a = topo.arrays
    n = topo.num_nodes
    et, eh, el = [], [], []
    for i in range(steps + 1):
        for link in range(topo.num_links):
            into_switch = a.is_switch[a.head[link]]
            if into_switch or i < steps:
                et.append(i * n + a.tail[link])
                eh.append((i if into_switch else i + 1) * n + a.head[link])
                el.append(link)
    return np.array(et), np.array(eh), np.array(el), (steps + 1) * n


def test_pricing_equals_time_expanded_dag_shortest_paths():
    """The level-by-level kernel equals Dijkstra on the explicit time-expanded graph."""
    rng = np.random.default_rng(3)
    for seed, steps in ((1, 2), (4, 3), (7, 20)):
        topo = irregular(seed)
        a = topo.arrays
        price = rng.choice([0.0, 0.5, 1.0, 2.0], size=topo.num_links)
        graph = PricingGraph.from_arrays(topo.num_nodes, a.tail, a.head, a.is_switch, a.gpu_nodes)
        g = topo.num_gpus
        out = price_paths(graph, price, np.full((g, g), np.inf), steps)
        et, eh, el, n_exp = time_expanded_arcs(topo, steps)
        # Dijkstra needs one weight per (tail, head): keep the cheapest expanded arc
        w = price[el] + 1e-300
        m = sp.coo_matrix((w, (et, eh)), shape=(n_exp, n_exp)).tocsr()
        m.sum_duplicates()
        dist = dijkstra(m, indices=a.gpu_nodes)
        for s in range(g):
            for d in range(g):
                if s == d:
                    continue
                copies = [i * topo.num_nodes + a.gpu_nodes[d] for i in range(steps + 1)]
                want = dist[s, copies].min()
                assert out.shortest[s, d] == pytest.approx(want, abs=1e-9)
        # returned paths are simple, start/end right and respect the step bound
        for j in range(out.count):
            arcs = out.arcs[out.start[j]:out.start[j + 1]]
            nodes = [a.tail[arcs[0]]] + list(a.head[arcs])
            assert len(set(nodes)) == len(nodes)
            assert nodes[0] == a.gpu_nodes[out.src[j]] and nodes[-1] == a.gpu_nodes[out.dst[j]]
            assert (~a.is_switch[a.head[arcs]]).sum() <= steps
            assert price[arcs].sum() == pytest.approx(out.shortest[out.src[j], out.dst[j]])


def test_warm_start_matches_cold_on_degraded_repaired_and_unrelated():
    base = hpn(1, 2, 8)
    cold = solve_alltoall(base)
    for topo in (fail1(base), fail2(base), fail3(base)):
        warm = solve_alltoall(topo, warm=cold)
        check_schedule(topo, warm, compact_optimum(topo))
        assert warm.stats["warm_columns"] > 0
        repaired = solve_alltoall(base, warm=warm)            # back to the healthy fabric
        check_schedule(base, repaired, cold.lp_rate_gbps)
    other = ring(5)
    check_schedule(other, solve_alltoall(other, warm=cold), compact_optimum(other))


def _state_arrays(ws):
    return [a.copy() for a in (ws.fabric.tail, ws.fabric.head, ws.lp.start, ws.lp.arcs, ws.lp.y,
                               ws.chunks.of_column, ws.fabric.capacity, ws.basis.col_status,
                               ws.basis.row_status)]


@pytest.mark.parametrize("prices", [True, False], ids=["certified-reuse", "basis"])
def test_warm_reuses_basis_and_chunks_when_the_changed_link_is_not_binding(prices):
    base = hpn(1, 4, 8)
    healthy = solve_alltoall(base)
    topo = fail1(base)                 # GPU0 <-> NVSwitch 2880 -> 800: never the bottleneck
    # without the old run's prices the Farley certificate cannot be re-checked: basis path
    start = healthy if prices else dataclasses.replace(healthy.warm_state, certificate=None)
    warm = solve_alltoall(topo, warm=start)
    cold = solve_alltoall(topo)
    check_schedule(topo, warm, compact_optimum(topo))
    assert warm.lp_rate_gbps == pytest.approx(cold.lp_rate_gbps, rel=1e-9)
    assert warm.stats["warm_mode"] == ("reuse" if prices else "basis")
    assert warm.stats["warm_basis"] != prices and not cold.stats["warm_basis"]
    assert warm.solver["iterations"] == 0          # the old solution is optimal as it stands
    assert warm.chunks == healthy.chunks           # same routes and shares: same chunks


def test_warm_after_a_binding_change_does_not_use_the_basis():
    base = hpn(1, 4, 8)
    healthy = solve_alltoall(base)
    topo = fail2(base)                 # GPU0's NIC 400 -> 50: the new bottleneck
    warm = solve_alltoall(topo, warm=healthy)
    assert not warm.stats["warm_basis"]
    check_schedule(topo, warm, compact_optimum(topo))


def test_a_wrongly_reused_basis_falls_back_to_a_cold_solve(monkeypatch):
    import mccl_opt.alltoall.driver as driver

    # a Fail2 run (many columns; a healthy master has one column per pair and is solved
    # in closed form) warm-started on the repaired fabric, where its basis is not optimal
    base = hpn(1, 2, 8)
    degraded = solve_alltoall(fail2(base))
    monkeypatch.setattr(driver, "reusable_basis", lambda prob, state, pool, name: state.basis)
    monkeypatch.setattr("mccl_opt.alltoall.master.BASIS_TRY_ITERATIONS", 1)
    # without chunk routes the local path does not apply: the full master from the basis
    warm = solve_alltoall(base, warm=dataclasses.replace(degraded.warm_state, chunks=None))
    assert not warm.stats["warm_basis"]            # the try ran out of pivots: rebuilt
    check_schedule(base, warm, compact_optimum(base))


def test_one_warm_state_serves_many_warm_starts_unchanged():
    base = hpn(1, 2, 8)
    healthy = solve_alltoall(base)
    before = _state_arrays(healthy.warm_state)
    chunks_before = healthy.chunks
    first = solve_alltoall(fail1(base), warm=healthy)
    second = solve_alltoall(fail2(base), warm=healthy)
    third = solve_alltoall(fail3(base), warm=healthy)
    again = solve_alltoall(fail1(base), warm=healthy)
    for a, b in zip(before, _state_arrays(healthy.warm_state)):
        np.testing.assert_array_equal(a, b)
    assert healthy.chunks is chunks_before
    assert first.stats["warm_mode"] == again.stats["warm_mode"] == "reuse"
    assert again.to_dict()["chunks"] == first.to_dict()["chunks"]
    for topo, sched in ((fail2(base), second), (fail3(base), third)):
        check_schedule(topo, sched, compact_optimum(topo))


def test_warm_start_from_a_schedule_file_uses_its_chunk_paths():
    base = hpn(1, 2, 4)
    loaded = Schedule.from_dict(solve_alltoall(base).to_dict())
    assert loaded.warm_state is None
    topo = fail2(base)
    warm = solve_alltoall(topo, warm=loaded)
    assert warm.stats["warm_columns"] > 0
    check_schedule(topo, warm, compact_optimum(topo))


def test_bottleneck_is_exactly_the_lp_saturated_links():
    topo = fail2(hpn(1, 2, 8))
    sched = solve_alltoall(topo)
    lp = sched.warm_state.lp
    t = 1.0 / sched.lp_rate_gbps
    seg = np.repeat(np.arange(lp.y.size), np.diff(lp.start))
    lp_load = np.bincount(lp.arcs, weights=lp.y[seg], minlength=topo.num_links)
    saturated = lp_load >= topo.arrays.capacity * t * (1 - 1e-6)
    loads = validate(topo, sched).loads
    expected = {(topo.links[a].src, topo.links[a].dst) for a in np.flatnonzero(saturated & (loads > 0))}
    got = {(b.src, b.dst) for b in sched.bottleneck}
    assert got == expected and got
    for b in sched.bottleneck:
        a = topo.link_index(b.src, b.dst)
        assert b.chunks == pytest.approx(loads[a] * 10)
        assert b.base_slack == pytest.approx(1 - sched.rate_gbps * loads[a] / topo.arrays.capacity[a])


def test_time_limit_returns_a_valid_schedule_with_its_bound():
    topo = fail2(hpn(1, 4, 8))          # Fail1 certifies in round 1 (cut prices); Fail2 needs ~15
    sched = solve_alltoall(topo, time_limit=1e-4)
    assert sched.stats["status"] == "time_limit"
    validate(topo, sched)
    assert sched.rate_gbps <= sched.lp_rate_gbps * (1 + 1e-9)
    assert sched.stats["lp_bound_gbps"] >= sched.lp_rate_gbps * (1 - 1e-9)


def test_max_steps_int_matches_time_expanded_compact_lp():
    topo = fail2(hpn(1, 2, 4))
    for steps in (2, 3):
        sched = solve_alltoall(topo, max_steps=steps)
        rep = check_schedule(topo, sched, compact_optimum(topo, max_steps=steps))
        assert rep.max_steps <= steps
    with pytest.raises(TopologyError, match="max_steps"):
        solve_alltoall(ring(5), max_steps=1)


def test_max_steps_min_is_the_smallest_lossless_bound():
    topo = fail3(hpn(1, 2, 4))
    z_star = compact_optimum(topo)
    sched = solve_alltoall(topo, max_steps="min")
    m = sched.stats["min_steps"]
    rep = check_schedule(topo, sched, z_star)
    assert rep.max_steps <= m
    assert compact_optimum(topo, max_steps=m) == pytest.approx(z_star, rel=REL)
    assert compact_optimum(topo, max_steps=m - 1) < z_star * (1 - 1e-6)


def test_fractional_schedule_reaches_the_lp_rate():
    topo = fail2(hpn(1, 2, 8))
    sched = solve_alltoall(topo, max_chunks=None)
    check_schedule(topo, sched, compact_optimum(topo))
    assert sched.rate_gbps == pytest.approx(sched.lp_rate_gbps, rel=1e-6)


def test_bad_arguments_raise():
    with pytest.raises(ValueError):
        solve_alltoall(ring(4), max_chunks=0)
    with pytest.raises(ValueError):
        solve_alltoall(ring(4), max_steps="fast")


def test_column_generation_reports_a_round_limit_not_optimal():
    from mccl_opt.alltoall.colgen import CGOptions, CGStatus, column_generation
    from mccl_opt.alltoall.driver import build_master
    from mccl_opt.alltoall.problem import problem_for

    prob = problem_for(fail2(hpn(1, 2, 8)))
    steps = prob.topo.num_nodes - 1
    master, _ = build_master(prob, "highs", steps, None)
    cut = column_generation(master, prob, steps, options=CGOptions(max_rounds=1))
    assert cut.status is CGStatus.ROUND_LIMIT and cut.rounds == 1
    assert cut.rate < cut.rate_bound * (1 - 1e-7)          # not certified yet
    done = column_generation(master, prob, steps)          # the same master, to the end
    assert done.status is CGStatus.OPTIMAL
    assert done.rate == pytest.approx(compact_optimum(prob.topo), rel=REL)
