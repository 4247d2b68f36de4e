"""Warm AllToAll after a NIC falls sharply or recovers (issue 25 item 2, "warm is never
the slow path", docs/alltoall.md): the warm solve reaches the cold optimum, a link at
<= 10 % of its capacity sends the warm start to the master without its columns, and a
repair whose cold routing is provably optimal solves cold."""

from __future__ import annotations

import pytest

from instances import degrade, fail3, hpn, irregular
from mccl_opt import validate
from mccl_opt.alltoall import solve_alltoall
from mccl_opt.alltoall import solve as solve_module
from bench.fuzz_alltoall import compact_optimum
from mccl_opt.alltoall.warm import SHARP_FALL

REL = 1e-6


def _nic(topo):
    g = topo.gpus[0]
    return g, next(l.dst for l in topo.links if l.src == g and "tor" in l.dst)


@pytest.mark.parametrize("shape", [(1, 2, 8), (1, 8, 8), (2, 4, 8)])
@pytest.mark.parametrize("fraction", [0.01, 0.1, 0.5])
@pytest.mark.parametrize("both", [True, False])
def test_warm_after_a_nic_falls_equals_cold(shape, fraction, both):
    base = hpn(*shape)
    g, tor = _nic(base)
    healthy = solve_alltoall(base)
    topo = degrade(base, g, tor, base.link(g, tor).capacity_gbps * fraction,
                   both_directions=both)
    warm = solve_alltoall(topo, warm=healthy)
    cold = solve_alltoall(topo)
    assert warm.lp_rate_gbps == pytest.approx(cold.lp_rate_gbps, rel=REL)
    validate(topo, warm)
    if fraction <= SHARP_FALL:
        # the local path is not tried: its restricted master crawled here
        assert warm.stats["warm_mode"] == "full" and not warm.stats["local_fallback"]
    # and the repair back to healthy, warm from the degraded schedule
    back = solve_alltoall(base, warm=warm)
    assert back.lp_rate_gbps == pytest.approx(healthy.lp_rate_gbps, rel=REL)
    # healthy HPN's first routing is provably optimal: the repair solves cold, no LP round
    assert back.stats["warm_mode"] == "cold" and back.stats["rounds"] == 1
    validate(base, back)
    # the same under a time limit (the full path carries warm columns there too)
    limited = solve_alltoall(base, warm=warm, time_limit=60.0)
    assert limited.stats["warm_mode"] == "cold" and limited.stats["rounds"] == 1
    assert limited.lp_rate_gbps == pytest.approx(healthy.lp_rate_gbps, rel=REL)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_warm_on_an_irregular_fabric_after_a_link_falls_equals_cold(seed):
    base = irregular(seed)
    healthy = solve_alltoall(base)
    link = max((l for l in base.links if base.is_gpu(l.src) and not base.is_gpu(l.dst)),
               key=lambda l: (l.capacity_gbps, l.src, l.dst))
    topo = degrade(base, link.src, link.dst, link.capacity_gbps * 0.01, both_directions=False)
    warm = solve_alltoall(topo, warm=healthy)
    assert warm.lp_rate_gbps == pytest.approx(solve_alltoall(topo).lp_rate_gbps, rel=REL)
    validate(topo, warm)


