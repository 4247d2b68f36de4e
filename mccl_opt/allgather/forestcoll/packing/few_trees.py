"""Phase 3's compiled exact packer for few trees per root (paper §4.3; Lovász's proof of
Edmonds' branching theorem).

The fast packers (:mod:`.repair`, :func:`.trees.greedy_pack`) can miss a packing that
exists: on a leaf-spine whose GPUs' NIC links are *narrow* (leaf-spine 8x2x4 with 4
spines: one tree per root, and every host's NIC ingress holds exactly one unit per tree
of another host) every tree must enter every other host exactly once, and a local
augmenting chain only moves the link into one vertex, never which vertex of a host a
tree enters.  Lovász's growth is exact there, but :mod:`.exact_packing` builds a network
with a node per class and its members for every extension (18 s at 64 GPUs).

Here the trees grow as *classes* (a root's partial arborescence with a multiplicity), one
class after another, so while class ``j`` grows every other class is finished (it meets
every GPU set) or unstarted (its root alone): the rooted condition of the partial
packing, ``units(δ⁻(S)) >= #{unstarted trees with root outside S}`` for every GPU set
``S``, reduces to a max-flow on the logical graph itself with ``s -> r`` of capacity the
unstarted trees at ``r``.  ``a`` copies of class ``j`` may take a link ``u -> v`` iff no
set ``S ∋ v``, ``u ∉ S`` has slack below ``a``, i.e. iff the max-flow from ``{s, u}`` to
``v`` reaches ``P + a`` (``P`` unstarted trees).  Where only ``a < mult`` copies fit, the
other copies give their links back and return to the unstarted trees of their root
(ForestColl would split them off as a second partial class, which needs a node per
class in the network); that never breaks the condition, as each such copy crossed every
set it met.  A set that does not meet ``R_j`` always has slack ``>= mult``, and a tight
one stays tight while ``j`` grows, so every failed check's sink side rules out all links
into it for the rest of ``j``'s growth (until copies are given back).  Links with room
for every copy are scanned first, and there a link that admits only some copies is passed
over (its check's sink side, slack below ``mult``, rules out the links into it for that
scan) so a class splits only where no link takes all its copies (leaf-spine 4x2x8 with a
NIC at 360 Gbps one way: 182 -> 175 classes, 13 469 -> 12 957 max-flows).  One small
max-flow per class edge tried, hence a budget of max-flows.

A check is decided without its max-flow where a flow on paths of at most three links
already reaches ``P + a`` (:func:`_short_paths_flow`: ``s -> v``, ``u -> v``, through
every other GPU ``w`` the units of ``w -> v`` fed by ``s -> w`` and ``u -> w``, then
``x -> w -> v`` from the feed ``x`` has left; the arcs' units are never exceeded).  A
flow is a lower bound on the max-flow, so the max-flow would return ``a``: the same
decisions and trees at ``O(n²)`` instead of a max-flow (dragonfly 4x4x1x8, one tree per
root: 18 115 -> 6 496 max-flows, of which ~1 860 fail).

Before growing, the graph is split along its disjoint tight sets (:mod:`.contraction`:
an outer packing with each set contracted and one inner packing per set, recursively), so
which link a tree enters a group by (a dragonfly's global cables) is decided on the small
outer graph: dragonfly 4x4x1x8, 1.1 -> 0.25 s for the packing.  The growth below packs
any vector of roots per node (``Problem.roots``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from numba import njit

from mccl_opt import anytime
from ..maxflow import INF, FlowNetwork, _bfs_levels, _dinic
from ..removal.splitting import LogicalGraph, SplitGraph, split_all
from .contraction import CONTRACT_MIN_GPUS, Problem, decompose, tight_sets
from .trees import TreeClass

__all__ = ["few_trees_pack", "few_trees_on_splits", "FEW_TREES_MAX_CHECKS",
           "FEW_TREES_CHECKS_PER_N2", "FEW_TREES_CHEAP_ENTRIES"]

#: max-flows (one per class edge tried) before the packing gives up: ~27 µs each at 64
#: GPUs on the 2-core machine, so ~0.3 s
FEW_TREES_MAX_CHECKS = 10_000

#: max-flows :func:`few_trees_on_splits` may run per ``n²`` (GPUs squared): one per
#: class edge tried, ~30-60 µs each at 64 GPUs (2-core machine); leaf-spine 8x2x4 with 4
#: spines (one tree per root) needs ~5 100, leaf-spine 4x2x8 with one NIC at 360 Gbps one
#: way (its balanced restriction: 583 trees per root, 182 classes) 13 469
FEW_TREES_CHECKS_PER_N2 = 4

#: with a chunk budget (fewer chunks are tried where the packing fails, within 5 % of the
#: optimum) the few-trees packing runs only up to this many entries ``k·n²``: leaf-spine
#: 6x2x8 with 4 spines at K=10 packs 7 trees per root exactly in 15 000 max-flows (1.4 s
#: CPU) where 2 trees per root (0.1 % below) take 0.19 s; 8x2x8: 27 000 (3.4 s) vs 0.65 s
FEW_TREES_CHEAP_ENTRIES = 1 << 14

#: tight sets remembered while one tree grows (each rules out the links entering it)
MAX_TIGHT_SETS = 64


@njit(cache=True)
def _check(u, v, want, p_left, n, m, cap, unstarted, start, arcs, rhead, res, level, queue,
           it, path):
    """How many copies of the growing class may take ``u -> v`` (at most ``want``): the
    max-flow from ``{s, u}`` (``s -> r``: the unstarted trees at ``r``) to ``v``, less
    the ``p_left`` unstarted trees; ``<= 0`` when a set ``S ∋ v``, ``u ∉ S`` is tight."""
    for b in range(m):
        res[2 * b] = cap[b]
        res[2 * b + 1] = 0
    for x in range(n):
        res[2 * (m + x)] = unstarted[x]
        res[2 * (m + x) + 1] = 0
        res[2 * (m + n + x)] = 0
        res[2 * (m + n + x) + 1] = 0
    res[2 * (m + u)] = INF
    res[2 * (m + n + v)] = INF
    return _dinic(n + 2, start, arcs, rhead, res, n, n + 1, p_left + want, level, queue, it,
                  path) - p_left


@njit(cache=True)
def _short_paths_flow(u, v, n, pair, unstarted, want, left, short):
    """A flow from ``{s, u}`` to ``v`` on paths of at most three links (a lower bound on
    the check's max-flow, module doc), stopped once it reaches ``want``.  Two links:
    ``s -> v``, ``u -> v``, and through every other GPU ``w`` the units of ``w -> v`` fed
    by ``s -> w`` and ``u -> w``; then each ``w -> v`` still short is fed by ``x -> w``
    from the feed ``x`` has left.  ``left``, ``short``: scratch of ``n``."""
    total = unstarted[v] + pair[u, v]
    for w in range(n):
        left[w] = 0
        short[w] = 0
        if w != u and w != v:
            feed = unstarted[w] + pair[u, w]
            used = min(pair[w, v], feed)
            total += used
            left[w] = feed - used
            short[w] = pair[w, v] - used
    for w in range(n):
        if total >= want:
            break
        if short[w] > 0:
            for x in range(n):
                if left[x] > 0 and x != w and pair[x, w] > 0:
                    push = min(short[w], left[x], pair[x, w])
                    short[w] -= push
                    left[x] -= push
                    total += push
                    if short[w] == 0:
                        break
    return total


@njit(cache=True)
def _grow_class(r, mult, n, m, l_tail, l_head, pair, left, short, out_start, out_arc, cap,
                unstarted, start, arcs, rhead, res, level, queue, it, path, row, tight,
                tight_slack, member, order, checks):
    """Grow a class of ``mult`` trees of root ``r`` edge by edge (module doc) into ``row``
    (the link into each rank); returns its final multiplicity: where a link admits only
    ``a < mult`` copies, the other copies give their links back and return to the
    unstarted trees of ``r``.  0 when stuck or past ``checks[1]`` max-flows."""
    p_left = 0
    for x in range(n):
        p_left += unstarted[x]
        member[x] = False
        row[x] = -1
    member[r] = True
    order[0] = r
    count = 1
    n_tight = 0
    while count < n:
        found = -1
        amount = 0
        for wide in (True, False):           # links with room for every copy first
            for i in range(count):
                u = order[i]
                for p in range(out_start[u], out_start[u + 1]):
                    a = out_arc[p]
                    v = l_head[a]
                    if member[v] or cap[a] == 0 or (wide and cap[a] < mult):
                        continue
                    need = mult if wide else 1
                    ruled = False
                    for c in range(n_tight):
                        if tight_slack[c] < need and tight[c, v] and not tight[c, u]:
                            ruled = True
                            break
                    if ruled:
                        continue
                    want = min(mult, cap[a])
                    if _short_paths_flow(u, v, n, pair, unstarted, p_left + want, left,
                                         short) >= p_left + want:
                        amount = want                # every check cut passes (module doc)
                    else:
                        checks[0] += 1
                        if checks[0] > checks[1]:
                            return 0
                        amount = _check(u, v, want, p_left, n, m, cap, unstarted, start,
                                        arcs, rhead, res, level, queue, it, path)
                    if amount >= need and (amount == mult or not wide):
                        found = a
                        break
                    if n_tight < tight.shape[0]:   # the sink side's slack only falls
                        _bfs_levels(n + 2, start, arcs, rhead, res, n, -1, level, queue)
                        for x in range(n):
                            tight[n_tight, x] = level[x] < 0
                        tight_slack[n_tight] = amount
                        n_tight += 1
                if found >= 0:
                    break
            if found >= 0:
                break
        if found < 0:
            return 0
        if amount < mult:                    # the rest start again later
            back = mult - amount
            for i in range(1, count):
                cap[row[order[i]]] += back
                pair[l_tail[row[order[i]]], order[i]] += back
            unstarted[r] += back
            p_left += back
            mult = amount
            n_tight = 0                      # given-back units may loosen tight sets
        cap[found] -= mult
        pair[l_tail[found], l_head[found]] -= mult
        v = l_head[found]
        row[v] = found
        member[v] = True
        order[count] = v
        count += 1
    return mult


def few_trees_pack(n: int, tail: np.ndarray, head: np.ndarray, units: np.ndarray, k: int,
                   max_checks: int | None = None, info: dict[str, Any] | None = None
                   ) -> list[TreeClass] | None:
    """``k`` trees per root on the logical graph by the compiled Lovász growth (module
    doc), split first along tight sets (:mod:`.contraction`), as tree classes; ``None``
    when a class gets stuck (the graph fails the rooted cut condition for ``k``) or after
    ``max_checks`` max-flows (default :data:`FEW_TREES_MAX_CHECKS`;
    ``info["few_trees_checks"]``: how many ran, the tight-set searches' included).  Every
    link stays within its units by construction.  Under a limit (a warm stage's
    allowance, the solve's ``time_limit``) the clock is checked before each class (at most
    ``n`` max-flows, ~2-5 ms at 64 GPUs)."""
    info = {} if info is None else info
    if n < 2:
        return None
    units = np.asarray(units, np.int64)
    problem = Problem(n, np.asarray(tail, np.int64), np.asarray(head, np.int64), units,
                      np.full(n, k, np.int64), np.arange(units.size, dtype=np.int64))
    checks = np.array([0, FEW_TREES_MAX_CHECKS if max_checks is None else max_checks], np.int64)
    classes = _pack(problem, checks)
    info["few_trees_checks"] = int(checks[0])
    return classes


def _pack(p: Problem, checks: np.ndarray) -> list[TreeClass] | None:
    """``p``'s packing: along its tight sets where it has some (an outer and an inner
    packing each, recursively: :mod:`.contraction`), else grown class by class."""
    if p.n >= CONTRACT_MIN_GPUS:
        anytime.check("Phase 3: the few-trees packing, tight sets")
        sets = tight_sets(p, checks)
        if sets is None or checks[0] > checks[1]:
            return None
        if sets:
            dec = decompose(p, sets)
            parts = []
            for q in [dec.outer, *dec.inners]:
                part = _pack(q, checks)
                if part is None:
                    return None
                parts.append(part)
            return dec.combine(parts[0], parts[1:])
    return _grow(p, checks)


def _grow(p: Problem, checks: np.ndarray) -> list[TreeClass] | None:
    """``p``'s packing grown class by class (module doc)."""
    n, tail, head = p.n, p.tail, p.head
    # a vertex's wide links first: a class fans out over them and keeps narrow units
    out_arc = np.lexsort((-p.units, tail)).astype(np.int64)
    out_start = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(tail, minlength=n), out=out_start[1:])
    net = FlowNetwork(n, tail, head)
    cap = p.units.copy()
    unstarted = p.roots.copy()
    pair = np.zeros((n, n), np.int64)        # units left from GPU to GPU, parallel links summed
    np.add.at(pair, (tail, head), cap)
    left, short = np.zeros(n, np.int64), np.zeros(n, np.int64)
    tight = np.zeros((MAX_TIGHT_SETS, n), np.bool_)
    tight_slack = np.zeros(MAX_TIGHT_SETS, np.int64)
    member = np.zeros(n, np.bool_)
    order = np.zeros(n, np.int64)
    classes: list[TreeClass] = []
    for r in range(n):
        while unstarted[r] > 0:
            anytime.check("Phase 3: the few-trees packing, before a class")
            mult, unstarted[r] = int(unstarted[r]), 0
            row = np.empty(n, np.int64)
            got = _grow_class(r, mult, n, tail.size, tail, head, pair, left, short,
                              out_start, out_arc, cap, unstarted, net._start, net._arcs,
                              net._head, net._res, net._level, net._queue, net._it,
                              net._path, row, tight, tight_slack, member, order, checks)
            if got == 0:
                return None
            classes.append(TreeClass(r, got, row))
    return classes


