"""Warm local re-optimisation with a global certificate ("pair fixing",
mccl_opt/alltoall/local.py): after a capacity-only change the warm solve re-optimises the
pairs whose routes cross a changed link, keeps every other pair's routes and chunks, and
proves the combined LP solution optimal with the Farley bound over all pairs."""

from __future__ import annotations

import dataclasses

import pytest

from instances import degrade, dgx, fail1, fail2, hpn, irregular, ring
from instances.hpn import NIC_GBPS
from mccl_opt import validate
from mccl_opt.alltoall import solve_alltoall
from mccl_opt.backends import available_backends

REL = 1e-6


def _nic(topo, gpu=0):
    g = topo.gpus[gpu]
    return g, [l for l in topo.links if l.src == g][-1].dst


def check_same_as_cold(topo, warm, cold=None):
    cold = cold if cold is not None else solve_alltoall(topo)
    rep = validate(topo, warm)
    assert warm.lp_rate_gbps == pytest.approx(cold.lp_rate_gbps, rel=REL)
    assert warm.stats["lp_bound_gbps"] >= cold.lp_rate_gbps * (1 - 1e-9)
    assert warm.rate_gbps <= warm.lp_rate_gbps * (1 + 1e-9)
    assert rep.rate_gbps == pytest.approx(warm.rate_gbps, rel=1e-9)
    assert all(abs(c.share * 10 - round(c.share * 10)) < 1e-9 for c in warm.chunks)
    return cold


@pytest.mark.parametrize("shape", [(1, 2, 8), (1, 4, 8)])
def test_fail2_warm_takes_the_local_path_and_equals_cold(shape):
    base = hpn(*shape)
    healthy = solve_alltoall(base)
    topo = fail2(base)
    warm = solve_alltoall(topo, warm=healthy)
    assert warm.stats["warm_mode"] == "local"
    assert 0 < warm.stats["free_pairs"] < base.num_gpus * (base.num_gpus - 1)
    assert warm.stats["certificate_rounds"] == 1
    cold = check_same_as_cold(topo, warm)
    assert warm.rate_gbps >= (1 - 0.01) * warm.lp_rate_gbps      # rounding gap <= 1 %
    # the fixed pairs' chunks are the old chunks (same paths, same shares)
    old_chunks = set(healthy.chunks)
    free_src = {c.src for c in warm.chunks if c not in old_chunks}
    assert sum(c in old_chunks for c in warm.chunks) > len(warm.chunks) // 2
    assert free_src                                  # ... and some pairs were re-routed
    assert cold.stats["warm_mode"] == "cold"
    # the new state keeps the old routes it needs by reference (layered), not as copies
    old, new = healthy.warm_state, warm.warm_state
    assert new.lp.routes.base_arcs is old.lp.routes.base_arcs
    assert new.chunks.routes.base_arcs is old.chunks.routes.base_arcs
    assert new.lp.routes.count == new.lp.count and new.chunks.routes.count == len(warm.chunks)


@pytest.mark.parametrize("make", [
    lambda: dgx(),
    lambda: ring(5),
    lambda: irregular(1),
], ids=["dgx", "ring5", "irregular1"])
def test_degraded_binding_link_of_other_fabrics(make):
    base = make()
    healthy = solve_alltoall(base)
    # degrade the link the healthy schedule loads most, relative to its capacity, among
    # those whose halving lowers the optimum (binding; equally loaded links tie)
    util = [sum(c.share for c in healthy.chunks
                if any((u, v) == (link.src, link.dst) for u, v in zip(c.path, c.path[1:])))
            / link.capacity_gbps for link in base.links]
    for a in sorted(range(len(base.links)), key=lambda a: -util[a]):
        link = base.links[a]
        topo = degrade(base, link.src, link.dst, link.capacity_gbps / 2)
        if solve_alltoall(topo).lp_rate_gbps < healthy.lp_rate_gbps * (1 - 1e-6):
            break
    warm = solve_alltoall(topo, warm=healthy)
    assert warm.stats["warm_mode"] == "local"
    check_same_as_cold(topo, warm)


