"""Tight sets split an exact packing into smaller ones (paper §4.3; Lovász's proof of
Edmonds' branching theorem).

With ``roots[r]`` trees rooted at each GPU ``r`` (``R`` in all), a GPU set ``S`` is
*tight* when ``units(δ⁻(S)) = roots(V \\ S)``: every tree rooted outside ``S`` enters it by
exactly one unit and uses every unit into it, a tree rooted inside never enters it.  So
for disjoint tight sets ``S_1..S_m`` every packing is, and every pair of the following
packings gives, a packing of the whole graph:

* the *outer* packing: each ``S_i`` contracted to one node with ``roots(S_i)`` roots,
  parallel links merged (their units summed);
* one *inner* packing per ``S_i``: ``G[S_i]`` plus a node ``O`` holding the ``R -
  roots(S_i)`` trees rooted outside, with a link ``O -> v`` of the units that enter ``S_i``
  at ``v``.  A tree of ``O`` takes exactly one of them (they sum to its trees), so which
  link an outer tree enters ``S_i`` by (all are used, so each head ``v`` is entered
  exactly as often as ``O -> v`` has units) is matched to an inner tree entering at ``v``.

Where a fabric's groups are joined by few links (a dragonfly's global cables, a
leaf-spine's narrow NICs per host), a tree's *entry* into each group is then decided by
the small outer packing, where growing one tree of the whole graph at a time searched
for it with one max-flow per tree edge (dragonfly 4x4x1x8: 128 GPUs, one tree per root,
6 500 max-flows of ~110 µs).  The minimal tight set holding ``v`` is the set of GPUs that
reach ``v`` in the residual network of a maximum flow ``s -> v`` (``s -> r``:
``roots[r]``), tight sets being closed under intersection (the slack is submodular).
On a tight graph (every node's in-units are the roots outside it) each node is its own
minimal tight set; :func:`maximal_tight_sets` then takes the largest ones instead.

Three places test tightness.  A node alone (:func:`tight_alone`) is the one definition
shared with :func:`..pack_steps.tight` (every rank tight alone, ``k`` roots each: the
greedy portfolio must use every unit).  The guarded split's
:func:`~..removal.cut_guard.zero_slack_sets` are the same sets (``k`` roots per GPU, none
per switch) of a different graph, found differently, so they stay apart: the split graph
of Phase 2, whose switches carry no roots and may lie on either side of a set; one rooted
sweep for all sinks (at scaled capacities), not one max-flow per node; per failing sink
the set with its GPUs those of the smallest tight set holding it but every switch any
such set may hold (the minimum cut's sink side farthest from ``s``), overlapping sets
kept; here, disjoint proper sets of a logical graph (or an inner problem with its ``O``
node) with any roots per node, the smallest or largest per node.  Computing the guard's
sets here would hand it other sets (fewer switches), and its pairings would change.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from ..maxflow import INF, FlowNetwork
from .trees import TreeClass

__all__ = ["Problem", "Decomposition", "tight_alone", "proper_tight_sets", "minimal_tight_sets",
           "maximal_tight_sets", "decompose", "CONTRACT_MIN_GPUS"]

#: :attr:`Problem.links` of an inner problem's ``O -> v`` links and of its ``r -> O``
#: links (``roots[r]`` units: a tree rooted in the set reaches ``O`` from its root, so
#: that every tree spans every node; a packing leaves ``O``'s links to ``O``'s trees,
#: which need every unit of them)
ENTRY, TO_O = -1, -2

#: graphs of fewer GPUs are packed whole (a proper tight set needs 2 <= |S| <= n - 2)
CONTRACT_MIN_GPUS = 6


@dataclass(frozen=True)
class Problem:
    """A packing to find: ``roots[r]`` trees rooted at each node of a graph of ``n``
    nodes; ``links[i]``: the parent problem's link that link ``i`` stands for
    (:data:`ENTRY`, :data:`TO_O`: an inner problem's links at ``O``)."""

    n: int
    tail: np.ndarray
    head: np.ndarray
    units: np.ndarray
    roots: np.ndarray
    links: np.ndarray


@njit(cache=True)
def _reaching(n_tot, start, arcs, head, res, t, mark, queue):
    """``mark[x]``: ``x`` reaches ``t`` in the residual network (the sink side of the
    minimum cut nearest to ``t``)."""
    for i in range(n_tot):
        mark[i] = False
    mark[t] = True
    queue[0] = t
    qh, qt = 0, 1
    while qh < qt:
        y = queue[qh]
        qh += 1
        for p in range(start[y], start[y + 1]):
            a = arcs[p]
            if res[a ^ 1] > 0:               # the reverse of ``y -> x`` is ``x -> y``
                x = head[a]
                if not mark[x]:
                    mark[x] = True
                    queue[qt] = x
                    qt += 1


def tight_alone(n: int, head: np.ndarray, units: np.ndarray, roots: np.ndarray) -> np.ndarray:
    """Per node, whether it is its own tight set: its in-units are exactly the roots
    outside it, ``units(δ⁻(v)) = roots(V \\ {v})``.  Every node of a tight graph is
    (:func:`..pack_steps.tight`: ``k`` roots per rank, no spare unit anywhere)."""
    return np.bincount(head, weights=units, minlength=n) == roots.sum() - roots


def proper_tight_sets(p: Problem, checks: np.ndarray) -> list[np.ndarray] | None:
    """Disjoint proper tight sets of ``p`` to split its packing along: the minimal ones
    (:func:`minimal_tight_sets`); where there are none but a node is its own minimal tight
    set (its in-units are the roots outside it), the largest (:func:`maximal_tight_sets`:
    a proper tight set all of whose nodes are tight alone has no proper minimal one).
    ``None`` when the graph admits no packing."""
    sets = minimal_tight_sets(p, checks)
    alone = tight_alone(p.n, p.head, p.units, p.roots)
    return maximal_tight_sets(p, checks) if sets == [] and alone.any() else sets


def minimal_tight_sets(p: Problem, checks: np.ndarray) -> list[np.ndarray] | None:
    """Disjoint proper tight sets (``2 <= |S| <= n - 2``), the largest minimal ones first
    (module doc); ``None`` when a sink's flow is below ``R``: the graph admits no
    packing.  One max-flow per node outside the sets found so far (a node's minimal tight
    set lies inside any tight set holding it): at most ``n``, counted in ``checks[0]``.
    (The guarded split's :func:`~..removal.cut_guard.zero_slack_sets`: module doc.)"""
    net, caps, total = _rooted_network(p)
    mark = np.zeros(p.n + 2, np.bool_)
    queue = np.zeros(p.n + 2, np.int64)
    found: dict[bytes, np.ndarray] = {}
    # a node whose in-units are the roots outside it is its own minimal tight set
    covered = tight_alone(p.n, p.head, p.units, p.roots)
    for v in range(p.n):
        if covered[v]:                      # inside a tight set found: its own is inside it
            continue
        caps[net.t_arc0 + v] = INF
        checks[0] += 1
        flow = net.max_flow(caps, total)
        caps[net.t_arc0 + v] = 0
        if flow < total:
            return None
        _reaching(p.n + 2, net._start, net._arcs, net._head, net._res, p.n + 1, mark, queue)
        members = np.flatnonzero(mark[: p.n])
        if 2 <= members.size <= p.n - 2:
            found.setdefault(members.tobytes(), members)
            covered[members] = True
    return _disjoint(p.n, found)


def maximal_tight_sets(p: Problem, checks: np.ndarray) -> list[np.ndarray] | None:
    """Disjoint proper tight sets, the largest first, each the largest tight set holding a
    node ``v`` and not the node ``x`` half the nodes on: the sink side of a maximum flow
    ``s -> v`` with ``s -> x`` unbounded, taken farthest from ``s`` (tight sets holding
    ``v`` are closed under union while they miss ``x``; a flow of ``R`` then cuts exactly
    at the tight sets).  Where every node is its own minimal tight set (a tight graph:
    the exact split of leaf-spine 8x2x8 with 4 spines, whose halves, leaves and hosts are
    tight) :func:`minimal_tight_sets` finds nothing proper, this does.  One max-flow per
    node outside the sets found so far, counted in ``checks[0]``; ``None`` when a flow is
    below ``R`` (the graph admits no packing).  A set is kept only if its slack,
    computed, is 0.  (:func:`~..removal.cut_guard.zero_slack_sets`: not these; module doc.)"""
    net, caps, total = _rooted_network(p)
    found: dict[bytes, np.ndarray] = {}
    covered = np.zeros(p.n, np.bool_)
    for v in range(p.n):
        if covered[v]:
            continue
        x = (v + p.n // 2) % p.n
        caps[net.s_arc0 + x], caps[net.t_arc0 + v] = INF, INF
        checks[0] += 1
        flow = net.max_flow(caps, total)
        caps[net.s_arc0 + x], caps[net.t_arc0 + v] = p.roots[x], 0
        if flow < total:
            return None
        side = ~net.source_side()
        members = np.flatnonzero(side)
        into = int(p.units[side[p.head] & ~side[p.tail]].sum())
        if 2 <= members.size <= p.n - 2 and into == total - int(p.roots[side].sum()):
            found.setdefault(members.tobytes(), members)
            covered[members] = True
    return _disjoint(p.n, found)


def _rooted_network(p: Problem) -> tuple[FlowNetwork, np.ndarray, int]:
    """``p``'s flow network with every node's roots on its source arc, its capacities
    and the roots in all (``R``)."""
    net = FlowNetwork(p.n, p.tail, p.head)
    caps = net.caps()
    caps[: net.m] = p.units
    caps[net.s_arc0: net.s_arc0 + p.n] = p.roots
    return net, caps, int(p.roots.sum())


def _disjoint(n: int, found: dict[bytes, np.ndarray]) -> list[np.ndarray]:
    """The largest of ``found`` first, each kept if it meets none kept before."""
    taken = np.zeros(n, np.bool_)
    chosen = []
    for members in sorted(found.values(), key=lambda s: (-s.size, int(s[0]))):
        if not taken[members].any():
            taken[members] = True
            chosen.append(members)
    return chosen


@dataclass(frozen=True)
class Decomposition:
    """The outer problem (sets contracted, parallel links merged: ``members[i]`` are the
    problem's links merged into outer link ``i``) and one inner problem per set (its
    nodes ``sets[i]`` in order, then ``O``); ``single[x]``: the node of an outer node
    that is no set (-1 for a set)."""

    problem: Problem
    sets: list[np.ndarray]
    single: np.ndarray
    outer: Problem
    members: list[np.ndarray]
    inners: list[Problem]

    def combine(self, outer: list[TreeClass], inners: list[list[TreeClass]]
                ) -> list[TreeClass]:
        """The problem's classes from the outer and inner ones (module doc): each outer
        class is cut into pieces wherever the link it enters a node or set by, or the inner
        class it continues with, runs out of units or copies."""
        p = self.problem
        left = p.units.astype(np.int64).copy()
        cursor = [0] * len(self.members)
        pools = [_pools(inner, nodes, classes)
                 for inner, nodes, classes in zip(self.inners, self.sets, inners)]
        pieces = [(c, c.mult, np.full(p.n, -1, np.int64), -1) for c in outer]
        for x in range(self.outer.n):
            out = []
            for c, mult, row, root in pieces:
                while mult > 0:
                    if c.root == x:
                        if self.single[x] >= 0:
                            q, root = mult, int(self.single[x])
                        else:
                            q, root = self._enter(x, pools[x], -1, mult, row)
                    else:
                        link = int(c.parent_arc[x])
                        a = int(self.members[link][cursor[link]])
                        q = min(mult, int(left[a]))
                        if self.single[x] >= 0:
                            row[self.single[x]] = a
                        else:
                            q = self._enter(x, pools[x], a, q, row)[0]
                        left[a] -= q
                        if left[a] == 0:
                            cursor[link] += 1
                    mult -= q
                    out.append((c, q, row.copy(), root))
            pieces = out
        return [TreeClass(root, q, row) for _, q, row, root in pieces]

    def _enter(self, s: int, pool: dict[int, list[list]], a: int, want: int,
               row: np.ndarray) -> tuple[int, int]:
        """Continue a piece into set ``s`` with the next inner class of ``pool``: entering by
        link ``a`` (a class of ``O`` entering at ``a``'s head), or rooted in the set when
        ``a < 0``; how many copies (at most ``want``) and the real root (-1 when
        entering); ``row`` filled over the set."""
        inner, nodes = self.inners[s], self.sets[s]
        queue = pool[-1 if a < 0 else int(self.problem.head[a])]
        c, avail = queue[0]
        q = min(want, avail)
        queue[0][1] -= q
        if queue[0][1] == 0:
            queue.pop(0)
        arcs = c.parent_arc[: inner.n - 1]
        links = inner.links[np.maximum(arcs, 0)]
        row[nodes] = np.where(arcs < 0, -1, np.where(links == ENTRY, a, links))
        return q, (-1 if a >= 0 else int(nodes[c.root]))


def _pools(inner: Problem, nodes: np.ndarray, classes: list[TreeClass]
           ) -> dict[int, list[list]]:
    """An inner problem's classes as queues of ``[class, copies left]``: those rooted in
    the set under -1, those of ``O`` under the node they enter the set at."""
    o = inner.n - 1
    pool: dict[int, list[list]] = {}
    for c in classes:
        key = -1
        if c.root == o:
            arcs = c.parent_arc[:o]
            entry = np.flatnonzero((arcs >= 0) & (inner.links[np.maximum(arcs, 0)] == ENTRY))
            key = int(nodes[entry[0]])
        pool.setdefault(key, []).append([c, c.mult])
    return pool


def decompose(p: Problem, sets: list[np.ndarray]) -> Decomposition:
    """The outer and inner problems of disjoint tight ``sets`` of ``p`` (module doc)."""
    node = np.full(p.n, -1, np.int64)
    for i, members in enumerate(sets):
        node[members] = i
    others = np.flatnonzero(node < 0)
    node[others] = len(sets) + np.arange(others.size)
    single = np.concatenate([np.full(len(sets), -1, np.int64), others])
    live = np.flatnonzero(p.units > 0)
    x, y = node[p.tail[live]], node[p.head[live]]
    cross = x != y
    live, x, y = live[cross], x[cross], y[cross]
    n_out = single.size
    keys, first, inverse = np.unique(x * n_out + y, return_index=True, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    bounds = np.cumsum(np.bincount(inverse, minlength=keys.size))
    members = np.split(live[order], bounds[:-1])
    outer = Problem(n_out, x[first], y[first],
                    np.bincount(inverse, weights=p.units[live], minlength=keys.size).astype(np.int64),
                    np.bincount(node, weights=p.roots, minlength=n_out).astype(np.int64),
                    np.arange(keys.size, dtype=np.int64))
    total = int(p.roots.sum())
    inners = []
    for i, nodes in enumerate(sets):
        local = np.full(p.n, -1, np.int64)
        local[nodes] = np.arange(nodes.size)
        inside = node[p.head] == i
        own = np.flatnonzero(inside & (node[p.tail] == i) & (p.units > 0))
        entering = np.flatnonzero(inside & (node[p.tail] != i) & (p.units > 0))
        e = np.bincount(local[p.head[entering]], weights=p.units[entering],
                        minlength=nodes.size).astype(np.int64)
        heads, rooted = np.flatnonzero(e), np.flatnonzero(p.roots[nodes])
        o = nodes.size
        inners.append(Problem(
            o + 1, np.concatenate([local[p.tail[own]], np.full(heads.size, o), rooted]),
            np.concatenate([local[p.head[own]], heads, np.full(rooted.size, o)]),
            np.concatenate([p.units[own], e[heads], p.roots[nodes][rooted]]).astype(np.int64),
            np.concatenate([p.roots[nodes], [total - int(p.roots[nodes].sum())]]).astype(np.int64),
            np.concatenate([own, np.full(heads.size, ENTRY), np.full(rooted.size, TO_O)])))
    return Decomposition(p, sets, single, outer, members, inners)
