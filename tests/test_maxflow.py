"""Incremental rooted check (mccl_opt/allgather/forestcoll/maxflow.py) against a from-scratch
networkx max-flow per sink: first failing position, min-cut source side, every failing
sink's cut, min over sinks; also scanned span by span under a time limit."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
from networkx.algorithms.flow import edmonds_karp

from instances import fail1, fail2, hpn
from mccl_opt import anytime
from mccl_opt.allgather.fabric import fabric_of
from mccl_opt.allgather.forestcoll import sweep_spans
from mccl_opt.allgather.forestcoll.maxflow import INF, FlowNetwork
from mccl_opt.allgather.forestcoll.throughput import optimal_rate


def reference(net: FlowNetwork, caps: np.ndarray, sink: int) -> tuple[int, np.ndarray]:
    """Max-flow value with ``sink -> T`` opened, and the real nodes reachable from the
    super-source in its residual network (the minimal min-cut source side)."""
    s, t = net.n, net.n + 1
    g = nx.DiGraph()
    g.add_nodes_from(range(net.n + 2))
    caps = caps.copy()
    caps[net.t_arc0 + sink] = INF
    for u, v, c in zip(net.arc_tail.tolist(), net.arc_head.tolist(), caps.tolist()):  # all arcs
        if u != v and c > 0:
            g.add_edge(u, v, capacity=g.edges[u, v]["capacity"] + c if g.has_edge(u, v) else c)
    r = edmonds_karp(g, s, t)
    seen = {s}
    stack = [s]
    while stack:
        u = stack.pop()
        for v, d in r[u].items():
            if v not in seen and d["capacity"] - d["flow"] > 0:
                seen.add(v)
                stack.append(v)
    side = np.zeros(net.n, bool)
    side[[v for v in seen if v < net.n]] = True
    return int(r.graph["flow_value"]), side


def expected_position(values: list[int], demand: int) -> int:
    return next((i for i, f in enumerate(values) if f < demand), -1)


def check_rooted(net, caps, sinks, demand, refs) -> int:
    """Compare ``first_failing_sink`` (and the source side on failure) with ``refs``,
    the reference per sink of ``sinks``; return the position."""
    pos = net.first_failing_sink(caps, sinks, demand)
    assert pos == expected_position([refs[g][0] for g in sinks.tolist()], demand)
    if pos >= 0:
        np.testing.assert_array_equal(net.source_side(), refs[int(sinks[pos])][1])
    return pos


def random_network(seed: int, forced: bool = False):
    """A random directed network (parallel arcs allowed), super-source arcs of equal
    capacity into a random set of "GPUs"; with ``forced``, some nodes forced onto the
    source side (``s -> v`` INF) and some onto the sink side (``v -> T`` INF)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 26))
    m = int(rng.integers(n, 5 * n))
    tail = rng.integers(0, n, m)
    head = (tail + rng.integers(1, n, m)) % n
    net = FlowNetwork(n, tail, head)
    caps = net.caps()
    caps[: net.m] = rng.integers(0, 12, m)
    gpus = rng.choice(n, int(rng.integers(2, n + 1)), replace=False)
    caps[net.s_arc0 + gpus] = int(rng.integers(1, 8))
    if forced:
        caps[net.s_arc0 + rng.choice(n, 1)] = INF
        caps[net.t_arc0 + rng.choice(n, int(rng.integers(0, 3)))] = INF
    return rng, net, caps, rng.permutation(gpus)


@pytest.mark.parametrize("seed", range(40))
def test_first_failing_sink_matches_per_sink_maxflow(seed):
    rng, net, caps, sinks = random_network(seed)
    sinks = np.concatenate([sinks, rng.choice(sinks, 2)])        # repeated sinks too
    refs = {g: reference(net, caps, g) for g in set(sinks.tolist())}
    values = sorted({f for f, _ in refs.values()})
    total = int(caps[net.s_arc0: net.t_arc0].sum())
    for demand in {0, 1, total, *values, *(f + 1 for f in values)}:
        check_rooted(net, caps, sinks, demand, refs)


