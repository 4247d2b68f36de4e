"""ForestColl-warm after Fail3 (paper §4.3): the previous physical trees carried onto the
fabric where a GPU was replaced (mccl_opt.allgather.warm.transfer), then rerouted; the
array-only forest (mccl_opt.allgather.warm.forest)."""

from __future__ import annotations

import numpy as np
import pytest

from instances import fail2, fail3, hpn
from mccl_opt import Schedule, validate
from mccl_opt import restore_warm_state
from mccl_opt.allgather import solve_allgather
from mccl_opt.allgather.canonical import canonical
from mccl_opt.allgather.warm.forest import FlatPaths, SwitchPathTable, link_lookup
from mccl_opt.allgather.warm.transfer import _loop_free, carried
from mccl_opt.allgather.warm.previous import Previous
from mccl_opt.topology import Topology


@pytest.mark.parametrize("shape", [(1, 4, 8), (2, 4, 8), (1, 16, 8)],
                         ids=["1x4x8", "2x4x8", "1x16x8"])
def test_fail3_warm_reroutes_the_carried_trees_to_the_cold_rate(shape):
    """After Fail3 the previous trees are carried onto the backup GPU and rerouted; the
    reroute certifies the guessed optimum, which equals cold's, and the schedule is valid
    (every root's shares sum to 1)."""
    before = solve_allgather(hpn(*shape))
    after = fail3(hpn(*shape))
    warm = solve_allgather(after, warm=before)
    cold = solve_allgather(after)
    assert warm.stats["reroute"] == "done"
    assert warm.stats["phase1_guess"] == "certified by rerouting"
    assert warm.rate_gbps == pytest.approx(cold.rate_gbps, rel=1e-9)
    assert warm.rate_gbps == pytest.approx(warm.lp_rate_gbps, rel=1e-9)
    validate(after, warm)
    per_root: dict[str, float] = {}
    for c in warm.chunks:
        per_root[c.src] = per_root.get(c.src, 0.0) + c.share
    assert sorted(per_root) == sorted(after.gpus)
    assert all(v == pytest.approx(1.0) for v in per_root.values())


def test_carried_forest_keeps_ranks_and_rides_new_links():
    """The carried forest has the previous parent ranks; each path joins the same ranks
    over links of the new fabric with switches inside; the paths at the backup that
    used the old GPU's NIC now cross the backup's ToR."""
    base = hpn(1, 2, 8)
    before = solve_allgather(base)
    after = canonical(fail3(base))
    old = before.warm_state.trees.forest
    forest = Previous(before, after).forest
    assert forest is not None
    assert np.array_equal(forest.parent, old.parent) and np.array_equal(forest.rows, old.rows)
    table, arr = forest.paths, after.arrays
    assert np.array_equal(table.tail, old.paths.tail)
    assert np.array_equal(table.head, old.paths.head)
    assert (table.links >= 0).all()
    ids = table.node_ids
    backup = after.gpus[0]
    via_tor = 0
    for j in range(len(table.nodes)):
        path = table.nodes[j]
        assert arr.rank_of[path[0]] == table.tail[j] and arr.rank_of[path[-1]] == table.head[j]
        assert all(arr.is_switch[v] for v in path[1:-1])
        assert all(after.has_link(ids[a], ids[b]) for a, b in zip(path, path[1:]))
        assert len(set(path)) == len(path)
        names = [ids[v] for v in path]
        if backup in names and "bk-tor" in names:
            via_tor += 1
    assert via_tor > 0
    old_names = [tuple(before.warm_state.trees.forest.paths.node_ids[v] for v in p)
                 for p in old.paths.nodes]
    assert any(p[0] == "s0h0g0" and p[1].startswith("s0tor") for p in old_names)


def test_fabric_whose_shape_changed_is_packed_anew():
    """A replaced GPU plus a lost cable between two kept nodes is not a GPU swap: no
    forest is carried, the warm start packs (reusing previous shapes), and still
    reaches the cold rate."""
    base = hpn(1, 2, 8)
    before = solve_allgather(base)
    f3 = fail3(base)
    cut = {("s0h1g1", "s0tor1"), ("s0tor1", "s0h1g1")}
    changed = Topology("hpn-1x2x8-fail3-cut", f3.nodes,
                       [l for l in f3.links if (l.src, l.dst) not in cut])
    assert Previous(before, canonical(changed)).forest is None
    warm = solve_allgather(changed, warm=before)
    assert "reroute" not in warm.stats and warm.stats.get("reused_trees", 0) > 0
    assert warm.rate_gbps == pytest.approx(solve_allgather(changed).rate_gbps, rel=1e-9)
    validate(changed, warm)


