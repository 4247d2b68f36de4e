"""Phase 3's compiled exact packer for few trees per root (paper §4.3; Lovász's proof of
Edmonds' branching theorem).

The fast packers (:mod:`.repair`, :func:`.trees.greedy_pack`) can miss a packing that
exists: on a leaf-spine whose GPUs' NIC links are *narrow* (leaf-spine 8x2x4 with 4
spines: one tree per root, and every host's NIC ingress holds exactly one unit per tree
of another host) every tree must enter every other host exactly once, and a local
augmenting chain only moves the link into one vertex, never which vertex of a host a
tree enters.  Lovász's growth is exact there, but :mod:`.exact_packing` builds a network
with a node per class and its members for every extension (18 s at 64 GPUs).

Here the trees grow as *classes* (a root's partial arborescence with a multiplicity;
:mod:`.class_growth` grows one), one class after another, so while class ``j`` grows
every other class is finished (it meets every GPU set) or unstarted (its root alone):
the rooted condition of the partial
packing, ``units(δ⁻(S)) >= #{unstarted trees with root outside S}`` for every GPU set
``S``, reduces to a max-flow on the logical graph itself with ``s -> r`` of capacity the
unstarted trees at ``r``.  ``a`` copies of class ``j`` may take a link ``u -> v`` iff no
set ``S ∋ v``, ``u ∉ S`` has slack below ``a``, i.e. iff the max-flow from ``{s, u}`` to
``v`` reaches ``P + a`` (``P`` unstarted trees).  Where only ``a < mult`` copies fit, the
other copies give their links back and return to the unstarted trees of their root
(ForestColl would split them off as a second partial class, which needs a node per
class in the network); that never breaks the condition, as each such copy crossed every
set it met.  Links with room for every copy are tried first, and there a link that
admits only some copies is passed over, so a class splits only where no link takes all
its copies.

**Unchecked links, verified in batches** (docs/allgather_history.md "Few-trees packing: checks
in batches").  On a tight graph (every rank's in-units exactly the trees still owed to
it: the exact split of a balanced fabric whose single-GPU cut is the optimum) a check is
a max-flow of ``P`` units that must saturate every link into ``v``, and leaf-spine 8x2x8
with 4 spines ran 28 400 of them (~3 s).  Four in five pass, and the failures are the
same few sets class after class (half-hosts, hosts, leaves and their unions).  So a
failed check's sink side is *remembered* for the whole packing with its exact slack
(``units(δ⁻(S))`` less the unstarted trees rooted outside ``S``: updated as links are
taken or given back, recomputed when a class starts or splits), and a link into a
remembered set whose slack is below the copies is ruled out without a max-flow
(exact: that set would fail the check).  A class then takes the links the checked scan
would take were every check to pass (members newest first, so it fills the host it has
just entered before leaving it), and the links taken since the last verified state are
verified at once by one rooted sweep (:func:`.growth_checks._verify`: one flow repaired from sink to
sink over the ranks they entered; a node fed the class's copies with an arc to each of
its ranks, so a set meeting the class is owed nothing more by it): a set broken by the
batch holds the head of the batch's last link into it, so those sinks suffice.  A failed
sweep's cut is remembered and the class goes back to before its first link into it;
where no unchecked link is left, one link is taken by checks as before.  Every state
kept passed a check or a sweep, so the packing is Lovász's, exact.  Leaf-spine 8x2x8:
28 412 max-flows (3.0 s) -> 225 max-flows and 414 sweeps (0.9-1.0 s).

A check is decided without its max-flow where a flow on paths of at most three links
already reaches ``P + a`` (:func:`.growth_checks._short_paths_flow`: ``s -> v``, ``u -> v``, through
every other GPU ``w`` the units of ``w -> v`` fed by ``s -> w`` and ``u -> w``, then
``x -> w -> v`` from the feed ``x`` has left; the arcs' units are never exceeded).  A
flow is a lower bound on the max-flow, so the max-flow would return ``a``: the same
decisions and trees at ``O(n²)`` instead of a max-flow (dragonfly 4x4x1x8, one tree per
root: 18 115 -> 6 496 max-flows, of which ~1 860 fail).

**Classes in lazy batches** (docs/allgather_history.md "Few-trees packing: classes in lazy
batches").  Once classes are complete, the packing's state is sound iff the units left
still admit the unstarted trees (Edmonds' theorem: the rooted cut condition for the
unstarted roots alone), which one rooted sweep over every rank decides.  So classes grow
*lazily* (no sweep once complete; the sweep before a checked link stays) in batches of
:data:`LAZY_FIRST_BATCH` up to :data:`LAZY_MAX_BATCH` classes, and one sweep verifies a
whole batch; where it fails (its cut is remembered) or a lazy class gets stuck, the batch
is rolled back and tried again at half the size, and a single class that fails grows as
above, with its own sweeps, from a verified state: exact (after ``j`` such failures in a
row, the next ``2^j`` classes grow so, which bounds the sweeps wasted where lazy classes
keep failing).  A dragonfly group packed inside its tight set (33 nodes, 128 classes of
one tree, each swept over its 32 ranks: those sweeps were ~90 % of the packing) needs
~15-20 batch sweeps (dragonfly 4x4x1x8 guarded split: 0.85 -> 0.21-0.27 s).

Before growing, the graph is split along its disjoint tight sets (:mod:`.contraction`:
an outer packing with each set contracted and one inner packing per set, recursively), so
which link a tree enters a group by (a dragonfly's global cables) is decided on the small
outer graph: dragonfly 4x4x1x8, 1.1 -> 0.25 s for the packing; on a tight graph, along its
largest tight sets (leaf-spine 8x2x8 with 4 spines: 1.0 -> 0.07 s).  The growth below packs
any vector of roots per node (``Problem.roots``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mccl_opt import anytime
from ..maxflow import FlowNetwork, _bfs_levels
from ..removal.exact_split import split_all
from ..removal.splitting import LogicalGraph, SplitGraph, sink_ranks
from .contraction import (CONTRACT_MIN_GPUS, Decomposition, Problem, decompose,
                          proper_tight_sets)
from .class_growth import SINKS_PER_CHECK, _grow_class
from .growth_checks import _verify
from .remembered_sets import _remember
from .trees import TreeClass

__all__ = ["few_trees_pack", "few_trees_on_splits", "FEW_TREES_MAX_CHECKS",
           "FEW_TREES_CHECKS_PER_N2", "FEW_TREES_CHEAP_ENTRIES"]

#: max-flows (one per class edge tried) before the packing gives up (~27 µs each at 64 GPUs)
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

#: tight sets remembered over the whole packing (each, while its slack is below a class's
#: multiplicity, rules out the links entering it from outside)
MEMORY_SETS = 256

#: classes grown lazily (no sweep while they grow) before the first sweep over every rank
#: verifies them at once; doubled after a sweep that passes up to :data:`LAZY_MAX_BATCH`,
#: halved after one that fails (the batch is rolled back and grown again; a single class
#: that fails grows with its own sweeps)
LAZY_FIRST_BATCH = 2
LAZY_MAX_BATCH = 32


def few_trees_pack(n: int, tail: np.ndarray, head: np.ndarray, units: np.ndarray, k: int,
                   max_checks: int | None = None, info: dict[str, Any] | None = None,
                   near: np.ndarray | None = None) -> list[TreeClass] | None:
    """``k`` trees per root on the logical graph by the compiled Lovász growth (module
    doc), split first along tight sets (:mod:`.contraction`), as tree classes; ``None``
    when a class gets stuck (the graph fails the rooted cut condition for ``k``) or after
    ``max_checks`` max-flows (default :data:`FEW_TREES_MAX_CHECKS`;
    ``info["few_trees_checks"]``: how many ran, the tight-set searches' included, a
    verification sweep counted as one per :data:`SINKS_PER_CHECK` sinks).  Every link
    stays within its units by construction.  ``near``: the ranks in the sweeps' sink
    order (rank order when ``None``, and in the parts of a tight-set split;
    :func:`few_trees_on_splits` passes the split's
    :func:`~..removal.splitting.sink_order`, hosts together).  Under a limit (a warm
    stage's allowance, the solve's ``time_limit``) the clock is checked before each class
    (at most ``n`` max-flows, ~2-5 ms at 64 GPUs)."""
    info = {} if info is None else info
    if n < 2:
        return None
    units = np.asarray(units, np.int64)
    problem = Problem(n, np.asarray(tail, np.int64), np.asarray(head, np.int64), units,
                      np.full(n, k, np.int64), np.arange(units.size, dtype=np.int64))
    # max-flows run, their budget, lazy batches swept, those rolled back
    checks = np.array([0, FEW_TREES_MAX_CHECKS if max_checks is None else max_checks, 0, 0],
                      np.int64)
    classes = _pack(problem, checks, near)
    info["few_trees_checks"] = int(checks[0])
    info["few_trees_batches"], info["few_trees_rollbacks"] = int(checks[2]), int(checks[3])
    return classes


def _pack(p: Problem, checks: np.ndarray, near: np.ndarray | None
          ) -> list[TreeClass] | None:
    """``p``'s packing: along its tight sets where it has some (an outer and an inner
    packing each, recursively: :mod:`.contraction`; their sweeps in the order
    :func:`_part_orders` keeps from ``near``), else grown class by class with the sweeps
    in ``near``'s order (rank order when ``None``)."""
    if p.n >= CONTRACT_MIN_GPUS:
        anytime.check("Phase 3: the few-trees packing, tight sets")
        sets = proper_tight_sets(p, checks)
        if sets is None or checks[0] > checks[1]:
            return None
        if sets:
            dec = decompose(p, sets)
            parts = []
            for q, order in zip([dec.outer, *dec.inners], _part_orders(dec, near)):
                part = _pack(q, checks, order)
                if part is None:
                    return None
                parts.append(part)
            return dec.combine(parts[0], parts[1:])
    return _grow(p, checks, near)


