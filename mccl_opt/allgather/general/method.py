"""The general AllGather method: the exact optimum with forwarding-only switches on any
connected fabric, balanced switches or not (docs/allgather_history.md "General method").

Pipeline: starting trees (the previous schedule's that are still valid, and a few
multiplicative-weights rounds of cheapest trees, :func:`.tree_colgen.mwu_trees`) → column
generation to a certified optimum (:mod:`.tree_colgen`) → rounding to ``max_chunks`` chunks
per root (:mod:`.tree_rounding`) → a :class:`~mccl_opt.Schedule` whose chunks are
trees of GPU-to-GPU switch-only paths.

``lp_rate_gbps`` is the master's optimum (a rate the fractional schedule reaches);
``stats['bound_gbps']`` the certified upper bound and ``stats['cg_gap']`` their relative
gap; ``stats['cut_bound_gbps']`` Phase 1's cut bound when the caller passes one that is
higher (no forwarding-only schedule reaches it: see the docs).
"""

from __future__ import annotations

import copy

import dataclasses
import time
from typing import Any, Callable, Sequence

import numpy as np

from mccl_opt import progress
from mccl_opt.backends import get_backend
from mccl_opt.errors import ScheduleError, SolveError, TopologyError
from mccl_opt.report import Method, SolveReport, Termination, WarmUse
from mccl_opt.schedule import Schedule, TreeChunk, bottleneck_links, schedule_rate
from mccl_opt.schedule_chunks import TreeChunks
from mccl_opt.topology import Topology
from .tree_colgen import TreeCGOptions, TreeCGResult, tree_column_generation, mwu_trees
from .restriction_seed import RestrictionSeed, table_columns
from ..warm.kept import AllGatherWarmState, TreeColumns
from .live_master import TreePool
from .tree_rounding import fractional_shares, round_trees
from .tree_table import tree_chunks

__all__ = ["solve_general", "chunk_columns", "rate_scale"]


def _warm_columns(warm: Schedule | None, topo: Topology) -> tuple[list[int], list[np.ndarray]]:
    """The previous schedule's trees that are still valid on ``topo`` (same GPUs, every
    hop a link), as ``(root ranks, arcs)``; plus its kept tree columns when its links
    are ``topo``'s."""
    if warm is None or tuple(warm.gpus) != tuple(topo.gpus):
        return [], []
    arr = topo.arrays
    roots: list[int] = []
    trees: list[np.ndarray] = []
    state = warm.warm_state
    kept = state.columns if isinstance(state, AllGatherWarmState) else None
    if kept is not None and kept.fits(topo):
        pool = kept.pool
        return pool.root.tolist(), pool.columns(range(len(pool)))
    index = {n.id: i for i, n in enumerate(topo.nodes)}
    link = {(int(a), int(b)): i for i, (a, b) in enumerate(zip(arr.tail, arr.head))}
    for c in warm.chunks:
        arcs: list[int] = []
        heads = set()
        for e in getattr(c, "edges", ()):
            ids = [index.get(v, -1) for v in e]
            hops = [link.get((a, b), -1) for a, b in zip(ids, ids[1:])]
            if -1 in hops or any(not arr.is_switch[v] for v in ids[1:-1]) \
                    or arr.rank_of[ids[-1]] < 0:
                arcs = []
                break
            heads.add(ids[-1])
            arcs += hops
        r = topo.rank(c.src) if topo.has_node(c.src) and topo.is_gpu(c.src) else -1
        if arcs and r >= 0 and len(heads) == topo.num_gpus - 1 and index[c.src] not in heads:
            roots.append(r)
            trees.append(np.array(arcs, np.int64))
    return roots, trees


def chunk_columns(schedules: tuple[Schedule, ...], topo: Topology
                   ) -> tuple[list[int], list[np.ndarray]]:
    """The trees of ``schedules`` still valid on ``topo`` (:func:`_warm_columns`), in order."""
    roots: list[int] = []
    trees: list[np.ndarray] = []
    for sched in schedules:
        r, t = _warm_columns(sched, topo)
        roots += r
        trees += t
    return roots, trees


