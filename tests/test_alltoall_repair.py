"""Chunk repair before the deep dive (docs/alltoall.md, *Chunk repair*): single-chunk
moves off the links a rounding overloads bring every link back to the LP's load, or
the repair gives up and leaves the rounding as it was."""

from __future__ import annotations

import numpy as np
import pytest

from instances import degrade, hpn
from mccl_opt.alltoall.colgen import CGOptions
from mccl_opt.alltoall.driver import run_cg
from mccl_opt.alltoall.problem import problem_for
from mccl_opt.alltoall.repair import repair_overloads
from mccl_opt.alltoall.rounding import largest_remainder, rounded_rate
from mccl_opt.topology import Link, Node, Topology

K = 10


def _solved(topo: Topology, steps: int | None = None):
    prob = problem_for(topo)
    steps = topo.num_nodes - 1 if steps is None else steps
    return prob, steps, run_cg(prob, "highs", steps, None, None, CGOptions())


def _two_switches() -> Topology:
    """GPUs a and b joined through two switches, 10 Gbps each way: the LP splits each
    pair's shard half and half, 5 of 10 chunks per switch."""
    nodes = [Node("a", "gpu"), Node("b", "gpu"), Node("s1", "switch"), Node("s2", "switch")]
    links = [Link(u, v, 10.0) for s in ("s1", "s2") for u, v in
             (("a", s), (s, "b"), ("b", s), (s, "a"))]
    return Topology("two-switches", nodes, links)


@pytest.mark.parametrize("max_steps", [None, 1])      # compiled search; the pricing kernel's
def test_an_overloaded_switch_gives_one_chunk_to_the_other(max_steps):
    prob, steps, solved = _solved(_two_switches(), max_steps)
    master, res = solved.master, solved.result
    pool = master.pool
    counts = largest_remainder(pool, res.solution.y, prob.num_pairs, K)
    assert rounded_rate(pool, counts, K, master.capacity) == res.rate   # 5 and 5
    ab = np.flatnonzero((pool.pair == 0) & (counts > 0))
    assert ab.size == 2
    bad = counts.copy()
    bad[ab[0]] += 1                                  # 6 and 4: one link a chunk over
    bad[ab[1]] -= 1
    assert rounded_rate(pool, bad, K, master.capacity) < res.rate
    fixed = repair_overloads(master, prob, bad, K, steps, res.solution.t)
    assert fixed is not None and fixed.size == len(master.pool)
    assert np.array_equal(np.bincount(master.pool.pair, weights=fixed, minlength=prob.num_pairs),
                          np.full(prob.num_pairs, K))
    assert abs(rounded_rate(master.pool, fixed, K, master.capacity) - res.rate) <= 1e-9 * res.rate
    # a rounding already at the LP's load needs no repair
    assert repair_overloads(master, prob, counts, K, steps, res.solution.t) is None


def test_a_gap_no_chunk_move_can_close_is_left_alone():
    fabric = hpn(1, 2, 8)
    g = fabric.gpus[0]
    tor = next(l.dst for l in fabric.links if l.src == g and "tor" in l.dst)
    prob, steps, solved = _solved(degrade(fabric, g, tor, fabric.link(g, tor).capacity_gbps * 0.5))
    master, res = solved.master, solved.result
    counts = largest_remainder(master.pool, res.solution.y, prob.num_pairs, K)
    assert rounded_rate(master.pool, counts, K, master.capacity) < res.rate * (1 - 1e-3)
    size = len(master.pool)
    assert repair_overloads(master, prob, counts, K, steps, res.solution.t) is None
    assert len(master.pool) == size                  # nothing added when it gives up
