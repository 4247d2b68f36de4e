"""Switch balancing before edge splitting (ForestColl, paper §4.3): reductions of tree
units that leave every switch with as many in- as out-units, planned for all switches
at once.

Splitting off at a switch needs its in-units equal to its out-units; one-directional
degradations break that.  The reductions ``r`` (``0 <= r <= units``) that balance every
switch are a flow: with all GPUs merged into one node ``G`` (their balance is free) and
each link ``a -> b`` at a switch turned into an arc ``b -> a``, a switch with ``e`` more
in- than out-units sends ``e``, one with more out-units receives the difference, and
``G`` the total.  One max-flow plans the reductions of every switch (Dinic's shortest
augmenting paths: an excess goes to a GPU link or to a neighbour short of units, not
round a cycle of switches; flow cycles are cancelled, a cycle's reductions leave every
switch as it was).  Each link's capacity in the plan is an upper bound on its *slack*,
how far it can be reduced keeping the rooted cut condition for ``k`` trees per root
(a GPU's in-units minus ``k (N-1)`` to start with).  A planned link whose slack is not
yet known is probed (:func:`.splitting.cut_slack`, one scan over the GPUs as sinks); a
probe that finds no slack closes every link into the tight set it finds.  When every
planned link is within its proven slack, the plan's reductions together are checked
by one rooted test and taken (one by one, each probed, if the test fails), and the rest
is planned again.  When open links cannot carry the rest, it is cut where a plan over
every link puts it, and the answer is ``False`` (the caller lowers the tree bandwidth).

The greedy this replaces balanced one switch at a time and passed each excess to a
neighbour switch, which passed it on: on leaf-spine 4x2x8 (2:1, one link degraded one
way, ``K = 10``) 17 units of imbalance went back and forth between leaves and spines in
2,230 passes (4,888 slack scans, 0.7 s CPU), and 2,324 units were cut.
"""

from __future__ import annotations

import numpy as np

from mccl_opt import anytime
from mccl_opt.errors import SolveError
from ..maxflow import FlowNetwork
from .splitting import SplitGraph, cut_slack, keeps_cuts

__all__ = ["balance_switches", "imbalance", "BALANCING"]

#: where a time limit stops switch balancing: it checks the clock before every plan, slack
#: probe and reduction (49-55 ms CPU in one piece at 512-1024 GPUs before, no check inside;
#: docs/allgather.md, "The leftovers past the deadline")
BALANCING = "switch balancing"


def imbalance(g: SplitGraph) -> np.ndarray:
    """In- minus out-units of every node (only switches must be 0)."""
    net = np.zeros(g.n, np.int64)
    for (a, b), u in g.units.items():
        net[b] += u
        net[a] -= u
    return net


def balance_switches(g: SplitGraph) -> bool:
    """Make every switch's in-units equal its out-units (module doc).

    ``True``: every reduction kept the rooted cut condition for ``k`` trees per root
    (proven by the slack oracle and the rooted test); ``False``: some imbalance had to
    be cut without it (the caller must lower the tree bandwidth).  Either way every
    switch ends balanced."""
    if not imbalance(g)[g.is_switch].any():
        return True
    return _Balancer(g).run()


