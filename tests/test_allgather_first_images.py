"""The first AllGather schedule averaged over fabric automorphisms
(:mod:`mccl_opt.allgather.first_images`, issue 25: a good schedule under a short limit).

HPN 2x5x8 (80 GPUs, one aggregation switch per rail) with one NIC uplink slowed one way:
the GPU line crosses hosts on one rail (14 % of the single-GPU cut bound); its images
under the rail shift -- an automorphism of the fabric's links only (the slowed NIC
breaks the capacitated one), moving both segments' ToRs and the per-rail aggregation
switches at once -- spread the crossings over every rail, the images that load the slow
NIC taken less often; one image per root carries what the average of all does.  On a
leaf-spine fabric the line's leaf-to-leaf crossings ride one spine unless the spines
are shifted too.  Nothing is timed.
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict

import numpy as np
import pytest

import mccl_opt as mo
from instances import hpn
from instances.aggregation import leaf_spine
from mccl_opt import anytime
from mccl_opt.allgather import first_images, solve
from mccl_opt.allgather.canonical import canonical
from mccl_opt.allgather.first import first_schedule
from mccl_opt.report import Method, Termination

from .oracle_allgather import check_schedule


def _slow_nic(factor: float) -> mo.Topology:
    topo = hpn(2, 5, 8)
    gpu = topo.gpus[0]
    link = next(l for l in topo.links if l.src == gpu and "tor" in l.dst)
    return topo.with_capacity({(link.src, link.dst): link.capacity_gbps * factor})


def _cut_bound(topo: mo.Topology) -> float:
    """The single-GPU cut: ``min_g min(ingress / (N - 1), egress)``."""
    arr = topo.arrays
    n = topo.num_gpus
    ingress = np.bincount(arr.head, weights=arr.capacity, minlength=topo.num_nodes)
    egress = np.bincount(arr.tail, weights=arr.capacity, minlength=topo.num_nodes)
    gpus = arr.gpu_nodes
    return float(min((ingress[gpus] / (n - 1)).min(), egress[gpus].min()))


@pytest.mark.parametrize("factor", [1 / 4, 1 / 64])
def test_the_line_s_images_reach_most_of_the_cut_bound(factor):
    """Valid (multiples of ``1/k``, ``k <= 10``) at three quarters of the cut bound, where
    averaging over every image alike reaches 15 % of it with the NIC at 1/64."""
    topo = canonical(_slow_nic(factor))
    first = first_schedule(topo, None, 10)
    images = first_images.averaged_first(topo, first, 10)
    bound = _cut_bound(topo)
    assert first.rate_gbps < 0.2 * bound
    assert images is not None and images.rate_gbps >= 0.75 * bound
    assert mo.validate(topo, images).rate_gbps == pytest.approx(images.rate_gbps, rel=1e-9)


def test_a_limit_after_the_first_schedule_returns_its_images(monkeypatch):
    """The limit passes where the chain starts: the images offered before it are returned."""
    topo = _slow_nic(1 / 4)
    monkeypatch.setattr(solve, "image_seconds", lambda gpus: 0.0)      # room, whatever the load
    monkeypatch.setattr(solve, "_chain", lambda *a, **k: anytime.run_out("a test: the chain"))
    sched = mo.solve_allgather(topo, max_chunks=10, time_limit=600.0)
    report = sched.report
    assert report.termination is Termination.TIME_LIMIT and report.method is Method.FIRST
    assert "automorphisms" in sched.stats["method"]
    check_schedule(topo, sched, max_chunks=10)
    assert report.bound_gbps >= sched.rate_gbps >= 0.75 * _cut_bound(topo)


def test_one_image_per_root_carries_what_the_average_does(monkeypatch):
    """One tree per root, whole shards, valid, at the rate of every image taken at its
    share of every root (``k`` times the trees): the root's tree is the image's tree of
    the GPU it maps onto the root."""
    topo = canonical(_slow_nic(1 / 4))
    first = first_schedule(topo, None, 10)
    one = first_images.averaged_first(topo, first, 10)
    tol = first_images.ASSIGN_TOL
    monkeypatch.setattr(first_images, "ASSIGN_TOL", -1.0)        # every image at a share
    every = first_images.averaged_first(topo, first, 10)
    assert one is not None and every is not None
    assert len(one.chunks) == topo.num_gpus and len(every.chunks) > topo.num_gpus
    assert sorted(c.src for c in one.chunks) == sorted(topo.gpus)
    assert all(c.share == 1.0 for c in one.chunks)
    assert one.rate_gbps >= (1 - tol) * every.rate_gbps
    assert mo.validate(topo, one).rate_gbps == pytest.approx(one.rate_gbps, rel=1e-9)
    check_schedule(topo, one, max_chunks=10)


def test_the_spines_are_shifted_too_on_leaf_spine(monkeypatch):
    """Leaf-spine 5x2x8 (80 GPUs, 2 spines): the line crosses from leaf to leaf over one
    spine in every image of the GPU shifts; shifting the twin spines as well doubles the
    rate (16.7 -> 33.3 Gbps), valid."""
    topo = canonical(leaf_spine(5, 2, 8))
    first = first_schedule(topo, None, 10)
    monkeypatch.setattr(first_images, "_CACHE", OrderedDict())
    both = first_images.averaged_first(topo, first, 10)
    monkeypatch.setattr(first_images, "_CACHE", OrderedDict())
    monkeypatch.setattr(first_images, "twin_switch_generators", lambda t: [])
    gpus_only = first_images.averaged_first(topo, first, 10)
    assert both is not None and gpus_only is not None
    assert both.rate_gbps >= 1.9 * gpus_only.rate_gbps > 1.9 * first.rate_gbps
    check_schedule(topo, both, max_chunks=10)


@pytest.mark.parametrize("orders", [[16] * 8 + [8], [2, 8, 8], [4, 2, 4, 2], [1, 3, 5, 2, 7],
                                    [17], []])
def test_the_image_estimate_counts_the_subgroups_weighed(orders):
    """:func:`first_images._weighed` counts the subsets whose orders' product is at most
    ``MAX_IMAGES`` (the only ones :func:`first_images._best_subgroup` weighs), as listing
    them does: 9 of HPN 8x16x8's 511."""
    listed = sum(1 for r in range(1, len(orders) + 1)
                 for subset in itertools.combinations(orders, r)
                 if math.prod(subset) <= first_images.MAX_IMAGES)
    assert first_images._weighed(orders, first_images.MAX_IMAGES) == listed


