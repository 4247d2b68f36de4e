"""ForestColl-warm by rerouting the previous physical trees (paper §4.3).

A localised degradation (Fail1: NVSwitch lanes of one GPU; Fail2: one NIC) moves the
optimum and with it the tree bandwidth, so Phase 2's logical graph and Phase 3's
packing change everywhere.  The previous *physical* trees, however, are still spanning
trees over real switch paths: at the new rate only the tree edges that cross a link
now over capacity are wrong.  :func:`reroute` keeps every previous tree with its
multiplicity (``k_old`` unit trees per root, shares ``m / k_old``) and moves each
offending edge ``(t, v)`` to another parent ``u`` of ``v`` -- any GPU outside ``v``'s
subtree in ``t``, over a switch-only path into ``v`` whose links still have room
(widest first) -- splitting the tree when only part of its multiplicity fits.  Moving
``v``'s in-edge keeps ``t`` a spanning arborescence.  When no link is left over capacity
the trees carry ``target`` per root; the caller has certified ``target`` as an upper
bound of the chunk-budget optimum, so the result is optimal.  If some link stays over
capacity nothing is returned and the caller packs from scratch.

Capacities are counted in unit trees exactly as Phase 3 does: ``floor(cap_a / b)`` for
the unit bandwidth ``b = target / k_old`` in capacity quanta.  The forest itself lives
in :mod:`.forest`.

Longer than ~400 lines on purpose: the move rules (a parent, a chain, room made in
other trees) are numba kernels that call one another on the same arrays; split across
modules they would only be harder to follow.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple

import time

import numpy as np
from numba import njit

from mccl_opt import anytime
from mccl_opt.report import WarmUse
from mccl_opt.schedule import Schedule
from mccl_opt.topology import Topology
from .kept import AllGatherWarmState
from .forest import SwitchPathTable, PhysicalForest, rebuilt, requantized, unit_loads

__all__ = ["Rerouted", "RerouteCostlier", "reroute", "predicted_seconds", "predicted_cold_seconds",
           "calibrated_cold_seconds"]

#: passes over the edges still crossing over-capacity links
REROUTE_PASSES = 4
#: candidate paths one compiled slice of a pass weighs before the clock is checked
#: (:func:`_pass`; calibrated in docs/allgather.md, *Warm never slower than cold*)
REROUTE_SLICE_WORK = 50_000
#: attempts per pass to make room for a chain in other trees ...
MAKE_ROOM_CALLS = 32
#: ... and blocked links each attempt tries to free
FREE_TRIES = 32

#: CPU seconds per candidate path of the first choice (the costliest measured: shared
#: aggregation 2x8x8 after a two-way fault, 532k paths 0.08-0.09 s; 1e-8-4e-8 elsewhere) ...
REROUTE_S_PER_PATH = 1.5e-7
#: ... and per tree slot (trees x GPUs: copied and edited arrays; HPN 8x16 1009 x 128, 6-8 ms)
REROUTE_S_PER_SLOT = 5e-8
#: ... and per candidate path a chain may weigh (:func:`_chain_forecast`: SuperPOD 2x2x8
#: one way, 973k paths, passes of 0.017 s where the rest forecast 0.0046 s, ~1.3e-8 s per
#: path; docs/allgather.md *One budget for a declined warm solve*)
REROUTE_S_PER_CHAIN_PATH = 1e-8
#: the cold solve's CPU seconds per entry ``k·n²`` of its packing, at least (the fuzz's
#: K=10 states: 5e-7 shared aggregation 80 GPUs to 2e-6 HPN 128 GPUs)
COLD_S_PER_ENTRY = 5e-7
#: rerouting may take at most this share of the predicted cold solve (predicted, then
#: measured in CPU seconds between slices): a warm solve declined past it costs at most
#: about 1.5 x cold
REROUTE_COLD_SHARE = 0.5
#: ... or this (s) on small fabrics, where the warm target's 20 ms floor leaves room
REROUTE_FLOOR_S = 0.005


class RerouteCostlier(Exception):
    """Raised by :func:`reroute` before its passes when their predicted cost exceeds
    :data:`REROUTE_COLD_SHARE` of the cold solve's (:func:`predicted_seconds`), or
    between slices once their CPU seconds do: the warm route is declined, not this
    guess (docs/allgather.md, *The warm start predicted costlier than cold*)."""


@dataclass(frozen=True)
class Rerouted:
    """A rerouted forest, its share load per link, and how many trees it rebuilt."""

    forest: PhysicalForest
    loads: np.ndarray
    moved_edges: int
    rebuilt_trees: int


class Paths(NamedTuple):
    """Candidate switch paths for the kernels: path ``q`` crosses links
    ``links[start[q]:start[q+1]]`` and starts at rank ``tail[q]``; the paths into rank
    ``v`` are ``into[into_start[v]:into_start[v+1]]``."""

    start: np.ndarray
    links: np.ndarray
    tail: np.ndarray
    into_start: np.ndarray
    into: np.ndarray


class Trees(NamedTuple):
    """The forest being edited (slots beyond the live tree count are spare): per tree
    ``t`` the parent rank ``parent[t, v]`` and path ``via[t, v]`` of every rank, its
    multiplicity, root rank and whether it changed."""

    parent: np.ndarray
    via: np.ndarray
    mult: np.ndarray
    roots: np.ndarray
    changed: np.ndarray


class Units(NamedTuple):
    """Unit trees crossing every link (``load``) and the link's capacity in them."""

    load: np.ndarray
    cap: np.ndarray