class _Balancer:
    """The links at switches (``keys``), their slack bounds, the reduction plan's flow
    network and the cut network, each built once."""

    def __init__(self, g: SplitGraph) -> None:
        self.g = g
        self.keys = [key for key in sorted(g.units) if g.is_switch[key[0]] or g.is_switch[key[1]]]
        self.tail = np.array([a for a, _ in self.keys], np.int64)
        self.head = np.array([b for _, b in self.keys], np.int64)
        self.cuts, all_keys, self.caps = g.network()
        where = {key: i for i, key in enumerate(all_keys)}
        self.at = np.array([where[key] for key in self.keys], np.int64)
        m = len(self.keys)
        # slack bounds: `upper` holds at any time, `lower` only until the next reduction
        self.upper = np.minimum(self.caps[self.at], self._single_node_slack())
        self.lower = np.zeros(m, np.int64)
        switches = int(g.is_switch.sum())
        node = np.full(g.n, switches, np.int64)            # every GPU: node G
        node[g.is_switch] = np.arange(switches)
        self.plan = FlowNetwork(switches + 1, node[self.head], node[self.tail])

    def _single_node_slack(self) -> np.ndarray:
        """Each link's slack on the cuts around one GPU: ``{g}`` for a link into ``g``
        (its in-units minus ``k (N-1)``), all but ``g`` for a link out of it."""
        g, m = self.g, self.cuts.m
        units = self.caps[:m]
        ins = np.bincount(self.cuts.arc_head[:m], units, g.n).astype(np.int64)
        outs = np.bincount(self.cuts.arc_tail[:m], units, g.n).astype(np.int64)
        big = np.iinfo(np.int64).max
        into = np.where(g.is_switch[self.head], big,
                        ins[self.head] - g.k * (g.gpus.size - 1))
        out_of = np.where(g.is_switch[self.tail], big, outs[self.tail] - g.k)
        return np.maximum(np.minimum(into, out_of), 0)

    def run(self) -> bool:
        while True:
            anytime.check(BALANCING)
            flow = self._flow(self.upper)
            if flow is None:
                return True
            if not flow.any():
                self._cut_rest()
                return False
            if self._probe(flow):
                self._take(flow)

    def _flow(self, bounds: np.ndarray) -> np.ndarray | None:
        """Planned reductions per link under ``bounds`` (one max-flow, cycles
        cancelled); ``None`` when every switch is balanced."""
        g, m = self.g, len(self.keys)
        excess = imbalance(g)[g.is_switch]
        if not excess.any():
            return None
        net, sw = self.plan, excess.size
        caps = net.caps()
        caps[:m] = np.minimum(bounds, self.caps[self.at])
        total = int(excess.sum())
        caps[net.s_arc0: net.s_arc0 + sw + 1] = np.r_[np.maximum(excess, 0), max(0, -total)]
        caps[net.t_arc0: net.t_arc0 + sw + 1] = np.r_[np.maximum(-excess, 0), max(0, total)]
        net.max_flow(caps)
        return _acyclic(net.arc_tail[:m], net.arc_head[:m], net.flows(m))

    def _probe(self, flow: np.ndarray) -> bool:
        """Prove the slack of every planned link not yet proven (up to its upper bound);
        ``True`` if the plan is within every link's slack."""
        for i in np.flatnonzero(flow > self.lower).tolist():
            if flow[i] > self.upper[i]:
                continue                        # closed by an earlier probe's tight set
            anytime.check(BALANCING)
            want = int(self.upper[i])
            s = cut_slack(self.g, self.cuts, self.caps, [int(self.tail[i])],
                          [int(self.head[i])], want)
            if s <= 0:                          # every link into that tight set is closed
                inside = self.cuts.sink_side()
                into = ~inside[self.tail] & inside[self.head]
                self.upper[into] = self.lower[into] = 0
            self.upper[i] = self.lower[i] = min(max(s, 0), want)
        return bool((flow <= self.upper).all())

    def _take(self, flow: np.ndarray) -> None:
        """Reduce the planned links: all at once if the rooted test passes, else one by
        one, each as far as its slack allows now."""
        used = np.flatnonzero(flow)
        trial = self.caps.copy()
        trial[self.at[used]] -= flow[used]
        together = keeps_cuts(self.g, self.cuts, trial)
        for i in used.tolist():
            anytime.check(BALANCING)
            want = int(flow[i])
            amount = want if together else max(0, min(want, cut_slack(
                self.g, self.cuts, self.caps, [int(self.tail[i])], [int(self.head[i])], want)))
            self._reduce(i, amount)
            if amount < want:
                self.upper[i] = 0
        self.lower[:] = 0

    def _reduce(self, i: int, amount: int) -> None:
        if amount:
            self.g.reduce(self.keys[i], amount)
            self.caps[self.at[i]] -= amount
            self.upper[i] = max(0, self.upper[i] - amount)

    def _cut_rest(self) -> None:
        """Cut the imbalance open links cannot carry where a plan over every link puts it."""
        flow = self._flow(self.caps[self.at])
        if flow is None or not flow.any():
            raise SolveError("internal: a switch imbalance with no link to reduce; please report")
        for i in np.flatnonzero(flow).tolist():
            self._reduce(i, int(flow[i]))
        if imbalance(self.g)[self.g.is_switch].any():
            raise SolveError("internal: switch balancing left a switch unbalanced; please report")


def _acyclic(tail: np.ndarray, head: np.ndarray, flow: np.ndarray) -> np.ndarray:
    """``flow`` with every cycle cancelled (same excess at every node, less on arcs)."""
    flow = flow.copy()
    while (cycle := _cycle(tail, head, flow)) is not None:
        flow[cycle] -= flow[cycle].min()
    return flow


def _cycle(tail: np.ndarray, head: np.ndarray, flow: np.ndarray) -> list[int] | None:
    """The arcs of one directed cycle of arcs with flow, or ``None`` (depth-first)."""
    out: dict[int, list[int]] = {}
    for i in np.flatnonzero(flow).tolist():
        out.setdefault(int(tail[i]), []).append(i)
    done: set[int] = set()
    for root in out:
        if root in done:
            continue
        path: list[int] = []                # arcs from root to the walk's end
        depth = {root: 0}                   # node on the walk -> arcs before it
        stack = [iter(out[root])]
        while stack:
            i = next(stack[-1], None)
            if i is None:                   # every arc out of the walk's end explored
                stack.pop()
                v = int(head[path.pop()]) if path else root
                done.add(v)
                del depth[v]
                continue
            w = int(head[i])
            if w in depth:
                return path[depth[w]:] + [i]
            if w not in done:
                path.append(i)
                depth[w] = len(path)
                stack.append(iter(out.get(w, ())))
    return None
