"""Balanced fabrics past ForestColl's exact tree limit, and what cannot certify at
``max_chunks=None`` (issue 25 item 3; docs/allgather_history.md "Balanced fabrics past the exact
tree limit").

An odd capacity (both ways: the switches stay balanced) makes the exact packing need
more than ``EXACT_TREES_LIMIT`` trees per root: up to ``SEEDED_GENERAL_MAX_GPUS`` GPUs
(above it, where ForestColl's scaled packing does not complete) the general method starts from ForestColl's own trees at a few chunks per root and stops at
the cut bound ``x*``, which on a balanced fabric is the forwarding-only optimum.  The
rates are checked against the independent oracle (tests/oracle_allgather.py)."""

from __future__ import annotations

import pytest

import mccl_opt as mo
from mccl_opt.allgather import quotient_stages
from instances import hpn
from instances.aggregation import leaf_spine, scrambled, shared_aggregation, superpod
from mccl_opt.allgather import solve
from mccl_opt.allgather.canonical import canonical
from mccl_opt.allgather.restriction.stages import restrict
from mccl_opt.allgather.restriction import balanced
from mccl_opt.errors import SolveError
from mccl_opt.report import Method, Termination
from tests.oracle_allgather import check_schedule, cut_bound, forwarding_optimum

ODD = 123.457                        # Gbps, both ways: > 4096 exact trees per root

FABRICS = {
    "shared-agg": lambda: shared_aggregation(2, 2, 4).with_capacity(src="s0h0g0", dst="s0tor0",
                                                                    gbps=ODD),
    "leaf-spine": lambda: leaf_spine(2, 2, 4).with_capacity(src="u0h0g0", dst="u0leaf0", gbps=ODD),
    "hpn": lambda: hpn(2, 2, 4).with_capacity(src="s0h0g0", dst="s0tor0", gbps=ODD),
    "superpod": lambda: superpod(2, 2, 4).with_capacity(src="u0h0g0", dst="u0leaf0", gbps=ODD),
}


def _scaled_packing_fails(*args, **kwargs):
    raise SolveError("the scaled packing did not complete (made to fail by the test)")


@pytest.mark.parametrize("family", sorted(FABRICS))
def test_past_the_tree_limit_the_seeded_general_method_reaches_the_cut_bound(family, monkeypatch):
    """Up to ``SEEDED_GENERAL_MAX_GPUS`` the seeded general method solves these fabrics;
    above it the scaled packing does (docs/allgather_history.md "Above the tree limit"), and
    where that fails the seeded general method again: all three at the cut bound."""
    topo = FABRICS[family]()
    bound = cut_bound(topo)                          # brute-force-free, independent max-flows
    s = mo.solve_allgather(topo, max_chunks=None)
    assert s.report.method is Method.GENERAL
    assert "more than 4096 exact trees" in s.stats["general_reason"], "the test needs the limit"
    monkeypatch.setattr(solve, "SEEDED_GENERAL_MAX_GPUS", 0)
    packed = mo.solve_allgather(topo, max_chunks=None)
    assert packed.report.method is Method.FORESTCOLL
    assert packed.lp_rate_gbps == pytest.approx(bound, rel=1e-9)
    monkeypatch.setattr(solve, "pack_scaled", _scaled_packing_fails)
    failed = mo.solve_allgather(topo, max_chunks=None)
    assert "scaled packing did not complete" in failed.stats["general_reason"]
    for sched in (s, failed):
        assert sched.report.method is Method.GENERAL
        assert sched.stats["seed"] == "forestcoll trees"
        assert sched.report.termination is Termination.OPTIMAL
        assert sched.lp_rate_gbps == pytest.approx(bound, rel=1e-9)
        assert check_schedule(topo, sched).rate_gbps == pytest.approx(bound, rel=1e-9)
        mo.validate(topo, sched)


