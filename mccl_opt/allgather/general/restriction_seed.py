"""Starting trees and a certified upper bound for the general method from the best
balanced restriction (docs/allgather.md "General method: restriction seed", "Balanced
fabrics past the exact tree limit").

On a fabric with unbalanced switches the forwarding-only optimum is the cut bound of
the best balanced restriction ``c' <= c`` (:mod:`..restriction.balanced`, docs
"Balanced restriction"): its certified rate is an *upper bound* the column generation
can stop at, with no Lagrangian tail.  ForestColl (paper §4.3) on ``c'`` with a few
chunks per root rounds a little below that optimum (the exact optimum would need
thousands of trees per root), but its trees, valid on ``c >= c'`` and re-weighted by the
tree master, start the column generation at or next to the optimum: HPN 4x8x8 with one
NIC at a quarter of its speed one way reaches it in the master's first solve, where
the multiplicative-weights start crept from 11.65 to 12.24 of 12.83 Gbps in 96 rounds.

A *balanced* fabric is its own best balanced restriction: where ForestColl declines it
(its exact packing needs more than ``EXACT_TREES_LIMIT`` trees per root, shared
aggregation 2x8x8 with an odd NIC capacity), :func:`balanced_seed` seeds the column
generation with ForestColl's own trees at a few chunks per root and stops it at the cut
bound ``x*`` (3.9 s -> 0.4 s CPU on that fabric).

The restriction is the one the method chain computed (:func:`..restriction.stages.restrict`), and
ForestColl on it is the chain's own sub-solve (:data:`..stage.ForestColl`), so neither the
cutting-plane LP nor the ForestColl pipeline is repeated here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

import numpy as np

from mccl_opt.errors import MCCLError, SolveError, TopologyError
from mccl_opt.schedule import Schedule
from mccl_opt.schedule_chunks import TreeChunks, path_nodes
from mccl_opt.topology import Topology
from ..budget import ChunkCounts, choose_trees
from ..fabric import fabric_of
from ..forestcoll.pack_plan import ForestCollAsk
from ..forestcoll.throughput import optimal_rate

if TYPE_CHECKING:
    from ..restriction.stages import Restricted
    from ..stage import ForestColl

__all__ = ["RestrictionSeed", "restriction_seed", "balanced_seed", "own_trees_seed",
           "one_per_root", "denser_chunks",
           "forestcoll_trees", "table_columns", "SEED_CHUNKS", "seed_chunks"]

#: chunks per root asked of ForestColl on the restriction (4 left HPN 4x16x8 stuck 0.25 % below
#: the optimum for 28 rounds; 10 reached it in the first master solve): enough trees that the master's
#: re-weighting reaches the optimum (or next to it) at 256-512 GPUs, few enough that the
#: first master solve stays cheap
SEED_CHUNKS = 10

#: up to this many GPUs the restriction seed asks for :data:`SMALL_SEED_CHUNKS` instead
#: (a balanced fabric's seed, which certifies at once, keeps 10: shared aggregation 2x8x8
#: with a NIC at 206.24 Gbps both ways, 0.36 s with 10, 0.46 s with 16): at 128 GPUs the
#: master over 10 chunks' trees can fall short (shared aggregation 2x8x8 with a NIC at
#: 150.8 Gbps one way: 0.15 % short, then 1280 weaker-direction trees and two masters of
#: ~1900 columns, 3.7 s CPU), while 16 chunks' trees reach the optimum in the first
#: master (1.2 s); past it the larger first master costs more than it saves (HPN 4x8x8,
#: 256 GPUs, certified at once either way: 2.9 -> 3.9 s)
SMALL_SEED_GPUS = 128
SMALL_SEED_CHUNKS = 16


#: chunks per root asked once more where ForestColl packs nothing at :func:`seed_chunks`:
#: shared aggregation 2x16x8 with one NIC at 100 Gbps one way chooses the budget ``k = 1``
#: at 10-36 chunks, whose restriction units do not balance (docs/allgather_history.md "Shared
#: aggregation 2x16x8"); at 64 it chooses ``k = 57``, 0.27 % below the optimum, and the first
#: master certifies (~44 s CPU), where the multiplicative-weights start ran past 10 minutes
RETRY_SEED_CHUNKS = 64


#: where the master over the restriction's and the weaker direction's trees falls short of
#: the optimum, ForestColl on the restriction is asked once more at this many times the
#: chunks (:attr:`RestrictionSeed.denser`): a budget with more trees per root (superpod
#: 2x4x8 with fuzz seed 3419's faults at ``max_chunks=None``: 16 chunks pack 3 per root in
#: 64 trees, 98.8 % of the optimum, the master over them and the weaker direction's stays
#: short; 32 chunks pack 18 per root in 1121 trees, with which the master certifies)
DENSER_FACTOR = 2


#: past this many GPUs (and up to :data:`SMALL_SEED_GPUS`), at ``max_chunks=None``, the
#: seed the general method makes for itself (no symmetry quotient or *Seed first* made it
#: before) asks for :data:`DENSER_FACTOR` times the chunks at once where that adds few
#: trees per root (:func:`dense_pays`): there every master over 1 000-2 000 columns that
#: falls short costs ~0.1-0.2 s CPU, and the weaker direction's packing behind it ~0.1 s
#: (shared-nic 2x8x8-p2 with a NIC at 4 Gbps one way, fuzz seed 3515: 16 chunks, ``k = 15``,
#: fell short twice, 0.70-0.84 s; 32 chunks, ``k = 19``, certify in the first master,
#: 0.44-0.48 s); at 16-64 GPUs every state measured took <= 0.12 s and the denser seed
#: cost up to 2x (docs/allgather_history.md "Shared-nic 2x8x8-p2: the general method's seed")
DENSE_SEED_ABOVE_GPUS = 64

#: ... only where the denser budget's trees per root are at most this many times the
#: plain one's: with about as many trees its master costs what the plain seed's does
#: (``k = 15 -> 19``: 1 115 -> 1 138 distinct trees), while a denser seed of many more trees
#: made masters that certified anyway slower (shared-nic 2x8x8-p2 / 2x8x6-p2 with a NIC
#: at 0.377 or 0.833 of its speed one way: ``k = 10 -> 27``, ``13 -> 25``, ``5 -> 28``;
#: 0.30-0.72 -> 0.55-0.82 s CPU)
DENSE_SEED_MAX_GROWTH = 1.3


def dense_seed(num_gpus: int) -> bool:
    """Whether the general method's own seed on ``num_gpus`` GPUs at ``max_chunks=None``
    may ask for the denser packing's chunks (:data:`DENSE_SEED_ABOVE_GPUS`,
    :func:`dense_pays`)."""
    return DENSE_SEED_ABOVE_GPUS < num_gpus <= SMALL_SEED_GPUS


def dense_pays(sub: Topology, chunks: int) -> bool:
    """Whether the chunk budget on the balanced fabric ``sub`` at :data:`DENSER_FACTOR`
    times ``chunks`` chooses more trees per root than at ``chunks``, but at most
    :data:`DENSE_SEED_MAX_GROWTH` times as many (Phase 1 and two budget searches,
    3-5 ms at 128 GPUs; the ``k`` ForestColl then packs)."""
    try:
        fab, _ = fabric_of(sub)
        p1 = optimal_rate(fab)
        few = choose_trees(fab, p1, chunks)[0]
        many = choose_trees(fab, p1, DENSER_FACTOR * chunks)[0]
    except (MCCLError, ArithmeticError, ValueError):
        return False
    return 0 < few < many <= DENSE_SEED_MAX_GROWTH * few


def seed_chunks(num_gpus: int) -> int:
    """Chunks per root the restriction seed asks ForestColl for on a fabric of
    ``num_gpus`` GPUs (the restriction's and the weaker-direction fabric's trees)."""
    return SMALL_SEED_CHUNKS if num_gpus <= SMALL_SEED_GPUS else SEED_CHUNKS


@dataclass(frozen=True)
class RestrictionSeed:
    """A certified upper bound ``rate_gbps`` on every forwarding-only schedule of the
    fabric (the restriction's optimum, or on a balanced fabric its cut bound ``x*``),
    ForestColl's schedules whose trees start the column generation (same node ids as the
    fabric), the ``seconds`` they took, what the seed is (``stats["seed"]``) and ``more``:
    makes further trees (the weaker-direction fabric's), asked for only when the master
    over the first ones falls short of the bound; ``denser``: the restriction's trees at
    :data:`DENSER_FACTOR` times the chunks (more trees per root), asked when the master
    over those falls short too."""

    rate_gbps: float
    schedules: tuple[Schedule, ...]
    seconds: float
    source: str = "balanced restriction"
    more: Callable[[], Schedule | None] | None = None
    denser: Callable[[], Schedule | None] | None = None

    def columns(self, topo: Topology) -> tuple[list[int], list[np.ndarray]] | None:
        """The schedules' trees as tree-master columns of ``topo`` (root ranks, link
        indices of every edge path, edges in order), converted in arrays; ``None`` when
        a schedule's chunks are not a tree table over ``topo``'s nodes (the caller
        converts chunk by chunk then)."""
        roots: list[int] = []
        trees: list[np.ndarray] = []
        for sched in self.schedules:
            found = table_columns(sched, topo)
            if found is None:
                return None
            roots += found[0]
            trees += found[1]
        return roots, trees


def table_columns(sched: Schedule, topo: Topology) -> tuple[list[int], list[np.ndarray]] | None:
    """``sched``'s trees as tree-master columns of ``topo`` (:meth:`RestrictionSeed.columns`)
    when its chunks are a tree table over nodes of ``topo`` (in any order: a sub-fabric's
    canonical listing, such as the weaker-direction fabric's): every used path's links
    found once (sorted link keys), then every tree's edges gathered as one index array;
    ``None`` otherwise (the caller converts chunk by chunk)."""
    chunks, arr, n = sched.chunks, topo.arrays, topo.num_nodes
    if not isinstance(chunks, TreeChunks):
        return None
    table = chunks.table
    index = {nd.id: i for i, nd in enumerate(topo.nodes)}
    to_topo = np.fromiter((index.get(v, -1) for v in table.node_ids), np.int64,
                          count=len(table.node_ids))
    if (to_topo < 0).any():                            # a node ``topo`` does not have
        return None
    used = table.used_paths()
    lens, nodes = path_nodes(table.paths, used)
    nodes = to_topo[nodes]
    last = np.cumsum(lens) - 1                         # flat index of every path's last node
    pair = np.ones(max(nodes.size - 1, 0), bool)
    pair[last[:-1]] = False                            # no hop from one path into the next
    want = nodes[:-1][pair] * n + nodes[1:][pair]
    key = arr.tail.astype(np.int64) * n + arr.head
    order = np.argsort(key, kind="stable")
    pos = np.minimum(np.searchsorted(key, want, sorter=order), key.size - 1)
    links = order[pos]
    if not np.array_equal(key[links], want):           # a hop that is no link of ``topo``
        return None
    hops = np.zeros(len(table.paths), np.int64)
    hops[used] = lens - 1
    first = np.zeros(len(table.paths), np.int64)
    first[used] = np.cumsum(lens - 1) - (lens - 1)
    edge_hops = hops[table.edges].ravel()
    ends = np.cumsum(edge_hops)
    gather = np.repeat(first[table.edges].ravel() - (ends - edge_hops), edge_hops) + \
        np.arange(int(ends[-1]) if ends.size else 0)
    arcs = links[gather]
    per_tree = edge_hops.reshape(table.edges.shape).sum(axis=1)
    trees = np.split(arcs, np.cumsum(per_tree)[:-1])
    roots = arr.rank_of[to_topo[table.src]]
    if (roots < 0).any():                              # a root that is no GPU of ``topo``
        return None
    return roots.tolist(), trees


def forestcoll_trees(sub: Topology, forestcoll: ForestColl,
                     ask: ForestCollAsk = ForestCollAsk(),
                     chunks: int = SEED_CHUNKS, once: bool = False) -> Schedule | None:
    """ForestColl's schedule (``forestcoll``, the chain's sub-solve, cold, keeping what
    balancing loses: the master re-weights the trees anyway) on the balanced fabric
    ``sub`` with at most ``chunks`` chunks per root (fewer while ForestColl fails, as the
    method chain does, skipping the limits that repeat a failed budget); ``None`` when
    ForestColl packs no chunk count; ``once``: ``chunks`` only; ``ask``: the headroom,
    split and balancing asked for (:class:`..forestcoll.pack_plan.ForestCollAsk`)."""
    counts = ChunkCounts(chunks)
    for k in [chunks] if once else counts:
        try:
            sched = forestcoll(sub, None, k, ask)
        except SolveError as e:                 # as the chain treats ForestColl failing: fewer
            counts.failed(e)
            continue
        except TopologyError:
            continue
        if isinstance(sched, Schedule):
            return sched
    return None


def restriction_seed(restricted: Restricted, forestcoll: ForestColl,
                     weaker: Schedule | Topology | None = None,
                     dense: bool = False) -> RestrictionSeed | None:
    """ForestColl's trees (:func:`forestcoll_trees`) on the balanced restriction
    ``restricted``, with its certified optimum as the bound; ``weaker`` (the chain's
    schedule on the weaker-direction fabric, or that fabric, packed on demand) gives
    ``more``: a second, different set of near-optimal trees, for a master that falls
    short with the first (shared aggregation 2x5x8 with a one-way NIC fault at
    ``max_chunks=None``: 31 rounds -> 3), packed on demand by the proportional spread
    split: with sibling pairs last (as the first set) nearly every tree of both sets
    enters every host once, and a master over such trees stops at that rate
    (docs/allgather_history.md "The seed's trees and sibling pairs": 41.14 of 41.50 Gbps there,
    then 22 pricing rounds); the proportional split's host loops give trees that enter a
    host more than once.  ``None`` when the restriction's rate is not
    positive or ForestColl packs nothing on it (the general method then starts from its
    own trees).  ``dense``: the restriction's trees at :data:`DENSER_FACTOR` times
    :func:`seed_chunks` where :func:`dense_pays` (and ``denser`` at that factor again)."""
    if not restricted.restriction.rate_gbps > 0:
        return None
    t = time.perf_counter()
    base = seed_chunks(restricted.sub.num_gpus)
    chunks = DENSER_FACTOR * base if dense and dense_pays(restricted.sub, base) else base
    ask = ForestCollAsk(headroom=restricted.restriction.headroom())
    main = forestcoll_trees(restricted.sub, forestcoll, replace(ask, fewer=True), chunks)
    if main is None and chunks < RETRY_SEED_CHUNKS:     # one try, not a count down from 64
        main = forestcoll_trees(restricted.sub, forestcoll, ask, RETRY_SEED_CHUNKS, once=True)
    if main is None:
        return None

    def more() -> Schedule | None:
        return forestcoll_trees(weaker, forestcoll, ForestCollAsk(siblings_last=False), base) \
            if isinstance(weaker, Topology) else weaker

    def denser() -> Schedule | None:
        return forestcoll_trees(restricted.sub, forestcoll, ask, DENSER_FACTOR * chunks,
                                once=True)

    return RestrictionSeed(restricted.optimum_gbps, (main,), time.perf_counter() - t,
                           more=None if weaker is None else more, denser=denser)


def balanced_seed(topo: Topology, bound_gbps: float | None,
                  forestcoll: ForestColl) -> RestrictionSeed | None:
    """The seed of a *balanced* fabric that ForestColl declined (its exact packing needs
    more than :data:`..budget.EXACT_TREES_LIMIT` trees per root, or its budget did not
    pack): the fabric is its own best balanced restriction, so its cut bound ``x*`` is
    the forwarding-only optimum (paper §4.3: ForestColl reaches it) and the column
    generation stops as soon as the master reaches it; ForestColl's trees at a few
    chunks per root start it (at :func:`denser_chunks` where those are one tree per
    root, :func:`one_per_root`).  ``None`` without a bound or trees."""
    if bound_gbps is None or not bound_gbps > 0:
        return None
    t = time.perf_counter()
    trees = forestcoll_trees(topo, forestcoll)
    chunks = denser_chunks(topo) if trees is not None and one_per_root(trees, topo.num_gpus) \
        else None
    if chunks is not None:
        denser = forestcoll_trees(topo, forestcoll, chunks=chunks, once=True)
        trees = trees if denser is None else denser
    if trees is None:
        return None
    return own_trees_seed(bound_gbps, trees, time.perf_counter() - t)


def one_per_root(sched: Schedule, num_gpus: int) -> bool:
    """Whether ``sched`` holds one tree per root (the chunk budget chose ``k = 1``): a
    master over such trees has one weight per root, so its rate is the seed's own, below
    the cut bound ForestColl declined to pack exactly, and only pricing closes the gap;
    :func:`balanced_seed` then asks ForestColl again at :data:`DENSER_FACTOR` times the
    chunks, up to :data:`RETRY_SEED_CHUNKS` (mixed-nics 2x8x8 with a 200 Gbps NIC at
    199.047 both ways, fuzz seed 3525: 10 chunks pack ``k = 1``, the master closed in 9
    pricing rounds, 0.92 s CPU; 20 chunks pack ``k = 20``, 861 trees, and the first
    master certifies, 0.15-0.20 s; docs/allgather_history.md "Balanced fabrics past the exact
    tree limit")."""
    return len(sched.chunks) <= num_gpus


def denser_chunks(topo: Topology) -> int | None:
    """The fewest chunks per root, doubling from :data:`DENSER_FACTOR` times
    :data:`SEED_CHUNKS` up to :data:`RETRY_SEED_CHUNKS`, at which the chunk budget on the
    balanced fabric ``topo`` chooses more than one tree per root (Phase 1 and a budget
    search each, a few ms, where a ForestColl run that packs ``k = 1`` again costs
    20-30 ms: HPN 2x4x8 of fuzz seed 3413 chooses ``k = 1`` up to 64 chunks); ``None``
    where none does (:func:`one_per_root`)."""
    try:
        fab, _ = fabric_of(topo)
        p1 = optimal_rate(fab)
        chunks = SEED_CHUNKS
        while chunks < RETRY_SEED_CHUNKS:
            chunks = min(DENSER_FACTOR * chunks, RETRY_SEED_CHUNKS)
            if choose_trees(fab, p1, chunks)[0] > 1:
                return chunks
    except (MCCLError, ArithmeticError, ValueError):
        return None
    return None


def own_trees_seed(bound_gbps: float, trees: Schedule, seconds: float = 0.0) -> RestrictionSeed:
    """A balanced fabric's seed from ForestColl's own schedule ``trees`` on it (made by
    :func:`balanced_seed`, or the one the chunk budget rounded too far), stopped at the
    fabric's cut bound ``bound_gbps``; ``stats["seed"]`` says ``"forestcoll trees"``."""
    return RestrictionSeed(bound_gbps, (trees,), seconds, "forestcoll trees")