def test_a_warm_limit_with_no_room_for_the_first_master_returns_the_routing_itself(monkeypatch):
    # a warm solve on the full path under a time limit routes first, so a limit
    # shorter than the routing returns the routing (it used to build and solve the
    # whole warm master past the limit: 5-10 s for 0.5 s at 2,048 GPUs)
    base = hpn(1, 4, 8)
    g, tor = _nic(base)
    topo = degrade(base, g, tor, base.link(g, tor).capacity_gbps * 0.01)
    healthy = solve_alltoall(base)
    warm = solve_alltoall(topo, warm=healthy, time_limit=1e-6)
    assert warm.stats["status"] == "time_limit"
    assert warm.stats["rounding"] == "routed" and warm.stats["rounds"] == 0
    validate(topo, warm)
    # with room, the same warm solve carries its columns (less those through the fallen
    # NIC) and is optimal, as without a limit
    roomy = solve_alltoall(topo, warm=healthy, time_limit=60.0)
    assert roomy.stats["status"] == "optimal" and roomy.stats["warm_mode"] == "full"
    assert roomy.lp_rate_gbps == pytest.approx(solve_alltoall(topo).lp_rate_gbps, rel=REL)
    # without a sharp fall, a small fabric's full path carries its columns (the full
    # warm master), a large one solves cold from its routing
    lost = fail3(base)
    cold_lp = solve_alltoall(lost).lp_rate_gbps
    small = solve_alltoall(lost, warm=healthy, time_limit=60.0)
    assert small.stats["status"] == "optimal" and small.stats["warm_mode"] == "full"
    assert small.lp_rate_gbps == pytest.approx(cold_lp, rel=REL)
    monkeypatch.setattr(solve_module, "WARM_UNDER_A_LIMIT_MAX_PAIRS", lost.num_gpus ** 2 // 2)
    large = solve_alltoall(lost, warm=healthy, time_limit=60.0)
    assert large.stats["status"] == "optimal" and large.stats["warm_mode"] == "cold"
    assert large.lp_rate_gbps == pytest.approx(cold_lp, rel=REL)


def test_a_master_at_the_cut_bound_certifies_when_its_duals_stall():
    """Multi-spine 2x2x8 with half of one ToR's uplinks: an NVSwitch link of GPU s1h0g4
    to 1/8 both ways leaves the optimum where it was (the host cut), but warm from the
    schedule read back from a file (no basis to reuse) the full master's duals stall:
    27 rounds at the optimum with the Farley bound 45 % above it (0.17 s, cold 0.03 s,
    fuzz seed 12).  The tightest node-set cut, priced once on the stall, certifies it."""
    from bench.fabric_variants import without_cables
    from instances.aggregation import multi_spine
    from mccl_opt import Schedule, restore_warm_state
    from mccl_opt.alltoall.cut_bound import cut_bound_gbps, tightest_cut

    base = without_cables(multi_spine(2, 2, 8, spines=2), "s0tor0", ["spine1"])
    healthy = solve_alltoall(base, max_chunks=None)
    from_file = restore_warm_state(Schedule.from_dict(healthy.to_dict()), base)
    topo = degrade(base, "s1h0g4", "s1h0nvs", 360.0, both_directions=True)
    warm = solve_alltoall(topo, warm=from_file, max_chunks=None)
    cold = solve_alltoall(topo, max_chunks=None)
    assert warm.stats["warm_mode"] == "full"
    assert warm.lp_rate_gbps == pytest.approx(cold.lp_rate_gbps, rel=REL)
    assert warm.lp_rate_gbps == pytest.approx(cut_bound_gbps(topo), rel=REL)
    assert warm.stats["rounds"] <= 3
    bound, links = tightest_cut(topo)            # a cut: capacity / bound = k (N - k)
    n = topo.num_gpus
    separated = float(topo.arrays.capacity[links].sum()) / bound
    assert bound == cut_bound_gbps(topo)
    assert any(abs(separated - k * (n - k)) <= 1e-9 * separated for k in range(1, n))


def test_two_nvswitch_lanes_under_a_limit_solve_warm_at_the_independent_optimum():
    """Loop fuzz seed 11 #3 (docs/alltoall.md, *A sharp fall under a time limit*): on HPN
    2x4x8 one NVSwitch lane falls one way to 438 of 2880 Gbps and another both ways to
    72 (a sharp fall); the time-limited warm solve carries the healthy columns less
    those through the fallen lane and reaches the independent compact LP's optimum."""
    base = hpn(2, 4, 8)
    healthy = solve_alltoall(base)
    topo = degrade(base, "s0h0g5", "s0h0nvs", 438.46, both_directions=False)
    topo = degrade(topo, "s0h1g2", "s0h1nvs", 72.06, both_directions=True)
    warm = solve_alltoall(topo, warm=healthy, max_chunks=10, time_limit=60.0)
    assert warm.stats["status"] == "optimal" and warm.stats["warm_mode"] == "full"
    lp = compact_optimum(topo)
    assert warm.lp_rate_gbps == pytest.approx(lp, rel=REL)
    assert warm.rate_gbps <= lp * (1 + REL)
    validate(topo, warm)
