"""Partial pricing of the full master (:func:`mccl_opt.alltoall.colgen.strongest_columns`):
it keeps the strongest columns, and column generation stays exact with it."""

from __future__ import annotations

import numpy as np
import pytest

from instances import hpn
from mccl_opt.alltoall import driver, solve_alltoall
from mccl_opt.alltoall.colgen import strongest_columns
from mccl_opt.alltoall.pricing import price_paths
from mccl_opt.alltoall.problem import problem_for


def _priced():
    """The first pricing of HPN 1x2x8 under prices on its NICs: many improving columns."""
    prob = problem_for(hpn(1, 2, 8))
    w = np.where(prob.capacity < prob.capacity.max(), 1.0 / prob.capacity, 0.0)
    threshold = np.full((prob.num_gpus, prob.num_gpus), 1.0)
    return price_paths(prob.graph, w, threshold, prob.graph.n_nodes - 1, None), threshold


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_strongest_columns_keeps_those_at_the_share_of_the_best(share):
    priced, threshold = _priced()
    assert priced.count > 1
    reduced = threshold[priced.src, priced.dst] - priced.cost
    kept = strongest_columns(priced, threshold, share)
    kept_reduced = threshold[kept.src, kept.dst] - kept.cost
    assert kept.count == int((reduced >= share * reduced.max()).sum())
    assert kept_reduced.max() == reduced.max()              # the best column always stays
    assert kept.start.size == kept.count + 1 and kept.arcs.size == kept.start[-1]
    for j in range(kept.count):                            # each kept path is one priced path
        arcs = kept.arcs[kept.start[j]:kept.start[j + 1]]
        assert any(np.array_equal(arcs, priced.arcs[priced.start[i]:priced.start[i + 1]])
                   for i in np.flatnonzero((priced.src == kept.src[j]) & (priced.dst == kept.dst[j])))


def test_partial_pricing_reaches_the_same_optimum(monkeypatch):
    # a spine link of HPN 2x2x8 at 46 %, warm from the healthy schedule: the full master
    # (the local try gives up) with and without partial pricing, and cold
    base = hpn(2, 2, 8)
    healthy = solve_alltoall(base)
    topo = base.with_capacity(src="agg0", dst="s0tor0", gbps=0.46 * 800.0)
    partial = solve_alltoall(topo, warm=healthy, max_chunks=None)
    monkeypatch.setattr(driver, "STRONGEST_COLUMNS", 0.0)
    every = solve_alltoall(topo, warm=healthy, max_chunks=None)
    cold = solve_alltoall(topo, max_chunks=None)
    assert partial.stats["warm_mode"] == "full"
    assert partial.lp_rate_gbps == pytest.approx(every.lp_rate_gbps, rel=1e-9)
    assert partial.lp_rate_gbps == pytest.approx(cold.lp_rate_gbps, rel=1e-9)
    assert partial.stats["lp_bound_gbps"] == pytest.approx(partial.lp_rate_gbps, rel=1e-7)