@njit(cache=True)
def _over(q, P, L):
    """Whether path ``q`` crosses a link over capacity."""
    for e in range(P.start[q], P.start[q + 1]):
        if L.load[P.links[e]] > L.cap[P.links[e]]:
            return True
    return False


@njit(cache=True)
def _climb(T, t, u, v, P, L):
    """``-1`` if ``u`` lies in ``v``'s subtree of tree ``t``, else ``u``'s depth, plus
    the number of ranks for every ancestor edge still over capacity (to be moved)."""
    depth = 0
    w = u
    while w >= 0:
        if w == v:
            return -1
        depth += 1
        g = T.via[t, w]
        if g >= 0 and _over(g, P, L):
            depth += T.parent.shape[1]
        w = T.parent[t, w]
    return depth


@njit(cache=True)
def _room(q, p, m, P, L):
    """Units (at most ``m``) that can move from path ``p`` to path ``q``: a link on both
    keeps its load, so it must not be over capacity; any other link of ``q`` needs room."""
    room = m
    for e in range(P.start[q], P.start[q + 1]):
        a = P.links[e]
        shared = False
        for f in range(P.start[p], P.start[p + 1]):
            if P.links[f] == a:
                shared = True
        if shared:
            if L.load[a] > L.cap[a]:
                return 0
        elif L.cap[a] - L.load[a] < room:
            room = L.cap[a] - L.load[a]
    return room


@njit(cache=True)
def _move(T, L, t, v, q, take, P):
    """Re-hang rank ``v`` of tree ``t`` (carrying ``take``) on path ``q``."""
    p = T.via[t, v]
    for e in range(P.start[p], P.start[p + 1]):
        L.load[P.links[e]] -= take
    for e in range(P.start[q], P.start[q + 1]):
        L.load[P.links[e]] += take
    T.parent[t, v] = P.tail[q]
    T.via[t, v] = q


@njit(cache=True)
def _take(T, num_trees, t, units):
    """``(slot, trees)``: the tree carrying ``units`` of tree ``t``'s multiplicity --
    ``t`` itself if it has no more, else a copy split off from it (``slot = -1`` when no
    slot is left)."""
    if units >= T.mult[t]:
        return t, num_trees
    if num_trees >= T.mult.size:
        return -1, num_trees
    T.parent[num_trees, :] = T.parent[t, :]
    T.via[num_trees, :] = T.via[t, :]
    T.roots[num_trees] = T.roots[t]
    T.mult[num_trees] = units
    T.mult[t] -= units
    T.changed[t] = True
    return num_trees, num_trees + 1


@njit(cache=True)
def _uses(q, b, P):
    """Whether path ``q`` crosses link ``b``."""
    for e in range(P.start[q], P.start[q + 1]):
        if P.links[e] == b:
            return True
    return False


