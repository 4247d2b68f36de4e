"""Fewer trees at equal rate (docs/allgather_history.md "Fewer trees at equal rate"): an exact
ForestColl schedule, on a balanced fabric or on a balanced restriction, is re-weighted at
a vertex of the tree master over its own trees; the rate stays the independent
forwarding-only optimum, every chunk is delivered within the capacities, and the trees
are no more than ForestColl's own and than a basic optimum can have."""

from __future__ import annotations

import dataclasses

import pytest

import mccl_opt as mo
import mccl_opt.allgather.fewer_trees as fewer
from mccl_opt import anytime
from instances import fail2, hpn, irregular, shared_aggregation
from instances.designs import dragonfly
from mccl_opt.allgather.general.restriction_seed import table_columns
from mccl_opt.report import Method, WarmUse
from tests.oracle_allgather import check_schedule, cut_bound, forwarding_optimum


def _one_way(topo: mo.Topology, gbps: float) -> mo.Topology:
    """The first GPU's NIC link (to its ToR) at ``gbps`` in its sending direction only."""
    gpu = topo.gpus[0]
    nic = next(link for link in topo.links if link.src == gpu
               and topo.node(link.dst).kind == "switch" and "nvs" not in link.dst)
    return topo.with_capacity(src=nic.src, dst=nic.dst, gbps=gbps, both_directions=False)


def _both(topo: mo.Topology, monkeypatch: pytest.MonkeyPatch) -> tuple[mo.Schedule, mo.Schedule]:
    """The exact schedule, and the one on ForestColl's own trees (no re-weighting)."""
    sched = mo.solve_allgather(topo, max_chunks=None)
    with monkeypatch.context() as m:
        m.setattr(fewer, "VERTEX_LP_MAX_SIZE", 0)
        own = mo.solve_allgather(topo, max_chunks=None)
    return sched, own


def _shared_agg_one_way() -> mo.Topology:
    return _one_way(shared_aggregation(2, 2, 8), 200.0)


def test_the_rate_is_the_independent_optimum_on_fewer_trees(monkeypatch):
    topo = irregular(7)                     # 10 GPUs on the restriction path: oracle in 0.3 s
    optimum = forwarding_optimum(topo).rate_gbps
    sched, own = _both(topo, monkeypatch)
    assert sched.stats["method"] == own.stats["method"] == "forestcoll-balanced-restriction"
    for s in (sched, own):
        check_schedule(topo, s)
        mo.validate(topo, s)
        assert s.rate_gbps == pytest.approx(optimum, rel=1e-9)
        assert s.lp_rate_gbps == pytest.approx(optimum, rel=1e-9)
    assert len(sched.chunks) < len(own.chunks)              # 81 -> 39
    assert sched.stats["fewer_trees_from"] == len(own.chunks)


def test_the_regressed_restriction_case_is_back_to_the_general_methods_count(monkeypatch):
    """Shared aggregation 2x2x8 with a one-way NIC fault: the restriction's exact
    packing has k = 2619 trees per root (2165 distinct); the general method's vertex had
    123 at the same rate (the forwarding oracle takes minutes here: the restriction's
    certificate and ForestColl's own exact trees are the references)."""
    topo = _shared_agg_one_way()
    sched, own = _both(topo, monkeypatch)
    check_schedule(topo, sched)
    mo.validate(topo, sched)
    assert sched.stats["method"] == "forestcoll-balanced-restriction"
    assert sched.rate_gbps == pytest.approx(own.rate_gbps, rel=1e-9)
    assert sched.rate_gbps == pytest.approx(sched.report.bound_gbps, rel=1e-9)
    # a basic optimum of the master has at most one positive tree per row (roots + links)
    assert len(sched.chunks) < topo.num_gpus + topo.num_links < len(own.chunks)
    assert len(sched.chunks) <= 123
    assert sched.report.k is None                          # shares are no multiples of 1/k


