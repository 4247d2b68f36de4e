"""The general AllGather method's restriction seed (mccl_opt.allgather.general.restriction_seed,
docs/allgather_history.md "Restriction seed"): ForestColl's trees on the best balanced restriction
as starting columns and its certified rate as the stop, on unbalanced fabrics."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import mccl_opt as mo
from instances import hpn
from instances.aggregation import shared_aggregation
from mccl_opt.allgather.canonical import canonical
from mccl_opt.allgather.chain import weaker_directions
from mccl_opt.allgather.general import method
from mccl_opt.allgather.general.method import solve_general
from mccl_opt.allgather.general.restriction_seed import RestrictionSeed, restriction_seed, \
    table_columns
from mccl_opt.allgather.restriction.stages import restrict
from mccl_opt.allgather.solve import sub_forestcoll
from mccl_opt.allgather.stage import Trail
from tests.oracle_allgather import check_schedule, forwarding_optimum

#: one NIC uplink at a quarter of its speed one way; one NVLink at 360 Gbps one way
FAULTS = [("s0h0g0", "s0tor0", 100.0), ("s0h0g1", "s0h0nvs", 360.0)]


def _faulty(shape: tuple[int, int, int], fault: tuple[str, str, float]):
    src, dst, gbps = fault
    return canonical(hpn(*shape).with_capacity(src=src, dst=dst, gbps=gbps,
                                               both_directions=False))


def _seed(topo) -> RestrictionSeed | None:
    """The seed as the method chain makes it: its restriction, its ForestColl."""
    restricted = restrict(topo, "highs")
    return None if restricted is None else restriction_seed(
        restricted, sub_forestcoll("highs", Trail()), weaker_directions(topo))


@pytest.mark.parametrize("shape,fault", [((1, 2, 8), FAULTS[0]), ((1, 2, 8), FAULTS[1]),
                                         ((2, 2, 2), FAULTS[0])])
def test_seeded_general_method_reaches_the_independent_forwarding_optimum(shape, fault):
    """Seeded from the restriction, ``max_chunks=None`` returns the forwarding-only optimum
    of an independent compact LP (tests/oracle_allgather.py, Edmonds' branching theorem),
    a schedule the validator accepts at that rate, and the same optimum as the
    multiplicative-weights start certified by its own Lagrangian bound."""
    topo = _faulty(shape, fault)
    s = solve_general(topo, max_chunks=None, seed=_seed(topo))
    assert s.stats["seed"] == "balanced restriction" and s.stats["cg_status"] == "optimal"
    opt = forwarding_optimum(topo).rate_gbps
    assert s.lp_rate_gbps == pytest.approx(opt, rel=1e-7)
    checked = check_schedule(topo, s)
    assert checked.rate_gbps == pytest.approx(opt, rel=1e-6)
    assert s.report.bound_gbps == pytest.approx(opt, rel=1e-7)


def test_without_a_restriction_the_multiplicative_weights_start_gives_the_same_optimum():
    """With no seed the old start runs and, certified by the Lagrangian bound, lands on
    the seeded run's optimum."""
    topo = _faulty((1, 4, 8), FAULTS[0])
    seeded = solve_general(topo, max_chunks=None, seed=_seed(topo))
    plain = solve_general(topo, max_chunks=None)
    assert plain.stats["seed"] == "multiplicative weights" and plain.stats["cg_gap"] <= 1e-8
    assert seeded.stats["seed"] == "balanced restriction"
    assert seeded.lp_rate_gbps == pytest.approx(plain.lp_rate_gbps, rel=1e-8)


def test_seed_trees_fit_the_fabric_and_the_rate_bounds_them():
    """The seed's schedule (on ``c' <= c``) is valid on the real fabric, its rate there at
    most the restriction's certified optimum, and so are the weaker direction's and the
    denser packing's (:attr:`RestrictionSeed.denser`); its columns, converted in arrays, are the
    same trees as the chunk by chunk conversion reads from the schedule."""
    topo = _faulty((1, 2, 8), FAULTS[0])
    seed = _seed(topo)
    assert seed is not None
    # its rate_gbps is in the restricted fabric's scaled units: recomputed, not compared
    assert seed.more is not None and seed.denser is not None
    denser = seed.denser()                           # the restriction's at more chunks
    assert denser is not None
    for sched in seed.schedules + (seed.more(), denser):
        on_topo = check_schedule(topo, dataclasses.replace(sched, rate_gbps=0.0),
                                 rel=float("inf"))
        assert on_topo.rate_gbps <= seed.rate_gbps * (1 + 1e-9)
    columns = seed.columns(topo)
    assert columns is not None
    roots, trees = columns
    chunk_roots, chunk_trees = method.chunk_columns(seed.schedules, topo)
    assert roots == chunk_roots and len(trees) == sum(len(s.chunks) for s in seed.schedules)
    assert all(np.array_equal(a, b) for a, b in zip(trees, chunk_trees))


def test_table_columns_map_a_schedule_listed_in_another_node_order():
    """The weaker-direction fabric's schedule (its table in its own canonical order), and
    the restriction's, converted onto the fabric listed in reverse order: the same trees
    as the chunk by chunk conversion on the fabric, ranks and links renumbered; a
    schedule over a node the fabric lacks is not converted."""
    topo = _faulty((1, 2, 8), FAULTS[0])
    seed = _seed(topo)
    assert seed is not None and seed.more is not None
    backwards = mo.Topology(topo.name, list(reversed(topo.nodes)), list(reversed(topo.links)),
                            dict(topo.extra))
    for sched in seed.schedules + (seed.more(),):
        found = table_columns(sched, backwards)
        assert found is not None
        slow_roots, slow_trees = method.chunk_columns((sched,), topo)
        last_gpu, last_link = topo.num_gpus - 1, topo.num_links - 1   # reversed numbering
        assert found[0] == [last_gpu - r for r in slow_roots]
        assert len(slow_trees) == len(sched.chunks) == len(found[1])
        assert all(np.array_equal(a, last_link - b) for a, b in zip(found[1], slow_trees))
    smaller = mo.Topology(topo.name, [nd for nd in topo.nodes if nd.id != topo.gpus[-1]],
                          [l for l in topo.links if topo.gpus[-1] not in (l.src, l.dst)],
                          dict(topo.extra))
    assert table_columns(seed.schedules[0], smaller) is None


def test_the_chain_computes_the_restriction_once_and_seeds_the_general_method(monkeypatch):
    """Through ``solve_allgather``: where ForestColl on the restriction does not reach its
    optimum exactly (HPN 1x2x8, one NVLink at 1234.5 Gbps one way, ``max_chunks=None``) the
    general method runs seeded from the same restriction; the cutting-plane LP ran once.
    (A NIC at 123.4 Gbps one way now seeds from the weaker direction's trees instead:
    docs/allgather_history.md, "Weaker direction past the exact tree count".)"""
    from mccl_opt.allgather.restriction import balanced

    calls = []
    real = balanced.balanced_restriction
    monkeypatch.setattr(balanced, "balanced_restriction",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    topo = _faulty((1, 2, 8), ("s0h0g1", "s0h0nvs", 1234.5))
    s = mo.solve_allgather(topo, max_chunks=None)
    assert any(a.method.value == "general" for a in s.report.attempts)
    assert s.stats["seed"] == "balanced restriction" and len(calls) == 1
    assert check_schedule(topo, s).rate_gbps == pytest.approx(s.rate_gbps, rel=1e-9)


def test_balanced_fabrics_skip_the_seed():
    assert solve_general(hpn(1, 2, 4), max_chunks=None).stats["seed"] == "multiplicative weights"


def test_chunk_counts_skip_the_limits_that_repeat_a_failed_budget():
    """A budget of ``k`` trees per root that could not be packed is chosen again by every
    limit down to ``k``: the retry goes on at ``k - 1``; any other failure tries the next
    limit; each limit is yielded at most once, in decreasing order."""
    from mccl_opt.allgather.budget import BudgetUnpacked, ChunkCounts
    from mccl_opt.errors import SolveError

    counts, seen = ChunkCounts(10), []
    for limit in counts:
        seen.append(limit)
        if limit == 10:
            counts.failed(BudgetUnpacked(7, "split failed"))     # 9, 8, 7 choose k = 7 too
        elif limit == 6:
            counts.failed(SolveError("something else"))         # no budget known: next
        elif limit == 5:
            counts.failed(BudgetUnpacked(9, "a larger k"))       # never goes back up
    assert seen == [10, 6, 5, 4, 3, 2, 1]



def test_the_second_seed_trees_let_the_master_pass_the_single_entry_rate(monkeypatch):
    """Shared aggregation 2x5x8 with one NIC uplink at 272.6 of 400 Gbps one way: at the
    optimum (41.499 Gbps) hosts take more fabric ingress than one entry per tree; trees that
    enter every host once stop at 41.143 (docs/allgather_history.md "The seed's trees and sibling
    pairs").  The seed's second set (the weaker direction's, by the proportional split)
    supplies second entries: the master over both sets reaches the bound without pricing
    (with siblings last in both: 12 rounds of pricing)."""
    from mccl_opt.allgather import quotient_stages

    monkeypatch.setattr(quotient_stages, "QUOTIENT_MIN_GPUS", 10**9)  # not the quotients
    topo = shared_aggregation(2, 5, 8).with_capacity(src="s1h0g0", dst="s1tor0", gbps=272.602,
                                                      both_directions=False)
    s = mo.solve_allgather(topo, max_chunks=None)
    assert s.stats["seed"] == "balanced restriction" and s.stats["seed_more_columns"] > 0
    # half of each root's seed trees, then all of them, then the second set with them
    # (method.FIRST_SEED_SHARE)
    assert s.stats["cg_status"] == "optimal" and s.stats["cg_rounds"] == 3
    assert s.stats["pricing_s"] == 0.0
    assert s.lp_rate_gbps == pytest.approx(41.498829430, rel=1e-9)
    check_schedule(topo, s)


def test_split_seed_keeps_each_roots_first_trees_and_partitions_the_rest():
    """Each root keeps its first ``ceil(share * count)`` trees in seed order; the two parts
    hold every column once."""
    roots = [0, 1, 0, 0, 2, 1, 0]
    trees = [np.array([i]) for i in range(len(roots))]
    (fr, ft), (rr, rt) = method.split_seed(roots, trees, 0.5)
    assert [int(t[0]) for t in ft] == [0, 1, 2, 4] and fr == [0, 1, 0, 2]
    assert [int(t[0]) for t in rt] == [3, 5, 6] and rr == [0, 1, 0]


def test_seed_trees_held_back_join_before_any_pricing(monkeypatch):
    """With one seed tree per root in the first master (short of the bound), the held-back
    seed trees are the next columns: the optimum is reached with the seed's columns alone,
    in one more master, not by pricing."""
    topo = _faulty((1, 2, 8), FAULTS[0])
    seed = _seed(topo)
    monkeypatch.setattr(method, "FIRST_SEED_SHARE", 1.0)
    full = solve_general(topo, max_chunks=None, seed=seed)
    monkeypatch.setattr(method, "FIRST_SEED_SHARE", 1e-9)
    held = solve_general(topo, max_chunks=None, seed=seed)
    assert full.stats["cg_rounds"] == 1 and held.stats["cg_status"] == "optimal"
    assert held.stats["cg_rounds"] == 2 and held.stats["columns"] == full.stats["columns"]
    assert held.lp_rate_gbps == pytest.approx(full.lp_rate_gbps, rel=1e-9)


def test_general_seed_at_128_gpus_certifies_in_its_first_master(monkeypatch):
    """Fuzz seed 3515's shared-nic 2x8x8 (2 GPUs per NIC, 128 GPUs) with a PCIe link at
    460.8 Gbps and a NIC uplink at 4 Gbps one way: no symmetry quotient, ``c'`` past the
    tree limit, so the general method makes its own seed, at the denser packing's 32
    chunks (``k = 19``, about as many trees as 16 chunks' ``k = 15``, which fell short
    twice and needed the weaker direction's trees).  Its first master reaches ``c'``'s
    optimum, the rate ForestColl's scaled packing on ``c'`` (another method) reaches,
    and the schedule is valid."""
    from instances.designs import rail_hosts
    from mccl_opt.allgather.general.restriction_seed import dense_pays, dense_seed, seed_chunks
    from mccl_opt.allgather.restriction import stages
    from mccl_opt.report import Method

    base = rail_hosts(2, 8, hosts=8, gpus_per_nic=2)
    topo = base.with_capacity(src="s1h4g5", dst="s1h4pcie2", gbps=460.8)
    topo = topo.with_capacity(src="s0h0pcie2", dst="s0tor2", gbps=4.0, both_directions=False)
    assert dense_seed(topo.num_gpus) and not dense_seed(64) and not dense_seed(256)
    assert dense_pays(restrict(canonical(topo), "highs").sub, seed_chunks(128))   # 15 -> 19
    # a NIC at 0.377 of its speed: the denser budget triples the trees per root (10 -> 27)
    slower = base.with_capacity(src="s0h0pcie0", dst="s0tor0", gbps=150.8,
                                both_directions=False)
    assert not dense_pays(restrict(canonical(slower), "highs").sub, seed_chunks(128))
    s = mo.solve_allgather(topo, max_chunks=None)
    assert s.report.method is Method.GENERAL and s.stats["seed"] == "balanced restriction"
    assert s.stats["cg_rounds"] == 1 and "seed_more_columns" not in s.stats
    assert s.report.termination.value == "optimal"
    mo.validate(topo, s)
    monkeypatch.setattr(stages, "SCALED_RESTRICTION_FROM", topo.num_gpus)
    packed = mo.solve_allgather(topo, max_chunks=None)
    assert packed.report.method is Method.BALANCED_RESTRICTION
    assert s.rate_gbps == pytest.approx(packed.rate_gbps, rel=1e-9)