def _later_columns(seed: RestrictionSeed, topo: Topology, roots: list[int],
                   trees: list[np.ndarray], stats: dict[str, Any]
                   ) -> tuple[list[int], list[np.ndarray]]:
    """The columns a seeded run adds when its first master falls short of the seed's
    bound: the previous schedule's trees ``roots, trees``, then the seed's other trees
    (:attr:`.restriction_seed.RestrictionSeed.more`: the weaker-direction fabric's)."""
    more_r, more_t = _seed_columns(seed.more, topo, stats, "seed_more_columns")
    return roots + more_r, trees + more_t


def _seed_columns(make: Callable[[], Schedule | None] | None, topo: Topology,
                  stats: dict[str, Any], key: str) -> tuple[list[int], list[np.ndarray]]:
    """The trees of the schedule ``make()`` as columns of ``topo`` (none without one),
    their count in ``stats[key]``."""
    other = make() if make is not None else None
    if other is None:
        return [], []
    roots, trees = table_columns(other, topo) or chunk_columns((other,), topo)
    stats[key] = len(roots)
    return roots, trees


#: share of each root's seed trees the first master holds; the others join only where it
#: falls short of the seed's bound (dragonfly 4x4x1x8, one-way, 13 trees per root: the
#: first 5 per root already reach it; the master's LP grows with its columns)
FIRST_SEED_SHARE = 0.5


#: from this many GPUs the tree master runs the LP solver's presolve; below, it is
#: skipped: on the 107 LPs over 150 kB of the solves of fuzz seeds 3413/3497/3511 (16-128
#: GPUs, up to 1 664 columns of ~175 links) HiGHS's primal simplex took 1.61 s without it
#: against 3.25 s with it, none slower (dragonfly 4x4x1x8 one way: 0.31 -> 0.19 s, the
#: same iterations); at 512 GPUs it paid (HPN 4x16x8 one way: 11.8 s with, 12.8 s
#: without; docs/allgather.md "Tie-broken pricing", "The tree master without presolve")
MASTER_PRESOLVE_FROM_GPUS = 256


#: the tree master's absolute primal feasibility tolerance (its rows are in units of the
#: smallest GPU egress, so a slow port's row is small: at the solvers' 1e-7 default a
#: 83.3 Gbps port of multi-plane 2x8x8 was overloaded by 1.5e-6 of its capacity; the
#: point is cut to the rate its trees reach, :func:`.master_solve.reached`, by ~1e-9 at
#: 1e-9, where it is re-solved tighter; docs/allgather.md "The tree master's certificate,
#: exact")
MASTER_FEASIBILITY_TOL = 1e-9


#: a seed of one tree per root (ForestColl's budget chose ``k = 1``) cannot certify: the
#: master holds one weight per root, so its rate is the seed's own; its
#: multiplicative-weights trees join from this round on, not from
#: ``TreeCGOptions.short_seed_after`` (HPN 2x4x8 two way, fuzz seed 3413 ``None`` step 1:
#: 11 -> 5 rounds, 0.32 -> 0.20 s CPU; docs/allgather_history.md "A balanced seed of one tree
#: per root")
ONE_TREE_SEED_AFTER = 2


def split_seed(roots: list[int], trees: list[np.ndarray], share: float | None = None
               ) -> tuple[tuple[list[int], list[np.ndarray]], tuple[list[int], list[np.ndarray]]]:
    """The seed's columns in two parts: each root's first ``ceil(share * count)`` trees
    (in seed order; ``share`` defaults to :data:`FIRST_SEED_SHARE`), and the others."""
    share = FIRST_SEED_SHARE if share is None else share
    r = np.asarray(roots, dtype=np.int64)
    if r.size == 0:
        return (roots, trees), ([], [])
    order = np.argsort(r, kind="stable")
    counts = np.bincount(r)
    start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    place = np.empty(r.size, np.int64)
    place[order] = np.arange(r.size) - np.repeat(start, counts)
    first = place < np.ceil(share * counts[r])
    pick = np.flatnonzero(first).tolist()
    rest = np.flatnonzero(~first).tolist()
    return ([roots[i] for i in pick], [trees[i] for i in pick]), \
        ([roots[i] for i in rest], [trees[i] for i in rest])


def rate_scale(topo: Topology) -> float:
    """The smallest GPU egress capacity: an upper bound on the rate (every root sends its
    shard out), so the master's rate and capacities are O(1) whatever the units."""
    arr = topo.arrays
    egress = np.bincount(arr.tail, weights=arr.capacity, minlength=topo.num_nodes)
    return float(egress[arr.gpu_nodes].min())