@pytest.mark.parametrize("family", sorted(FABRICS))
def test_the_rate_does_not_depend_on_node_order_or_names(family):
    topo = FABRICS[family]()
    other = scrambled(topo, 12345)
    assert {n.id for n in other.nodes} != {n.id for n in topo.nodes}
    a = mo.solve_allgather(topo, max_chunks=None)
    b = mo.solve_allgather(other, max_chunks=None)
    assert b.rate_gbps == pytest.approx(a.rate_gbps, rel=1e-9)
    check_schedule(other, b)


@pytest.mark.parametrize("family", sorted(FABRICS))
def test_a_chunk_budget_gives_a_valid_schedule_below_the_cut_bound(family):
    topo = FABRICS[family]()
    s = mo.solve_allgather(topo, max_chunks=10)
    checked = check_schedule(topo, s, max_chunks=10)
    assert checked.rate_gbps <= cut_bound(topo) * (1 + 1e-9)
    assert s.rate_gbps >= 0.95 * cut_bound(topo)


def test_a_weaker_direction_below_the_cut_bound_only_seeds_at_none():
    """HPN 1x2x8 with one NVLink at 360 Gbps one way: the weaker-direction optimum is
    below the cut bound, so at ``None`` its exact ForestColl (which could not certify) is
    not run; the answer is the independent forwarding-only optimum."""
    topo = hpn(1, 2, 8).with_capacity(src="s0h0g1", dst="s0h0nvs", gbps=360.0,
                                      both_directions=False)
    s = mo.solve_allgather(topo, max_chunks=None)
    weaker = [a for a in s.report.attempts if a.method is Method.WEAKER_DIRECTIONS]
    assert weaker and "below the cut bound" in weaker[0].outcome
    optimum = forwarding_optimum(topo).rate_gbps
    assert optimum < cut_bound(topo) * (1 - 1e-6)
    assert s.rate_gbps == pytest.approx(optimum, rel=1e-7)
    check_schedule(topo, s)


def test_a_coarsened_restriction_only_seeds_at_none(monkeypatch):
    """Leaf-spine 4x2x8, NIC 160.889 of 400 Gbps one way: the restriction's vertex is too
    fine for the quantum and is rounded onto a coarser grid, which ForestColl cannot
    pack exactly; at ``None`` it only seeds, and the answer is the restriction's optimum
    (certified in exact integers), below the cut bound; at ``K=10`` ForestColl on it
    still runs.  (The seeded quotient, which reaches the same optimum sooner here, is
    kept out.)"""
    monkeypatch.setattr(quotient_stages, "SEEDED_QUOTIENT_MAX_COPIES", 0)
    topo = leaf_spine(4, 2, 8).with_capacity(src="u1h1g0", dst="u1leaf0", gbps=160.889,
                                             both_directions=False)
    restricted = restrict(canonical(topo), "highs")
    assert restricted is not None and restricted.coarsened
    s = mo.solve_allgather(topo, max_chunks=None)
    outcomes = [a.outcome for a in s.report.attempts if a.method is Method.BALANCED_RESTRICTION]
    assert outcomes and "coarser grid" in outcomes[0]
    assert s.stats["seed"] == "balanced restriction"
    assert s.rate_gbps == pytest.approx(restricted.optimum_gbps, rel=1e-9)
    assert s.rate_gbps <= cut_bound(topo) * (1 + 1e-9)
    check_schedule(topo, s)
    k10 = mo.solve_allgather(topo, max_chunks=10)
    assert k10.report.method is Method.BALANCED_RESTRICTION
    check_schedule(topo, k10, max_chunks=10)


