"""Phase 3's compiled exact packer for few trees per root (paper §4.3; Lovász's proof of
Edmonds' branching theorem).

The fast packers (:mod:`.repair`, :func:`.trees.greedy_pack`) can miss a packing that
exists: on a leaf-spine whose GPUs' NIC links are *narrow* (leaf-spine 8x2x4 with 4
spines: one tree per root, and every host's NIC ingress holds exactly one unit per tree
of another host) every tree must enter every other host exactly once, and a local
augmenting chain only moves the link into one vertex, never which vertex of a host a
tree enters.  Lovász's growth is exact there, but :mod:`.exact_packing` builds a network
with a node per class and its members for every extension (18 s at 64 GPUs).

Here the trees grow one after another, so while tree ``j`` grows every other unfinished
tree is still its root alone: the rooted condition of the partial packing,
``units(δ⁻(S)) >= #{unstarted trees with root outside S}`` for every GPU set ``S``
(finished trees meet every ``S``), reduces to a max-flow on the logical graph itself
with ``s -> r`` of capacity the unstarted trees at ``r``.  Tree ``j`` may take a link
``u -> v`` with a free unit iff no set ``S ∋ v``, ``u ∉ S`` is tight, i.e. iff the
max-flow from ``{s, u}`` to ``v`` reaches ``P + 1`` (``P`` unstarted trees); a set that
meets ``R_j`` never is tight and one that is stays tight while ``j`` grows, so every
failed check's sink side rules out all links entering it for the rest of ``j``'s growth.
One small max-flow per tree edge: ``k·n·(n-1)`` of them, hence :data:`FEW_TREES_MAX_ENTRIES`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..maxflow import INF, FlowNetwork, _bfs_levels, _dinic
from .trees import TreeClass

__all__ = ["few_trees_pack", "FEW_TREES_MAX_ENTRIES"]

#: largest ``k·n·n`` (unit trees x ranks) packed this way: one max-flow per tree edge,
#: and each costs more with more trees (its flow value is the unstarted trees): at 64
#: GPUs ~27 µs per edge with 1 tree per root (0.11 s), ~46 µs with 7 (1.3 s, where the
#: general method takes 0.15 s: leaf-spine 4x2x8 with a spine cable at 80 Gbps)
FEW_TREES_MAX_ENTRIES = 1 << 13

#: tight sets remembered while one tree grows (each rules out the links entering it)
MAX_TIGHT_SETS = 64


@njit(cache=True)
def _grow_one(t, r, n, m, l_head, out_start, out_arc, cap, unstarted, start, arcs, rhead,
              res, level, queue, it, path, par, tight, member, order):
    """Grow unit tree ``t`` of root ``r`` edge by edge (module doc); ``False`` if stuck."""
    p_left = 0
    for x in range(n):
        p_left += unstarted[x]
        member[x] = False
    member[r] = True
    order[0] = r
    count = 1
    n_tight = 0
    s_arc0 = m
    t_arc0 = m + n
    while count < n:
        found = -1
        for i in range(count):
            u = order[i]
            for p in range(out_start[u], out_start[u + 1]):
                a = out_arc[p]
                v = l_head[a]
                if member[v] or cap[a] == 0:
                    continue
                ruled = False
                for c in range(n_tight):
                    if tight[c, v] and not tight[c, u]:
                        ruled = True
                        break
                if ruled:
                    continue
                for b in range(m):
                    res[2 * b] = cap[b]
                    res[2 * b + 1] = 0
                for x in range(n):
                    res[2 * (s_arc0 + x)] = unstarted[x]
                    res[2 * (s_arc0 + x) + 1] = 0
                    res[2 * (t_arc0 + x)] = 0
                    res[2 * (t_arc0 + x) + 1] = 0
                res[2 * (s_arc0 + u)] = INF
                res[2 * (t_arc0 + v)] = INF
                flow = _dinic(n + 2, start, arcs, rhead, res, n, n + 1, p_left + 1, level,
                              queue, it, path)
                if flow > p_left:
                    found = a
                    break
                if n_tight < tight.shape[0]:       # the sink side is tight for tree t
                    _bfs_levels(n + 2, start, arcs, rhead, res, n, -1, level, queue)
                    for x in range(n):
                        tight[n_tight, x] = level[x] < 0
                    n_tight += 1
            if found >= 0:
                break
        if found < 0:
            return False
        cap[found] -= 1
        v = l_head[found]
        par[t, v] = found
        member[v] = True
        order[count] = v
        count += 1
    return True


def few_trees_pack(n: int, tail: np.ndarray, head: np.ndarray, units: np.ndarray,
                   k: int) -> list[TreeClass] | None:
    """``k`` unit trees per root on the logical graph by the compiled Lovász growth
    (module doc), identical trees of a root merged; ``None`` when a tree gets stuck (the
    graph fails the rooted cut condition for ``k``) or ``k·n·n`` exceeds
    :data:`FEW_TREES_MAX_ENTRIES`.  Every link stays within its units by construction."""
    if k * n * n > FEW_TREES_MAX_ENTRIES or n < 2:
        return None
    tail = np.asarray(tail, np.int64)
    head = np.asarray(head, np.int64)
    m = tail.size
    # a vertex's wide links first: a tree fans out over them and keeps narrow units
    out_arc = np.lexsort((-np.asarray(units, np.int64), tail)).astype(np.int64)
    out_start = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(tail, minlength=n), out=out_start[1:])
    net = FlowNetwork(n, tail, head)
    cap = np.asarray(units, np.int64).copy()
    unstarted = np.full(n, k, np.int64)
    par = np.full((n * k, n), -1, np.int64)
    tight = np.zeros((MAX_TIGHT_SETS, n), np.bool_)
    member = np.zeros(n, np.bool_)
    order = np.zeros(n, np.int64)
    for r in range(n):
        for c in range(k):
            unstarted[r] -= 1
            if not _grow_one(r * k + c, r, n, m, head, out_start, out_arc, cap, unstarted,
                             net._start, net._arcs, net._head, net._res, net._level,
                             net._queue, net._it, net._path, par, tight, member, order):
                return None
    return _merged(n, k, par)


def _merged(n: int, k: int, par: np.ndarray) -> list[TreeClass]:
    """Unit trees ``par[r·k + c]`` as classes: identical trees of a root share one."""
    classes: list[TreeClass] = []
    for r in range(n):
        seen: dict[bytes, TreeClass] = {}
        for c in range(k):
            row = par[r * k + c]
            key = row.tobytes()
            if key in seen:
                seen[key].mult += 1
            else:
                seen[key] = TreeClass(r, 1, row.copy())
                classes.append(seen[key])
    return classes
