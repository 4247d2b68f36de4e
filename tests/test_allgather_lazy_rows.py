"""Lazy link rows in the general method's tree master (docs/allgather_history.md "Lazy link
rows"): a master started with half the capacity rows, adding the ones its solutions
violate, must end at the optimum of the master with every row, meet every link's
capacity, and certify only that optimum."""

from __future__ import annotations

import numpy as np
import pytest

from instances import hpn
from mccl_opt.allgather.general.live_master import TreeMaster, TreePool
from mccl_opt.allgather.general.method import rate_scale, solve_general
from mccl_opt.allgather.general.tree_colgen import (TreeCGOptions, mwu_trees,
                                                    tree_column_generation)
from mccl_opt.backends import get_backend
from tests.oracle_allgather import check_schedule, forwarding_optimum

LAZY = TreeCGOptions(lazy_rows_from=1)          # every fabric starts with half its rows
ALL_ROWS = TreeCGOptions(lazy_rows_from=10**9)


def _one_way(shape: tuple[int, int, int], gbps: float = 100.0):
    return hpn(*shape).with_capacity(src="s0h0g0", dst="s0tor0", gbps=gbps,
                                     both_directions=False)


@pytest.mark.parametrize("shape", [(1, 2, 8), (2, 2, 4)])
def test_lazy_rows_reach_the_full_masters_optimum_and_the_independent_one(shape):
    """Same certified optimum as with every row, equal to the compact LP's
    forwarding-only optimum; the schedule validates at that rate (so no link is over
    its capacity) although the master ended with fewer rows than links."""
    topo = _one_way(shape)
    lazy = solve_general(topo, max_chunks=None, options=LAZY)
    full = solve_general(topo, max_chunks=None, options=ALL_ROWS)
    assert lazy.stats["cg_status"] == "optimal" and lazy.stats["cg_gap"] <= 1e-8
    assert full.stats["link_rows"] == topo.num_links
    assert lazy.lp_rate_gbps == pytest.approx(full.lp_rate_gbps, rel=1e-9)
    opt = forwarding_optimum(topo).rate_gbps
    assert lazy.lp_rate_gbps == pytest.approx(opt, rel=1e-7)
    assert lazy.report.bound_gbps == pytest.approx(opt, rel=1e-7)
    checked = check_schedule(topo, lazy)
    assert checked.rate_gbps == pytest.approx(opt, rel=1e-6)


def test_every_link_capacity_holds_with_rows_missing():
    """Started from few trees (so the rows the seed leaves out do bind later), the
    column generation adds the violated rows: the final weights load no link above its
    capacity, rows left out were added back, and some were never needed."""
    topo = _one_way((1, 4, 8))
    capacity = topo.arrays.capacity / rate_scale(topo)
    roots, trees = mwu_trees(topo, capacity, rounds=1)
    with get_backend("highs") as lp:
        res = tree_column_generation(topo, lp, capacity, roots, trees, LAZY)
    with get_backend("highs") as lp:
        full = tree_column_generation(topo, lp, capacity, roots, trees, ALL_ROWS)
    half = (capacity.size + 1) // 2
    assert half < res.link_rows < capacity.size
    loads = res.pool.loads(res.weights, capacity.size)
    assert (loads <= capacity * (1 + 1e-9)).all()
    totals = np.bincount(res.pool.root, weights=res.weights, minlength=topo.num_gpus)
    assert totals.min() >= res.rate * (1 - 1e-9)
    assert res.status == full.status == "optimal"
    assert res.rate == pytest.approx(full.rate, rel=1e-9)


def test_relaxed_master_caps_tree_weights_and_lifts_the_caps_with_the_last_row():
    """A tree crossing only missing rows is held at the weight cap (the relaxed master
    stays bounded); once every row is in, the cap goes and the master is the full one."""
    topo = _one_way((1, 2, 4))
    capacity = topo.arrays.capacity / rate_scale(topo)
    roots, trees = mwu_trees(topo, capacity, rounds=1)
    pool = TreePool()
    pool.append(roots, trees)
    with get_backend("highs") as lp:
        master = TreeMaster(lp, topo.num_gpus, capacity, pool, rows=np.zeros(0, np.int64),
                            weight_cap=2.0)
        capped = master.solve("test")
        assert capped.x == pytest.approx(2.0) and master.violated(capped.w).size
        master.add_rows(master.missing)
        assert master.missing.size == 0
        full = master.solve("test", "dual")
        assert not master.violated(full.w).size
    with get_backend("highs") as lp:
        ref = TreeMaster(lp, topo.num_gpus, capacity, pool).solve("test")
    assert full.x == pytest.approx(ref.x, rel=1e-9) and full.x < 1.0


def test_round_cap_returns_a_valid_schedule_with_its_status():
    """At the round cap the master's trees come back (no internal error), marked
    ``round_limit``, with a bound at or above their rate."""
    topo = _one_way((1, 4, 8))
    s = solve_general(topo, max_chunks=None,
                      options=TreeCGOptions(seed_rounds=1, max_rounds=1, lazy_rows_from=1))
    assert s.stats["cg_status"] in ("round_limit", "optimal")
    assert s.report.bound_gbps >= s.lp_rate_gbps * (1 - 1e-9)
    check_schedule(topo, s)
