"""``solver_synthesizer(shallow=True)`` (controller ``--shallow-trees``): a warm AllGather
start that deepens the trees is replaced by a cold solve of the same rate with shallower
trees (issue 26, real ranks: every tree hop is a round on the executor)."""

from __future__ import annotations

import pytest


def _fabric():
    from instances import hpn

    topo = hpn(1, 2, 4)
    cap = topo.arrays.capacity.copy()
    for (a, b, g) in (("s0h0g0", "s0h0nvs", 800), ("s0h0g1", "s0tor1", 50), ("s0h1g3", "s0h1nvs", 1000)):
        cap[topo.link_index(a, b)] = g
        if b != "s0h1nvs":
            cap[topo.link_index(b, a)] = g
    return topo, topo.with_capacities(cap)


def test_shallow_keeps_the_rate_and_never_deepens_past_the_cold_schedule():
    import mccl_opt
    from mccl_runtime.synthesizer import solver_synthesizer, tree_rounds

    topo, degraded = _fabric()
    healthy = mccl_opt.solve_allgather(topo)
    cold = mccl_opt.solve_allgather(degraded)
    plain = solver_synthesizer()("allgather", degraded, healthy, None)
    shallow = solver_synthesizer(shallow=True)("allgather", degraded, healthy, None)
    mccl_opt.validate(degraded, shallow)
    # this fabric is the case: the warm start from the healthy trees deepens them
    assert tree_rounds(plain) > tree_rounds(healthy)
    assert shallow.rate_gbps >= plain.rate_gbps * (1 - 1e-9)          # rate never given up
    assert tree_rounds(shallow) == min(tree_rounds(plain), tree_rounds(cold)) < tree_rounds(plain)
    # a warm start that does not deepen is kept as it is (no cold solve)
    again = solver_synthesizer(shallow=True)("allgather", degraded, shallow, None)
    assert tree_rounds(again) <= tree_rounds(shallow)


def test_tree_rounds_is_the_deepest_tree():
    from mccl_opt.baselines import rail_allgather
    from mccl_runtime.synthesizer import tree_rounds
    from instances import hpn

    topo = hpn(1, 1, 4)
    sched = rail_allgather(topo)
    want = max(max(c.depths().values()) for c in sched.chunks)
    assert tree_rounds(sched) == want >= 1