def test_a_chunk_limit_keeps_the_rounded_trees(monkeypatch):
    topo = _shared_agg_one_way()
    sched = mo.solve_allgather(topo, max_chunks=10)
    monkeypatch.setattr(fewer, "VERTEX_LP_MAX_SIZE", 0)
    own = mo.solve_allgather(topo, max_chunks=10)
    assert "fewer_trees_from" not in sched.stats
    assert [c.to_dict() for c in sched.chunks] == [c.to_dict() for c in own.chunks]
    check_schedule(topo, sched, 10)


def test_a_master_over_the_size_limit_is_not_solved(monkeypatch):
    topo = irregular(7)
    monkeypatch.setattr(fewer, "VERTEX_LP_MAX_SIZE", 0)
    sched = mo.solve_allgather(topo, max_chunks=None)
    assert fewer.fewer_trees(topo, sched, None, "highs") is sched


def test_a_balanced_fabric_keeps_its_cut_bound_on_fewer_trees(monkeypatch):
    """HPN 1x2x8 Fail2 is balanced: ForestColl's exact packing (148 trees) reaches the
    cut bound, an independent upper bound; the re-weighted trees reach it too."""
    topo = fail2(hpn(1, 2, 8))
    bound = cut_bound(topo)
    sched, own = _both(topo, monkeypatch)
    assert sched.report.method == own.report.method == Method.FORESTCOLL
    for s in (sched, own):
        check_schedule(topo, s)
        mo.validate(topo, s)
        assert s.rate_gbps == pytest.approx(bound, rel=1e-9)
    assert len(sched.chunks) < topo.num_gpus + topo.num_links < len(own.chunks)
    # ForestColl's own trees at new shares (not rebuilt from the LP), a whole shard per root
    own_trees = {(c.src, c.edges) for c in own.chunks}
    assert all((c.src, c.edges) in own_trees for c in sched.chunks)
    per_root: dict[str, float] = {}
    for c in sched.chunks:
        per_root[c.src] = per_root.get(c.src, 0.0) + c.share
    assert sorted(per_root) == sorted(topo.gpus)
    assert all(v == pytest.approx(1.0, rel=1e-9) for v in per_root.values())


def test_a_warm_solve_of_the_same_state_still_reuses_forestcolls_trees():
    """The re-weighted schedule keeps ForestColl's warm state (its 1/k trees)."""
    topo = fail2(hpn(1, 2, 8))
    prev = mo.solve_allgather(topo, max_chunks=None)
    warm = mo.solve_allgather(topo, warm=prev, max_chunks=None)
    assert warm.stats["warm_route"] == "warm"
    assert warm.rate_gbps == pytest.approx(prev.rate_gbps, rel=1e-9)
    assert len(warm.chunks) <= len(prev.chunks)


def test_a_warm_solve_keeps_the_previous_fewer_trees_where_they_reach_the_rate():
    """A cable off the bottleneck cut by 10 %: the previous schedule's re-weighted trees
    (27, from ForestColl's 148), judged by their own link loads, still reach the certified
    rate, so the warm solve keeps them (no rerouting, no master): exact and valid."""
    topo = fail2(hpn(1, 2, 8))
    prev = mo.solve_allgather(topo, max_chunks=None)
    assert prev.stats["fewer_trees_from"] > len(prev.chunks)
    later = topo.with_capacity(src="s0h0g1", dst="s0tor1", gbps=360.0, both_directions=True)
    warm = mo.solve_allgather(later, warm=prev, max_chunks=None)
    assert warm.report.warm is WarmUse.KEPT
    assert len(warm.chunks) <= len(prev.chunks)
    assert warm.rate_gbps == pytest.approx(mo.solve_allgather(later, max_chunks=None).rate_gbps,
                                           rel=1e-9)
    check_schedule(later, warm)
    mo.validate(later, warm)