def test_the_generators_are_cached_per_shape_not_capacities():
    """A fabric with a slowed link has its shape's generators (capacities ignored), read
    only, so no caller can change what the next one gets."""
    plain = first_images.structural_generators(canonical(hpn(2, 5, 8)))
    slowed = first_images.structural_generators(canonical(_slow_nic(1 / 4)))
    assert slowed is plain and plain[0]
    node, link = plain[0][0][0]
    assert not node.flags.writeable and not link.flags.writeable


@pytest.mark.parametrize("where", ["symmetry search", "first schedule's images"])
def test_a_limit_passing_inside_the_images_returns_the_line(monkeypatch, where):
    """The generators' search and the subgroups' weighing check the limit as they go:
    the limit made to pass at their first check returns the line, valid, status
    ``time_limit``, the stop named (a shape not cached, so the search runs)."""
    topo = _slow_nic(1 / 4)
    monkeypatch.setattr(solve, "image_seconds", lambda topo: 0.0)      # room, whatever the load
    monkeypatch.setattr(first_images, "_CACHE", OrderedDict())
    real_check = anytime.check

    def check(at: str) -> None:
        if where in at:
            anytime.run_out(at)
        real_check(at)

    monkeypatch.setattr(anytime, "check", check)
    sched = mo.solve_allgather(topo, max_chunks=10, time_limit=600.0)
    report = sched.report
    assert report.termination is Termination.TIME_LIMIT and report.method is Method.FIRST
    assert sched.stats["method"] == "line-trees" and where in report.attempts[-1].outcome
    check_schedule(topo, sched, max_chunks=10)