def test_failure_at_first_middle_and_last_sink():
    """A sink with the strictly smallest max-flow placed first, in the middle and last
    fails exactly there at ``demand = its flow + 1``; at its flow every sink passes."""
    placed, networks = set(), 0
    for seed in range(200):
        rng, net, caps, sinks = random_network(1000 + seed)
        refs = {g: reference(net, caps, g) for g in sinks.tolist()}
        low = min(refs, key=lambda g: refs[g][0])
        rest = [g for g in sinks.tolist() if g != low]
        if len(rest) < 2 or min(refs[g][0] for g in rest) == refs[low][0]:
            continue
        for j in (0, len(rest) // 2, len(rest)):
            order = np.array(rest[:j] + [low] + rest[j:], np.int64)
            assert check_rooted(net, caps, order, refs[low][0] + 1, refs) == j
            assert check_rooted(net, caps, order, refs[low][0], refs) == -1
            placed.add("first" if j == 0 else "last" if j == len(rest) else "middle")
        networks += 1
        if networks == 12:
            break
    assert placed == {"first", "middle", "last"}


@pytest.mark.parametrize("seed", range(30))
def test_min_flow_over_sinks_matches_per_sink_maxflow(seed):
    """Also with nodes forced onto either side by INF arcs (the splitting slack oracle),
    where closing a sink that is forced onto the sink side leaves its arc open."""
    _, net, caps, sinks = random_network(2000 + seed, forced=True)
    lowest = min(reference(net, caps, g)[0] for g in sinks.tolist())
    for upper in (1 << 62, lowest + 3, lowest, max(lowest - 2, 0)):
        assert net.min_flow_over_sinks(caps, sinks, upper=upper) == min(upper, lowest)
        for floor in (lowest - 1, lowest, lowest + 1):
            got = net.min_flow_over_sinks(caps, sinks, upper=upper, floor=floor)
            if min(upper, lowest) > floor:
                assert got == min(upper, lowest)
            else:
                assert min(upper, lowest) <= got <= floor


def expected_sets(net, refs, sinks, demand, skip=True) -> list[np.ndarray]:
    """The sink sides of the failing sinks (with ``skip``, those no earlier sink side
    holds), in sink order."""
    covered, rows = np.zeros(net.n, bool), []
    for g in sinks.tolist():
        if not (skip and covered[g]) and refs[g][0] < demand:
            rows.append(~refs[g][1])
            covered |= rows[-1]
    return rows


@pytest.mark.parametrize("seed", range(40))
def test_failing_sets_match_per_sink_maxflow(seed):
    """One scan past every failing sink (the scaled packing's rounding sweep) returns
    each failing sink's minimum cut, skipping sinks an earlier cut holds; with fewer rows
    allowed, the first ones; without skipping (the restriction's cutting planes), every
    failing sink's; the same network then still answers the first failing sink like a
    fresh scan."""
    rng, net, caps, sinks = random_network(4000 + seed, forced=seed % 2 == 1)
    sinks = np.concatenate([sinks, rng.choice(sinks, 2)])
    refs = {g: reference(net, caps, g) for g in set(sinks.tolist())}
    values = sorted({f for f, _ in refs.values()})
    for demand in {0, 1, *values, *(f + 1 for f in values)}:
        want = expected_sets(net, refs, sinks, demand)
        got = net.failing_sets(caps, sinks, demand, net.n)
        assert got.shape == (len(want), net.n)
        for row, expected in zip(got, want):
            np.testing.assert_array_equal(row, expected)
        if len(want) > 1:
            np.testing.assert_array_equal(net.failing_sets(caps, sinks, demand, 1), want[:1])
        every = expected_sets(net, refs, sinks, demand, skip=False)   # the cutting planes'
        np.testing.assert_array_equal(
            net.failing_sets(caps, sinks, demand, sinks.size, skip=False).reshape(-1, net.n),
            np.array(every, bool).reshape(-1, net.n))
        check_rooted(net, caps, sinks, demand, refs)


def test_max_flow_matches_networkx():
    for seed in range(20):
        _, net, caps, sinks = random_network(3000 + seed)
        caps[net.t_arc0 + sinks[0]] = 1 << 40
        value, side = reference(net, caps, int(sinks[0]))
        assert net.max_flow(caps) == value
        np.testing.assert_array_equal(net.source_side(), side)
        assert net.max_flow(caps, limit=value // 2) == value // 2


@pytest.mark.parametrize("topo", [f(hpn(*shape)) for shape in [(1, 2, 4), (1, 4, 8)]
                                  for f in (lambda t: t, fail1, fail2)],
                         ids=lambda t: t.name)
def test_rooted_check_on_hpn_fabrics(topo):
    """Phase 1's test at ``x*`` (every GPU passes) and just above it (the failing GPU
    and its cut, with the degraded GPU first, in the middle and last)."""
    fab, _ = fabric_of(topo)
    p1 = optimal_rate(fab)
    n_gpu = fab.num_gpus
    net = fab.net
    for scale, extra in ((1, 0), (1000, 1)):
        caps = net.caps()
        caps[: net.m] = fab.cap * p1.den * scale
        caps[net.s_arc0 + fab.gpus] = p1.num * scale + extra
        demand = n_gpu * (p1.num * scale + extra)
        refs = {g: reference(net, caps, g) for g in fab.gpus.tolist()}
        for shift in (0, n_gpu // 2, n_gpu - 1):
            pos = check_rooted(net, caps, np.roll(fab.gpus, shift), demand, refs)
            assert (pos < 0) == (extra == 0)
        check_rooted(net, caps, fab.gpus[::-1].copy(), demand, refs)


@pytest.mark.parametrize("seed", range(6))
def test_scans_resumed_span_by_span_under_a_time_limit(seed, monkeypatch):
    """Under a time limit every scan runs a span of sinks per compiled call (here one)
    and checks the clock between calls; resumed from the flow the last call left, it must
    answer exactly as one whole scan (first failing sink and its cut, failing sets with
    and without skipping, min over sinks)."""
    monkeypatch.setattr(sweep_spans, "SWEEP_WORK", 1)     # one sink per span
    checks = []
    real_check = anytime.check
    monkeypatch.setattr(anytime, "check", lambda where: (checks.append(where), real_check(where)))
    rng, net, caps, sinks = random_network(5000 + seed, forced=seed % 2 == 1)
    sinks = np.concatenate([sinks, rng.choice(sinks, 3)])
    refs = {g: reference(net, caps, g) for g in set(sinks.tolist())}
    values = sorted({f for f, _ in refs.values()})

    def scans() -> bool:
        for demand in {0, 1, *values, *(f + 1 for f in values)}:
            check_rooted(net, caps, sinks, demand, refs)
            for skip in (True, False):
                want = expected_sets(net, refs, sinks, demand, skip=skip)
                got = net.failing_sets(caps, sinks, demand, sinks.size, skip=skip)
                np.testing.assert_array_equal(got.reshape(-1, net.n),
                                              np.array(want, bool).reshape(-1, net.n))
        lowest = min(f for f, _ in refs.values())
        for upper in (1 << 62, lowest + 1, max(lowest - 1, 0)):
            assert net.min_flow_over_sinks(caps, sinks, upper=upper) == min(upper, lowest)
        return True

    done, stopped = anytime.limited(1e6, scans)
    assert done and stopped is None
    assert any("rooted sweep" in w for w in checks)


def test_spans_shrink_to_the_cpu_a_span_may_take(monkeypatch):
    """Under a limit a scan's spans are :data:`sweep_spans.SWEEP_WORK` ``// arcs`` sinks at
    most, and fewer once a span took more than :data:`sweep_spans.SPAN_CPU_S` CPU seconds
    for as many (here any: the first scan is one span, the next one sink a span), the
    network keeping what it learned for its next scan; every span is preceded by a clock check, the first
    included.  The answers stay those of one whole scan."""
    monkeypatch.setattr(sweep_spans, "SPAN_CPU_S", 0.0)
    rng, net, caps, sinks = random_network(5003)
    sinks = np.concatenate([sinks, sinks, sinks])
    refs = {g: reference(net, caps, g) for g in set(sinks.tolist())}
    lowest = min(f for f, _ in refs.values())
    most = sweep_spans.SWEEP_WORK // net.num_arcs
    assert most > sinks.size                          # without shrinking: one span
    checks = []
    real_check = anytime.check
    monkeypatch.setattr(anytime, "check", lambda where: (checks.append(where), real_check(where)))

    def scans() -> list[int]:
        counts = []
        for _ in range(2):
            before = len(checks)
            assert net.min_flow_over_sinks(caps, sinks) == lowest
            counts.append(len(checks) - before)
        return counts

    counts, stopped = anytime.limited(1e6, scans)
    assert stopped is None and counts == [1, sinks.size]
    assert net.min_flow_over_sinks(caps, sinks) == lowest      # no limit: one call
    assert len(checks) == 1 + sinks.size
