"""Pricing: step-bounded shortest paths under arc prices (paper §4.2).

The paper prices over the time-expanded DAG: copies ``v_0..v_{m_s-1}`` of every node, an
arc into a switch stays in its step, any other arc advances one step.  Every time copy of
a link carries the same price (the link's capacity dual), so the shortest path from
``s_0`` to any copy of ``d`` equals the shortest path on the base graph among paths with
at most ``m_s - 1`` GPU-arrivals.  We compute it level by level (Bellman-Ford by steps):
level ``k`` holds the cheapest cost of reaching each node with at most ``k`` steps.  A
level starts from the previous one, relaxes the step arcs (into GPUs) from level ``k-1``
and then closes over the instantaneous arcs (into switches).  When a level changes no
label, no later level can: we stop.  This is exact and costs a few levels instead of
``m_s``; the DAG's topological order is the level order.

Ties: a label only changes on a strict improvement, so among equal-cost paths the one
with the fewest steps (the earliest level) wins, and among those the first arc in arc
order -- deterministic.  With non-negative prices the predecessor structure is a tree and
the extracted paths are simple.

The kernel (:mod:`._kernels`, numba ``@njit(cache=True)``) is imported and compiled on
first use.
"""

from __future__ import annotations

from dataclasses import dataclass
import numpy as np

__all__ = ["PricingGraph", "PricedColumns", "price_paths", "price_sources"]


@dataclass(frozen=True)
class PricingGraph:
    """Base-graph arrays the kernel needs (int64/bool numpy arrays)."""

    n_nodes: int
    tail: np.ndarray
    head: np.ndarray
    step_arcs: np.ndarray      # arcs into a GPU (advance one step), in arc order
    switch_arcs: np.ndarray    # arcs into a switch (stay in the step), in arc order
    is_switch: np.ndarray
    gpu_nodes: np.ndarray      # node of rank r

    @classmethod
    def from_arrays(cls, n_nodes: int, tail: np.ndarray, head: np.ndarray, is_switch: np.ndarray,
                    gpu_nodes: np.ndarray) -> "PricingGraph":
        tail = np.ascontiguousarray(tail, dtype=np.int64)
        head = np.ascontiguousarray(head, dtype=np.int64)
        is_switch = np.ascontiguousarray(is_switch, dtype=np.bool_)
        into_switch = is_switch[head]
        return cls(int(n_nodes), tail, head, np.flatnonzero(~into_switch).astype(np.int64),
                   np.flatnonzero(into_switch).astype(np.int64), is_switch,
                   np.ascontiguousarray(gpu_nodes, dtype=np.int64))

    @property
    def num_gpus(self) -> int:
        return int(self.gpu_nodes.size)


@dataclass(frozen=True)
class PricedColumns:
    """Output of one pricing pass.

    ``shortest[s, d]``: cheapest path cost from rank ``s`` to rank ``d`` (0 on the
    diagonal).  Improving paths: pair ``(src[j], dst[j])`` with arcs
    ``arcs[start[j]:start[j+1]]`` and cost ``cost[j]``.
    """

    shortest: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    cost: np.ndarray
    start: np.ndarray
    arcs: np.ndarray

    @property
    def count(self) -> int:
        return int(self.src.size)


#: The zero-price condensation (:func:`condensed_shortest`) is tried while the
#: zero-price arcs leave at most this many strongly connected components.
CONDENSE_MAX_COMPONENTS = 256


def condensed_shortest(graph: PricingGraph, price: np.ndarray) -> np.ndarray | None:
    """Every GPU pair's shortest path cost under ``price >= 0`` with no step bound, from
    the strongly connected components of the zero-price arcs: inside one component
    every node reaches every other at cost 0, so the costs are the shortest paths
    between components (Floyd-Warshall over the components, each link between two
    components an edge).  Exact up to the order of the float additions.  ``None``
    when there are more than :data:`CONDENSE_MAX_COMPONENTS` components (prices on
    many links: the kernel is as fast)."""
    from ..graph_components import strong_components

    zero = price == 0.0
    count, label = strong_components(graph.n_nodes, graph.tail[zero], graph.head[zero])
    if count > CONDENSE_MAX_COMPONENTS:
        return None
    dist = np.full((count, count), np.inf)
    np.fill_diagonal(dist, 0.0)
    lt, lh = label[graph.tail], label[graph.head]
    cross = lt != lh
    np.minimum.at(dist, (lt[cross], lh[cross]), price[cross])
    for k in range(count):
        np.minimum(dist, dist[:, k, None] + dist[None, k, :], out=dist)
    gl = label[graph.gpu_nodes]
    return dist[gl[:, None], gl[None, :]]


def price_paths(graph: PricingGraph, price: np.ndarray, threshold: np.ndarray,
                max_steps: int, want: np.ndarray | None = None) -> PricedColumns:
    """Shortest paths with at most ``max_steps`` steps from every GPU to every GPU
    under non-negative arc ``price``; returns every pair's shortest cost and, for the
    pairs with ``want[s, d]`` whose cost is strictly below ``threshold[s, d]``, the path.

    Without a step bound and with prices on few links, every pair's cost comes from
    :func:`condensed_shortest`, and the kernel runs only from the sources with a wanted
    pair that may price out (cost below its threshold up to a relative 1e-9, far above
    the float error of either sum): it returns the same paths as a run from every
    source, and at 1024 GPUs most passes need a few sources or none.
    """
    g = graph.num_gpus
    price = np.ascontiguousarray(np.maximum(price, 0.0), dtype=np.float64)
    threshold = np.ascontiguousarray(threshold, dtype=np.float64)
    if want is None:
        want = np.ones((g, g), dtype=np.bool_)
    levels = int(min(max_steps, graph.n_nodes - 1))
    shortest = condensed_shortest(graph, price) if levels == graph.n_nodes - 1 else None
    if shortest is None:
        sources = np.arange(g, dtype=np.int64)
    else:
        maybe = want & (shortest < threshold * (1 + 1e-9))     # costs are >= 0
        sources = np.flatnonzero(maybe.any(axis=1)).astype(np.int64)
    from ._kernels import price_all

    out = price_all(graph.n_nodes, graph.tail, graph.head, price, graph.step_arcs,
                    graph.switch_arcs, graph.is_switch, graph.gpu_nodes, levels, threshold,
                    np.ascontiguousarray(want, dtype=np.bool_), sources)
    if shortest is not None:
        shortest[sources] = out[0][sources]
        out = (shortest,) + out[1:]
    return PricedColumns(*out)


def price_sources(graph: PricingGraph, price: np.ndarray, sources: np.ndarray, max_steps: int,
                  want: np.ndarray) -> PricedColumns:
    """The shortest path of every wanted pair from the GPUs of rank ``sources`` (any
    cost) under ``price >= 0``; ``shortest`` holds those sources' rows only (the
    others 0)."""
    from ._kernels import price_all

    g = graph.num_gpus
    price = np.ascontiguousarray(np.maximum(price, 0.0), dtype=np.float64)
    levels = int(min(max_steps, graph.n_nodes - 1))
    out = price_all(graph.n_nodes, graph.tail, graph.head, price, graph.step_arcs,
                    graph.switch_arcs, graph.is_switch, graph.gpu_nodes, levels,
                    np.full((g, g), np.inf), np.ascontiguousarray(want, dtype=np.bool_),
                    np.ascontiguousarray(sources, dtype=np.int64))
    return PricedColumns(*out)
