"""Cheapest switch-only paths between all ordered GPU pairs under link prices.

An AllGather tree edge ``u -> v`` is a transfer whose interior nodes are switches only
(docs/modelling.md; switches forward and never duplicate, so every tree edge is one path
through the fabric).  Pricing in the general method (:mod:`.tree_colgen`) needs, for link
prices ``pi >= 0``, the cheapest such path for every ordered GPU pair: one Dijkstra
per source GPU that expands the source and switches only (a GPU reached is a leaf).
Ties are broken by fewer hops, then by the first arc to reach the label (arcs are
scanned in CSR order), so the paths are deterministic.  Compiled on first use.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from mccl_opt.errors import InputError
from mccl_opt.topology import Topology

__all__ = ["SwitchPaths", "switch_paths", "from_sources"]


@njit(cache=True)
def _push(hc, hh, hn, size, c, h, v):
    i = size
    hc[i] = c
    hh[i] = h
    hn[i] = v
    while i > 0:
        p = (i - 1) // 2
        if hc[p] < hc[i] or (hc[p] == hc[i] and (hh[p] < hh[i] or (hh[p] == hh[i] and hn[p] <= hn[i]))):
            break
        hc[p], hc[i] = hc[i], hc[p]
        hh[p], hh[i] = hh[i], hh[p]
        hn[p], hn[i] = hn[i], hn[p]
        i = p
    return size + 1


@njit(cache=True)
def _pop(hc, hh, hn, size):
    c, h, v = hc[0], hh[0], hn[0]
    size -= 1
    hc[0], hh[0], hn[0] = hc[size], hh[size], hn[size]
    i = 0
    while True:
        lft = 2 * i + 1
        if lft >= size:
            break
        m = lft
        r = lft + 1
        if r < size and (hc[r] < hc[lft] or (hc[r] == hc[lft] and (
                hh[r] < hh[lft] or (hh[r] == hh[lft] and hn[r] < hn[lft])))):
            m = r
        if hc[i] < hc[m] or (hc[i] == hc[m] and (hh[i] < hh[m] or (hh[i] == hh[m] and hn[i] <= hn[m]))):
            break
        hc[m], hc[i] = hc[i], hc[m]
        hh[m], hh[i] = hh[i], hh[m]
        hn[m], hn[i] = hn[i], hn[m]
        i = m
    return c, h, v, size


@njit(cache=True)
def _from_sources(price, head, out_start, out_arcs, is_switch, gpu_nodes, sources):
    """``cost[i, t]`` and ``pred[i, node]`` of the Dijkstra from rank ``sources[i]``
    (every rank for all pairs: one kernel signature for the warm-up to load)."""
    n = is_switch.size
    g = gpu_nodes.size
    m = head.size
    cost = np.full((sources.size, g), np.inf)
    pred = np.full((sources.size, n), -1, np.int64)
    dist = np.empty(n)
    hops = np.empty(n, np.int64)
    hc = np.empty(m + 1)
    hh = np.empty(m + 1, np.int64)
    hn = np.empty(m + 1, np.int64)
    for s in range(sources.size):
        src = gpu_nodes[sources[s]]
        dist[:] = np.inf
        hops[:] = 0
        dist[src] = 0.0
        size = _push(hc, hh, hn, 0, 0.0, 0, src)
        while size > 0:
            c, h, u, size = _pop(hc, hh, hn, size)
            if c != dist[u] or h != hops[u]:
                continue
            if u != src and not is_switch[u]:
                continue
            for k in range(out_start[u], out_start[u + 1]):
                a = out_arcs[k]
                v = head[a]
                nc = c + price[a]
                if nc < dist[v] or (nc == dist[v] and h + 1 < hops[v]):
                    dist[v] = nc
                    hops[v] = h + 1
                    pred[s, v] = a
                    size = _push(hc, hh, hn, size, nc, h + 1, v)
        for t in range(g):
            if t != sources[s]:
                cost[s, t] = dist[gpu_nodes[t]]
        pred[s, src] = -1
    return cost, pred


@njit(cache=True)
def _edge_arcs(pred, tail, gpu_nodes, root, parent):
    """Arcs of the switch-only path of every tree edge ``parent[v] -> v`` (v != root),
    concatenated; ``count`` arcs in all."""
    g = gpu_nodes.size
    out = np.empty(g * 8, np.int64)
    count = 0
    buf = np.empty(pred.shape[1], np.int64)
    for v in range(g):
        if v == root:
            continue
        u = parent[v]
        node = gpu_nodes[v]
        src = gpu_nodes[u]
        k = 0
        while node != src:
            a = pred[u, node]
            buf[k] = a
            k += 1
            node = tail[a]
        if count + k > out.size:
            bigger = np.empty(2 * (count + k), np.int64)
            bigger[:count] = out[:count]
            out = bigger
        for i in range(k):
            out[count + i] = buf[k - 1 - i]
        count += k
    return out[:count]


class SwitchPaths:
    """Cheapest switch-only paths for one price vector: ``cost[s, t]`` (rank space,
    ``inf`` where none exists) and the predecessor arc ``pred[s, node]`` of each node
    in source rank ``s``'s search tree."""

    def __init__(self, topo: Topology, price: np.ndarray) -> None:
        arr = topo.arrays
        self.topo = topo
        self.cost, self.pred = _from_sources(
            np.ascontiguousarray(price, dtype=np.float64), arr.head, arr.out_start,
            arr.out_arcs, arr.is_switch, arr.gpu_nodes, np.arange(arr.gpu_nodes.size))

    def tree_arcs(self, root: int, parent: np.ndarray) -> np.ndarray:
        """Link indices of every edge path of the tree ``parent`` (rank space), edge of
        rank ``v`` before rank ``v+1``, each path in order."""
        arr = self.topo.arrays
        return _edge_arcs(self.pred, arr.tail, arr.gpu_nodes, int(root),
                          np.asarray(parent, np.int64))

    def forest_arcs(self, roots: np.ndarray, parents: np.ndarray) -> list[np.ndarray]:
        """:meth:`tree_arcs` of every root in ``roots`` (rank space), ``parents[r]``
        its tree: one call per pricing round."""
        return [self.tree_arcs(r, parents[r]) for r in roots.tolist()]


def from_sources(topo: Topology, price: np.ndarray, sources: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The rows of :class:`SwitchPaths`'s ``cost`` and ``pred`` for the source ranks
    ``sources`` only (one Dijkstra each)."""
    arr = topo.arrays
    return _from_sources(np.ascontiguousarray(price, dtype=np.float64), arr.head,
                         arr.out_start, arr.out_arcs, arr.is_switch, arr.gpu_nodes,
                         np.ascontiguousarray(sources, dtype=np.int64))


def switch_paths(topo: Topology, price: np.ndarray) -> SwitchPaths:
    """:class:`SwitchPaths` of ``topo`` under link prices ``price >= 0``."""
    price = np.asarray(price, dtype=np.float64)
    if price.shape != (topo.num_links,) or not np.isfinite(price).all() or (price < 0).any():
        raise InputError(f"price must hold {topo.num_links} finite non-negative link prices")
    return SwitchPaths(topo, price)