@njit(cache=True)
def _best_parent(T, t, v, avoid, m, P, L, skip_link):
    """``(path, units, tail depth)``: the path into ``v`` (not crossing ``skip_link``;
    ``-1``: any) whose tail is outside ``avoid``'s subtree in tree ``t`` and that takes
    the most of ``m`` units (all of them first), then has the shallowest tail;
    ``(-1, 0, 0)`` if none has room."""
    p = T.via[t, v]
    best_q, best_r, best_d = -1, 0, 0
    for qi in range(P.into_start[v], P.into_start[v + 1]):
        q = P.into[qi]
        if q == p or (skip_link >= 0 and _uses(q, skip_link, P)):
            continue
        depth = _climb(T, t, P.tail[q], avoid, P, L)
        if depth < 0:
            continue
        room = _room(q, p, m, P, L)
        if room <= 0:
            continue
        if best_q < 0 or room > best_r or (room == best_r and depth < best_d):
            best_q, best_r, best_d = q, room, depth
    return best_q, best_r, best_d


@njit(cache=True)
def _memo_parent(T, t, u, v, m, P, L, memo):
    """:func:`_best_parent` ``(T, t, u, v, m, P, L, -1)``, computed once per rank ``u``
    within one :func:`_chain` call (loads do not change there)."""
    if memo[u, 0] == -2:
        memo[u, 0], memo[u, 1], memo[u, 2] = _best_parent(T, t, u, v, m, P, L, -1)
    return memo[u, 0], memo[u, 1], memo[u, 2]


@njit(cache=True)
def _memo_climb(T, t, u, v, P, L, memo):
    """:func:`_climb` ``(T, t, u, v, P, L)``, computed once per rank ``u`` within one
    :func:`_chain` call."""
    if memo[u] == -2:
        memo[u] = _climb(T, t, u, v, P, L)
    return memo[u]


@njit(cache=True)
def _chain(T, t, v, m, P, L):
    """A chain re-hanging ``v`` (all of whose candidate parents lie in its own subtree
    of tree ``t``): ``v`` below ``u1`` below (``u2`` below) ``w``, with ``u1``, ``u2``
    from ``v``'s subtree and ``w`` outside it, every new path with room.  The result is
    a tree: only chain ranks change parents, and ``w``'s ancestors are outside ``v``'s
    subtree.  Returns the shallowest as ``(q, u1, q1, u2, q2, units, depth of v)``,
    ``q = -1`` if none.  Parent searches and climbs are memoised per rank (the same
    ranks recur as ``u1`` and ``u2`` of many candidates)."""
    p = T.via[t, v]
    n = T.parent.shape[1]
    parents = np.full((n, 3), -2, np.int64)
    climbs = np.full(n, -2, np.int64)
    best = (-1, -1, -1, -1, -1, 0, 1 << 30)
    for ai in range(P.into_start[v], P.into_start[v + 1]):
        q = P.into[ai]
        u1 = P.tail[q]
        if q == p or _memo_climb(T, t, u1, v, P, L, climbs) >= 0:
            continue
        r = _room(q, p, m, P, L)
        if r <= 0:
            continue
        q1, r1, d1 = _memo_parent(T, t, u1, v, m, P, L, parents)
        if q1 >= 0 and d1 + 2 < best[6]:
            best = (q, u1, q1, -1, -1, min(r, r1), d1 + 2)
            if best[6] <= 3:                 # a tail at the root: nothing is shallower
                break
            continue
        if best[6] <= 4:                     # a two-step chain reaches depth 4 at best
            continue
        for bi in range(P.into_start[u1], P.into_start[u1 + 1]):
            q1 = P.into[bi]
            u2 = P.tail[q1]
            if q1 == T.via[t, u1] or u2 == v or _memo_climb(T, t, u2, v, P, L, climbs) >= 0:
                continue
            r1 = _room(q1, T.via[t, u1], m, P, L)
            if r1 <= 0:
                continue
            q2, r2, d2 = _memo_parent(T, t, u2, v, m, P, L, parents)
            if q2 >= 0 and d2 + 3 < best[6]:
                best = (q, u1, q1, u2, q2, min(r, r1, r2), d2 + 3)
                if best[6] <= 4:
                    break
    return best