def test_a_restriction_misread_at_the_loosest_tolerance_is_read_again_tighter(monkeypatch):
    """A leaf-spine state of the fuzz (seed 3413, scrambled, three one-way changes): the
    LP's vertex read at 1e-12 is not certified (a coarser rational passes for a
    coordinate), at 1e-14 it is; the certified rate is the forwarding-only optimum's
    upper bound and the solve at ``K=10`` uses it."""
    base = scrambled(leaf_spine(4, 2, 8), 169927372)
    topo = canonical(base.with_capacity({("n00040", "n00033"): 4.0, ("n00029", "n00033"): 360.0,
                                         ("n00038", "n00061"): 417.933}))
    monkeypatch.setattr(balanced, "_READ_TOLS", (1e-12,))
    assert balanced.balanced_restriction(topo) is None, "the test needs a misread at 1e-12"
    monkeypatch.undo()
    found = balanced.balanced_restriction(topo)
    assert found is not None
    assert found.rate_gbps <= cut_bound(topo) * (1 + 1e-9)
    s = mo.solve_allgather(topo, max_chunks=10)
    assert s.report.method is Method.BALANCED_RESTRICTION
    assert s.lp_rate_gbps == pytest.approx(found.rate_gbps, rel=1e-9)
    check_schedule(topo, s, max_chunks=10)


def test_at_k_the_trees_that_rounded_too_far_seed_the_general_method(monkeypatch,
                                                                     proportional_spread):
    """Leaf-spine 5x2x8 with 5 spines at ``K=10`` (80 GPUs; 6x2x8 with 4 spines, 96 GPUs,
    took 9 s in the suite): ForestColl's trees round to a schedule below the optimum, which
    the default rounding gap accepts; with the gap made 0 that schedule is rejected, and its
    trees (not multiplicative weights) seed the general method, which reaches the cut bound
    ``x*`` (the fabric is balanced) and rounds to a valid schedule."""
    from mccl_opt.allgather import solve

    monkeypatch.setattr(solve, "RESTRICTION_ROUNDING_GAP", 0.0)
    topo = leaf_spine(5, 2, 8, spines=5)
    s = mo.solve_allgather(topo, max_chunks=10)
    assert s.report.method is Method.GENERAL and s.stats["seed"] == "forestcoll trees"
    bound = cut_bound(topo)
    assert s.lp_rate_gbps == pytest.approx(bound, rel=1e-6)
    checked = check_schedule(topo, s, max_chunks=10)
    assert checked.rate_gbps <= bound * (1 + 1e-9)


def test_up_to_128_gpus_the_restriction_seed_certifies_in_its_first_master():
    """Shared aggregation 2x2x8, NIC 272.6 Gbps one way (the shape of the 2x8x8 state of
    docs/allgather_history.md "Finer restriction seed up to 128 GPUs"): ForestColl's trees on the
    restriction at 10 chunks per root fell 0.1 % short and the column generation took 11
    rounds; at :func:`seed_chunks` (16 here) the first master reaches the certified
    optimum.  The rate is the forwarding-only optimum of the general method run from its
    own multiplicative-weights start (Lagrangian-certified, no restriction involved)."""
    from mccl_opt.allgather.general.method import solve_general
    from mccl_opt.allgather.general.restriction_seed import SMALL_SEED_CHUNKS, seed_chunks

    topo = shared_aggregation(2, 2, 8).with_capacity(src="s0h0g0", dst="s0tor0", gbps=272.6,
                                                     both_directions=False)
    assert seed_chunks(topo.num_gpus) == SMALL_SEED_CHUNKS
    s = mo.solve_allgather(topo, max_chunks=None)
    assert s.report.method is Method.GENERAL and s.stats["seed"] == "balanced restriction"
    assert s.report.termination is Termination.OPTIMAL
    # the restriction's trees alone (half per root first, method.FIRST_SEED_SHARE; no pricing)
    assert s.stats["cg_rounds"] <= 2 and "seed_more_columns" not in s.stats
    assert s.stats["pricing_s"] == 0.0
    unseeded = solve_general(topo, max_chunks=None)
    assert unseeded.stats["seed"] == "multiplicative weights"
    assert unseeded.report.termination is Termination.OPTIMAL
    assert s.rate_gbps == pytest.approx(unseeded.rate_gbps, rel=1e-7)
    assert check_schedule(topo, s).rate_gbps == pytest.approx(s.rate_gbps, rel=1e-9)
    k10 = mo.solve_allgather(topo, max_chunks=10)
    assert check_schedule(topo, k10, max_chunks=10).rate_gbps <= s.rate_gbps * (1 + 1e-9)