def _from_fail2_to(gbps):
    """1x4x8 warm-started from its Fail2 schedule, with GPU0's NIC at ``gbps``."""
    base = hpn(1, 4, 8)
    g, tor = _nic(base)
    failed = solve_alltoall(fail2(base), warm=solve_alltoall(base))
    topo = degrade(base, g, tor, gbps)
    return topo, solve_alltoall(topo, warm=failed)


def _growth_case():
    """1x4x8 Fail2 (cold), then host 1's GPU0 NIC (s0h1g0 -> s0tor0) cut to an eighth:
    freeing the pairs on that link is not enough to certify.  Which degenerate optimum
    the old LP and the restricted masters sit on decides whether a case needs growing;
    this one does."""
    old = fail2(hpn(1, 4, 8))
    link = next(x for x in old.links if (x.src, x.dst) == ("s0h1g0", "s0tor0"))
    topo = degrade(old, link.src, link.dst, link.capacity_gbps / 8)
    return topo, solve_alltoall(topo, warm=solve_alltoall(old))


def test_certificate_grows_the_free_set_when_the_first_is_not_enough():
    # the certificate frees the fixed pairs priced above their shortest paths
    topo, warm = _growth_case()
    assert warm.stats["warm_mode"] == "local"
    assert warm.stats["certificate_rounds"] > 1
    check_same_as_cold(topo, warm)


def test_a_repaired_bottleneck_goes_to_the_full_master():
    # a repaired NIC (50 -> 200 Gbps): most pairs re-balance onto it, so the local path is
    # not tried
    topo, warm = _from_fail2_to(200.0)
    assert warm.stats["warm_mode"] == "full" and not warm.stats["local_fallback"]
    check_same_as_cold(topo, warm)


def test_local_path_falls_back_to_the_full_master_when_it_cannot_certify(monkeypatch):
    import mccl_opt.alltoall.local as local

    # the growth case above, with no room to grow: the full warm master solves it
    monkeypatch.setattr(local.local_resolve, "__defaults__", (3, 0.0, 10))
    topo, warm = _growth_case()
    assert warm.stats["warm_mode"] == "full" and warm.stats["local_fallback"]
    check_same_as_cold(topo, warm)


def test_local_try_gives_up_when_growing_does_not_shrink_the_certificate_gap():
    # an NVLink of 1x2x4 Fail2 at 400 of 2880 Gbps: the restricted optimum's duals leave
    # the fixed pairs a 37 % gap, and freeing the pair with an excess leaves it there; the
    # try stops (it would otherwise grow again) and the full master solves it
    topo = fail2(hpn(1, 2, 4))
    nearby = topo.with_capacity(src="s0h1g2", dst="s0h1nvs", gbps=400.0)
    warm = solve_alltoall(nearby, warm=solve_alltoall(topo))
    assert warm.stats["warm_mode"] == "full" and warm.stats["local_fallback"]
    assert warm.stats["local_gave_up"].startswith("the free set grew and the certificate gap")
    check_same_as_cold(nearby, warm)