@njit(cache=True)
def _last_link_blocks(q, P, L):
    """Whether only the last link of path ``q`` (the one into its head) is full."""
    last = P.links[P.start[q + 1] - 1]
    if L.load[last] < L.cap[last]:
        return False
    for e in range(P.start[q], P.start[q + 1] - 1):
        if L.load[P.links[e]] >= L.cap[P.links[e]]:
            return False
    return True


@njit(cache=True)
def _free_into(T, num_trees, x, b, need, skip, P, L):
    """Free up to ``need`` units on link ``b`` into rank ``x`` by re-hanging ``x`` in
    other trees than ``skip`` onto paths that avoid ``b`` and have room.  Returns
    ``(trees, units freed)``; ``trees = -1`` when the split slots ran out."""
    freed = 0
    for t in range(num_trees):
        if freed >= need:
            break
        p = T.via[t, x]
        if t == skip or p < 0:
            continue
        if not _uses(p, b, P):
            continue
        q, room, _ = _best_parent(T, t, x, x, min(T.mult[t], need - freed), P, L, b)
        if q < 0:
            continue
        moved, num_trees = _take(T, num_trees, t, room)
        if moved < 0:
            return -1, freed
        _move(T, L, moved, x, q, T.mult[moved], P)
        T.changed[moved] = True
        freed += T.mult[moved]
    return num_trees, freed


@njit(cache=True)
def _make_room(T, num_trees, t, v, P, L):
    """For a rank ``v`` of tree ``t`` that neither a parent nor a chain can take: find a
    rank ``u`` of ``v``'s subtree that could feed ``v``, whose only outside parent path
    is blocked by a full link into ``u``, and free that link in other trees
    (:func:`_free_into`: a scan of every tree, at most :data:`FREE_TRIES` links, so a
    target that cannot be reached fails in bounded time).  Returns ``(trees, freed,
    scans)``: ``scans`` links tried, each a scan of every tree (the slice's work)."""
    p = T.via[t, v]
    m = T.mult[t]
    tries = FREE_TRIES
    for ai in range(P.into_start[v], P.into_start[v + 1]):
        q = P.into[ai]
        u = P.tail[q]
        if q == p or _climb(T, t, u, v, P, L) >= 0 or _room(q, p, m, P, L) <= 0:
            continue
        for bi in range(P.into_start[u], P.into_start[u + 1]):
            q1 = P.into[bi]
            if q1 == T.via[t, u] or _climb(T, t, P.tail[q1], v, P, L) < 0:
                continue
            if tries > 0 and _last_link_blocks(q1, P, L):
                tries -= 1
                b = P.links[P.start[q1 + 1] - 1]
                trees, freed = _free_into(T, num_trees, u, b, m, t, P, L)
                if trees < 0 or freed > 0:
                    return trees, freed, FREE_TRIES - tries
    return num_trees, 0, FREE_TRIES - tries


@njit(cache=True)
def _chain_work(v, P):
    """The candidate paths :func:`_chain` may weigh for rank ``v``: those into ``v`` and,
    for each, those into its tail."""
    work = 0
    for ai in range(P.into_start[v], P.into_start[v + 1]):
        u = P.tail[P.into[ai]]
        work += 1 + P.into_start[u + 1] - P.into_start[u]
    return work


@njit(cache=True)
def _chain_forecast(cand_v, P, load, cap):
    """The candidate paths the chain search may weigh (:func:`_chain_work`) for the
    crossing edges into ranks ``cand_v`` none of whose in-paths has room on every link
    (a first choice would take such a path; only where none has room the chains run)."""
    work = 0
    for v in cand_v:
        roomy = False
        for qi in range(P.into_start[v], P.into_start[v + 1]):
            q = P.into[qi]
            roomy = True
            for e in range(P.start[q], P.start[q + 1]):
                if load[P.links[e]] >= cap[P.links[e]]:
                    roomy = False
                    break
            if roomy:
                break
        if not roomy:
            work += _chain_work(v, P)
    return work


