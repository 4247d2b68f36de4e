"""The first valid AllGather schedule of a time-limited solve (:mod:`mccl_opt.anytime`).

Built before any optimisation so that a limit that passes early still returns trees:

* warm: the previous schedule's trees, re-rated on the new capacities, when they are
  still trees of the fabric (same GPUs, every hop a link);
* otherwise, up to :data:`MWU_MAX_GPUS` GPUs, ``r = min(4, max_chunks)``
  multiplicative-weights rounds of every root's cheapest tree
  (:func:`.general.tree_colgen.mwu_trees`, the general method's starting columns), each
  tree carrying ``1/r`` of its root's shard;
* above that, the two-way chains of one GPU line (:mod:`.first_line`: ``2N`` compiled
  cheapest paths, 0.03-0.09 s at 2,048 GPUs), or where some GPU has no switch-only path
  to the next, one shortest-path tree per root (link cost ``1/capacity``, scipy's
  Dijkstra from every GPU, the trees built in arrays, :func:`shortest_path_trees`:
  ``N^2`` routed paths, 4-9 s at 2,048 GPUs).  Up to :data:`BOTH_MAX_GPUS` GPUs, and
  above where the time limit leaves room, both are built and the better kept (on a ring
  of hosts the line's rate is half, on a full mesh 1/70).  The cheapest-tree rounds
  cost ``O(N^3)`` (a minimum arborescence of the dense GPU graph per root: 10 s at 512
  GPUs and 95-164 s at 1024 on the 2-core machine), longer than the solve they stand
  in for.

Neither is optimal; the solve then improves on it and the report says which one was
returned (:class:`~mccl_opt.report.Method.FIRST`).  A cold one above
:data:`MWU_MAX_GPUS` GPUs is next offered averaged over fabric automorphisms
(:mod:`.first_images`: the line's host crossings spread over every rail); at equal rates
the line is kept over the shortest-path trees for that.
"""

from __future__ import annotations

import time

import numpy as np

from .. import anytime
from ..errors import TopologyError
from ..report import Method, SolveReport, Termination, WarmUse
from ..schedule import Schedule, bottleneck_links, schedule_rate, share_loads
from ..schedule_chunks import FlatPaths, TreeChunks, TreeTable
from ..topology import Topology
from .general.tree_colgen import mwu_trees
from .general.tree_table import distinct_rows, tree_chunks
from .first_line import line_trees

__all__ = ["first_schedule", "previous_trees", "shortest_path_trees", "FIRST_ROUNDS",
           "MWU_MAX_GPUS", "BOTH_MAX_GPUS",
           "SPT_SECONDS_PER_PAIR"]

#: multiplicative-weights rounds of the cold first schedule (its shares are ``1/r``)
FIRST_ROUNDS = 4

#: above this many GPUs the cold first schedule is one shortest-path tree per root
#: or the chains of one GPU line
MWU_MAX_GPUS = 64

#: without a time limit, up to this many GPUs both are built (shortest-path trees:
#: <= 50 ms) and the better kept
BOTH_MAX_GPUS = 256

#: under a time limit, both only where it leaves this many seconds per GPU pair for the
#: shortest-path trees (measured 1-2 us per pair at 1024-2048 GPUs, loaded machine;
#: 0.4-0.6 us at 80-512 GPUs), at any size: at 256 GPUs they took 40 ms CPU, 0.5 s wall
#: at a CPU share of 0.08, before any check (docs/allgather_history.md, "Checks before every span")
SPT_SECONDS_PER_PAIR = 2e-6


