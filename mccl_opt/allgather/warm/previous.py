"""What ForestColl-warm (paper §4.3) keeps from a schedule and reads back from it.

Every AllGather schedule carries an :class:`~.kept.AllGatherWarmState`; a warm start reads it (or, for a
schedule loaded from a file, the chunks alone) through :class:`Previous`:
the previous tight cut (a hint for Phase 1), per-root guide trees and tree shapes in
rank space (seeds for Phase 3, so a replaced GPU inherits its rank's trees), the link
loads (to keep a schedule that still reaches the optimum) and the physical trees (to
reroute them, :mod:`.reroute`).  docs/allgather.md describes the warm paths.
"""

from __future__ import annotations

import dataclasses
from functools import cached_property
from typing import Any, Sequence

import numpy as np

from mccl_opt.errors import ScheduleError
from mccl_opt.schedule import Schedule, schedule_rate, share_loads
from mccl_opt.schedule_chunks import TreeChunks
from mccl_opt.topology import Topology
from ..canonical import canonical
from .forest import PhysicalForest
from .kept import AllGatherWarmState, KeptTrees, Shapes
from .transfer import carried

__all__ = ["Previous", "restore_forest_state"]

class Previous:
    """The previous schedule of a warm start, read against the new topology ``topo``.

    ``hint_cuts``: its tight set as a node mask (the bottleneck links' heads when it has
    no warm state), empty if none of it is in ``topo``; ``guides``: per root rank, the
    parent ranks of its largest tree; ``shapes``: its tree shapes in rank space, or the
    guides' when it has no warm state for ``topo``'s GPU count."""

    def __init__(self, schedule: Schedule, topo: Topology) -> None:
        if not isinstance(schedule, Schedule) or schedule.collective != "allgather":
            raise ScheduleError("warm must be a previous AllGather Schedule")
        self.schedule = schedule
        self.topo = topo
        state = schedule.warm_state
        self.state: KeptTrees | None = state.trees if isinstance(state, AllGatherWarmState) else None
        ids = self.state.cut if self.state is not None else {b.dst for b in schedule.bottleneck}
        cut = np.array([n.id in ids for n in topo.nodes], bool)
        self.hint_cuts: list[np.ndarray] = [cut] if cut.any() else []
        fits = self.state is not None and self.state.num_gpus == topo.num_gpus
        self.guides: dict[int, np.ndarray] = self.state.guides if fits else _guides_from(
            schedule, topo)
        self.shapes: Shapes | None = self.state.shapes if fits else _stacked(self.guides)

    @cached_property
    def same_fabric(self) -> KeptTrees | None:
        """The warm state if ``topo`` has the previous GPUs and links (only capacities may
        differ: Fail1, Fail2, drift; not Fail3), else ``None``."""
        state, arr = self.state, self.topo.arrays
        if state is None or tuple(self.schedule.gpus) != tuple(self.topo.gpus):
            return None
        tail, head = state.links
        if tail.size != arr.tail.size or not (np.array_equal(tail, arr.tail)
                                              and np.array_equal(head, arr.head)):
            return None
        return state

    @cached_property
    def forest(self) -> PhysicalForest | None:
        """The previous physical trees on ``topo``: as they are if ``topo`` has their
        nodes and links, carried over (:mod:`.transfer`) if only GPUs were replaced
        (Fail3), else ``None``."""
        state = self.same_fabric
        if state is not None:
            return state.forest
        if self.state is None or self.state.forest is None:
            return None
        return carried(self.state.forest, self.schedule.gpus, self.state.links, self.topo)

    def kept_loads(self, budget_opt_gbps: float, max_chunks: int | None) -> np.ndarray | None:
        """The previous link loads if, on the new capacities, the previous schedule still
        reaches the chunk-budget optimum ``budget_opt_gbps`` (a drift on links it does not
        saturate); else ``None``."""
        state = self.same_fabric
        if state is None or self.schedule.max_chunks != max_chunks:
            return None
        if schedule_rate(self.topo, state.loads) < budget_opt_gbps * (1 - 1e-12):
            return None
        return state.loads


def _sources_and_shares(chunks: Sequence[Any]) -> tuple[list[str], list[float]]:
    """Every chunk's source GPU and share, in order; read from the tree table where the
    chunks are one (:class:`~mccl_opt.schedule_chunks.TreeChunks`), without building a
    chunk: a general-method schedule of 128 GPUs has ~3,000 trees, and building them all
    cost a warm start 35 ms (leaf-spine 4x2x8 at ``None``, a 25-35 ms cold solve)."""
    if isinstance(chunks, TreeChunks):
        t = chunks.table
        return [t.node_ids[s] for s in t.src.tolist()], t.shares.tolist()
    return [c.src for c in chunks], [c.share for c in chunks]


def _guides_from(warm: Schedule, topo: Topology) -> dict[int, np.ndarray]:
    """Per root rank, the parent ranks of its largest previous tree (the first of equal
    shares; by rank position, so a replaced GPU keeps its rank's guidance)."""
    if len(warm.gpus) != topo.num_gpus:
        return {}
    rank = {g: i for i, g in enumerate(warm.gpus)}
    best: dict[int, tuple[float, int]] = {}
    for i, (src, share) in enumerate(zip(*_sources_and_shares(warm.chunks))):
        r = rank.get(src)
        if r is not None and (r not in best or share > best[r][0]):
            best[r] = (share, i)
    guides = {}
    for r, (_, i) in best.items():
        c = warm.chunks[i]
        par = np.full(topo.num_gpus, -1, np.int64)
        for e in getattr(c, "edges", ()):
            if e[0] in rank and e[-1] in rank:
                par[rank[e[-1]]] = rank[e[0]]
        guides[r] = par
    return guides


def _stacked(guides: dict[int, np.ndarray]) -> Shapes | None:
    """The guides as shapes (one per root, by root)."""
    if not guides:
        return None
    roots = sorted(guides)
    return np.array(roots, np.int64), np.stack([guides[r] for r in roots])


def restore_forest_state(schedule: Schedule, topo: Topology) -> Schedule:
    """An AllGather ``schedule`` read without its warm state (a file, a controller's saved
    state) with that state rebuilt from its trees on ``topo`` (its GPUs and links), so a
    warm start from it reroutes the trees (:mod:`.reroute`) instead of packing anew; the
    schedule unchanged if it has a warm state or its chunks are not spanning trees over
    ``topo``'s switch paths with shares in multiples of one ``1/k``.  Costs ~60 ms at
    128 GPUs: done when a schedule is loaded, not when a failure strikes."""
    kept = schedule.warm_state
    if schedule.collective != "allgather" or tuple(schedule.gpus) != tuple(topo.gpus) \
            or (isinstance(kept, AllGatherWarmState) and kept.trees is not None):
        return schedule
    topo = canonical(topo)            # the listing solve_allgather works on
    forest = PhysicalForest.from_chunks(schedule.chunks, topo)
    if forest is None:
        return schedule
    trees = KeptTrees.of_trees(topo, {b.dst for b in schedule.bottleneck}, forest.k,
                               forest.shapes(), share_loads(topo, schedule.chunks), forest=forest)
    columns = kept.columns if isinstance(kept, AllGatherWarmState) else None
    return dataclasses.replace(schedule, warm_state=AllGatherWarmState(trees, columns))