@njit(cache=True)
def _reroute_edges(T, num_trees, P, L, cand_t, cand_v, first, room_calls, max_work):
    """Move every candidate edge ``(t, v)`` from index ``first`` on whose path crosses
    an over-capacity link (module docstring).  First choice: a parent outside ``v``'s
    subtree taking the most of the multiplicity, then the shallowest (an ancestor edge
    still over capacity counts as deep).  A chain through ``v``'s subtree
    (:func:`_chain`) when there is no such parent or the chain leaves ``v`` shallower;
    when neither exists, room made for a chain in other trees (:func:`_make_room`, at
    most ``room_calls`` times: on a target that cannot be reached it would search every
    tree each time).  Splits the tree when only part of its multiplicity fits (a chain
    whose steps turn out to share a full link is undone).

    One *slice*: it stops after the first edge at which ``max_work`` candidate paths
    (counted as the searches could weigh them; :func:`_make_room` as every tree per link
    it tried to free: counted once, one slice made ~8 ms of its scans, half the warm
    allowance of a 128-GPU state, docs/allgather.md, *The warm allowance sized by this
    state's cold cost*) have
    been weighed, so that the caller can check the clock between slices; resuming at
    the returned index gives the moves of one unsliced call.  Returns ``(trees, moves,
    next index, room calls left, work)``; ``trees = -1`` when the split slots ran
    out."""
    moves = 0
    work = 0
    i = first
    while i < cand_t.size and work < max_work:
        t = cand_t[i]
        v = cand_v[i]
        i += 1
        made_room = False
        while _over(T.via[t, v], P, L):
            m = T.mult[t]
            work += P.into_start[v + 1] - P.into_start[v]
            q, room, depth = _best_parent(T, t, v, v, m, P, L, -1)
            q1, u1, q2, u2 = -1, -1, -1, -1
            if q < 0 or depth > 3:               # a chain: w -> (u2 ->) u1 -> v, u's below v
                work += _chain_work(v, P)
                c = _chain(T, t, v, m, P, L)
                if c[0] >= 0 and (q < 0 or c[6] < depth + 1):
                    q, u1, q1, u2, q2, room = c[0], c[1], c[2], c[3], c[4], c[5]
            if q < 0 and room_calls > 0 and not made_room:    # make room elsewhere, retry
                room_calls -= 1
                made_room = True
                scanned = num_trees
                num_trees, freed, scans = _make_room(T, num_trees, t, v, P, L)
                work += _chain_work(v, P) + max(1, scans) * scanned
                if num_trees < 0:
                    return -1, moves, i, room_calls, work
                if freed > 0:
                    moves += 1
                    continue
            if q < 0:
                break
            moved, num_trees = _take(T, num_trees, t, room)
            if moved < 0:
                return -1, moves, i, room_calls, work
            take = T.mult[moved]
            old_v, old_u1, old_u2 = T.via[moved, v], -1, -1
            if q2 >= 0:
                old_u2 = T.via[moved, u2]
                _move(T, L, moved, u2, q2, take, P)
            if q1 >= 0:
                old_u1 = T.via[moved, u1]
                _move(T, L, moved, u1, q1, take, P)
            _move(T, L, moved, v, q, take, P)
            if _over(q, P, L) or (q1 >= 0 and _over(q1, P, L)) or (q2 >= 0 and _over(q2, P, L)):
                # steps of a chain shared a link: undo, give up on this edge
                _move(T, L, moved, v, old_v, take, P)
                if q1 >= 0:
                    _move(T, L, moved, u1, old_u1, take, P)
                if q2 >= 0:
                    _move(T, L, moved, u2, old_u2, take, P)
                if moved != t:
                    T.mult[t] += take
                    num_trees -= 1
                break
            T.changed[moved] = True
            moves += 1
    return num_trees, moves, i, room_calls, work


@njit(cache=True)
def _crossing(via, p_start, p_links, over):
    """``(trees, ranks)`` of the tree edges whose path crosses a link marked ``over``."""
    bad = np.zeros(p_start.size - 1, np.bool_)
    for q in range(bad.size):
        for e in range(p_start[q], p_start[q + 1]):
            if over[p_links[e]]:
                bad[q] = True
    count = 0
    for t in range(via.shape[0]):
        for v in range(via.shape[1]):
            if via[t, v] >= 0 and bad[via[t, v]]:
                count += 1
    trees = np.empty(count, np.int64)
    ranks = np.empty(count, np.int64)
    i = 0
    for t in range(via.shape[0]):
        for v in range(via.shape[1]):
            if via[t, v] >= 0 and bad[via[t, v]]:
                trees[i], ranks[i] = t, v
                i += 1
    return trees, ranks