def solve_general(topo: Topology, warm: Schedule | None = None, backend: str = "highs",
                  max_chunks: int | None = 10, cut_bound_gbps: float | None = None,
                  options: TreeCGOptions = TreeCGOptions(),
                  seed: RestrictionSeed | None = None, first_only: bool = False) -> Schedule:
    """The AllGather optimum with forwarding-only switches, rounded to ``max_chunks``
    chunks per root (``None``: the fractional optimum), warm-started from ``warm``;
    ``seed``: ForestColl's trees on the fabric's best balanced restriction (on a balanced
    fabric, the fabric itself) and its certified rate, at which the column generation
    stops (:mod:`.restriction_seed`, made by the method chain), else
    multiplicative-weights trees start the column generation.  ``first_only`` (with a
    ``seed``): the master over the seed's trees alone, solved once (no later columns, no
    pricing); ``stats["cg_status"]`` says whether it reached the seed's bound."""
    if not isinstance(topo, Topology):
        raise TopologyError(f"expected a mccl_opt.Topology, got {type(topo).__name__}")
    if topo.num_gpus < 2:
        raise TopologyError("an AllGather needs at least 2 GPUs")
    if warm is not None and (not isinstance(warm, Schedule) or warm.collective != "allgather"):
        raise ScheduleError("warm must be a previous AllGather Schedule")
    t_start = time.perf_counter()
    arr = topo.arrays
    scale = rate_scale(topo)
    capacity = arr.capacity / scale
    stats: dict[str, Any] = {"warm": warm is not None, "method": "general"}
    roots, trees = _warm_columns(warm, topo)
    stats["warm_columns"] = len(roots)
    progress.update("AllGather general method: starting trees")
    t = time.perf_counter()
    upper = None
    used: list[bool] = []                   # whether the previous trees were added
    if seed is not None:                    # ForestColl's trees on c', and its optimum
        seed_r, seed_t = seed.columns(topo) or chunk_columns(seed.schedules, topo)
        stats["seed"], stats["seed_columns"] = seed.source, len(seed_r)
        upper = seed.rate_gbps / scale
    else:
        seed_r, seed_t = mwu_trees(topo, capacity, rounds=options.seed_rounds if not roots
                                   else options.warm_seed_rounds)
        stats["seed"], stats["seed_columns"] = "multiplicative weights", len(seed_r)
    stats["seed_s"] = time.perf_counter() - t + (0.0 if seed is None else seed.seconds)
    with get_backend(backend, presolve=topo.num_gpus >= MASTER_PRESOLVE_FROM_GPUS,
                     feasibility_tol=MASTER_FEASIBILITY_TOL) as lp:
        if upper is not None:                # the previous trees only if the seed falls short
            # still short after a few rounds: multiplicative-weights trees too (leaf-spine
            # 4x2x8, one-way NIC, None, seeded with one tree per root: 219 rounds -> 108)
            # still short with those: the restriction's trees at more chunks (superpod
            # 2x4x8, fuzz seed 3419, None: 16 rounds -> 3; asked only then, for where the
            # weaker direction's trees reach the bound it repeats the first packing)
            # each root's other seed trees first (a master over half of them reaches
            # the bound on dragonfly 4x4x1x8 one-way: first master 0.26 -> 0.14 s)
            rest: tuple[list[int], list[np.ndarray]] = ([], [])
            short_after = min(options.short_seed_after, ONE_TREE_SEED_AFTER) \
                if len(seed_r) <= topo.num_gpus else options.short_seed_after
            if not first_only:
                (seed_r, seed_t), rest = split_seed(seed_r, seed_t)

            def previous() -> tuple[list[int], list[np.ndarray]]:
                used.append(True)
                return _later_columns(seed, topo, roots, trees, stats)

            later = [] if first_only else [
                (1, lambda: rest),
                (1, previous),
                (2, lambda: _seed_columns(seed.denser, topo, stats, "seed_denser_columns")),
                (short_after, lambda: mwu_trees(topo, capacity, options.short_seed_rounds))]
            res = tree_column_generation(
                topo, lp, capacity, seed_r, seed_t,
                dataclasses.replace(options, max_rounds=1) if first_only else options,
                upper_bound=upper, later=later)
        else:
            res = tree_column_generation(topo, lp, capacity, roots + seed_r, trees + seed_t,
                                         options)
    if upper is not None and not used:
        stats["warm_columns"] = 0               # the seed's trees sufficed: none were added
    if res.rate <= 0:
        raise SolveError("the general AllGather method found no tree with positive rate; "
                         "check that every link capacity is positive")
    stats.update(cg_rounds=res.rounds, cg_status=res.status, cg_gap=res.gap,
                 bound_gbps=res.bound * scale, lp_s=res.lp_seconds, first_lp_s=res.first_lp_seconds,
                 pricing_s=res.pricing_seconds,
                 columns=len(res.pool), dropped=res.dropped, link_rows=res.link_rows)
    return _schedule(topo, res, scale, max_chunks, cut_bound_gbps, stats, t_start, backend)