@pytest.mark.parametrize("batch_rows, rebuilt", [(0.0, True), (1e-3, True), (1.0, False)])
def test_local_master_presolves_again_only_after_a_large_batch(batch_rows, rebuilt):
    # the local master re-solves cold only after at least batch_rows x pair rows new
    # columns; after a smaller batch it re-solves warm from its basis (a cold re-solve
    # lands on another degenerate dual vertex and column generation tails)
    import numpy as np

    from mccl_opt.alltoall.initial import initial_columns
    from mccl_opt.alltoall.master import ColumnPool, RestrictedMaster
    from mccl_opt.alltoall.pricing import price_paths
    from mccl_opt.alltoall.problem import problem_for
    from mccl_opt.backends import get_backend

    prob = problem_for(fail2(hpn(1, 2, 4)))
    steps = prob.topo.num_nodes - 1
    init = initial_columns(prob, steps, np.ones(prob.num_pairs, dtype=bool))
    pool = ColumnPool()
    pool.append(prob.pair_index(init.src, init.dst), init.start, init.arcs)
    master = RestrictedMaster(get_backend("highs"), prob.num_pairs, prob.capacity, pool)
    master.presolve_every_time("primal", batch_rows=batch_rows)
    first = master.solve("first")
    priced = price_paths(prob.graph, first.w, prob.pair_matrix(first.sigma * (1 - 1e-9), -np.inf),
                         steps, None)
    assert 0 < priced.count
    two = priced.start[:3]                      # the first two priced columns only
    builds = []
    rebuild = master._rebuild
    master._rebuild = lambda: builds.append(1) or rebuild()
    assert master.add(prob.pair_index(priced.src[:2], priced.dst[:2]), two,
                      priced.arcs[:two[-1]]) == 2
    second = master.solve("second")
    assert bool(builds) == rebuilt
    assert second.t <= first.t * (1 + 1e-12)
    cold = RestrictedMaster(get_backend("highs"), prob.num_pairs, prob.capacity, pool).solve("cold")
    assert second.t == pytest.approx(cold.t, rel=1e-9)


@pytest.mark.parametrize("min_pairs, cold_after_batch", [(30_000, False), (0, True)])
def test_small_local_master_resolves_warm_after_any_batch(monkeypatch, min_pairs, cold_after_batch):
    # below PRESOLVE_EVERY_TIME_MIN_PAIRS the local master is rebuilt (cold) only when it
    # starts, grows or is rounded; from it up, also after a batch of one new column per
    # free pair (docs/alltoall.md, *The last rounds and the local try*)
    import mccl_opt.alltoall.local as local
    from mccl_opt.alltoall.master import RestrictedMaster

    monkeypatch.setattr(local, "PRESOLVE_EVERY_TIME_MIN_PAIRS", min_pairs)
    after_batch = []
    rebuild = RestrictedMaster._rebuild

    def counted(self):
        after_batch.append(self.presolve_each_solve and not self._stale)
        return rebuild(self)

    base = hpn(1, 4, 8)
    healthy = solve_alltoall(base)
    monkeypatch.setattr(RestrictedMaster, "_rebuild", counted)
    topo = base.with_capacity(src="s0h1g0", dst="s0tor0", gbps=0.46 * NIC_GBPS)
    warm = solve_alltoall(topo, warm=healthy)
    assert warm.stats["warm_mode"] == "local"
    assert any(after_batch) == cold_after_batch
    check_same_as_cold(topo, warm)


def test_chained_warm_healthy_fail2_repaired_equals_cold_each_time():
    base = hpn(1, 4, 8)
    healthy = solve_alltoall(base)
    topo = fail2(base)
    first = solve_alltoall(topo, warm=healthy)
    check_same_as_cold(topo, first)
    repaired = solve_alltoall(base, warm=first)              # capacity back up
    check_same_as_cold(base, repaired, healthy)
    again = solve_alltoall(topo, warm=repaired)               # and down again
    check_same_as_cold(topo, again)
    # a warm start from a local result takes the local path again
    g, tor = _nic(base)
    lower = degrade(base, g, tor, 40.0)
    third = solve_alltoall(lower, warm=first)
    assert third.stats["warm_mode"] == "local"
    check_same_as_cold(lower, third)
    fourth = solve_alltoall(topo, warm=third)
    check_same_as_cold(topo, fourth)


def test_capacity_increase_of_a_binding_link_is_correct():
    base = hpn(1, 2, 8)
    g, tor = _nic(base)
    healthy = solve_alltoall(base)
    topo = degrade(base, g, tor, 800.0)
    check_same_as_cold(topo, solve_alltoall(topo, warm=healthy))


def test_fractional_warm_local():
    base = hpn(1, 2, 8)
    healthy = solve_alltoall(base, max_chunks=None)
    topo = fail2(base)
    warm = solve_alltoall(topo, warm=healthy, max_chunks=None)
    assert warm.stats["warm_mode"] == "local"
    cold = solve_alltoall(topo, max_chunks=None)
    assert warm.lp_rate_gbps == pytest.approx(cold.lp_rate_gbps, rel=REL)
    assert warm.rate_gbps == pytest.approx(warm.lp_rate_gbps, rel=1e-6)
    validate(topo, warm)


