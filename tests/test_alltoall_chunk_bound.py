"""The whole-chunk cut bound (docs/alltoall.md, *Rounding at the whole-chunk bound*):
no schedule of ``K`` chunks per pair beats it, it is exact where the LP's load on a cut
is fractional, and a rounding that reaches it skips the repair and the deep dive."""

from __future__ import annotations

import numpy as np
import pytest

from formulations.compact import build_chunked_milp
from instances import degrade, hpn
from mccl_opt import validate
from mccl_opt.alltoall import solve_alltoall
from mccl_opt.alltoall.chunk_bound import chunk_bound_gbps
from mccl_opt.alltoall.cut_bound import cut_bound_gbps
from mccl_opt.backends import get_backend
from mccl_opt.topology import Link, Node, Topology


def _two_hosts(slow_nic: float) -> Topology:
    """Two hosts of two GPUs (switches A and B, 100 Gbps each way), each GPU's NIC at
    10 Gbps to one top switch T, but GPU a1's at ``slow_nic``."""
    nodes = [Node(g, "gpu") for g in ("a1", "a2", "b1", "b2")] + [
        Node(s, "switch") for s in ("A", "B", "T")]
    links = []
    for g, host in (("a1", "A"), ("a2", "A"), ("b1", "B"), ("b2", "B")):
        nic = slow_nic if g == "a1" else 10.0
        links += [Link(g, host, 100.0), Link(host, g, 100.0), Link(g, "T", nic), Link("T", g, nic)]
    return Topology("two-hosts", nodes, links)


def _milp_rate(topo: Topology, k: int) -> float:
    """The best rate of any ``k``-chunk schedule: the compact chunked MILP (App. G.2)."""
    arr = topo.arrays
    lp = build_chunked_milp(topo.num_nodes, np.asarray(arr.tail), np.asarray(arr.head),
                            np.asarray(arr.capacity, float), np.asarray(arr.is_switch),
                            np.asarray(arr.gpu_nodes), k)
    backend = get_backend("highs")
    backend.load(lp)
    return 1.0 / backend.solve_mip(mip_gap=1e-9).objective


def test_the_bound_is_the_best_chunked_schedule_where_the_lp_load_is_fractional():
    topo = _two_hosts(1.0)
    # host A sends 4 pairs x 3 chunks over 10 + 1 Gbps: 30/z + 3/z whole chunks must
    # reach 12, so z <= 30/11 (the fractional cut: 11/4)
    assert cut_bound_gbps(topo) == pytest.approx(11 / 4)
    assert chunk_bound_gbps(topo, 3) == pytest.approx(30 / 11)
    assert _milp_rate(topo, 3) == pytest.approx(30 / 11, rel=1e-6)
    for k in (1, 2, 4):               # never below the best k-chunk schedule
        assert chunk_bound_gbps(topo, k) >= _milp_rate(topo, k) * (1 - 1e-6)
        assert chunk_bound_gbps(topo, k) <= cut_bound_gbps(topo) * (1 + 1e-12)


def test_a_rounding_at_the_bound_is_kept_without_a_dive():
    base = hpn(1, 2, 8)
    g = base.gpus[0]
    tor = next(l.dst for l in base.links if l.src == g and "tor" in l.dst)
    topo = degrade(base, g, tor, base.link(g, tor).capacity_gbps * 0.01)
    # the host cut: 7 NICs at 400 and one at 4 carry 8 x 8 pairs x 10 chunks only when
    # each 400 Gbps NIC takes 92 chunks: z <= 4000/92 (LP: 2804/64)
    bound = chunk_bound_gbps(topo, 10)
    assert bound == pytest.approx(4000 / 92)
    sched = solve_alltoall(topo)
    validate(topo, sched)
    assert sched.lp_rate_gbps == pytest.approx(2804 / 64)
    assert sched.rate_gbps == pytest.approx(bound, rel=1e-12)
    assert sched.stats["chunk_bound_gbps"] == pytest.approx(bound)
    assert sched.stats["dive_steps"] == 0 and not sched.stats["repaired"]
    # on the healthy fabric the LP's loads are whole chunks: the bounds agree
    assert chunk_bound_gbps(base, 10) == pytest.approx(cut_bound_gbps(base))


def test_a_cut_with_a_larger_fractional_bound_can_still_give_the_smallest_bound():
    """GPU a sends its one chunk over 50 or 39.04 Gbps (fractional cut 89.04), b over
    60: the whole-chunk bound is 50, the best 1-chunk schedule.  Searching the cuts in
    order of their fractional bound and stopping above the best so far gave 60 (valid,
    but not the smallest): a cut's whole-chunk bound can fall far below its fractional one."""
    nodes = [Node("a", "gpu"), Node("b", "gpu"), Node("S1", "switch"), Node("S2", "switch")]
    links = [Link("a", "S1", 50.0), Link("a", "S2", 39.04), Link("S1", "b", 1000.0),
             Link("S2", "b", 1000.0), Link("b", "a", 60.0)]
    topo = Topology("two-gpus", nodes, links)
    assert chunk_bound_gbps(topo, 1) == pytest.approx(50.0)
    assert _milp_rate(topo, 1) == pytest.approx(50.0, rel=1e-6)
    assert chunk_bound_gbps(topo, 2) >= _milp_rate(topo, 2) * (1 - 1e-6)