def previous_trees(topo: Topology, warm: Schedule | None) -> Schedule | None:
    """``warm``'s trees re-rated on ``topo``'s capacities, or ``None`` when they are not
    trees of ``topo`` (other GPUs, or a hop that is no link)."""
    if warm is None or tuple(warm.gpus) != tuple(topo.gpus) or not len(warm.chunks):
        return None
    try:
        loads = share_loads(topo, warm.chunks)
    except TopologyError:
        return None
    rate = schedule_rate(topo, loads)
    if not 0 < rate < float("inf"):
        return None
    return Schedule(collective="allgather", topology=topo.name, gpus=topo.gpus, rate_gbps=rate,
                    lp_rate_gbps=rate, max_chunks=warm.max_chunks, chunks=warm.chunks,
                    bottleneck=bottleneck_links(topo, loads, rate, warm.max_chunks),
                    solver={"backend": "none", "seconds": 0.0, "algorithm": "previous-trees"},
                    stats={"warm": True, "method": "previous-trees"},
                    report=_report(WarmUse.KEPT, warm.max_chunks, None))


def first_schedule(topo: Topology, warm: Schedule | None, max_chunks: int | None) -> Schedule:
    """The previous trees if still valid (:func:`previous_trees`), else cheapest trees by
    multiplicative weights (above :data:`MWU_MAX_GPUS` GPUs a line's chains, else
    shortest-path trees);
    ``lp_rate_gbps`` is the schedule's own rate (no optimum is known yet)."""
    t = time.perf_counter()
    previous = previous_trees(topo, warm)
    if previous is not None:
        return previous
    if topo.num_gpus > MWU_MAX_GPUS:
        (chunks, loads), how = _line_or_shortest_path(topo)
        k = 1
    else:
        (chunks, k), how = _cheapest_trees(topo, max_chunks), "cheapest-trees"
        loads = share_loads(topo, chunks)
    rate = schedule_rate(topo, loads)
    if not 0 < rate < float("inf"):
        raise TopologyError("no first AllGather schedule: some GPU cannot reach every other")
    return Schedule(collective="allgather", topology=topo.name, gpus=topo.gpus, rate_gbps=rate,
                    lp_rate_gbps=rate, max_chunks=max_chunks, chunks=chunks,
                    bottleneck=bottleneck_links(topo, loads, rate, k),
                    solver={"backend": "none", "seconds": time.perf_counter() - t,
                            "algorithm": how},
                    stats={"warm": warm is not None, "method": how, "k": k},
                    report=_report(WarmUse.COLD, max_chunks, k))


def _line_or_shortest_path(topo: Topology) -> tuple[tuple[TreeChunks, np.ndarray], str]:
    """The line's chains (:func:`.first_line.line_trees`); where there is room
    (:func:`_room_for_both`) also the shortest-path trees, the higher rate kept; the
    shortest-path trees alone where there is no line."""
    line = line_trees(topo)
    if line is not None and not _room_for_both(topo):
        return line, "line-trees"
    tree = shortest_path_trees(topo)
    if line is not None and schedule_rate(topo, line[1]) >= schedule_rate(topo, tree[1]):
        return line, "line-trees"
    return tree, "shortest-path-trees"


def _room_for_both(topo: Topology) -> bool:
    """Whether to build the shortest-path trees as well as the line: without a time
    limit up to :data:`BOTH_MAX_GPUS` GPUs; under one where it leaves room for them
    (:data:`SPT_SECONDS_PER_PAIR` per GPU pair, a high estimate): on fabrics whose GPUs
    are cabled to each other (a mesh, a torus or ring of hosts) they are far better
    than the line (a 70-GPU mesh: 100 vs 1.45 Gbps).  The time left is scaled by the CPU
    share the solve gets (:func:`mccl_opt.anytime.cpu_share`, measured over the line just
    built): at load 10, 512 GPUs and a 1 s limit the trees took 1.3 s wall."""
    left = anytime.limit_left()
    if left is None:
        return topo.num_gpus <= BOTH_MAX_GPUS
    return left * anytime.cpu_share() >= SPT_SECONDS_PER_PAIR * topo.num_gpus ** 2


