"""The pack plan (:mod:`mccl_opt.allgather.forestcoll.pack_plan`): which Phase 3 packers
run, in which order, for each goal and size (docs/allgather_history.md "The pack plan").  Pure
functions of ``(goal, k, n)``: no graph is built."""

from __future__ import annotations

import itertools

import pytest

from mccl_opt.allgather.forestcoll.pack_plan import (FEW_BEFORE_FAST_K, TEST_FIRST_ENTRIES,
                                                     TEST_FIRST_K, TEST_FIRST_SINKS, Goal, Step,
                                                     plan_pack)
from mccl_opt.allgather.forestcoll.packing.exact_packing import EXACT_PACK_MAX_EDGES
from mccl_opt.allgather.forestcoll.packing.few_trees import FEW_TREES_CHEAP_ENTRIES
from mccl_opt.allgather.forestcoll.packing.growth_order import RAIL_FIRST_MIN_RANKS
from mccl_opt.allgather.forestcoll.packing.scaled import PLAIN_FIRST_ENTRIES

S = Step
SIZES = [(k, n) for k, n in itertools.product((1, 2, 10, 41, 63, 64, 65, 145, 700),
                                              (2, 8, 16, 64, 128, 511, 512, 1024))]


def test_goal_of_a_solve():
    assert Goal.of(None) is Goal.EXACT and Goal.of(None, True) is Goal.DECLINABLE
    assert Goal.of(10) is Goal.BUDGET


def test_few_trees_per_root_at_none_greedy_after_the_few_trees_packing():
    """Below ``FEW_BEFORE_FAST_K`` at ``None``: the rail-first retry on small fabrics, the
    few-trees packing before greedy (tight graph or not), the exact packing last where its
    tree edges are few; with a chunk budget the cheap few-trees packing after greedy."""
    assert plan_pack(Goal.EXACT, 1, 16).steps == (
        S.REPAIR, S.GUARDED, S.RAIL_FIRST, S.FEW_TREES, S.GREEDY, S.EXACT_SPLIT, S.EXACT)
    assert plan_pack(Goal.EXACT, 31, 128).steps == (
        S.REPAIR, S.GUARDED, S.RAIL_FIRST, S.FEW_TREES, S.GREEDY, S.EXACT_SPLIT)
    assert plan_pack(Goal.EXACT, 1, 1024).steps == (
        S.REPAIR, S.GUARDED, S.FEW_TREES, S.GREEDY, S.EXACT_SPLIT)
    assert plan_pack(Goal.BUDGET, 1, 16).steps == (
        S.REPAIR, S.GUARDED, S.RAIL_FIRST, S.GREEDY, S.FEW_TREES, S.EXACT_SPLIT, S.EXACT)


def test_many_trees_per_root_try_few_trees_right_after_the_guarded_split():
    plan = plan_pack(Goal.EXACT, FEW_BEFORE_FAST_K, 64)
    assert plan.steps == (S.REPAIR, S.GUARDED, S.FEW_TREES, S.RAIL_FIRST, S.GREEDY,
                          S.EXACT_SPLIT)
    assert plan.plain_first and plan.capped and not plan.declines
    assert plan.guarded_skips_narrow
    late = plan_pack(Goal.EXACT, 700, 64)           # past PLAIN_FIRST_ENTRIES: plain after
    assert 700 * 64 * 64 > PLAIN_FIRST_ENTRIES and not late.plain_first
    assert late.steps[:4] == (S.REPAIR, S.GUARDED, S.FEW_TREES, S.PLAIN)


def test_a_chunk_budget_packs_few_trees_only_when_cheap_and_searches_uncapped():
    for k, n in SIZES:
        plan = plan_pack(Goal.BUDGET, k, n)
        few = S.FEW_TREES in plan.steps
        assert few == (k * n * n <= FEW_TREES_CHEAP_ENTRIES), (k, n)
        assert not plan.capped and not plan.guarded_skips_tight and not plan.declines
        assert plan.guarded_skips_narrow == (few and k >= FEW_BEFORE_FAST_K), (k, n)


def test_a_declinable_packing_past_cheap_entries_runs_one_repair_packing_on_a_sample():
    plan = plan_pack(Goal.DECLINABLE, 145, 128)
    assert plan.steps == (S.REPAIR,) and plan.declines
    assert plan.test_stride == 128 // TEST_FIRST_SINKS       # sampled, although k > 64
    assert plan_pack(Goal.EXACT, 145, 128).test_stride == 1
    # cheap: the exact method's own plan
    cheap = plan_pack(Goal.DECLINABLE, 1, 8)
    assert 8 * 8 <= FEW_TREES_CHEAP_ENTRIES and cheap == plan_pack(Goal.EXACT, 1, 8)


@pytest.mark.parametrize("goal", list(Goal))
def test_every_plan_keeps_the_documented_order(goal):
    """Over a grid of sizes: the repair packing first, each step at most once, in the
    module's order; the rooted test first from ``TEST_FIRST_K`` trees per root or
    ``TEST_FIRST_ENTRIES`` entries; the rail-first retry below ``RAIL_FIRST_MIN_RANKS``;
    the exact packing only up to ``EXACT_PACK_MAX_EDGES`` tree edges."""
    order = list(Step)
    for k, n in SIZES:
        plan = plan_pack(goal, k, n)
        steps = list(plan.steps)
        assert steps[0] is S.REPAIR and len(set(steps)) == len(steps)
        if plan.declines:
            assert steps == [S.REPAIR]
            continue
        rank = [order.index(s) for s in steps if s is not S.FEW_TREES]
        assert rank == sorted(rank), (goal, k, n, steps)
        assert (S.GREEDY in steps) and (S.EXACT_SPLIT in steps)
        assert (S.RAIL_FIRST in steps) == (n < RAIL_FIRST_MIN_RANKS)
        assert (S.EXACT in steps) == (k * n * (n - 1) <= EXACT_PACK_MAX_EDGES)
        assert (S.PLAIN in steps) == (not plan.plain_first)
        if S.FEW_TREES in steps:        # before greedy at None, and from 64 trees per root
            before = steps.index(S.FEW_TREES) < steps.index(S.GREEDY)
            assert before == (k >= FEW_BEFORE_FAST_K or plan.capped)
        # the guarded split's repair packing is skipped only for a few-trees packing next,
        # from FEW_BEFORE_FAST_K trees per root (where it was measured)
        few_next = steps[steps.index(S.GUARDED) + 1] is S.FEW_TREES
        assert plan.guarded_skips_narrow == (few_next and k >= FEW_BEFORE_FAST_K), (k, n)
        tested = k > TEST_FIRST_K or k * n * n >= TEST_FIRST_ENTRIES
        assert (plan.test_stride is not None) == tested
        if tested and k <= TEST_FIRST_K:
            assert plan.test_stride == max(1, n // TEST_FIRST_SINKS)
