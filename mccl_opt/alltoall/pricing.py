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

__all__ = ["PricingGraph", "PricedColumns", "price_paths"]


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


def price_paths(graph: PricingGraph, price: np.ndarray, threshold: np.ndarray,
                max_steps: int, want: np.ndarray | None = None) -> PricedColumns:
    """Shortest paths with at most ``max_steps`` steps from every GPU to every GPU
    under non-negative arc ``price``; returns every pair's shortest cost and, for the
    pairs with ``want[s, d]`` whose cost is strictly below ``threshold[s, d]``, the path.
    """
    g = graph.num_gpus
    price = np.ascontiguousarray(np.maximum(price, 0.0), dtype=np.float64)
    threshold = np.ascontiguousarray(threshold, dtype=np.float64)
    if want is None:
        want = np.ones((g, g), dtype=np.bool_)
    levels = int(min(max_steps, graph.n_nodes - 1))
    from ._kernels import price_all

    out = price_all(graph.n_nodes, graph.tail, graph.head, price, graph.step_arcs,
                    graph.switch_arcs, graph.is_switch, graph.gpu_nodes, levels, threshold,
                    np.ascontiguousarray(want, dtype=np.bool_))
    return PricedColumns(*out)
