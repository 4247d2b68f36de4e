"""Phase 2: switch removal by edge splitting (ForestColl, paper §4.3, Fig. 18).

Input: the fabric with every link's capacity in *tree units* (``floor(cap/y)``: how
many trees of bandwidth ``y`` it carries) and the tree count ``k`` per root.  Output:
logical GPU-to-GPU links, each with integer units and the physical switch path(s) it
rides on (:class:`LogicalGraph`).  Splitting ``α`` units off ``u -> w -> t`` turns them
into ``α`` units of a logical link ``u -> t``.

* **Balance** (:mod:`.balancing`, before splitting).  Splitting needs a switch's in- and
  out-units equal; reductions within the rooted cut condition's slack
  (:func:`cut_slack`) make them so.
* **Spread proposal** (default, cheap; in arrays, :mod:`.spread`): each switch is split
  like a transportation problem whose pair amounts start from the proportional share
  ``a_u b_t / (C - b_u)``, so every GPU gets logical links to all its switch peers
  (dense, shallow trees) instead of ForestColl's chain-like greedy result.
* **Exact greedy** (fallback, ForestColl): pairs ``(u, t)`` in order, each split by the
  largest amount the two families of dangerous cuts allow (``S ∋ w, u,t ∉ S`` and
  ``S ∌ w, u,t ∈ S``), each bounded by one max-flow per GPU.  By Mader's splitting
  theorem this completes on a balanced fabric and keeps every cut condition
  (:mod:`.exact_split`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import breadth_first_order

from mccl_opt.errors import SolveError
from .bundles import Bundles
from ..maxflow import INF, FlowNetwork
from ..hosts import host_hubs, order_by_host

__all__ = ["LogicalGraph", "SplitGraph", "cut_slack", "keeps_cuts", "switch_order", "sink_ranks",
           "hubs_of",
           "fewest_links_first", "gpu_links", "peel", "simple_path"]

Bundle = list  # list of [path (tuple of node indices), units]


@dataclass
class SplitGraph:
    """A mutable graph in tree units with the physical path bundle of every arc."""

    n: int
    is_switch: np.ndarray
    gpus: np.ndarray
    k: int
    units: dict[tuple[int, int], int] = field(default_factory=dict)
    bundles: dict[tuple[int, int], Bundle] = field(default_factory=dict)
    ins: dict[int, set[int]] = field(default_factory=dict)     # head -> tails with units
    outs: dict[int, set[int]] = field(default_factory=dict)    # tail -> heads with units
    near: np.ndarray | None = field(default=None, repr=False)  # :func:`sink_order`, cached
    hubs: np.ndarray | None = field(default=None, repr=False)  # :func:`hubs_of`, cached

    @classmethod
    def from_links(cls, n: int, tail: np.ndarray, head: np.ndarray, units: np.ndarray,
                   is_switch: np.ndarray, gpus: np.ndarray, k: int) -> "SplitGraph":
        g = cls(n, np.asarray(is_switch, bool), np.asarray(gpus), k)
        for a, b, u in zip(tail.tolist(), head.tolist(), units.tolist()):
            if u > 0:
                g._set((a, b), u)
                g.bundles[(a, b)] = [[(a, b), u]]
        return g

    def copy(self) -> "SplitGraph":
        return SplitGraph(self.n, self.is_switch, self.gpus, self.k, dict(self.units),
                          {key: [list(p) for p in b] for key, b in self.bundles.items()},
                          {w: set(x) for w, x in self.ins.items()},
                          {w: set(x) for w, x in self.outs.items()}, self.near, self.hubs)

    def in_arcs(self, w: int) -> list[tuple[int, int]]:
        return [(u, w) for u in sorted(self.ins.get(w, ()))]

    def out_arcs(self, w: int) -> list[tuple[int, int]]:
        return [(w, t) for t in sorted(self.outs.get(w, ()))]

    def network(self) -> tuple[FlowNetwork, list[tuple[int, int]], np.ndarray]:
        keys = sorted(self.units)
        tail = np.array([a for a, _ in keys], np.int64)
        head = np.array([b for _, b in keys], np.int64)
        caps = np.array([self.units[key] for key in keys], np.int64)
        return FlowNetwork(self.n, tail, head), keys, caps

    def reduce(self, key: tuple[int, int], amount: int) -> None:
        """Drop ``amount`` units of an arc (taken from the back of its bundle)."""
        peel(self.bundles[key], amount, from_back=True)
        self._set(key, self.units[key] - amount)

    def _set(self, key: tuple[int, int], value: int) -> None:
        if value > 0:
            if key not in self.units:
                self.ins.setdefault(key[1], set()).add(key[0])
                self.outs.setdefault(key[0], set()).add(key[1])
            self.units[key] = value
        elif key in self.units:
            del self.units[key]
            self.bundles.pop(key, None)
            self.ins[key[1]].discard(key[0])
            self.outs[key[0]].discard(key[1])

    def split(self, u: int, w: int, t: int, amount: int) -> None:
        """Replace ``amount`` units of ``u -> w`` and ``w -> t`` by ``u -> t``."""
        if amount <= 0:
            return
        first = peel(self.bundles[(u, w)], amount)
        second = peel(self.bundles[(w, t)], amount)
        self._set((u, w), self.units[(u, w)] - amount)
        self._set((w, t), self.units[(w, t)] - amount)
        if u == t:
            return
        pieces: Bundle = []
        i = j = 0
        ra, rb = first[0][1], second[0][1]
        while i < len(first):
            take = min(ra, rb)
            pieces.append([simple_path(first[i][0] + second[j][0][1:]), take])
            ra -= take
            rb -= take
            if ra == 0:
                i += 1
                ra = first[i][1] if i < len(first) else 0
            if rb == 0:
                j += 1
                rb = second[j][1] if j < len(second) else 0
        bundle = self.bundles.setdefault((u, t), [])
        for path, amt in pieces:
            for entry in bundle:
                if entry[0] == path:
                    entry[1] += amt
                    break
            else:
                bundle.append([path, amt])
        self._set((u, t), self.units.get((u, t), 0) + amount)


def peel(bundle: Bundle, amount: int, from_back: bool = False) -> Bundle:
    """Remove ``amount`` units from a bundle; return the removed pieces."""
    out: Bundle = []
    while amount > 0:
        entry = bundle[-1] if from_back else bundle[0]
        take = min(amount, entry[1])
        out.append([entry[0], take])
        entry[1] -= take
        amount -= take
        if entry[1] == 0:
            bundle.pop(-1 if from_back else 0)
    return out


def simple_path(path: tuple[int, ...]) -> tuple[int, ...]:
    """Cut cycles out of a walk (a loop only adds load)."""
    out: list[int] = []
    pos: dict[int, int] = {}
    for v in path:
        if v in pos:
            del out[pos[v] + 1:]
            pos = {x: i for i, x in enumerate(out)}
        else:
            pos[v] = len(out)
            out.append(v)
    return tuple(out)


# ---------------------------------------------------------------------- cut slack oracle
def sink_order(g: SplitGraph) -> np.ndarray:
    """The GPUs in an order that keeps neighbours together: by the breadth-first position
    (from the first GPU, over ``g``'s links in both directions) of the node at the end of
    their widest link (a host's NVSwitch), then by their own.  The rooted scans
    (:func:`cut_slack`, :func:`keeps_cuts`) move the sink from GPU to GPU repairing one
    flow (:meth:`.maxflow.FlowNetwork.min_flow_over_sinks`), which is cheap between
    neighbours: in rank order, a fabric listed with its ranks shuffled made every move
    reroute flow across the fabric (leaf-spine 8x2x8 with 4 spines, exact split: 5.6 s
    instead of 1.1 s).  Their results do not depend on the order.  Computed once per graph
    (copies share it: it is a speed hint, not a property of the units)."""
    if g.near is None:
        seen = _breadth_first(g)
        g.near = order_by_host(np.asarray(g.gpus, np.int64), hubs_of(g, seen), seen)
    return g.near


def _breadth_first(g: SplitGraph) -> np.ndarray:
    """``g``'s nodes breadth-first from its first GPU over its links both ways (none
    without GPUs)."""
    if g.gpus.size == 0:
        return np.zeros(0, np.int64)
    ends = np.array(list(g.units), np.int64).reshape(-1, 2)
    adj = csr_matrix((np.ones(len(ends)), (ends[:, 0], ends[:, 1])), shape=(g.n, g.n))
    return breadth_first_order(adj + adj.T, int(g.gpus[0]), directed=False,
                               return_predecessors=False)


def hubs_of(g: SplitGraph, seen: np.ndarray | None = None) -> np.ndarray:
    """Each node's host hub in ``g`` as first asked (:func:`.hosts.host_hubs`: the head of
    its widest link; ``g.n`` where none), ``seen`` its breadth-first order where the
    caller has it: the host grouping of :func:`sink_order` and of the exact split's host
    seeds.  Computed once per graph (copies share it: a grouping hint, not a property of
    the units)."""
    if g.hubs is None:
        ends = np.array(list(g.units), np.int64).reshape(-1, 2)
        g.hubs = host_hubs(g.n, ends[:, 0], ends[:, 1],
                           np.fromiter(g.units.values(), np.int64, len(g.units)),
                           _breadth_first(g) if seen is None else seen)
    return g.hubs


def sink_ranks(g: SplitGraph, rank_of: np.ndarray) -> np.ndarray:
    """:func:`sink_order` as ranks (``rank_of``: node index -> rank): the order of the
    rooted sweeps over a logical graph of ``g`` (:meth:`LogicalGraph.admits`, the
    few-trees packing's checks)."""
    return np.asarray(rank_of, np.int64)[sink_order(g)]


def cut_slack(g: SplitGraph, net: FlowNetwork, caps: np.ndarray, source: list[int],
              sink: list[int], want: int) -> int:
    """``min(want, slack)``, slack the min over node sets S holding a GPU, with
    ``source`` outside S and ``sink`` inside, of ``units(δ⁻(S)) - k |V_c \\ S|``
    (exact when positive; any value <= 0 means "nothing can be taken")."""
    full = net.caps()
    full[: net.m] = caps
    full[net.s_arc0 + g.gpus] = g.k
    for v in source:
        full[net.s_arc0 + v] = INF
    for v in sink:
        full[net.t_arc0 + v] = INF
    demand = g.k * g.gpus.size
    sinks = np.array([x for x in sink_order(g).tolist() if x not in source], np.int64)
    if sinks.size == 0:
        return int(INF)
    return net.min_flow_over_sinks(full, sinks, upper=demand + want, floor=demand) - demand


def keeps_cuts(g: SplitGraph, net: FlowNetwork, caps: np.ndarray) -> bool:
    """Whether units ``caps`` (on ``net``, :meth:`SplitGraph.network`) admit ``k`` trees
    per root: the rooted cut condition, one scan over the GPUs as sinks."""
    full = net.caps()
    full[: net.m] = caps
    full[net.s_arc0 + g.gpus] = g.k
    return net.first_failing_sink(full, sink_order(g), g.k * g.gpus.size) < 0


# ---------------------------------------------------------------------- splitting
def gpu_links(is_switch: np.ndarray, rank_of: np.ndarray, tail: np.ndarray, head: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The links ``tail -> head`` (node indices) left after switch removal in logical
    order: ``(order, tail ranks, head ranks)`` sorted by tail rank, then head rank;
    :class:`SolveError` if a link still touches a switch."""
    if (is_switch[tail] | is_switch[head]).any():
        raise SolveError("switch removal left links at a switch (its in- and out-units "
                         "could not be paired); the fabric's switches are unbalanced")
    tail, head = rank_of[tail].astype(np.int64), rank_of[head].astype(np.int64)
    order = np.argsort(tail * max(int(rank_of.max()) + 1, 1) + head)     # pairs are distinct
    return order, tail[order], head[order]


def switch_order(g: SplitGraph) -> list[int]:
    """Switches whose neighbours are switches first (aggregation before ToR before
    NVSwitch), ties by index: deterministic."""
    nsw = np.zeros(g.n, np.int64)
    for a, b in g.units:
        if g.is_switch[a] and g.is_switch[b]:
            nsw[a] += 1
            nsw[b] += 1
    sw = np.flatnonzero(g.is_switch)
    return sw[np.lexsort((sw, -nsw[sw]))].tolist()


def fewest_links_first(g: SplitGraph) -> list[int]:
    """Switches with the fewest links first (pass-through NICs, CPUs, then PCIe
    switches, NVSwitches, rails), ties by index: the guarded spread's second order
    (:mod:`.guarded_spread`), where a low-degree switch is split while its neighbours are
    still switches and the guard has whole links to exchange."""
    links = np.zeros(g.n, np.int64)
    for a, b in g.units:
        links[a] += 1
        links[b] += 1
    sw = np.flatnonzero(g.is_switch)
    return sw[np.lexsort((sw, links[sw]))].tolist()


@dataclass
class LogicalGraph:
    """GPU-only logical links: ``tail[i] -> head[i]`` (ranks) with ``units[i]`` and
    ``bundles[i]`` (physical node-index paths with units, :class:`.bundles.Bundles`;
    a list view ``[[path, units], ...]`` per link is converted)."""

    num_gpus: int
    tail: np.ndarray
    head: np.ndarray
    units: np.ndarray
    bundles: Bundles

    def __post_init__(self) -> None:
        if not isinstance(self.bundles, Bundles):
            self.bundles = Bundles.from_lists(self.bundles)

    @classmethod
    def from_split(cls, g: SplitGraph, rank_of: np.ndarray) -> "LogicalGraph":
        keys = list(g.units)
        ends = np.array(keys, np.int64).reshape(-1, 2)
        order, tail, head = gpu_links(g.is_switch, rank_of, ends[:, 0], ends[:, 1])
        units = np.fromiter(g.units.values(), np.int64, count=len(keys))
        return cls(int(g.gpus.size), tail, head, units[order],
                   [g.bundles[keys[i]] for i in order.tolist()])

    def admits(self, k: int, stride: int = 1, passed: int | None = None,
               order: np.ndarray | None = None) -> bool:
        """Rooted cut test: ``k`` trees per root fit (Edmonds' branching theorem).
        ``stride > 1`` tests every ``stride``-th rank as a sink only: ``False`` is then
        still a proof that none fit, ``True`` is not.  ``passed``: the stride of an
        earlier test of the same ``k`` that passed, whose sinks are not tested again.
        ``order``: the ranks in the order to sweep them (the split's :func:`sink_order`
        mapped to ranks), a speed hint only: the sweep repairs one flow from sink to
        sink, cheap between neighbours (fat-tree 4x2x2x8 scrambled, 128 sinks: 0.29 s
        in rank order, 0.065 s in this one); the sinks tested and the answer are the
        same."""
        net = FlowNetwork(self.num_gpus, self.tail, self.head)
        caps = net.caps()
        caps[: net.m] = self.units
        caps[net.s_arc0: net.s_arc0 + self.num_gpus] = k
        sinks = np.arange(self.num_gpus, dtype=np.int64) if order is None \
            else np.asarray(order, np.int64)
        sinks = sinks[sinks % stride == 0]
        if passed is not None:
            sinks = sinks[sinks % passed != 0]
        return net.first_failing_sink(caps, sinks, k * self.num_gpus) < 0
