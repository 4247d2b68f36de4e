"""Chunk budget (mccl_opt/allgather/budget.py): the best-first search with shared cuts
chooses exactly the brute-force ``(k, y)`` with no more max-flows, and the probed guess
stays an upper bound that is tight on HPN Fail2."""

from __future__ import annotations

from fractions import Fraction

import pytest

from instances import fail1, fail2, fail3, hpn, irregular
from mccl_opt.allgather.budget import MAX_UNITS, choose_trees, exact_k, guess_budget
from mccl_opt.allgather.fabric import fabric_of
from mccl_opt.allgather.forestcoll.throughput import Fabric, PhaseOneResult, best_tree_bandwidth, optimal_rate
from mccl_opt.topology import Topology


def _drift(topo: Topology) -> Topology:
    """GPU 1's NIC cable of the first host at 70 %."""
    link = topo.link("s0h0g1", "s0tor1")
    return topo.with_capacity(src=link.src, dst=link.dst, gbps=0.7 * link.capacity_gbps)


FABRICS = [f(hpn(*shape)) for shape in [(1, 2, 8), (1, 4, 8), (2, 2, 4)]
           for f in (fail1, fail2, fail3, _drift)] + [irregular(seed) for seed in range(30)]


def brute_force(fab: Fabric, p1: PhaseOneResult, budget: int) -> tuple[int, Fraction, int]:
    """``(k, y_k, max-flows)``: every ``k <= budget`` swept on its own from ``x*/k`` (no
    shared cuts), the largest ``k·y_k``, ties smallest ``k``."""
    x_star = Fraction(p1.num, p1.den)
    scored, calls = [], 0
    for k in range(1, budget + 1):
        y, c, passed, _ = best_tree_bandwidth(fab, k, x_star / k)
        assert passed == fab.num_gpus or y == 0
        scored.append((k * y, -k, y))
        calls += c
    _, neg_k, y = max(scored)
    return -neg_k, y, calls


def _needs_search(fab: Fabric, p1: PhaseOneResult, budget: int) -> bool:
    k0 = exact_k(fab, p1)
    return k0 > budget or int(fab.cap.max()) * k0 * p1.den // p1.num > MAX_UNITS


@pytest.mark.parametrize("budget", [3, 10])
@pytest.mark.parametrize("topo", FABRICS, ids=lambda t: t.name)
def test_choose_trees_matches_brute_force(topo, budget):
    fab, _ = fabric_of(topo)
    p1 = optimal_rate(fab)
    k, y, calls = choose_trees(fab, p1, budget)
    if not _needs_search(fab, p1, budget):     # the fewest trees whose floors reach x*
        assert k * y == p1.rate and (k, y) == brute_force(fab, p1, exact_k(fab, p1))[:2]
        return
    ref_k, ref_y, ref_calls = brute_force(fab, p1, budget)
    assert (k, y) == (ref_k, ref_y)
    assert calls <= ref_calls


@pytest.mark.parametrize("budget", [3, 10])
@pytest.mark.parametrize("topo", FABRICS, ids=lambda t: t.name)
def test_guess_budget_bounds_the_optimum(topo, budget):
    fab, _ = fabric_of(topo)
    p1 = optimal_rate(fab)
    guess = guess_budget(fab, p1, budget)
    if not _needs_search(fab, p1, budget):
        assert guess is None
        return
    k, y, _ = brute_force(fab, p1, budget)
    assert guess is not None
    g_k, g_y, calls = guess
    assert 1 <= g_k <= budget
    assert g_k * g_y >= k * y
    assert calls <= 4 * 8


@pytest.mark.parametrize("shape", [(1, 4, 8), (1, 32, 8)], ids=["1x4x8", "1x32x8"])
def test_guess_budget_is_tight_on_hpn_fail2(shape):
    """Fail2 on 256 GPUs: the single-GPU cuts bound k=3 above its best (11489 vs 11428
    quanta); the probe of GPU 0 finds its host's cut (8 GPUs + NVSwitch) and the guess
    becomes k=6, exact; choose_trees shares that cut with every k."""
    fab, _ = fabric_of(fail2(hpn(*shape)))
    p1 = optimal_rate(fab)
    k, y, calls = brute_force(fab, p1, 10)
    g_k, g_y, g_calls = guess_budget(fab, p1, 10)
    assert (g_k, g_y) == (k, y)
    assert g_calls <= 4 * 8
    c_k, c_y, c_calls = choose_trees(fab, p1, 10)
    assert (c_k, c_y) == (k, y)
    if shape == (1, 32, 8):             # one sweep plus the host cut, not ten sweeps
        assert c_calls <= fab.num_gpus + 8 < calls


def test_exact_fit_check_does_not_overflow_int64():
    """Phase 1's ``x* = num/den`` are Python ints, so the exact-budget check
    ``cap_max * k0 * den // num`` cannot wrap around in int64 (a fuzz chain state:
    links at 4.000013 and 104.2917 Gbps one way give a quantum of 1 kbps and
    ``cap_max * k0 * den`` above 2^63, which numpy's int64 overflowed with a warning)."""
    import warnings

    from instances.aggregation import shared_aggregation
    from mccl_opt.allgather.budget import _exact_fits
    from mccl_opt.allgather.forestcoll.throughput import cut_upper_bound

    topo = shared_aggregation(1, 2, 4).with_capacity(
        src="s0h0g0", dst="s0tor0", gbps=4.000013, both_directions=False).with_capacity(
        src="s0tor0", dst="s0h1g0", gbps=104.2917, both_directions=False)
    fab, _ = fabric_of(topo)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for p1 in (optimal_rate(fab), cut_upper_bound(fab)):
            assert type(p1.num) is int and type(p1.den) is int
            k0 = exact_k(fab, p1)
            assert int(fab.cap.max()) * k0 * p1.den > 2 ** 63    # the product that overflowed
            assert _exact_fits(fab, p1, None, k0) == \
                (int(fab.cap.max()) * k0 * p1.den // p1.num <= MAX_UNITS)


def test_fewest_trees_screens_later_k_by_the_cut_a_failed_test_found():
    """Above ``x*`` (a warm guess: the single-GPU cut bound of HPN 1x2x4 without a rail
    ToR, whose GPUs relay over NVLink) no ``k < k0`` passes the rooted test: the answer is
    the brute force's (``k0``), and the first failed test's cut excludes every later ``k``,
    so the max-flows stay those of one sweep (35 sweeps before)."""
    from bench.fabric_variants import without_node
    from mccl_opt.allgather.budget import FEWEST_TRIES, fewest_trees
    from mccl_opt.allgather.forestcoll.throughput import cut_upper_bound, violated_tree_cut

    fab, _ = fabric_of(without_node(hpn(1, 2, 4), "s0tor1"))
    bound = cut_upper_bound(fab)
    x, k0 = Fraction(bound.num, bound.den), exact_k(fab, bound)
    brute = next((k for k in range(1, min(k0, FEWEST_TRIES + 1))
                  if violated_tree_cut(fab, k, x / k, fab.gpus)[0] < 0), k0)
    k, y, calls = fewest_trees(fab, bound, k0)
    assert (k, y) == (brute, x / brute) and k == k0 > 2
    assert 0 < calls <= fab.num_gpus
