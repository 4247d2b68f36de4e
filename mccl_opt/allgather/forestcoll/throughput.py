"""Phase 1: the exact optimal AllGather rate (ForestColl, paper §4.3).

Every node set ``S`` holding a GPU must receive the shards of the GPUs outside it, so
``x * |V_c \\ S| <= cap(δ⁻(S))``; ForestColl shows this bound is achieved, hence

    x* = min { cap(δ⁻(S)) / |V_c \\ S|  :  S ∩ V_c ≠ ∅,  V_c ⊄ S }.

Test of a rate ``x = P/M``: super-source ``s`` with an arc of capacity ``P`` to every
GPU, every link scaled by ``M``; ``x`` is feasible iff every GPU ``t`` admits a flow of
``N·P`` from ``s`` (the cut with sink side ``S`` costs ``P|V_c ∩ S| + M cap(δ⁻(S))``).

Search (Dinkelbach): start from the smallest single-GPU ingress ratio; for each GPU in
turn, while its max-flow is short, the minimum cut it exposes is a set with a smaller
ratio: jump to that ratio.  A GPU that passes at ``x`` passes at every smaller ``x``, so
one sweep over the GPUs (plus one call per jump) certifies the optimum exactly.

The same routine finds the best tree bandwidth for a fixed tree count ``k``
(:func:`best_tree_bandwidth`), where a link carries ``floor(cap/y)`` trees.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Sequence

import numpy as np

from mccl_opt.errors import InputError, SolveError, TopologyError
from .hosts import host_hubs, order_by_host
from .maxflow import FlowNetwork

__all__ = ["Fabric", "PhaseOneResult", "optimal_rate", "best_tree_bandwidth",
           "violated_tree_cut", "cut_tree_bandwidth", "cut_upper_bound"]


@dataclass
class Fabric:
    """Integer view of a fabric: ``n`` nodes, arcs ``tail -> head`` with capacities in
    quanta, ``gpus`` the node index of every rank.  ``net`` is the reusable network;
    ``near`` the sweeps' sink order once computed (:meth:`sweep`)."""

    n: int
    tail: np.ndarray
    head: np.ndarray
    cap: np.ndarray
    gpus: np.ndarray
    net: FlowNetwork
    near: np.ndarray | None = None

    @classmethod
    def build(cls, n: int, tail: np.ndarray, head: np.ndarray, cap: np.ndarray,
              gpus: np.ndarray) -> "Fabric":
        tail = np.asarray(tail, np.int64)
        head = np.asarray(head, np.int64)
        return cls(n, tail, head, np.asarray(cap, np.int64), np.asarray(gpus, np.int64),
                   FlowNetwork(n, tail, head))

    def with_caps(self, cap: np.ndarray) -> "Fabric":
        """The same links and GPUs at capacities ``cap``: the network and the sweep
        order (:meth:`sweep`) are shared, not rebuilt."""
        return Fabric(self.n, self.tail, self.head, np.asarray(cap, np.int64), self.gpus,
                      self.net, self.sweep())

    def sweep(self) -> np.ndarray:
        """The GPUs in the order the rooted sweeps take them as sinks (:func:`near_gpus`),
        computed once per fabric and shared by :meth:`with_caps`."""
        if self.near is None:
            self.near = near_gpus(self)
        return self.near

    @property
    def num_gpus(self) -> int:
        return int(self.gpus.size)

    def is_gpu(self) -> np.ndarray:
        mask = np.zeros(self.n, bool)
        mask[self.gpus] = True
        return mask

    def ingress(self) -> np.ndarray:
        """Capacity into every node (quanta)."""
        return np.bincount(self.head, weights=self.cap, minlength=self.n).astype(np.int64)

    def cut_arcs(self, sink_side: np.ndarray) -> np.ndarray:
        """Mask of the arcs entering ``sink_side`` (δ⁻(S)); one row per sink side if
        ``sink_side`` is 2-D."""
        return ~sink_side[..., self.tail] & sink_side[..., self.head]