def test_a_time_limit_passing_in_the_master_keeps_the_exact_schedule(monkeypatch):
    """The re-weighting runs after ForestColl's exact schedule, which is not offered as
    the time limit's incumbent: a limit passing inside the master must return that exact
    schedule, not fall back to the first (rounded, slower) schedule."""
    topo = fail2(hpn(1, 2, 8))
    exact = mo.solve_allgather(topo, max_chunks=None)

    def limit_passes(*args, **kwargs):
        anytime.run_out("the re-weighting master (made to run out)")

    import mccl_opt.allgather.general.tree_colgen as tree_colgen
    monkeypatch.setattr(tree_colgen, "tree_column_generation", limit_passes)
    limited = mo.solve_allgather(topo, max_chunks=None, time_limit=60.0)
    check_schedule(topo, limited)
    mo.validate(topo, limited)
    assert limited.report.method == Method.FORESTCOLL
    assert limited.rate_gbps == pytest.approx(exact.rate_gbps, rel=1e-12)
    assert limited.report.optimal and limited.report.termination == exact.report.termination


def test_one_tree_per_root_is_not_re_weighted(monkeypatch):
    """Every root's shard needs a tree: with one per root no vertex has fewer, so the
    master is not solved (it cost 0.07 s of a healthy dragonfly 4x4x1x8's solve)."""
    topo = dragonfly(3, 2, 1, 4)
    sched = mo.solve_allgather(topo, max_chunks=None)
    assert len(sched.chunks) == topo.num_gpus
    assert not fewer.master_pays(topo, sched)

    def solved(*args, **kwargs):
        raise AssertionError("the master was solved")

    monkeypatch.setattr(fewer, "_reweighted_once", solved)
    assert fewer.fewer_trees(topo, sched, None, "highs") is sched


def test_the_masters_estimate_counts_its_nonzeros():
    """The estimate grows with the trees' link crossings (the master's nonzeros), the
    columns the master is built from, not with trees x rows."""
    topo = _shared_agg_one_way()
    sched = mo.solve_allgather(topo, max_chunks=None)
    roots, trees = table_columns(sched, topo)
    assert fewer.master_nonzeros(sched) == sum(t.size for t in trees) > 0
    as_tuple = dataclasses.replace(sched, chunks=tuple(sched.chunks))
    assert fewer.master_nonzeros(as_tuple) == fewer.master_nonzeros(sched)
    assert fewer.master_seconds(sched) == pytest.approx(
        fewer.master_nonzeros(sched) * fewer.MASTER_S_PER_NONZERO)


def test_a_basic_solutions_trees_are_independent_and_forestcolls_are_not(monkeypatch):
    """irregular(7): ForestColl's 80 trees are linearly dependent on the rows tight at the
    rate (rank 50: the master re-weights them, 80 -> 39); the master's basic optimum's
    trees are independent (a vertex), so a second master is not solved on them; a
    dependent share below :data:`DEPENDENT_SHARE`, or an estimate above
    :data:`MASTER_CAP_S`, is not worth a master either."""
    topo = irregular(7)
    sched, own = _both(topo, monkeypatch)
    assert len(sched.chunks) < len(own.chunks)
    as_tuple = dataclasses.replace(sched, chunks=tuple(sched.chunks))
    dependent = fewer.dependent_trees(topo, own)
    assert 0 < dependent < len(own.chunks)
    assert fewer.dependent_trees(topo, sched) == fewer.dependent_trees(topo, as_tuple) == 0
    monkeypatch.setattr(fewer, "MASTER_FLOOR_S", 0.0)      # decided by the check alone
    assert fewer.master_pays(topo, own)
    assert not fewer.master_pays(topo, sched)
    monkeypatch.setattr(fewer, "MASTER_CAP_S", 0.0)        # dependent, but estimated above
    assert not fewer.master_pays(topo, own)
    monkeypatch.setattr(fewer, "MASTER_CAP_S", 1.0)
    monkeypatch.setattr(fewer, "DEPENDENT_SHARE", (dependent + 1) / len(own.chunks))
    assert not fewer.master_pays(topo, own)
