"""Minimum-cost spanning arborescences on a dense digraph (Edmonds / Chu-Liu, in Tarjan's
path-growing form with dense contraction, O(V^2) per root).

The pricing step of the general AllGather method (:mod:`.tree_colgen`, paper §4.3 tree
packing generalised to forwarding-only switches) needs, for every root ``r``, the
cheapest spanning arborescence of the GPU digraph whose edge ``u -> v`` costs the
cheapest switch-only path under the link prices.  The graph is complete or nearly so
(``D[u, v] = inf`` where no switch-only path exists), so the dense variant is the
fast one:

* Edmonds' theorem (Chu-Liu 1965, Edmonds 1967): pick every node's cheapest in-edge;
  if the picks contain a cycle ``C``, contract it, reduce every edge entering ``C`` at
  ``c`` by the cost of ``c``'s pick, solve the contracted graph and expand; the result
  is a minimum arborescence.
* Tarjan (1977): grow a path backwards along cheapest in-edges from an unvisited node;
  a repeat closes a cycle, contracted on the spot into a new node that continues the
  path; reaching the root (or a finished node) finishes the whole path.  With the
  costs kept in a matrix, contracting ``C`` costs ``O(V |C|)``, so a root costs
  ``O(V^2)`` in all.

Ties are broken by the lowest matrix slot (node index), so results are deterministic.
Kernels are compiled on first use (``cache=True``).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from mccl_opt.errors import InputError

__all__ = ["min_arborescences"]


@njit(cache=True)
def _cheapest_in(W, active, sc):
    """Slot of the cheapest finite edge into slot ``sc`` from another active slot."""
    best = np.inf
    bs = -1
    for s in range(W.shape[0]):
        if active[s] and s != sc and W[s, sc] < best:
            best = W[s, sc]
            bs = s
    return bs


@njit(cache=True)
def _contract(W, Et, Eh, active, node_slot, inw, cycle, xs):
    """Merge the cycle's slots into slot ``xs``: edges into the cycle reduced by the
    entered member's pick (Edmonds), edges out of it the cheapest of the members'."""
    g = W.shape[0]
    in_cycle = np.zeros(g, np.bool_)
    for c in cycle:
        in_cycle[node_slot[c]] = True
    for s in range(g):
        if not active[s] or in_cycle[s]:
            continue
        bi = np.inf
        bt = -1
        bh = -1
        bo = np.inf
        ot = -1
        oh = -1
        for c in cycle:
            sc = node_slot[c]
            v = W[s, sc] - inw[c]
            if v < bi:
                bi = v
                bt = Et[s, sc]
                bh = Eh[s, sc]
            if W[sc, s] < bo:
                bo = W[sc, s]
                ot = Et[sc, s]
                oh = Eh[sc, s]
        W[s, xs] = bi
        Et[s, xs] = bt
        Eh[s, xs] = bh
        W[xs, s] = bo
        Et[xs, s] = ot
        Eh[xs, s] = oh
    for c in cycle:
        sc = node_slot[c]
        if sc != xs:
            active[sc] = False


@njit(cache=True)
def _arborescence(D, root, W, Et, Eh, parent):
    """Fill ``parent`` with a minimum spanning arborescence of ``D`` rooted at ``root``
    (``parent[root] = -1``); returns its cost, ``inf`` if some node is unreachable.
    ``W``, ``Et``, ``Eh`` are ``g x g`` work arrays."""
    g = D.shape[0]
    for i in range(g):
        for j in range(g):
            W[i, j] = D[i, j]
            Et[i, j] = i
            Eh[i, j] = j
    m = 2 * g
    slot_node = np.arange(g)
    node_slot = np.full(m, -1, np.int64)
    node_slot[:g] = np.arange(g)
    active = np.ones(g, np.bool_)
    state = np.zeros(m, np.int64)          # 0 unvisited, 1 on the path, 2 done, 3 contracted
    fpar = np.full(m, -1, np.int64)        # the contracted node a node belongs to
    inw = np.zeros(m)
    in_t = np.full(m, -1, np.int64)
    in_h = np.full(m, -1, np.int64)
    path = np.empty(m, np.int64)
    state[root] = 2
    nxt = g
    for v0 in range(g):
        if state[v0] != 0:
            continue
        plen = 0
        cur = v0
        state[cur] = 1
        path[plen] = cur
        plen += 1
        while True:
            sc = node_slot[cur]
            bs = _cheapest_in(W, active, sc)
            if bs < 0:
                return np.inf
            inw[cur] = W[bs, sc]
            in_t[cur] = Et[bs, sc]
            in_h[cur] = Eh[bs, sc]
            u = slot_node[bs]
            if state[u] == 2:
                for i in range(plen):
                    state[path[i]] = 2
                break
            if state[u] == 0:
                state[u] = 1
                path[plen] = u
                plen += 1
                cur = u
                continue
            k = plen - 1                   # u is on the path: contract path[k:] (a cycle)
            while path[k] != u:
                k -= 1
            cycle = path[k:plen].copy()
            xs = node_slot[u]
            _contract(W, Et, Eh, active, node_slot, inw, cycle, xs)
            x = nxt
            nxt += 1
            for c in cycle:
                state[c] = 3
                fpar[c] = x
            slot_node[xs] = x
            node_slot[x] = xs
            state[x] = 1
            plen = k
            path[plen] = x
            plen += 1
            cur = x
    for x in range(nxt - 1, g - 1, -1):    # expand: a node's pick passes to the member it enters
        b = in_h[x]
        mbr = b
        while fpar[mbr] != x:
            mbr = fpar[mbr]
        in_t[mbr] = in_t[x]
        in_h[mbr] = in_h[x]
    cost = 0.0
    for v in range(g):
        if v == root:
            parent[v] = -1
        else:
            parent[v] = in_t[v]
            cost += D[in_t[v], v]
    return cost


@njit(cache=True)
def _arborescences(D, roots):
    g = D.shape[0]
    W = np.empty((g, g))
    Et = np.empty((g, g), np.int64)
    Eh = np.empty((g, g), np.int64)
    parents = np.empty((roots.size, g), np.int64)
    costs = np.empty(roots.size)
    for i in range(roots.size):
        costs[i] = _arborescence(D, roots[i], W, Et, Eh, parents[i])
    return parents, costs


def min_arborescences(cost: np.ndarray, roots: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Minimum spanning arborescences of the dense digraph ``cost`` (``cost[u, v]`` the
    edge ``u -> v``, ``inf`` where there is none, diagonal ignored; any finite costs), one per root:
    ``(parents, costs)`` with ``parents[i, v]`` the parent of ``v`` in the tree of
    ``roots[i]`` (-1 at the root) and ``costs[i]`` its cost (``inf``, and ``parents[i]``
    meaningless, when some node cannot be reached from that root)."""
    D = np.ascontiguousarray(cost, dtype=np.float64)
    if D.ndim != 2 or D.shape[0] != D.shape[1]:
        raise InputError(f"cost must be a square matrix, got shape {D.shape}")
    if np.isnan(D).any() or np.isneginf(D).any():
        raise InputError("edge costs must be numbers or +inf (no edge), not NaN or -inf")
    r = np.ascontiguousarray(roots, dtype=np.int64).reshape(-1)
    if r.size and (r.min() < 0 or r.max() >= D.shape[0]):
        raise InputError(f"roots must lie in 0..{D.shape[0] - 1}")
    return _arborescences(D, r)
