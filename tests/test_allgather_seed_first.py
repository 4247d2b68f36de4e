"""One master over the restriction seed first (mccl_opt.allgather.seed_first,
docs/allgather_history.md "Seed first"): at ``max_chunks=None`` on a cold solve of an unbalanced
fabric, the general method's master over ForestColl's trees on the balanced restriction
is solved once before ForestColl packs the restriction exactly (from 64 GPUs; here its
lower limit is lowered to 8 GPUs, where the oracle is cheap, and the lower limit on the
exact trees per root to 0 unless said); it is kept only when it reaches the restriction's
certified optimum, which is the independent forwarding-only optimum, and otherwise the
chain goes on to the same optimum."""

from __future__ import annotations

import pytest

import mccl_opt as mo
import mccl_opt.allgather.seed_first as seed_first
from mccl_opt.allgather.general import restriction_seed
from mccl_opt.report import Method, Termination
from instances import shared_aggregation
from tests.oracle_allgather import check_schedule, forwarding_optimum


def _one_way(gbps: float) -> mo.Topology:
    """Shared aggregation 2x2x2 (8 GPUs: the oracle LP takes ~0.1 s) with the first GPU's
    NIC link at ``gbps`` in its sending direction only."""
    topo = shared_aggregation(2, 2, 2)
    gpu = topo.gpus[0]
    nic = next(link for link in topo.links if link.src == gpu
               and topo.node(link.dst).kind == "switch" and "nvs" not in link.dst)
    return topo.with_capacity(src=nic.src, dst=nic.dst, gbps=gbps, both_directions=False)


@pytest.fixture(autouse=True)
def _any_trees(monkeypatch):
    """The seed first from 8 GPUs and whatever the exact trees per root (the fabric at
    200 Gbps needs 25, at 150.8 Gbps 2 459)."""
    monkeypatch.setattr(seed_first, "SEED_FIRST_MIN_GPUS", 8)
    monkeypatch.setattr(seed_first, "SEED_FIRST_MIN_TREES", 0)


def _exact(topo: mo.Topology, sched: mo.Schedule, optimum: float) -> None:
    check_schedule(topo, sched)
    mo.validate(topo, sched)
    assert sched.rate_gbps == pytest.approx(optimum, rel=1e-9)
    assert sched.report.termination is Termination.OPTIMAL


@pytest.mark.parametrize("gbps", [200.0, 150.8])
def test_one_master_over_the_seed_reaches_the_independent_optimum(gbps, monkeypatch):
    topo = _one_way(gbps)
    optimum = forwarding_optimum(topo).rate_gbps
    sched = mo.solve_allgather(topo, max_chunks=None)
    assert sched.stats["general_reason"].startswith("restriction seed: one master")
    assert [a.method for a in sched.report.attempts][-1] is Method.GENERAL
    assert Method.BALANCED_RESTRICTION not in [a.method for a in sched.report.attempts]
    _exact(topo, sched, optimum)
    monkeypatch.setattr(seed_first, "SEED_FIRST_MAX_GPUS", 0)       # the chain without it
    without = mo.solve_allgather(topo, max_chunks=None)
    assert not without.stats.get("general_reason", "").startswith("restriction seed")
    _exact(topo, without, optimum)


def test_a_master_that_falls_short_goes_on_to_the_same_optimum(monkeypatch):
    """A seed of two chunks per root falls short of the bound in one master (three reach
    it or not depending on which of the restriction's equal-capacity vertices the LP
    returns): the try is recorded as declined and the chain still returns the independent
    optimum."""
    topo = _one_way(200.0)
    monkeypatch.setattr(restriction_seed, "seed_chunks", lambda num_gpus: 2)
    sched = mo.solve_allgather(topo, max_chunks=None)
    tries = [a for a in sched.report.attempts if a.method is Method.GENERAL]
    assert tries[0].outcome.startswith("declined: one master")
    _exact(topo, sched, forwarding_optimum(topo).rate_gbps)


def test_a_chunk_limit_does_not_try_it(monkeypatch):
    topo = _one_way(200.0)
    rounded = mo.solve_allgather(topo, max_chunks=4)
    assert not rounded.stats.get("general_reason", "").startswith("restriction seed")
    assert not any(a.outcome.startswith("declined: one master") for a in rounded.report.attempts)


def test_a_warm_solve_takes_the_cold_path(monkeypatch):
    """A warm solve tries the seed first too (skipping it, a warm start whose steps on
    c' did not pay went on to ForestColl packing c', slower than cold's path), and
    returns cold's certified optimum with the warm start declined."""
    topo = _one_way(200.0)
    cold = mo.solve_allgather(topo, max_chunks=None)
    for prev in (mo.solve_allgather(topo, max_chunks=4),
                 mo.solve_allgather(shared_aggregation(2, 2, 2), max_chunks=None)):
        warm = mo.solve_allgather(topo, warm=prev, max_chunks=None)
        assert warm.stats["general_reason"] == cold.stats["general_reason"]
        assert warm.stats["warm_route"] == "declined"
        _exact(topo, warm, cold.rate_gbps)


def test_few_exact_trees_pack_exactly_instead(monkeypatch):
    """Where ForestColl's exact optimum on ``c'`` needs at most ``SEED_FIRST_MIN_TREES``
    trees per root (25 at 200 Gbps) the seed's master is not tried: ForestColl packs
    ``c'`` exactly and certifies the same optimum; at 2 459 trees per root it still is."""
    monkeypatch.setattr(seed_first, "SEED_FIRST_MIN_TREES", 128)
    topo = _one_way(200.0)
    sched = mo.solve_allgather(topo, max_chunks=None)
    methods = [a.method for a in sched.report.attempts]
    assert Method.GENERAL not in methods and methods[-1] is Method.BALANCED_RESTRICTION
    _exact(topo, sched, forwarding_optimum(topo).rate_gbps)
    many = mo.solve_allgather(_one_way(150.8), max_chunks=None)
    assert many.stats["general_reason"].startswith("restriction seed: one master")