def _cheapest_trees(topo: Topology, max_chunks: int | None) -> tuple[TreeChunks, int]:
    """Multiplicative-weights rounds of every root's cheapest tree, shares ``1/r``."""
    rounds = FIRST_ROUNDS if max_chunks is None else min(FIRST_ROUNDS, max_chunks)
    arr = topo.arrays
    roots, trees = mwu_trees(topo, arr.capacity / float(arr.capacity.max()), rounds)
    owner = np.asarray(roots, np.int64)
    per_root = np.bincount(owner, minlength=topo.num_gpus)
    lengths = np.fromiter(map(len, trees), np.int64, count=len(trees))
    chunks, _ = tree_chunks(topo, owner, lengths, np.concatenate(trees),
                            1.0 / per_root[owner])
    return chunks, int(per_root.max())


def shortest_path_trees(topo: Topology) -> tuple[TreeChunks, np.ndarray]:
    """One tree per root, whole shard: the shortest-path tree of the physical fabric
    under link costs ``1/capacity`` (scipy's Dijkstra from every GPU at once), each GPU
    hung below the nearest GPU on its path (the edge rides the switches between them);
    with the share load of every link.  Raises :class:`TopologyError` when some GPU
    cannot reach another."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import dijkstra

    arr = topo.arrays
    n, gpus = topo.num_nodes, np.asarray(arr.gpu_nodes, np.int64)
    graph = csr_matrix((float(arr.capacity.max()) / arr.capacity, (arr.tail, arr.head)),
                       shape=(n, n))
    dist, pred = dijkstra(graph, indices=gpus, return_predecessors=True)
    if not np.isfinite(dist[:, gpus]).all():
        raise TopologyError("no first AllGather schedule: some GPU cannot reach every other")
    g = gpus.size
    rows = np.repeat(np.arange(g), g)
    heads = np.tile(gpus, g)
    keep = heads != gpus[rows]                         # every (tree, non-root GPU)
    rows, heads = rows[keep], heads[keep]
    hops = [heads]                                     # walk back to the nearest GPU
    cur, done = heads, np.zeros(heads.size, bool)
    while not done.all():
        cur = np.where(done, cur, pred[rows, cur])
        hops.append(np.where(done, -1, cur))
        done |= ~arr.is_switch[cur]
    path = np.stack(hops[::-1], axis=1)                # parent GPU first, -1 padded in front
    real = path >= 0
    parent = np.full((g, n), -1, np.int64)              # node index of each GPU's parent
    parent[rows, heads] = path[np.arange(path.shape[0]), np.argmax(real, axis=1)]
    depth = np.zeros((g, n), np.int64)                  # GPU hops from the root
    for _ in range(g):
        nxt = np.where(parent >= 0, np.take_along_axis(depth, np.maximum(parent, 0), 1) + 1, 0)
        if np.array_equal(nxt, depth):
            break
        depth = nxt
    order = np.argsort(depth[rows, heads].reshape(g, g - 1), axis=1, kind="stable")
    first, which = distinct_rows(path, n)
    edges = np.take_along_axis(which.reshape(g, g - 1), order, 1)
    table = TreeTable([v.id for v in topo.nodes],
                      FlatPaths.of_lengths(path[first][real[first]], real[first].sum(axis=1)),
                      gpus, np.ones(g), edges)
    hop = real[:, :-1] & real[:, 1:]                    # consecutive nodes of a path: a link
    key = arr.tail.astype(np.int64) * n + arr.head
    by_key = np.argsort(key)
    link = by_key[np.searchsorted(key, (path[:, :-1] * n + path[:, 1:])[hop], sorter=by_key)]
    return TreeChunks(table), np.bincount(link, minlength=topo.num_links).astype(float)


def _report(warm: WarmUse, max_chunks: int | None, k: int | None) -> SolveReport:
    """A first schedule's report: no optimum known, so no bound of its own."""
    return SolveReport(collective="allgather", method=Method.FIRST,
                       termination=Termination.TIME_LIMIT, bound_gbps=None, warm=warm,
                       max_chunks=max_chunks, seconds=0.0, k=k)
