"""The guarded spread split's sweeps and packings at ``max_chunks=None`` in any listing
(docs/allgather_history.md, "Guard sweeps in structural order").

The guard's rooted sweeps scan the ranks in the split's sink order (a host's GPUs
together), not in the listing's rank order, and on a tight guarded graph the repair
packing in the plain growth order is skipped (the rail-first retry and the few-trees
packing follow).  Leaf-spine 4x2x8 (64 GPUs) takes the guarded split at ``None`` in its
plain listing.  The sweeps over the physical fabric keep hosts together as well, and a
guarded split whose repair packing completes is not swept.
"""

from __future__ import annotations

import pytest

import mccl_opt as mo
from instances.aggregation import leaf_spine, scrambled
from mccl_opt.allgather.fabric import fabric_of
from mccl_opt.allgather.forestcoll import pack_steps
from mccl_opt.allgather.forestcoll.removal import guarded_spread
from mccl_opt.allgather.forestcoll.removal.spread import spread_split
from mccl_opt.allgather.forestcoll.throughput import optimal_rate
from tests.oracle_allgather import cut_bound
from tests.test_allgather_split_arrays import split_of


def _host_of_rank(topo: mo.Topology) -> dict[int, str]:
    """Each rank's host: the switch at the end of its GPU's widest link (the NVSwitch)."""
    widest: dict[str, tuple[float, str]] = {}
    for link in topo.links:
        if link.src in topo.gpus and link.dst not in topo.gpus:
            if link.capacity_gbps > widest.get(link.src, (0.0, ""))[0]:
                widest[link.src] = (link.capacity_gbps, link.dst)
    return {topo.rank(g): widest[g][1] for g in topo.gpus}


def test_guard_sweeps_keep_hosts_together(monkeypatch):
    """A scrambled listing: the guard's rank sweep scans all ranks once, each host's
    ranks in one run (in rank order it jumps from host to host)."""
    topo = scrambled(leaf_spine(4, 2, 8), 56718613)
    g, rank_of = split_of(topo)
    sweeps = []
    real = guarded_spread.violated_sets

    def spy(n, gpus, k, arcs, most):
        sweeps.append(list(gpus))
        return real(n, gpus, k, arcs, most)

    monkeypatch.setattr(guarded_spread, "violated_sets", spy)
    lg = spread_split(g, rank_of)
    assert guarded_spread.guarded_spread(g, rank_of, lg) is lg      # it passes: kept
    host = _host_of_rank(topo)
    assert len(sweeps) == 1
    order = sweeps[0]
    assert sorted(order) == list(range(topo.num_gpus))
    runs = [host[r] for r in order]
    assert sum(a != b for a, b in zip(runs, runs[1:])) == len(set(runs)) - 1 == 7


def test_tight_guarded_graph_skips_the_plain_order_repair(monkeypatch):
    """After the guarded split (tight at ``None``) only the rail-first repair packing runs,
    and it packs the oracle's optimum."""
    topo = leaf_spine(4, 2, 8)
    calls = []
    real = pack_steps._pack_repair

    def spy(lg, k, stats, shapes, **kw):
        found = real(lg, k, stats, shapes, **kw)
        calls.append((kw.get("guarded", False), bool(kw.get("rail_first")), found is not None))
        return found

    monkeypatch.setattr(pack_steps, "_pack_repair", spy)
    sched = mo.solve_allgather(topo, max_chunks=None)
    mo.validate(topo, sched)
    assert sched.stats["split"] == "guarded"
    assert [c for c in calls if c[0]] == [(True, True, True)]
    assert sched.rate_gbps == pytest.approx(cut_bound(topo), rel=1e-6)


def test_a_guarded_split_that_packs_is_not_swept(monkeypatch):
    """Leaf-spine 4x2x8 at ``K = 10``: the plain spread split fails the rooted test (one
    sweep, which finds the sets the guard learns) and the guarded split's repair packing
    completes, which proves its test: no second sweep.  The schedule is valid, within
    the chunk budget's 0.03 % of the oracle's optimum."""
    topo = leaf_spine(4, 2, 8)
    sweeps = []
    real = guarded_spread._violated_ranks

    def spy(lg, k, times, near):
        found = real(lg, k, times, near)
        sweeps.append(found is None)
        return found

    monkeypatch.setattr(guarded_spread, "_violated_ranks", spy)
    sched = mo.solve_allgather(topo, max_chunks=10)
    mo.validate(topo, sched)
    assert (sched.stats["split"], sched.stats["packing"]) == ("guarded", "repair")
    assert sweeps == [False]
    assert 0.9997 * cut_bound(topo) <= sched.rate_gbps <= cut_bound(topo) * (1 + 1e-9)


def test_phase_one_sweeps_keep_hosts_together():
    """The rooted sweeps over the physical fabric (Phase 1, the chunk budget, the
    restriction's cuts) take the GPUs in :meth:`Fabric.sweep` order: in a scrambled
    listing every host's GPUs in one run, and the optimum is the plain listing's."""
    topo = scrambled(leaf_spine(4, 2, 8), 56718613)
    fab = fabric_of(topo)[0]
    host = _host_of_rank(topo)
    rank = {int(node): r for r, node in enumerate(fab.gpus.tolist())}
    order = fab.sweep()
    assert sorted(order.tolist()) == sorted(fab.gpus.tolist())
    runs = [host[rank[int(v)]] for v in order]
    assert sum(a != b for a, b in zip(runs, runs[1:])) == len(set(runs)) - 1 == 7
    assert fab.with_caps(fab.cap).sweep() is order
    plain = fabric_of(leaf_spine(4, 2, 8))[0]
    assert optimal_rate(fab).rate == optimal_rate(plain).rate