def few_trees_on_splits(split: SplitGraph, rank_of: np.ndarray, k: int, stats: dict[str, Any],
                        lg: LogicalGraph) -> tuple[LogicalGraph, list[TreeClass]] | None:
    """A few-trees packing of ``k`` trees per root: first on ``lg`` (the spread or guarded
    split) when ``k·n²`` is at most :data:`FEW_TREES_CHEAP_ENTRIES`, within ``2·n²``
    max-flows (one tree per root: ``n`` classes, ~``n²`` max-flows; leaf-spine 8x2x4 with 4
    spines, guarded split: 4 459, 0.09 s), then on the exact split's logical graph of
    ``split`` (left as it is) within ``FEW_TREES_CHECKS_PER_N2 · n²``; that graph and its
    packing, or ``None``.  The exact split for many trees per root: its few wide links keep
    the classes few (leaf-spine 4x2x8 with a spine cable at 80 Gbps, 7 trees per root: 92
    classes, 7 233 max-flows, 0.13 s, where the spread split's 1 976 thin links need 394
    classes and 27 511 max-flows, 1.2-2.7 s).  ``stats``: ``few_trees_checks``,
    ``few_trees_s`` (both attempts)."""
    t = time.perf_counter()
    n = lg.num_gpus
    found, first = None, 0
    if k * n * n <= FEW_TREES_CHEAP_ENTRIES:
        classes = few_trees_pack(n, lg.tail, lg.head, lg.units, k, 2 * n * n, stats)
        found = None if classes is None else (lg, classes)
        first = stats.get("few_trees_checks", 0)
    if found is None:
        g = split.copy()
        if split_all(g):
            exact = LogicalGraph.from_split(g, rank_of)
            classes = few_trees_pack(n, exact.tail, exact.head, exact.units, k,
                                     FEW_TREES_CHECKS_PER_N2 * n * n, stats)
            found = None if classes is None else (exact, classes)
            stats["few_trees_checks"] = stats.get("few_trees_checks", 0) + first
    stats["few_trees_s"] = time.perf_counter() - t
    return found
