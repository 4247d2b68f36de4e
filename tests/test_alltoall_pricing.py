"""Pricing from fewer sources (mccl_opt/alltoall/pricing.py): without a step bound, every
pair's shortest cost comes from the components of the zero-price links, and the kernel
runs only from the sources that may have an improving path; the columns must be exactly
those of a run from every source (same paths, same tie-breaking)."""

from __future__ import annotations

import numpy as np
import pytest

import mccl_opt.alltoall.pricing as pricing
from instances import dgx, fail2, hpn, irregular
from instances.aggregation import host_ring
from mccl_opt.alltoall.problem import problem_for

FABRICS = [lambda: irregular(2), lambda: irregular(5), lambda: fail2(hpn(1, 4, 8)), lambda: dgx()]


def _prices(rng, n_links, kind):
    if kind == "sparse":                 # a vertex dual: a few priced links
        return np.where(rng.random(n_links) < 0.04, rng.random(n_links), 0.0)
    if kind == "cut":                    # cut prices: 1/cap(S) on a set S
        return np.where(rng.random(n_links) < 0.1, 1.0 / 713.0, 0.0)
    return rng.choice([0.0, 0.25, 1.0], size=n_links)     # many equal costs: ties


@pytest.mark.parametrize("make", FABRICS, ids=["irregular2", "irregular5", "hpn1x4x8-fail2", "dgx"])
def test_fewer_sources_give_the_same_columns_as_every_source(make, monkeypatch):
    topo = make()
    prob = problem_for(topo)
    graph, g = prob.graph, prob.num_gpus
    rng = np.random.default_rng(11)
    unbounded = topo.num_nodes - 1
    for kind in ("sparse", "cut", "ties"):
        price = _prices(rng, prob.num_links, kind)
        with monkeypatch.context() as m:
            m.setattr(pricing, "CONDENSE_MAX_COMPONENTS", -1)       # the kernel everywhere
            base = pricing.price_paths(graph, price, np.full((g, g), -np.inf), unbounded)
        exact = base.shortest
        # thresholds below, at (ties: no column), just above and above each pair's cost
        scale = rng.choice([0.5, 1.0, 1.0 + 1e-12, 3.0], size=(g, g))
        threshold = exact * scale + rng.choice([0.0, 0.0, 1e-3], size=(g, g))
        want = rng.random((g, g)) < 0.6
        with monkeypatch.context() as m:
            m.setattr(pricing, "CONDENSE_MAX_COMPONENTS", -1)
            full = pricing.price_paths(graph, price, threshold, unbounded, want)
        fewer = pricing.price_paths(graph, price, threshold, unbounded, want)
        assert full.count > 0 or kind == "ties"
        for name in ("src", "dst", "cost", "start", "arcs"):
            assert np.array_equal(getattr(full, name), getattr(fewer, name)), (kind, name)
        np.testing.assert_allclose(fewer.shortest, exact, rtol=1e-12, atol=0.0)


def test_condensed_costs_are_the_kernel_costs_and_give_up_on_dense_prices(monkeypatch):
    topo = irregular(4)
    prob = problem_for(topo)
    graph, g = prob.graph, prob.num_gpus
    rng = np.random.default_rng(5)
    price = np.where(rng.random(prob.num_links) < 0.05, rng.random(prob.num_links), 0.0)
    cond = pricing.condensed_shortest(graph, price)
    monkeypatch.setattr(pricing, "CONDENSE_MAX_COMPONENTS", topo.num_nodes - 1)
    assert pricing.condensed_shortest(graph, np.ones(prob.num_links)) is None  # one per node
    monkeypatch.setattr(pricing, "CONDENSE_MAX_COMPONENTS", -1)
    kernel = pricing.price_paths(graph, price, np.full((g, g), -np.inf), topo.num_nodes - 1)
    np.testing.assert_allclose(cond, kernel.shortest, rtol=1e-12, atol=0.0)
    assert (cond == 0).sum() > g              # zero-price components: many free pairs


@pytest.mark.parametrize("make", [lambda: host_ring(8, 8), lambda: fail2(hpn(2, 8, 8))],
                         ids=["hostring8x8", "hpn2x8x8-fail2"])
def test_routing_every_pair_gives_one_connected_shortest_path_each(make):
    """The kernel sizes its path arrays once and grows the links array from the mean
    path length seen (thousands of paths of uneven length here, several growths from
    its first 4,096 entries): every wanted pair gets exactly one path, from its source
    GPU to its destination GPU over consecutive links, costing its shortest cost."""
    topo = make()
    prob = problem_for(topo)
    g, n = prob.graph, prob.num_gpus
    price = np.random.default_rng(7).choice([0.25, 1.0, 3.0], size=prob.num_links)
    want = ~np.eye(n, dtype=bool)
    want[0, 1:] = False                                   # one source wants nothing
    out = pricing.price_sources(g, price, np.arange(n), topo.num_nodes - 1, want)
    assert out.count == int(want.sum()) and out.arcs.size > 4096
    assert np.array_equal(np.sort(prob.pair_index(out.src, out.dst)),
                          np.sort(prob.pair_index(*np.nonzero(want))))
    for j in range(out.count):
        arcs = out.arcs[out.start[j]:out.start[j + 1]]
        assert g.tail[arcs[0]] == g.gpu_nodes[out.src[j]]
        assert g.head[arcs[-1]] == g.gpu_nodes[out.dst[j]]
        assert np.array_equal(g.head[arcs[:-1]], g.tail[arcs[1:]])
        assert price[arcs].sum() == pytest.approx(out.cost[j], rel=1e-12)
        assert out.cost[j] == pytest.approx(out.shortest[out.src[j], out.dst[j]], rel=1e-12)