def _tree_chunks(topo: Topology, pool: TreePool, shares: np.ndarray
                 ) -> tuple[TreeChunks, np.ndarray]:
    """A chunk per pool column of positive share (a tree table, :mod:`.tree_table`), and
    each tree's depth."""
    keep = shares > 0
    roots, start, arcs = pool.select(keep)
    return tree_chunks(topo, roots, np.diff(start), arcs, shares[keep])


ChunksOf = Callable[[Topology, TreePool, np.ndarray], tuple[Sequence[TreeChunk], Sequence[int]]]


def _schedule(topo: Topology, res: TreeCGResult, scale: float, max_chunks: int | None,
              cut_bound_gbps: float | None, stats: dict[str, Any], t_start: float,
              backend: str, chunks_of: ChunksOf = _tree_chunks) -> Schedule:
    """Round, build the chunks (``chunks_of``: the chunks of the columns of positive
    share and their depths), recompute loads and rate, and the warm state."""
    pool, g = res.pool, topo.num_gpus
    capacity = topo.arrays.capacity / scale
    progress.update("AllGather general method: rounding")
    t = time.perf_counter()
    k: int | None = None
    if max_chunks is None:
        shares = fractional_shares(pool, res.weights, g)
    else:
        counts, k = round_trees(pool, res.weights, g, capacity, max_chunks)
        shares = counts / k
        stats["k"] = k                          # every share is a multiple of 1/k
    stats["rounding_s"] = time.perf_counter() - t
    chunks, depths = chunks_of(topo, pool, shares)
    loads = pool.loads(np.where(shares > 0, shares, 0.0), topo.num_links)
    rate = schedule_rate(topo, loads)
    lp_rate = res.rate * scale
    if max_chunks is None:
        lp_rate = max(lp_rate, rate)            # the fractional schedule is the LP's own
    lp_loads = pool.loads(res.weights, topo.num_links) * scale
    saturated = lp_loads >= topo.arrays.capacity * (1 - 1e-9)
    stats.update(num_trees=len(chunks), max_depth=int(max(depths)), mean_depth=float(np.mean(depths)))
    cut_bound = None
    if cut_bound_gbps is not None and cut_bound_gbps > lp_rate * (1 + 1e-9):
        cut_bound = stats["cut_bound_gbps"] = float(cut_bound_gbps)
    seconds = time.perf_counter() - t_start
    stats["total_s"] = seconds
    keep = res.weights > 0
    kept = copy.copy(pool)                      # the pool is deduplicated: no re-hashing
    if not keep.all():                          # (the symmetric expansion's: all kept)
        kept.keep(keep)
    state = AllGatherWarmState(columns=TreeColumns(kept, (topo.arrays.tail, topo.arrays.head)))
    report = SolveReport(collective="allgather", method=Method.GENERAL,
                         termination=Termination(res.status), bound_gbps=res.bound * scale,
                         warm=WarmUse.COLUMNS if stats["warm_columns"] else WarmUse.COLD,
                         max_chunks=max_chunks, seconds=seconds, cut_bound_gbps=cut_bound, k=k)
    return Schedule(
        collective="allgather", topology=topo.name, gpus=topo.gpus, rate_gbps=rate,
        lp_rate_gbps=lp_rate, max_chunks=max_chunks,
        chunks=chunks if isinstance(chunks, TreeChunks) else tuple(chunks),
        bottleneck=bottleneck_links(topo, loads, rate, k, saturated=saturated),
        solver={"backend": backend, "seconds": seconds, "iterations": res.iterations,
                "algorithm": "tree-colgen"},
        stats=stats, warm_state=state, report=report)
