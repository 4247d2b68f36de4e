"""AllToAll on imported and irregular fabrics (docs/alltoall.md, *Imported fabrics*): the
cut bounds of the saturated set's capacity classes (``colgen.class_cut_prices``) are
never below the compact LP's optimum (paper App. G, scipy's HiGHS: independent of column
generation) and equal it where they certify the run; NCCL-XML imported DGX fabrics,
with and without their CPU paths, reach the compact optimum cold and warm."""

from __future__ import annotations

import numpy as np
import pytest

import mccl_opt as mo
from bench.alltoall_bounds import recorded_bounds
from bench.allgather_chains import events
from bench.fuzz_alltoall import chain, compact_optimum
from instances import DATA_DIR
from instances.aggregation import host_ring, host_torus, superpod
from mccl_opt.alltoall import colgen, driver
from mccl_opt.alltoall.master import RestrictedMaster
from mccl_opt.alltoall.pricing import price_paths
from mccl_opt.alltoall.problem import problem_for

DGX = DATA_DIR / "hosts" / "dgx-h100.xml"
REL = 1e-6


def _fabrics() -> list[mo.Topology]:
    """An irregular fabric with odd capacities and one-way degradations, and event chains
    (one-way and two-way degradations, repairs) on a SuperPOD-like fabric, a host ring
    and a host torus (32 GPUs each): the healthy SuperPOD is certified by a capacity
    class, the others' saturated sets have classes with positive cut bounds."""
    out = chain(7, 2, 8, np.random.default_rng(7))
    for base in (superpod(2, 2, 8), host_ring(4, 8), host_torus(2, 2, 8)):
        out += [base] + [t.renamed(f"{base.name}-e{i}") for i, (_, t) in
                         enumerate(events(base, np.random.default_rng(1), 3))]
    return out


def _class_bounds_of_every_master_solution(monkeypatch, prob) -> list[float]:
    """Every master solve of the run also computes the class cut bounds of its solution
    (each a valid bound whatever the solution: ``class_cut_prices``'s proof), as rates."""
    seen: list[float] = []
    solve = RestrictedMaster.solve
    steps = prob.graph.n_nodes - 1
    none = np.full((prob.num_gpus, prob.num_gpus), -np.inf)

    def solve_and_bound(self, *args, **kwargs):
        sol = solve(self, *args, **kwargs)
        if self.capacity.size == prob.num_links:
            for w in colgen.class_cut_prices(self, sol):
                sp = float(prob.pair_values(price_paths(prob.graph, w, none, steps).shortest).sum())
                if sp > 0:
                    seen.append(max(1.0, float(self.capacity @ w)) / sp)
        return sol

    monkeypatch.setattr(RestrictedMaster, "solve", solve_and_bound)
    return seen


def test_class_cut_bounds_are_never_below_the_compact_optimum_and_certify_it(monkeypatch):
    checked = certified_by_class = 0
    for topo in _fabrics():
        z = compact_optimum(topo)
        prob = problem_for(topo)
        every = _class_bounds_of_every_master_solution(monkeypatch, prob)
        # every priced column added, as when these fabrics were chosen: the class cut then
        # certifies one of them (partial pricing reaches the optimum on other vertices)
        monkeypatch.setattr(driver, "STRONGEST_COLUMNS", 0.0)
        with recorded_bounds() as rec:
            sched = mo.solve_alltoall(topo)
        monkeypatch.undo()
        assert sched.lp_rate_gbps == pytest.approx(z, rel=REL), topo.name
        assert sched.stats["lp_bound_gbps"] >= z * (1 - 1e-9), topo.name
        # an upper bound on the rate: never below the optimum, whichever solution gave it
        for r in every + rec.rates():
            assert r >= z * (1 - 1e-9), topo.name
        checked += len(every) + len(rec.rates("class"))
        # the loop's best bound came from a capacity class: it is the optimum itself
        best_kind, best_t = max(rec.bounds, key=lambda kb: kb[1])
        if best_kind == "class":
            assert 1.0 / best_t == pytest.approx(z, rel=REL), topo.name
            certified_by_class += 1
    assert checked >= 10 and certified_by_class >= 1      # the property is not vacuous


@pytest.mark.parametrize("hosts,cpu_paths", [(2, True), (2, False), (4, False)])
def test_imported_dgx_reaches_the_compact_optimum_cold_and_warm(hosts, cpu_paths):
    topo = mo.Topology.from_nccl_xml(DGX, hosts=hosts, network="rail", cpu_paths=cpu_paths)
    # one NIC's rail link at half capacity: the warm start repairs the old optimum
    link = next(l for l in topo.links if l.dst.startswith("rail"))
    half = topo.with_capacity({(link.src, link.dst): link.capacity_gbps / 2})
    cold = mo.solve_alltoall(topo)
    for fabric, warm in ((topo, None), (half, cold), (half, None)):
        z = compact_optimum(fabric)
        with recorded_bounds() as rec:
            sched = mo.solve_alltoall(fabric, warm=warm)
        assert sched.lp_rate_gbps == pytest.approx(z, rel=REL)
        assert all(r >= z * (1 - 1e-9) for r in rec.rates())
        rep = mo.validate(fabric, sched)
        assert rep.rate_gbps == pytest.approx(sched.rate_gbps, rel=1e-9)
        assert sched.rate_gbps <= sched.lp_rate_gbps * (1 + 1e-9)
    # every GPU sends 8 of its 15 blocks across hosts through 8 x 400 Gbps NICs per host
    if hosts == 2:
        assert cold.lp_rate_gbps == pytest.approx(3200 / 64)


def test_initial_routing_is_certified_only_when_it_is_optimal():
    """The cold start's routing (one path per pair) of the healthy 8-host DGX import is
    the optimum, and its busiest links' cut says so; with a NIC link halved it is not,
    and the certificate must not claim it.  The optima are the NIC cuts of host 0, by
    hand: its 8 GPUs send 8 x 56 blocks to the other hosts through 8 x 400 Gbps (3200;
    3000 with one link at 200); bench/bench_alltoall_imports.py finds the compact LP
    at both values."""
    from mccl_opt.alltoall.initial import _cut_certified, initial_columns

    topo = mo.Topology.from_nccl_xml(DGX, hosts=8, network="rail")
    link = next(l for l in topo.links if l.src == "h0nic0" and l.dst.startswith("rail"))
    half = topo.with_capacity({(link.src, link.dst): link.capacity_gbps / 2})
    for fabric, z, optimal in ((topo, 3200 / 448, True), (half, 3000 / 448, False)):
        prob = problem_for(fabric)
        steps = prob.graph.n_nodes - 1
        init = initial_columns(prob, steps, np.ones(prob.num_pairs, dtype=bool))
        pairs = prob.pair_index(init.src, init.dst)
        np.testing.assert_array_equal(np.sort(pairs), np.arange(prob.num_pairs))  # each once
        load = np.bincount(init.arcs, minlength=prob.num_links).astype(float)
        t = float((load / prob.capacity).max())
        assert 1.0 / t <= z * (1 + 1e-9)
        assert (1.0 / t == pytest.approx(z, rel=REL)) is optimal
        assert _cut_certified(prob, steps, load, t) is optimal