def test_below_the_tree_limit_many_packing_entries_go_to_the_seeded_master(monkeypatch):
    """HPN 1x2x8 Fail2 (balanced, ``k = 293`` exact trees per root at 16 GPUs, below the
    tree limit) with the entries threshold lowered below its ``k·n²``: the seeded general
    method solves it at the cut bound (the independent max-flow bound) and says why; at
    the default threshold ForestColl packs it exactly at the same rate, and a chunk limit
    keeps ForestColl."""
    from instances import fail2

    topo = fail2(hpn(1, 2, 8))
    bound = cut_bound(topo)
    packed = mo.solve_allgather(topo, max_chunks=None)
    assert packed.report.method is Method.FORESTCOLL
    monkeypatch.setattr(solve, "SEEDED_GENERAL_ENTRIES", 1)
    seeded = mo.solve_allgather(topo, max_chunks=None)
    assert seeded.report.method is Method.GENERAL
    assert "the seeded master is cheaper" in seeded.stats["general_reason"]
    assert seeded.stats["seed"] == "forestcoll trees"
    for sched in (packed, seeded):
        check_schedule(topo, sched)
        mo.validate(topo, sched)
        assert sched.rate_gbps == pytest.approx(bound, rel=1e-9)
        assert sched.report.termination is Termination.OPTIMAL
    assert mo.solve_allgather(topo, max_chunks=10).report.method is Method.FORESTCOLL


def test_a_seed_of_one_tree_per_root_asks_for_more_chunks(monkeypatch):
    """Mixed-nics 2x4x4 with a 200 Gbps NIC at 199.047 both ways (the shape of fuzz seed
    3525's 2x8x8 state, docs/allgather_history.md "Balanced fabrics past the exact tree limit"):
    at 10 chunks the budget chooses one tree per root, over which the master's rate is
    ForestColl's own, below the cut bound; the seed is taken at :func:`denser_chunks`
    instead, and its first master reaches the cut bound (the independent max-flows), no
    pricing.  The one-tree seed priced to the end gives the same rate."""
    from instances.designs import rail_hosts
    from mccl_opt.allgather.general import restriction_seed

    topo = rail_hosts(2, 4, hosts=4, nic_gbps=(400, 200) * 2).with_capacity(
        src="s0h1g0", dst="s0tor0", gbps=199.047, both_directions=True)
    assert restriction_seed.denser_chunks(canonical(topo)) == 4 * restriction_seed.SEED_CHUNKS
    s = mo.solve_allgather(topo, max_chunks=None)
    assert s.report.method is Method.GENERAL and s.stats["seed"] == "forestcoll trees"
    assert "more than 4096 exact trees" in s.stats["general_reason"], "the test needs the limit"
    assert s.stats["seed_columns"] > topo.num_gpus and s.stats["pricing_s"] == 0.0
    assert s.report.termination is Termination.OPTIMAL
    assert check_schedule(topo, s).rate_gbps == pytest.approx(cut_bound(topo), rel=1e-9)
    monkeypatch.setattr(restriction_seed, "denser_chunks", lambda t: None)
    priced = mo.solve_allgather(topo, max_chunks=None)
    assert priced.stats["seed_columns"] == topo.num_gpus        # one tree per root
    assert priced.stats["cg_rounds"] > 1 and priced.report.termination is Termination.OPTIMAL
    assert priced.rate_gbps == pytest.approx(s.rate_gbps, rel=1e-9)