def test_chained_warm_starts_through_a_replaced_gpu():
    """healthy -> Fail3 (carried, rerouted) -> Fail3 + Fail2 on another GPU (from the
    carried trees) -> from a schedule read back from JSON, Fail3 again (rerouted): each
    equals its cold rate and validates."""
    base = hpn(1, 4, 8)
    f3 = fail3(base)
    both = fail2(f3, 9)
    prev = solve_allgather(base)
    for topo in (f3, both):
        warm = solve_allgather(topo, warm=prev)
        # the second failure leaves the backup the bottleneck: kept or rerouted
        assert warm.stats.get("reroute") == "done" or warm.stats.get("reused_schedule")
        assert warm.warm_state.trees.forest is not None
        assert warm.rate_gbps == pytest.approx(solve_allgather(topo).rate_gbps, rel=1e-9)
        validate(topo, warm)
        prev = warm
    loaded = restore_warm_state(Schedule.from_dict(solve_allgather(base).to_dict()), base)
    warm = solve_allgather(f3, warm=loaded)
    assert warm.stats["reroute"] == "done"
    assert warm.rate_gbps == pytest.approx(solve_allgather(f3).rate_gbps, rel=1e-9)


def test_link_lookup_and_flat_paths():
    """``link_lookup`` finds every link of the topology and ``-1`` for pairs that are not
    links; a table's flat paths read back as the tuples it was built from."""
    topo = hpn(2, 2, 4)
    arr = topo.arrays
    assert np.array_equal(link_lookup(topo, arr.tail, arr.head), np.arange(topo.num_links))
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, topo.num_nodes, 400), rng.integers(0, topo.num_nodes, 400)
    ids = [n.id for n in topo.nodes]
    want = [topo.link_index(ids[x], ids[y]) if topo.has_link(ids[x], ids[y]) else -1
            for x, y in zip(a.tolist(), b.tolist())]
    assert link_lookup(topo, a, b).tolist() == want
    paths = [(0, 8, 1), (3, 8, 2)]
    table = SwitchPathTable.build(paths, topo)
    flat = FlatPaths(table.flat, table.first)
    assert list(flat) == paths and flat[-1] == paths[-1]
    with pytest.raises(IndexError):
        flat[2]


def test_loop_free_cuts_cycles():
    """A splice that revisits a node has the cycle removed."""
    assert _loop_free([0, 5, 6, 5, 1]) == [0, 5, 1]
    assert _loop_free([0, 5, 6, 7, 6, 8, 1]) == [0, 5, 6, 8, 1]
    assert _loop_free([0, 5, 1]) == [0, 5, 1]


def test_carried_refuses_other_gpu_counts():
    """A forest is only carried onto a fabric with as many GPUs."""
    before = solve_allgather(hpn(1, 2, 8))
    state = before.warm_state.trees
    other = canonical(hpn(1, 4, 8))
    assert carried(state.forest, before.gpus, state.links, other) is None


def test_a_gpu_renamed_in_place_keeps_every_tree():
    """A GPU replaced by one on the very same cables (a new id, no other change): the
    trees are carried unchanged, fit as they are (no edge moves) and keep the rate."""
    from mccl_opt.topology import Link, Node

    base = hpn(1, 2, 8)
    before = solve_allgather(base)
    new = {"s0h0g0": "s0h0g0-new"}
    swapped = Topology("hpn-1x2x8-renamed",
                       [Node(new.get(n.id, n.id), n.kind) for n in base.nodes],
                       [Link(new.get(l.src, l.src), new.get(l.dst, l.dst), l.capacity_gbps,
                             l.latency_us) for l in base.links])
    warm = solve_allgather(swapped, warm=before)
    assert warm.stats["reroute"] == "done" and warm.stats["rerouted_edges"] == 0
    assert warm.rate_gbps == pytest.approx(before.rate_gbps, rel=1e-12)
    validate(swapped, warm)
    old = sorted((c.share, tuple(new.get(v, v) for e in c.edges for v in e)) for c in before.chunks)
    assert sorted((c.share, tuple(v for e in c.edges for v in e)) for c in warm.chunks) == old
