"""The exact split's sink order (``removal.splitting.sink_order``): a speed hint only.

The rooted scans of the exact split move the sink from GPU to GPU repairing one flow;
``sink_order`` keeps a host's GPUs together so that a listing with shuffled ranks scans
as cheaply as one in rank order (docs/allgather.md, *Leaf-spine 8x2x8 in any listing*).
Its results are a minimum or a pass/fail over all sinks, so any order must give the same
split.
"""

from __future__ import annotations

import numpy as np

from instances.aggregation import leaf_spine, scrambled
from mccl_opt.allgather.canonical import canonical
from mccl_opt.allgather.forestcoll.maxflow import FlowNetwork
from mccl_opt.allgather.forestcoll.removal.exact_split import split_all
from mccl_opt.allgather.forestcoll.removal.splitting import LogicalGraph, hubs_of, sink_order, sink_ranks
from mccl_opt.allgather.forestcoll.removal.spread import spread_split
from tests.test_allgather_split_arrays import split_of


def test_sink_order_keeps_hosts_together_in_any_listing():
    """Scrambled leaf-spine (ranks shuffled): the order is a permutation of the GPUs in
    which each host's GPUs (one NVSwitch) are consecutive."""
    topo = canonical(scrambled(leaf_spine(2, 2, 4), 7))
    g, _ = split_of(topo)
    order = sink_order(g).tolist()
    assert sorted(order) == sorted(g.gpus.tolist())
    arr = topo.arrays
    host = {}                       # GPU node -> its NVSwitch (the neighbour switch of
    for a, b, c in zip(arr.tail.tolist(), arr.head.tolist(), arr.capacity.tolist()):
        if not arr.is_switch[a] and arr.is_switch[b] and c > host.get(a, (0, -1))[0]:
            host[a] = (c, b)        # the widest link)
    runs = [host[v][1] for v in order]
    changes = sum(x != y for x, y in zip(runs, runs[1:]))
    assert changes == len(set(runs)) - 1 == 3


def test_the_exact_split_does_not_depend_on_the_sink_order():
    """The same logical links and units with the GPUs scanned in reverse or shuffled."""
    g, _ = split_of(scrambled(leaf_spine(2, 2, 4, spines=2), 3))
    results = []
    rng = np.random.default_rng(5)
    for near in (None, g.gpus[::-1].copy(), rng.permutation(g.gpus)):
        h = g.copy()
        h.near = None if near is None else np.asarray(near, np.int64)
        assert split_all(h)
        results.append(h.units)
    assert results[0] == results[1] == results[2]


def _failing_sinks(lg: LogicalGraph, k: int) -> set[int]:
    """The ranks whose rooted max-flow is below ``k n``, one flow per sink."""
    net = FlowNetwork(lg.num_gpus, lg.tail, lg.head)
    caps = net.caps()
    caps[: net.m] = lg.units
    caps[net.s_arc0: net.s_arc0 + lg.num_gpus] = k
    return {v for v in range(lg.num_gpus)
            if net.first_failing_sink(caps, np.array([v], np.int64), k * lg.num_gpus) == 0}


def test_the_rooted_test_does_not_depend_on_the_sink_order():
    """``LogicalGraph.admits`` with the ranks swept in the split's order, reversed or
    shuffled: the answer of rank order, for every stride and ``passed``, on the spread
    graph and on one with a link cut so that a few ranks fail as sinks: it fails exactly
    where one of them is among the ranks tested (the stride picks ranks, not positions in
    the order)."""
    g, rank_of = split_of(scrambled(leaf_spine(2, 2, 4), 11))
    lg = spread_split(g, rank_of)
    n, k = lg.num_gpus, g.k
    rng = np.random.default_rng(3)
    orders = [None, sink_ranks(g, rank_of), np.arange(n)[::-1].copy(), rng.permutation(n)]
    assert sorted(orders[1].tolist()) == list(range(n))
    graphs = [lg]
    for i in range(lg.units.size):              # the first cut link that fails a few sinks
        units = lg.units.copy()
        units[i] = 0
        weak = LogicalGraph(n, lg.tail, lg.head, units, lg.bundles)
        if 0 < len(_failing_sinks(weak, k)) < n // 2:
            graphs.append(weak)
            break
    assert len(graphs) == 2 and not _failing_sinks(lg, k)
    answers = set()
    for graph in graphs:
        failing = _failing_sinks(graph, k)
        for stride, passed in ((1, None), (2, None), (4, None), (1, 4), (1, 2), (3, 2)):
            tested = {v for v in range(0, n, stride) if passed is None or v % passed}
            want = not failing & tested
            assert {graph.admits(k, stride, passed, order=o) for o in orders} == {want}
            answers.add(want)
    assert answers == {True, False}


def _host_groups(topo) -> set[frozenset[str]]:
    """The GPUs grouped by their hub in the split graph (``splitting.hubs_of``, the
    grouping of the sink order and of the exact split's host seeds), by name."""
    g, _ = split_of(topo)
    hub = hubs_of(g)
    groups: dict[int, set[str]] = {}
    for v in g.gpus.tolist():
        groups.setdefault(int(hub[v]), set()).add(topo.nodes[v].id)
    return {frozenset(x) for x in groups.values()}


def test_host_groups_do_not_depend_on_the_listing():
    """Leaf-spine 2x2x4 listed three ways (nodes and links permuted, names kept): the same
    groups of GPU names, each the four GPUs cabled to one NVSwitch; renamed and
    permuted (``scrambled``): four groups of four again."""
    topo = leaf_spine(2, 2, 4)
    by_nvswitch: dict[str, set[str]] = {}
    for link in topo.links:
        if link.dst.endswith("nvs") and not link.src.endswith("nvs"):
            by_nvswitch.setdefault(link.dst, set()).add(link.src)
    want = {frozenset(x) for x in by_nvswitch.values()}
    assert len(want) == 4 and all(len(x) == 4 for x in want)
    rng = np.random.default_rng(9)
    for _ in range(3):
        relisted = topo.relisted(rng.permutation(len(topo.nodes)), rng.permutation(len(topo.links)))
        assert _host_groups(relisted) == want
    assert sorted(map(len, _host_groups(scrambled(topo, 4)))) == [4] * 4
