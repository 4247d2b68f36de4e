"""The first schedule of a time-limited AllGather solve (mccl_opt.allgather.first): above
MWU_MAX_GPUS GPUs one shortest-path tree per root, built in arrays; checked against the
independent oracle's model (valid trees, the rate its loads give)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import mccl_opt as mo
from instances import hpn
from instances.aggregation import host_ring, shared_aggregation
from mccl_opt.allgather.canonical import canonical
from mccl_opt.allgather.first import MWU_MAX_GPUS, first_schedule
from mccl_opt.schedule_chunks import TreeChunks, TreeTable
from tests.oracle_allgather import check_schedule


@pytest.mark.parametrize("make", [lambda: hpn(2, 8, 8), lambda: shared_aggregation(2, 5, 8),
                                  lambda: host_ring(12, 8)])
def test_shortest_path_first_schedule_is_valid(make):
    topo = canonical(make())
    assert topo.num_gpus > MWU_MAX_GPUS
    s = first_schedule(topo, None, 10)
    assert s.stats["method"] == "shortest-path-trees"
    checked = check_schedule(topo, s, max_chunks=10)
    assert checked.rate_gbps == pytest.approx(s.rate_gbps, rel=1e-9)
    assert mo.validate(topo, s).rate_gbps == pytest.approx(s.rate_gbps, rel=1e-9)


def test_first_schedule_rate_is_not_above_the_optimum():
    topo = canonical(shared_aggregation(2, 5, 8))
    s = first_schedule(topo, None, 10)
    assert 0 < s.rate_gbps <= mo.solve_allgather(topo, max_chunks=None).lp_rate_gbps * (1 + 1e-9)


def test_validator_counts_a_path_a_table_lists_twice():
    """Loads of a tree table that names one path under two indices count both uses."""
    base = canonical(hpn(1, 1, 2))
    ids = [n.id for n in base.nodes]
    g0, g1 = (ids.index(g) for g in base.gpus)
    nvs = next(i for i, n in enumerate(base.nodes) if n.kind == "switch" and "nvs" in n.id)
    topo = base.with_capacity({(ids[g0], ids[nvs]): 100.0})      # path 0's link the bottleneck
    paths = [(g0, nvs, g1), (g1, nvs, g0), (g0, nvs, g1)]        # path 2 repeats path 0
    table = TreeTable(ids, paths, np.array([g0, g0, g1]), np.array([0.5, 0.5, 1.0]),
                      np.array([[0], [2], [1]]))
    sched = first_schedule(topo, None, None)
    loads = mo.schedule.share_loads(topo, TreeChunks(table))
    rate = mo.schedule.schedule_rate(topo, loads)
    tabled = dataclasses.replace(sched, chunks=TreeChunks(table), rate_gbps=rate,
                                 lp_rate_gbps=max(rate, sched.lp_rate_gbps))
    assert mo.validate(topo, tabled).rate_gbps == pytest.approx(rate, rel=1e-9)
    assert rate == pytest.approx(check_schedule(topo, tabled).rate_gbps, rel=1e-9)
