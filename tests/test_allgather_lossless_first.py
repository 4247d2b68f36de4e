"""Lossless balancing first (docs/allgather_history.md "Lossless balancing first: dragonfly one way
at None"): a GPU short of its trees is rejected before the rooted test, a balancing that
must stay lossless returns before the lossy options, and the general method's seed weighs
a smaller budget balanced without loss, packing the lossy one where that does not pack."""

from __future__ import annotations

import numpy as np
import pytest

import mccl_opt as mo
from instances import hpn
from instances.designs import dragonfly
from mccl_opt.allgather import solve
from mccl_opt.allgather.budget import choose_trees
from mccl_opt.allgather.canonical import canonical
from mccl_opt.allgather.fabric import fabric_of
from mccl_opt.allgather.forestcoll import pipeline
from mccl_opt.allgather.forestcoll.pack_plan import ForestCollAsk, Goal
from mccl_opt.allgather.forestcoll.removal.unit_rounding import _gpu_short
from mccl_opt.allgather.forestcoll.throughput import _violated_cut, optimal_rate
from mccl_opt.allgather.general.restriction_seed import forestcoll_trees
from mccl_opt.allgather.restriction.stages import restrict
from mccl_opt.allgather.solve import sub_forestcoll
from mccl_opt.allgather.stage import Declined, Trail
from mccl_opt.errors import SolveError
from mccl_opt.report import Termination


def test_a_gpu_short_of_its_trees_fails_the_rooted_test_too():
    """The one-GPU screen is a necessary condition of the rooted test: it never rejects
    units that admit ``k`` trees per root, and it does reject (the chunk budget's units on
    HPN 1x2x4, links lowered at random)."""
    fab, _ = fabric_of(hpn(1, 2, 4))
    k, y, _ = choose_trees(fab, optimal_rate(fab), 4)
    floors = (fab.cap * y.denominator) // y.numerator
    n, rng = fab.num_gpus, np.random.default_rng(7)
    seen = {True: 0, False: 0}
    for _ in range(60):
        units = floors - rng.integers(0, 2, fab.cap.size) * rng.integers(0, 2, fab.cap.size)
        passes = _violated_cut(fab, units, k, n * k, fab.gpus)[0] < 0
        short = _gpu_short(fab, units, k)
        assert not (short and passes)
        seen[short] += 1
    assert seen[True] and seen[False]
    assert not _gpu_short(fab, floors, k)


def test_a_lossless_balancing_returns_before_the_lossy_options(monkeypatch):
    """Goal ``EXACT`` at ``None``: the re-optimised and symmetrized budgets are not
    computed for a balancing that is declined anyway; under ``DECLINABLE`` they are."""
    topo = canonical(dragonfly(3, 2, 1, 4).with_capacity(src="d0r0h0g0", dst="d0r0",
                                                         gbps=200.0, both_directions=False))
    calls = []
    split_for = pipeline._split_for
    monkeypatch.setattr(pipeline, "_split_for", lambda *a: calls.append(1) or split_for(*a))
    forestcoll = sub_forestcoll("highs", Trail())
    assert isinstance(forestcoll(topo, None, None, ForestCollAsk(goal=Goal.EXACT)), Declined)
    assert not calls
    lossy = forestcoll(topo, None, None, ForestCollAsk(goal=Goal.DECLINABLE))
    assert isinstance(lossy, mo.Schedule)
    assert calls


def test_the_seed_takes_fewer_trees_balanced_without_loss(monkeypatch):
    """Dragonfly 4x4x1x8 with one NVLink at half one way (fuzz seeds 3497 / 3511's fault):
    the restriction's budget at 16 chunks, 13 trees per root, balances only lossily; the
    seed takes 8 balanced without loss at the same bandwidth, the master over them
    certifies the optimum, and where 8 do not pack the lossy 13 are packed."""
    topo = canonical(dragonfly(4, 4, 1, 8).with_capacity(
        src="d0r0h0g1", dst="d0r0h0nvs", gbps=1440.0, both_directions=False))
    sched = mo.solve_allgather(topo, max_chunks=None)
    assert sched.report.termination is Termination.OPTIMAL
    assert sched.stats["seed_columns"] == 8 * topo.num_gpus
    assert sched.rate_gbps == pytest.approx(sched.report.bound_gbps, rel=1e-9)
    mo.validate(topo, sched)
    restricted = restrict(topo, "highs")
    real = solve._pack

    def failing(run, route, balanced, *a):
        if balanced.k == 8:
            raise SolveError("no fast packing (test)")
        return real(run, route, balanced, *a)

    monkeypatch.setattr(solve, "_pack", failing)
    fallback = forestcoll_trees(restricted.sub, sub_forestcoll("highs", Trail()), ForestCollAsk(
        headroom=restricted.restriction.headroom(), fewer=True), 16)
    assert len(fallback.chunks) == 13 * topo.num_gpus
    assert not fallback.stats["balanced_exactly"]