def test_other_max_chunks_does_not_reuse_old_chunks():
    base = hpn(1, 2, 8)
    healthy = solve_alltoall(base, max_chunks=10)
    topo = fail2(base)
    warm = solve_alltoall(topo, warm=healthy, max_chunks=4)
    assert warm.stats["warm_mode"] != "local"
    assert all(abs(c.share * 4 - round(c.share * 4)) < 1e-9 for c in warm.chunks)
    validate(topo, warm)


@pytest.mark.parametrize("name", [b for b in available_backends() if b != "highs"])
def test_local_warm_on_other_backends(name):
    base = hpn(1, 2, 4)
    healthy = solve_alltoall(base, backend=name)
    topo = fail2(base)
    warm = solve_alltoall(topo, warm=healthy, backend=name)
    assert warm.stats["warm_mode"] == "local"
    cold = solve_alltoall(topo, backend="highs")
    assert warm.lp_rate_gbps == pytest.approx(cold.lp_rate_gbps, rel=REL)
    validate(topo, warm)


def test_certified_reuse_only_when_the_old_certificate_still_holds():
    base = hpn(1, 4, 8)
    healthy = solve_alltoall(base)
    # a non-binding change keeps the old certificate: the old schedule, no LP; a binding
    # one does not; nor does another step bound
    for topo, mode in ((fail1(base), "reuse"), (fail2(base), "local")):
        sched = solve_alltoall(topo, warm=healthy)
        assert sched.stats["warm_mode"] == mode
        assert (sched.stats["rounds"] == 0) == (mode == "reuse")
        check_same_as_cold(topo, sched)
        # chained: from the reused (or local) state back to the healthy fabric
        check_same_as_cold(base, solve_alltoall(base, warm=sched), healthy)
    bounded = solve_alltoall(fail1(base), warm=healthy, max_steps=4)
    assert bounded.stats["warm_mode"] != "reuse"
    assert bounded.lp_rate_gbps == pytest.approx(
        solve_alltoall(fail1(base), max_steps=4).lp_rate_gbps, rel=REL)


@pytest.mark.parametrize("failure", [fail1, fail2])
def test_a_schedule_read_from_a_file_warm_starts_locally_after_restore(failure, tmp_path):
    from mccl_opt import Schedule
    from mccl_opt import restore_warm_state

    base = hpn(1, 4, 8)
    path = tmp_path / "healthy.json"
    solve_alltoall(base).save(path)
    loaded = Schedule.load(path)
    assert loaded.warm_state is None
    restored = restore_warm_state(loaded, base)
    assert restored.warm_state is not None and restored.chunks == loaded.chunks
    topo = failure(base)
    warm = solve_alltoall(topo, warm=restored)
    assert warm.stats["warm_mode"] == "local"                  # not the full warm master
    check_same_as_cold(topo, warm)
    # the fixed pairs keep the loaded chunks (same paths, same shares)
    loaded_chunks = set(loaded.chunks)
    assert sum(c in loaded_chunks for c in warm.chunks) > len(warm.chunks) // 2


def test_restore_leaves_schedules_it_cannot_map_unchanged():
    from mccl_opt import restore_warm_state

    sched = solve_alltoall(hpn(1, 2, 4))
    assert restore_warm_state(sched, hpn(1, 2, 4)) is sched     # already has its state
    bare = dataclasses.replace(sched, warm_state=None)
    assert restore_warm_state(bare, hpn(1, 2, 8)) is bare        # other GPUs
    assert restore_warm_state(bare, ring(8)).warm_state is None  # other GPU names / links
    c = bare.chunks[0]
    bent = dataclasses.replace(bare, chunks=(dataclasses.replace(c, path=c.path[::-1]),)
                               + bare.chunks[1:])
    assert restore_warm_state(bent, hpn(1, 2, 4)) is bent        # a path that is no path here