def _part_orders(dec: Decomposition, near: np.ndarray | None) -> list[np.ndarray | None]:
    """The sweeps' sink orders of ``dec``'s outer and inner problems kept from ``near``
    (the problem's): a set's nodes, and the outer nodes by their first member, in
    ``near``'s order, each inner ``O`` last; all ``None`` (rank order) when ``near`` is."""
    if near is None:
        return [None] * (1 + len(dec.sets))
    pos = np.empty(dec.problem.n, np.int64)
    pos[near] = np.arange(near.size)
    first = np.array([pos[s].min() for s in dec.sets] + pos[dec.single[len(dec.sets):]].tolist(),
                     np.int64)
    return [np.argsort(first, kind="stable")] + \
        [np.append(np.argsort(pos[s], kind="stable"), s.size) for s in dec.sets]


def _grow(p: Problem, checks: np.ndarray, near: np.ndarray | None) -> list[TreeClass] | None:
    """``p``'s packing grown class by class (module doc)."""
    n, tail, head = p.n, p.tail, p.head
    # a vertex's wide links first: a class fans out over them and keeps narrow units
    out_arc = np.lexsort((-p.units, tail)).astype(np.int64)
    out_start = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(tail, minlength=n), out=out_start[1:])
    in_arc = np.argsort(head, kind="stable").astype(np.int64)
    in_start = np.zeros(n + 1, np.int64)
    np.cumsum(np.bincount(head, minlength=n), out=in_start[1:])
    net = FlowNetwork(n, tail, head)
    # the verification network: node n (ρ) fed the class's copies, an arc to every rank
    vnet = FlowNetwork(n + 1, np.concatenate([tail, np.full(n, n, np.int64)]),
                       np.concatenate([head, np.arange(n, dtype=np.int64)]))
    cap = p.units.copy()
    unstarted = p.roots.copy()
    pair = np.zeros((n, n), np.int64)        # units left from GPU to GPU, parallel links summed
    np.add.at(pair, (tail, head), cap)
    most = min(MEMORY_SETS, 4 * n)
    mem = np.zeros(2, np.int64)              # sets remembered, the next to replace
    sets = np.zeros((most, n), np.bool_)
    members = np.zeros((most, n), np.int64)
    sizes, slack = np.zeros(most, np.int64), np.zeros(most, np.int64)
    scratch = [np.zeros(n, np.int64) for _ in range(4)]
    side, member, spent = np.zeros(n, np.bool_), np.zeros(n, np.bool_), np.zeros(n, np.bool_)
    dead = np.zeros(tail.size, np.bool_)
    flows = (net._start, net._arcs, net._head, net._res, net._level, net._queue, net._it,
             net._path)
    vflows = (vnet._start, vnet._arcs, vnet._head, vnet._res, vnet._level, vnet._queue,
              vnet._it, vnet._path)
    vcaps = vnet.caps()
    sweep_pos = np.empty(n, np.int64)        # each rank's place in the sweeps' sink order
    sweep_pos[np.arange(n) if near is None else np.asarray(near, np.int64)] = np.arange(n)
    everyone = np.arange(n, dtype=np.int64)

    def grow(r: int, lazy: bool) -> TreeClass | None:
        anytime.check("Phase 3: the few-trees packing, before a class")
        mult, unstarted[r] = int(unstarted[r]), 0
        row = np.empty(n, np.int64)
        got = _grow_class(r, mult, n, tail.size, tail, head, pair, scratch[0], scratch[1],
                          out_start, out_arc, in_start, in_arc, cap, unstarted, flows, vflows,
                          vcaps, scratch[2], row, member, scratch[3], side, mem, sets, members,
                          sizes, slack, dead, spent, sweep_pos, checks, lazy)
        return None if got == 0 else TreeClass(r, got, row)

    def sweep() -> bool:
        """The rooted sweep over every rank: the unstarted trees still fit (Edmonds); a
        failing sink's cut is remembered."""
        checks[0] += 1 + n // SINKS_PER_CHECK
        checks[2] += 1
        p_left = int(unstarted.sum())
        if _verify(0, n, 0, n, tail.size, cap, unstarted, everyone, p_left, vcaps, vflows,
                   scratch[2], sweep_pos) < 0:
            return True
        _bfs_levels(n + 3, *vflows[:4], n + 1, -1, vflows[4], vflows[5])
        side[:] = vflows[4][:n] < 0
        _remember(side, n, mem, sets, members, sizes, slack, in_start, in_arc, tail, cap,
                  unstarted, p_left)
        return False

    classes: list[TreeClass] = []
    batch, eager = LAZY_FIRST_BATCH, 1
    r = 0
    while True:
        while r < n and unstarted[r] == 0:
            r += 1
        if r == n:
            return classes
        saved = (cap.copy(), pair.copy(), unstarted.copy(), len(classes), r)
        made = 0
        while made < batch and r < n:        # a lazy batch (module doc)
            c = grow(r, True)
            if c is None:
                break
            classes.append(c)
            made += 1
            while r < n and unstarted[r] == 0:
                r += 1
        else:
            if checks[0] + 1 + n // SINKS_PER_CHECK <= checks[1] and sweep():
                batch, eager = min(2 * batch, LAZY_MAX_BATCH), 1
                continue
        checks[3] += 1
        cap[:], pair[:], unstarted[:] = saved[:3]
        del classes[saved[3]:]
        r = saved[4]
        if batch > 1:                        # half the batch, lazily again
            batch //= 2
            continue
        # one class alone fails: it and the next ones grow with their own sweeps, twice as
        # many after each such failure in a row (a graph where lazy classes keep failing
        # costs at most a few sweeps more than growing every class so)
        for _ in range(eager):
            while r < n and unstarted[r] == 0:
                r += 1
            if r == n:
                break
            c = grow(r, False)
            if c is None:
                return None
            classes.append(c)
        eager *= 2


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
    near = sink_ranks(split, rank_of)           # the sweeps' sink order
    found, first = None, 0
    if k * n * n <= FEW_TREES_CHEAP_ENTRIES:
        classes = few_trees_pack(n, lg.tail, lg.head, lg.units, k, 2 * n * n, stats, near)
        found = None if classes is None else (lg, classes)
        first = stats.get("few_trees_checks", 0)
    if found is None:
        g = split.copy()
        if split_all(g):
            exact = LogicalGraph.from_split(g, rank_of)
            classes = few_trees_pack(n, exact.tail, exact.head, exact.units, k,
                                     FEW_TREES_CHECKS_PER_N2 * n * n, stats, near)
            found = None if classes is None else (exact, classes)
            stats["few_trees_checks"] = stats.get("few_trees_checks", 0) + first
    stats["few_trees_s"] = time.perf_counter() - t
    return found