def near_gpus(fab: "Fabric") -> np.ndarray:
    """``fab.gpus`` in an order that keeps neighbours together, whatever the listing: by
    the breadth-first position (from the first GPU, links taken both ways,
    :meth:`.maxflow.FlowNetwork.breadth_first`) of the node at the end of each GPU's
    widest out-link (its host's NVSwitch; ties to the earliest), then by their own: the
    rule of :func:`.removal.splitting.sink_order` for a split graph.  A rooted sweep moves
    its sink from GPU to GPU repairing one flow, cheap between neighbours: in a scrambled
    listing every move rerouted flow across the fabric (Phase 1 of dragonfly 4x4x1x8:
    5.6-6.4 ms a sweep in listing order, 1.2-1.4 ms in this one; docs/allgather_history.md
    "Sweeps in structural order").  What the sweeps certify (a rate, a passing test) does
    not depend on it."""
    if fab.gpus.size == 0:
        return fab.gpus
    seen = fab.net.breadth_first(int(fab.gpus[0]))
    return order_by_host(fab.gpus, host_hubs(fab.n, fab.tail, fab.head, fab.cap, seen), seen)


@dataclass
class PhaseOneResult:
    """``x* = num / den`` (in capacity quanta); ``cut`` the sink side of a tight set."""

    num: int
    den: int
    cut: np.ndarray
    maxflow_calls: int

    @property
    def rate(self) -> Fraction:
        return Fraction(self.num, self.den)


def _violated_cut(fab: Fabric, link_caps: np.ndarray, super_cap: int, demand: int,
                  order: np.ndarray) -> tuple[int, np.ndarray | None]:
    """Run the rooted test; return (position of failing sink or -1, its sink side)."""
    caps = fab.net.caps()
    caps[: fab.net.m] = link_caps
    caps[fab.net.s_arc0 + fab.gpus] = super_cap
    pos = fab.net.first_failing_sink(caps, order, demand)
    if pos < 0:
        return -1, None
    return pos, ~fab.net.source_side()