def _one_switch_paths(topo: Topology, heads: np.ndarray, table: SwitchPathTable
                      ) -> list[tuple[int, ...]]:
    """Every ``gpu -> switch -> head`` path into the head ranks (a mask over ranks)
    not in ``table``."""
    arr = topo.arrays
    g, s, h = _one_switch_candidates(arr.tail, arr.head, arr.is_switch, arr.rank_of, heads,
                                     np.sort(table.key), topo.num_nodes)
    return list(zip(g.tolist(), s.tolist(), h.tolist()))


@njit(cache=True)
def _one_switch_candidates(tail, head, is_switch, rank_of, heads, known, n):
    """``(gpus, switches, heads)`` of the paths ``g -> s -> h`` (links in index order,
    then ``g`` by the index of its link into ``s``) with ``heads[rank(h)]`` whose key
    ``(g·n + s)·n + h`` is not in the sorted ``known``."""
    count = np.zeros(n + 1, np.int64)          # GPU -> switch links, grouped by switch
    for a in range(tail.size):
        if rank_of[tail[a]] >= 0 and is_switch[head[a]]:
            count[head[a] + 1] += 1
    start = np.cumsum(count)
    fill = start[:-1].copy()
    up = np.empty(start[-1], np.int64)
    for a in range(tail.size):
        if rank_of[tail[a]] >= 0 and is_switch[head[a]]:
            up[fill[head[a]]] = tail[a]
            fill[head[a]] += 1
    out_g, out_s, out_h = [], [], []
    for a in range(tail.size):
        sw, h = tail[a], head[a]
        if not is_switch[sw] or rank_of[h] < 0 or not heads[rank_of[h]]:
            continue
        for i in range(start[sw], start[sw + 1]):
            g = up[i]
            key = (g * n + sw) * n + h
            j = np.searchsorted(known, key)
            if g != h and (j == known.size or known[j] != key):
                out_g.append(g)
                out_s.append(sw)
                out_h.append(h)
    return np.array(out_g, np.int64), np.array(out_s, np.int64), np.array(out_h, np.int64)


def _with_neighbours(topo: Topology, ranks: np.ndarray) -> np.ndarray:
    """Mask over ranks: the ranks and every rank one switch away from them (two-step
    moves need those)."""
    arr = topo.arrays
    mark = np.zeros(topo.num_nodes, bool)
    mark[arr.gpu_nodes[ranks]] = True
    switches = np.zeros(topo.num_nodes, bool)
    switches[arr.tail[mark[arr.head] & arr.is_switch[arr.tail]]] = True
    mark[arr.tail[switches[arr.head]]] = True
    return mark[arr.gpu_nodes]



