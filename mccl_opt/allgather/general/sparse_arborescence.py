"""Minimum spanning arborescences from each node's few cheapest in-edges, certified
against the whole dense digraph (docs/allgather_history.md "Pricing on the cheapest in-edges").

The quotient's pricing (:mod:`.quotient`) needs one minimum arborescence per root orbit
of a dense ``g x g`` GPU digraph; the dense kernel (:mod:`.arborescence`) costs
``O(g^2)`` memory traffic per root (7 ms at 512 GPUs).  Here:

1. every node ``t`` keeps its ``k`` cheapest in-edges (one pass over the transposed
   matrix per round, shared by all roots), and ``thresh[t]``, the cheapest in-edge left
   out;
2. Edmonds' algorithm in Tarjan's form with mergeable skew heaps (``O(gk log(gk))``;
   Tarjan 1977, Gabow-Galil-Spencer-Tarjan 1986; the loop's shape learned from the
   public-domain KACTL notes, written here with the dual kept) finds a minimum arborescence of
   that sparse digraph together with its dual: a value ``y_S >= 0`` per contracted set
   (each pick's reduced cost), ``sum y_S`` the tree's cost, and every kept edge
   ``s -> t`` with ``sum {y_S : t in S, s not in S} <= c(s, t)`` (Edmonds 1967);
3. that dual is feasible for the dense digraph too when every left-out edge satisfies
   the same inequality, and then the tree is a minimum arborescence of the dense
   digraph (LP duality on the directed-cut formulation, whose optimum is integral).
   With ``Y(t)`` the sum over all sets holding ``t``, ``Y(t) <= thresh[t]`` settles a
   node at once; otherwise its left-out in-edges are checked one by one against the
   sets that hold ``t`` and not their tail.

A root whose sparse digraph does not reach every node, or whose dual fails the check,
is solved by the dense kernel, so the result is always a minimum arborescence (ties may
be broken differently from the dense kernel's).

Longer than ~400 lines on purpose: the sparse search, its dual and the check against the
dense digraph are one certified computation, and the search's heap and union-find must
be closures inside one kernel (as separate compiled functions each call cost ~40x).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .arborescence import min_arborescences

__all__ = ["min_arborescences_sparse", "IN_EDGES"]

#: in-edges kept per node: a host's NVLink peers and some of its cheapest fabric paths
IN_EDGES = 16

#: reduced costs down to ``-TOL * Y(t)`` pass as non-negative: ``Y(t)`` is a sum of picks'
#: reduced costs, so a tie of the fabric's many equal paths may miss it by a few ulps; the
#: tree is then within ``g * TOL`` (relative) of the minimum, far inside the column
#: generation's ``1e-9``
TOL = 1e-14

#: searches per root, each adding the left-out edges its dual broke, before the dense kernel
ROUNDS = 8


@njit(cache=True)
def _candidates(DT, k, step):
    """Per node ``t`` (row ``t`` of ``DT``: its in-edge costs), the tails of its ``k``
    cheapest finite in-edges (``-1`` where fewer), their costs, and the cheapest cost
    left out (``inf`` if none).  Tails are scanned from ``t + 1`` in strides of ``step``
    (coprime to ``g``) and ties kept in that order, so a node with more equally cheap
    in-edges than ``k`` keeps tails spread over the fabric, not the lowest ranks."""
    g = DT.shape[0]
    src = np.full((g, k), -1, np.int64)
    w = np.full((g, k), np.inf)
    thresh = np.full(g, np.inf)
    bw = np.empty(k + 1)
    bs = np.empty(k + 1, np.int64)
    for t in range(g):
        bw[:] = np.inf
        bs[:] = -1
        for j in range(g):
            s = (t + 1 + j * step) % g
            c = DT[t, s]
            if s == t or not c < bw[k]:
                continue
            i = k
            while i > 0 and bw[i - 1] > c:
                bw[i] = bw[i - 1]
                bs[i] = bs[i - 1]
                i -= 1
            bw[i] = c
            bs[i] = s
        for i in range(k):
            if bs[i] >= 0 and bw[i] < np.inf:
                src[t, i] = bs[i]
                w[t, i] = bw[i]
        thresh[t] = bw[k]
    return src, w, thresh


@njit(cache=True)
def _edmonds(ea, eb, w, g, root, parent, setpar, ytop):
    """A minimum arborescence rooted at ``root`` of the digraph of edges ``ea[e] ->
    eb[e]`` costing ``w[e] >= 0`` on ``g`` nodes (Tarjan's contraction with skew heaps): tails into
    ``parent``, and its dual: ``setpar`` the set that contracted each set (singleton
    ``v`` is set ``v``; ``-1``: none) and ``ytop`` the sum of ``y`` over a set and the
    sets holding it.  False when some node is not reached."""
    m = ea.size
    key = w.copy()
    lz = np.zeros(m)
    lc = np.full(m, -1, np.int64)
    rc = np.full(m, -1, np.int64)
    stack = np.empty(m, np.int64)
    heap = np.full(g, -1, np.int64)
    uf = np.full(g, -1, np.int64)            # union by size, rolled back when expanding

    def prop(x):                            # push x's pending addition down
        d = lz[x]
        if d != 0.0:
            key[x] += d
            if lc[x] >= 0:
                lz[lc[x]] += d
            if rc[x] >= 0:
                lz[rc[x]] += d
            lz[x] = 0.0

    def merge(a, b):                        # skew-heap merge (-1: empty)
        if a < 0:
            return b
        if b < 0:
            return a
        n = 0
        while a >= 0 and b >= 0:
            prop(a)
            prop(b)
            if key[a] > key[b]:
                a, b = b, a
            stack[n] = a
            n += 1
            a = rc[a]
        child = a if a >= 0 else b
        for i in range(n - 1, -1, -1):
            x = stack[i]
            rc[x] = lc[x]
            lc[x] = child
            child = x
        return child

    def find(x):                            # union-find root, no path compression
        while uf[x] >= 0:
            x = uf[x]
        return x

    for e in range(m):
        if eb[e] != root:
            heap[eb[e]] = merge(heap[eb[e]], e)
    hist_i = np.empty(2 * g, np.int64)
    hist_v = np.empty(2 * g, np.int64)
    nh = 0
    seen = np.full(g, -1, np.int64)
    seen[root] = root
    path = np.empty(g, np.int64)
    qe = np.empty(g, np.int64)
    in_e = np.full(g, -1, np.int64)
    setid = np.arange(g)
    setpar[:] = -1
    y = np.zeros(2 * g + 1)
    nsets = g
    cyc_u = np.empty(g, np.int64)
    cyc_time = np.empty(g, np.int64)
    cyc_lo = np.empty(g + 1, np.int64)
    comp = np.empty(2 * g, np.int64)
    nc = 0
    ncomp = 0
    cyc_lo[0] = 0
    for s in range(g):
        u = s
        qi = 0
        while seen[u] < 0:
            h = heap[u]
            if h < 0:
                return False
            prop(h)
            kw = key[h]
            lz[h] -= kw
            prop(h)
            heap[u] = merge(lc[h], rc[h])
            qe[qi] = h
            path[qi] = u
            qi += 1
            seen[u] = s
            y[setid[u]] += kw
            v = find(ea[h])
            if v == u:                       # an edge inside u's set: y_u rose, pick again
                qi -= 1
                seen[u] = -1
                continue
            u = v
            if seen[u] == s:                 # a cycle on the path: contract it
                cyc = -1
                end = qi
                time = nh
                new = nsets
                nsets += 1
                while True:
                    qi -= 1
                    x = path[qi]
                    cyc = merge(cyc, heap[x])
                    setpar[setid[x]] = new
                    a = find(u)
                    b = find(x)
                    if a == b:
                        break
                    if uf[a] > uf[b]:
                        a, b = b, a
                    hist_i[nh] = a
                    hist_v[nh] = uf[a]
                    hist_i[nh + 1] = b
                    hist_v[nh + 1] = uf[b]
                    nh += 2
                    uf[a] += uf[b]
                    uf[b] = a
                u = find(u)
                heap[u] = cyc
                seen[u] = -1
                setid[u] = new
                cyc_u[nc] = u
                cyc_time[nc] = time
                for i in range(qi, end):
                    comp[ncomp] = qe[i]
                    ncomp += 1
                nc += 1
                cyc_lo[nc] = ncomp
        for i in range(qi):
            in_e[find(eb[qe[i]])] = qe[i]
    for c in range(nc - 1, -1, -1):         # expand the cycles, last contracted first
        while nh > cyc_time[c]:
            nh -= 1
            uf[hist_i[nh]] = hist_v[nh]
        inedge = in_e[cyc_u[c]]
        for i in range(cyc_lo[c], cyc_lo[c + 1]):
            e = comp[i]
            in_e[find(eb[e])] = e
        in_e[find(eb[inedge])] = inedge
    ytop[:] = 0.0
    for x in range(nsets - 1, -1, -1):
        ytop[x] = y[x] + (ytop[setpar[x]] if setpar[x] >= 0 else 0.0)
    for v in range(g):
        parent[v] = -1 if v == root else ea[in_e[v]]
    return True



@njit(cache=True)
def _intervals(setpar, nodes):
    """Positions of a laminar order of the sets (each set a contiguous ``[lo, hi)``,
    children inside their parent): ``(lo, hi, order)``, ``order[p]`` the node at
    position ``p`` (parents have larger ids than their children)."""
    n = setpar.size
    size = np.zeros(n, np.int64)
    size[:nodes] = 1
    for x in range(n):
        if setpar[x] >= 0:
            size[setpar[x]] += size[x]
    lo = np.zeros(n, np.int64)
    cursor = np.zeros(n, np.int64)
    top = 0
    for x in range(n - 1, -1, -1):
        if size[x] == 0:
            continue
        p = setpar[x]
        if p < 0:
            lo[x] = top
            top += size[x]
        else:
            lo[x] = cursor[p]
            cursor[p] += size[x]
        cursor[x] = lo[x]
    order = np.empty(nodes, np.int64)
    for v in range(nodes):
        order[lo[v]] = v
    return lo, lo + size, order


@njit(cache=True)
def _violations(DT, src, thresh, root, setpar, ytop, ex_src, ex_n):
    """Append to ``ex_src[t, :ex_n[t]]`` the (at most ``k``) left-out in-edges of each
    node ``t`` that break the dual most: reduced cost ``c(s, t) - sum {y_S : t in S, s
    not in S}`` below zero.  The tails ``s`` whose smallest set shared with ``t`` is
    ``S`` are ``S`` less its child holding ``t``: two intervals of a laminar order, with
    the one sum ``ytop[t] - ytop[S]``.  Ties go by a hash of ``(s, t)`` (spread over the
    fabric, not the lowest ranks).  Returns how many were added, ``-1`` when ``ex_src``
    is full."""
    g, k = src.shape
    lo, hi, order = _intervals(setpar, g)
    kept = np.full(g, -1, np.int64)
    bw = np.empty(k)
    bh = np.empty(k, np.int64)
    bs = np.empty(k, np.int64)
    added = 0
    for t in range(g):
        yt = ytop[t]
        if t == root or yt <= thresh[t]:
            continue
        kept[root] = t
        for i in range(k):
            if src[t, i] >= 0:
                kept[src[t, i]] = t
        for i in range(ex_n[t]):
            kept[ex_src[t, i]] = t
        bw[:] = np.inf
        bs[:] = -1
        inner = t
        x = setpar[t]
        while True:                          # x: the next set up t's chain (-1: none)
            need = yt - (ytop[x] if x >= 0 else 0.0)   # sum over the sets t is in, s not
            if need > TOL * yt:
                a0, a1 = (lo[x], hi[x]) if x >= 0 else (0, g)
                for part in range(2):
                    p0, p1 = (a0, lo[inner]) if part == 0 else (hi[inner], a1)
                    for p in range(p0, p1):
                        s = order[p]
                        c = DT[t, s] - need      # its reduced cost
                        if c >= -TOL * yt or kept[s] == t or c > bw[k - 1]:
                            continue
                        h = ((s + 1) * 2654435761 ^ (t + 1) * 40503) & 0xFFFFFFFF
                        if c == bw[k - 1] and h >= bh[k - 1]:
                            continue
                        i = k - 1
                        while i > 0 and (bw[i - 1] > c or (bw[i - 1] == c and bh[i - 1] > h)):
                            bw[i] = bw[i - 1]
                            bh[i] = bh[i - 1]
                            bs[i] = bs[i - 1]
                            i -= 1
                        bw[i] = c
                        bh[i] = h
                        bs[i] = s
            if x < 0:
                break
            inner = x
            x = setpar[x]
        for i in range(k):
            if bs[i] < 0:
                break
            if ex_n[t] == ex_src.shape[1]:
                return -1
            ex_src[t, ex_n[t]] = bs[i]
            ex_n[t] += 1
            added += 1
    return added


@njit(cache=True)
def _sparse_tree(DT, src, w, thresh, root, parent, step):
    """A minimum arborescence of the dense digraph rooted at ``root`` (module
    docstring): the kept in-edges, every edge out of the root (so the sparse digraph
    spans), and the left-out edges that broke the dual so far, until the dual holds.
    Its cost, ``-1.0`` when not settled within :data:`ROUNDS` searches."""
    g, k = src.shape
    ex_src = np.empty((g, ROUNDS * k), np.int64)
    ex_n = np.zeros(g, np.int64)
    setpar = np.empty(2 * g + 1, np.int64)
    ytop = np.empty(2 * g + 1)
    for _ in range(ROUNDS):
        m = 0
        for t in range(g):
            m += k + 1 + ex_n[t]
        ea = np.empty(m, np.int64)
        eb = np.empty(m, np.int64)
        ew = np.empty(m)
        m = 0
        for t in range(g):
            if t == root:
                continue
            for i in range(k):
                if src[t, i] >= 0:
                    ea[m], eb[m], ew[m] = src[t, i], t, w[t, i]
                    m += 1
            for i in range(ex_n[t]):
                ea[m], eb[m], ew[m] = ex_src[t, i], t, DT[t, ex_src[t, i]]
                m += 1
            if DT[t, root] < np.inf:
                ea[m], eb[m], ew[m] = root, t, DT[t, root]
                m += 1
        if not _edmonds(ea[:m], eb[:m], ew[:m], g, root, parent, setpar, ytop):
            return -1.0
        added = _violations(DT, src, thresh, root, setpar, ytop, ex_src, ex_n)
        if added < 0:
            return -1.0
        if added == 0:
            cost = 0.0
            for v in range(g):
                if v != root:
                    cost += DT[v, parent[v]]
            return cost
    return -1.0


@njit(cache=True)
def _sparse_trees(DT, roots, k, step):
    g = DT.shape[0]
    src, w, thresh = _candidates(DT, k, step)
    parents = np.empty((roots.size, g), np.int64)
    costs = np.empty(roots.size)
    for i in range(roots.size):
        costs[i] = _sparse_tree(DT, src, w, thresh, roots[i], parents[i], step)
    return parents, costs


def _stride(g: int) -> int:
    """The least stride ``>= 0.618 g`` coprime to ``g`` (1 for ``g <= 2``)."""
    step = max(1, int(0.618 * g))
    while math.gcd(step, g) != 1:
        step += 1
    return step


def min_arborescences_sparse(cost_t: np.ndarray, roots: np.ndarray, k: int = IN_EDGES
                             ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`.arborescence.min_arborescences` of the digraph whose edge ``u -> v``
    costs ``cost_t[v, u] >= 0`` (the transposed matrix: row ``v`` holds ``v``'s
    in-edges), by the module's certified sparse search, the dense kernel for the roots
    it does not settle (and for all of them when a cost is negative, which it solves,
    or the input is malformed, which it rejects with :class:`InputError`):
    ``(parents, costs)``."""
    DT = np.ascontiguousarray(cost_t, dtype=np.float64)
    r = np.ascontiguousarray(roots, dtype=np.int64).reshape(-1)
    if DT.ndim != 2 or DT.shape[0] != DT.shape[1] or not (DT >= 0).all() or (
            r.size and (r.min() < 0 or r.max() >= DT.shape[0])):
        return min_arborescences(DT.T, r)        # checks the input; duals need costs >= 0
    g = DT.shape[0]
    parents, costs = _sparse_trees(DT, r, max(1, min(int(k), g - 1)), _stride(g))
    left = np.flatnonzero(costs < 0)
    if left.size:
        p, c = min_arborescences(DT.T, r[left])
        parents[left], costs[left] = p, c
    return parents, costs