def cut_upper_bound(fab: Fabric, hint_cuts: list[np.ndarray] | None = None) -> PhaseOneResult:
    """The smallest ratio ``cap(δ⁻(S)) / |V_c \\ S|`` over the single-GPU sets ``{g}``
    (ingress), their complements (egress) and ``hint_cuts``: an upper bound on ``x*``
    without any max-flow (``maxflow_calls = 0``).  ForestColl-warm guesses ``x*`` with it
    after a failure and lets a completed packing certify the guess (§4.3)."""
    is_gpu = fab.is_gpu()
    n_gpu = fab.num_gpus
    ingress = fab.ingress()
    egress = np.bincount(fab.tail, weights=fab.cap, minlength=fab.n).astype(np.int64)
    best: tuple[int, int, np.ndarray] | None = None
    if n_gpu > 1:
        for caps, complement in ((ingress, False), (egress, True)):
            g = int(fab.gpus[np.argmin(caps[fab.gpus])])
            s = np.zeros(fab.n, bool)
            s[g] = True
            c = int(caps[g])
            m = 1 if complement else n_gpu - 1
            if best is None or c * best[1] < best[0] * m:
                best = (c, m, ~s if complement else s)
    for s in hint_cuts or []:
        m = int(np.count_nonzero(is_gpu & ~s))
        if m and (is_gpu & s).any():
            c = int(fab.cap[fab.cut_arcs(s)].sum())
            if best is None or c * best[1] < best[0] * m:
                best = (c, m, s)
    if best is None:
        raise TopologyError("a fabric needs at least two GPUs for an AllGather bound")
    g = math.gcd(best[0], best[1]) or 1        # Python ints: no int64 products downstream
    return PhaseOneResult(best[0] // g, best[1] // g, best[2], 0)


def optimal_rate(fab: Fabric, hint_cuts: list[np.ndarray] | None = None) -> PhaseOneResult:
    """Exact ``x*`` by Dinkelbach updates from violated min-cuts (see module doc).

    ``hint_cuts`` (sink-side masks, e.g. the previous schedule's bottleneck) only seed
    the starting ratio; the result does not depend on them.
    """
    n_gpu = fab.num_gpus
    if n_gpu < 2:
        raise TopologyError("a fabric needs at least two GPUs for an AllGather rate")
    is_gpu = fab.is_gpu()
    ingress = fab.ingress()
    g = int(fab.gpus[np.argmin(ingress[fab.gpus])])     # the first GPU of least ingress
    single = np.zeros(fab.n, bool)
    single[g] = True
    best = (int(ingress[g]), n_gpu - 1, single)
    for s in hint_cuts or []:
        m = int(np.count_nonzero(is_gpu & ~s))
        if m == 0 or not (is_gpu & s).any():
            continue
        c = int(fab.cap[fab.cut_arcs(s)].sum())
        if c * best[1] < best[0] * m:
            best = (c, m, s)
    num, den, cut = best
    calls = 0
    order = fab.sweep()
    start = 0
    while start < n_gpu:
        pos, sink_side = _violated_cut(fab, fab.cap * den, num, n_gpu * num, order[start:])
        calls += (n_gpu - start) if pos < 0 else pos + 1
        if pos < 0:
            break
        start += pos
        c = int(fab.cap[fab.cut_arcs(sink_side)].sum())
        m = int(np.count_nonzero(is_gpu & ~sink_side))
        if c * den >= num * m:          # a violated cut always lowers the ratio
            raise SolveError("Phase 1: a violated min-cut did not lower the rate (max-flow "
                             "and cut disagree); the capacities may overflow int64 quanta")
        num, den, cut = c, m, sink_side
    g = math.gcd(num, den) or 1                # Python ints: no int64 products downstream
    return PhaseOneResult(num // g, den // g, cut, calls)


def cut_tree_bandwidth(caps: np.ndarray | Sequence[int], need: int) -> Fraction:
    """Largest ``y`` with ``sum floor(caps/y) >= need`` (0 if impossible).

    ``y`` is a breakpoint ``c/j``; every breakpoint ``t = j/c`` of ``t = 1/y`` between
    the bounds ``need/C`` and ``(need+len)/C`` is tested in integers and the smallest
    feasible one kept (exact, no rational arithmetic in the loop).
    """
    caps = [int(c) for c in caps if c > 0]
    if need <= 0:
        raise InputError("need must be positive")
    total = sum(caps)
    if total < need:
        return Fraction(0)
    hi = need + len(caps)                 # floor(c t) >= c t - 1
    best_j, best_c = 0, 0
    for c in set(caps):
        for j in range(max(1, -(-need * c // total)), hi * c // total + 1):
            if best_c and j * best_c >= best_j * c:
                break                     # no smaller t left for this c
            if sum((x * j) // c for x in caps) >= need:
                best_j, best_c = j, c
                break
    return Fraction(best_c, best_j) if best_c else Fraction(0)


def violated_tree_cut(fab: Fabric, k: int, y: Fraction,
                      sinks: np.ndarray) -> tuple[int, np.ndarray | None]:
    """Rooted test of ``k`` trees per root when link ``a`` carries ``floor(cap_a / y)``
    trees: (position in ``sinks`` of the first GPU short of ``N k`` or -1, the sink side
    of its minimum cut)."""
    units = (fab.cap * y.denominator) // y.numerator
    return _violated_cut(fab, units, k, fab.num_gpus * k, sinks)


def best_tree_bandwidth(fab: Fabric, k: int, upper: Fraction, start: int = 0,
                        stop_below: Fraction = Fraction(0)
                        ) -> tuple[Fraction, int, int, list[np.ndarray]]:
    """Largest tree bandwidth ``y <= upper`` such that ``k`` trees per root fit when
    link ``a`` carries ``floor(cap_a / y)`` trees; returns ``(y, maxflow calls, GPUs
    passed, violated sink sides)``.

    Same sweep as :func:`optimal_rate`: a violated cut lowers ``y`` to the largest
    value that cut admits (:func:`cut_tree_bandwidth`).  The sweep may resume: the first
    ``start`` GPUs are known to pass at ``upper``.  It stops early, with ``y`` only an
    upper bound and fewer than ``N`` GPUs passed, once ``y < stop_below``; with all
    ``N`` passed ``y`` is exact.
    """
    n_gpu = fab.num_gpus
    is_gpu = fab.is_gpu()
    y = upper
    calls = 0
    cuts: list[np.ndarray] = []
    while y > 0 and y >= stop_below and start < n_gpu:
        pos, sink_side = violated_tree_cut(fab, k, y, fab.sweep()[start:])
        calls += (n_gpu - start) if pos < 0 else pos + 1
        if pos < 0:
            start = n_gpu
            break
        start += pos
        m = int(np.count_nonzero(is_gpu & ~sink_side))
        y_new = cut_tree_bandwidth(fab.cap[fab.cut_arcs(sink_side)], k * m)
        if y_new >= y:                  # a violated cut always lowers the bandwidth
            raise SolveError("chunk budget: a violated cut did not lower the tree bandwidth "
                             "(max-flow and cut disagree)")
        y = y_new
        cuts.append(sink_side)
    return y, calls, start, cuts