def reroute(forest: PhysicalForest, topo: Topology, cap_q: np.ndarray, k: int,
            target: Fraction, cold_s: float | None = None, spent_s: float = 0.0
            ) -> Rerouted | None:
    """``forest``, requantized to ``k`` unit trees per root, rerouted to carry
    ``target`` (quanta per root) on capacities ``cap_q`` (quanta per link of ``topo``,
    which must have the forest's nodes and links), or ``None`` if some link stays over
    capacity (module docstring).  ``cold_s``: the cold solve's CPU seconds where better
    known than :func:`predicted_cold_seconds` (:func:`calibrated_cold_seconds`);
    ``spent_s``: CPU seconds the solve's warm steps spent before this call: the passes
    stop (:class:`RerouteCostlier`) once they and those reach the cap, one budget for
    the whole warm path (the floor :data:`REROUTE_FLOOR_S` is rerouting's own, where
    the 20 ms target leaves room); the forecast alone is held to the whole cap (a
    forecast high by the seconds spent declined HPN 1x16x8 after Fail3, rerouted in
    4 ms against a 17 ms cold solve)."""
    forest = requantized(forest, k)
    unit = target / forest.k
    if int(cap_q.max()) * unit.denominator >= 1 << 62:
        return None                     # unit counts beyond int64: let Phase 3 decide
    cap = (cap_q * unit.denominator) // unit.numerator
    table = forest.paths
    load = unit_loads(forest.via, forest.mults, table.start, table.links, topo.num_links)
    over = load > cap
    if not over.any():                  # the (requantized) previous trees already fit
        return Rerouted(forest, load / forest.k, 0, 0)
    cand_t, cand_v = _crossing(forest.via, table.start, table.links, over)
    # candidate paths into the affected ranks and their one-switch neighbours
    heads = _with_neighbours(topo, cand_v)
    table = table.extended(_one_switch_paths(topo, heads, table), topo)
    paths = _candidate_paths(table, heads, topo.num_gpus)

    trees = forest.roots.size
    reroute_s, cold_k = predicted_seconds(paths, cand_v, Units(load, cap), trees, k,
                                          topo.num_gpus)
    cold_s = cold_k if cold_s is None else min(cold_s, cold_k)
    cap_s = max(REROUTE_FLOOR_S, REROUTE_COLD_SHARE * cold_s)
    if reroute_s > cap_s:
        raise RerouteCostlier(f"rerouting {trees} previous trees is predicted at {reroute_s:.2g} s "
                              f"CPU, a cold solve at {cold_s:.2g} s")
    cpu_by = time.thread_time() + max(REROUTE_FLOOR_S, REROUTE_COLD_SHARE * cold_s - spent_s)
    # splits divide multiplicities (at most k·N trees) and memory caps the slots; a
    # first try leaves room for a quarter more trees, a second (same moves, as the
    # kernels are deterministic) runs only if those slots ran out
    most = min(forest.k * topo.num_gpus, 2 * trees + 4 * topo.num_gpus)
    for slots in sorted({min(most, trees + max(64, trees // 4)), most}):
        units = Units(load.copy(), cap)
        work, trees, moves = _edit(forest, paths, table, units, cand_t, cand_v, heads, slots,
                                   cpu_by)
        if trees >= 0:
            break
    if trees < 0 or (units.load > cap).any():
        return None
    # the forest keeps the work arrays unless a quarter or more of their slots is idle
    own = (lambda a: a[:trees]) if 4 * trees >= 3 * slots else (lambda a: a[:trees].copy())
    new = rebuilt(forest, table, own(work.parent), own(work.via), own(work.mult),
                  own(work.roots), work.changed[:trees])
    return Rerouted(new, units.load / forest.k, moves, int(work.changed[:trees].sum()))


def predicted_seconds(paths: Paths, cand_v: np.ndarray, units: Units, trees: int, k: int,
                      n: int) -> tuple[float, float]:
    """``(rerouting, cold)`` predicted CPU seconds: the passes' first choices weigh every
    candidate path into each crossing edge's head (:data:`REROUTE_S_PER_PATH`), the
    chains, where no such path has room on ``units``, those and the paths into their
    tails (:func:`_chain_forecast`, :data:`REROUTE_S_PER_CHAIN_PATH`), over
    ``trees x n`` slots (:data:`REROUTE_S_PER_SLOT`); cold packs ``k`` trees per root
    (:data:`COLD_S_PER_ENTRY` per ``k·n²``).  Rerouting's work scales with the previous
    schedule and its damage, cold's with this state's budget."""
    start = paths.into_start
    first = int((start[cand_v + 1] - start[cand_v]).sum())
    chain = _chain_forecast(cand_v, paths, units.load, units.cap)
    return (first * REROUTE_S_PER_PATH + chain * REROUTE_S_PER_CHAIN_PATH
            + trees * n * REROUTE_S_PER_SLOT, predicted_cold_seconds(k, n))


def predicted_cold_seconds(k: int, n: int) -> float:
    """A cold ForestColl solve's predicted CPU seconds: ``k`` trees per root of ``n``
    GPUs packed (:data:`COLD_S_PER_ENTRY` per ``k·n²``)."""
    return k * n * n * COLD_S_PER_ENTRY


def calibrated_cold_seconds(k: int, n: int, previous: Schedule | None) -> float | None:
    """The cold solve's CPU seconds at ``k`` trees per root of ``n`` GPUs, scaled from the
    previous schedule's measured cold solve (``report.cold_cpu`` at ``k_prev``, the
    unit trees per root of its kept ForestColl trees, on as many GPUs) by ``k / k_prev``, never above it; ``None`` unless that
    schedule was solved cold here (its ``k`` and cold seconds are of one solve).  The
    ``k·n²`` prediction misses Phase 2 at small ``k`` and overestimates the plain repair
    packing at large ``k`` (leaf-spine 2x2x8 one-way, fuzz seed 3413: 0.15 s predicted
    at ``k = 301``, cold 0.09 s CPU); the previous solve measured the same fabric family
    (docs/allgather.md, *Rerouting sized by the previous cold solve*)."""
    report = previous.report if isinstance(previous, Schedule) else None
    state = previous.warm_state if report is not None else None
    k_prev = state.trees.k if isinstance(state, AllGatherWarmState) and state.trees is not None \
        else None
    if report is None or report.cold_cpu is None or not isinstance(k_prev, (int, np.integer)) \
            or k_prev <= 0 or report.warm not in (WarmUse.COLD, WarmUse.DECLINED) \
            or len(previous.gpus) != n:
        return None
    return report.cold_cpu * min(1.0, k / k_prev)


def _edit(forest: PhysicalForest, paths: Paths, table: SwitchPathTable, units: Units,
          cand_t: np.ndarray, cand_v: np.ndarray, heads: np.ndarray,
          slots: int, cpu_by: float) -> tuple[Trees, int, int]:
    """The passes of :func:`_reroute_edges` on a copy of ``forest`` with room for
    ``slots`` trees, until this thread's CPU clock reaches ``cpu_by`` (then
    :class:`RerouteCostlier`): ``(trees, tree count, moves)``, the count ``-1`` when
    the slots ran out; ``units.load`` is updated."""
    trees = forest.roots.size
    n = forest.parent.shape[1]
    work = Trees(np.empty((slots, n), np.int32), np.empty((slots, n), np.int32),
                 np.zeros(slots, np.int64), np.zeros(slots, np.int64), np.zeros(slots, bool))
    work.parent[:trees], work.via[:trees] = forest.parent, forest.via
    work.mult[:trees], work.roots[:trees] = forest.mults, forest.roots
    moves = 0
    for _ in range(REROUTE_PASSES):     # a later pass finds room earlier moves made
        trees, done = _pass(work, trees, paths, units, cand_t, cand_v, cpu_by)
        moves += done
        over = units.load > units.cap
        if trees < 0 or done == 0 or not over.any():
            break
        cand_t, cand_v = _crossing(work.via[:trees], table.start, table.links, over)
        if not heads[cand_v].all():
            break
    return work, trees, moves


def _pass(work: Trees, trees: int, paths: Paths, units: Units, cand_t: np.ndarray,
          cand_v: np.ndarray, cpu_by: float) -> tuple[int, int]:
    """One pass of :func:`_reroute_edges` over the candidates, in slices of
    :data:`REROUTE_SLICE_WORK` candidate paths with the clock checked before each
    (:func:`mccl_opt.anytime.check`): a warm stage's allowance passing abandons the
    rerouting within one slice, where one compiled pass ran up to ~1 s past it
    (docs/allgather.md, *Warm never slower than cold*), and :class:`RerouteCostlier`
    once this thread's CPU clock passes ``cpu_by``.  Returns ``(trees, moves)``."""
    first, room_calls, moves = 0, MAKE_ROOM_CALLS, 0
    while first < cand_t.size and trees >= 0:
        anytime.check("ForestColl-warm: rerouting")
        if time.thread_time() > cpu_by:
            raise RerouteCostlier(f"rerouting and the warm steps before it (spent warm) passed "
                                  f"{REROUTE_COLD_SHARE:g} x the predicted cold solve's CPU "
                                  f"seconds (at least {REROUTE_FLOOR_S:g} s)")
        trees, done, first, room_calls, _ = _reroute_edges(
            work, trees, paths, units, cand_t, cand_v, first, room_calls, REROUTE_SLICE_WORK)
        moves += done
    return trees, moves


def _candidate_paths(table: SwitchPathTable, heads: np.ndarray, num_gpus: int) -> Paths:
    """The kernels' view of ``table``: every path, and those into the ``heads`` ranks
    grouped by head rank."""
    into = np.flatnonzero(heads[table.head])
    into = into[np.argsort(table.head[into], kind="stable")]
    into_start = np.zeros(num_gpus + 1, np.int64)
    np.cumsum(np.bincount(table.head[into], minlength=num_gpus), out=into_start[1:])
    return Paths(table.start, table.links, table.tail, into_start, into)
