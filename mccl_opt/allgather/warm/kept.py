"""What an AllGather schedule keeps for its successor: :class:`AllGatherWarmState`.

One typed warm state per collective (AllToAll's is
:class:`~mccl_opt.alltoall.state.AllToAllWarmState`).  An AllGather schedule made by
ForestColl keeps its trees (:class:`KeptTrees`: the tight cut, the unit-tree count, the
tree shapes in rank space, the link loads and the physical forest), read back by
ForestColl-warm (paper §4.3, :class:`.previous.Previous`); one made by the general method
keeps its tree columns (:class:`TreeColumns`), the seed of the next column generation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from mccl_opt.topology import Topology
from ..forestcoll.mapping import MappedTrees
from ..general.live_master import TreePool
from .forest import PhysicalForest

__all__ = ["AllGatherWarmState", "KeptTrees", "TreeColumns", "Shapes"]

Shapes = tuple[np.ndarray, np.ndarray]      # (root ranks, parent-rank rows), by root, largest first


@dataclass(frozen=True)
class KeptTrees:
    """The trees a ForestColl schedule keeps for ForestColl-warm.

    ``cut``: node ids of Phase 1's tight set; ``k``: unit trees per root; ``num_gpus``;
    ``shapes``: ``(roots, parent ranks)`` of every tree, by root and largest first;
    ``guides``: per root rank, the parent ranks of its largest tree (its first shape);
    ``loads``: share load per link; ``links``: the ``(tail, head)`` node arrays those
    loads refer to; ``forest``: the physical trees (:mod:`.forest`), built with the
    schedule so that a warm start only edits arrays."""

    cut: frozenset[str]
    k: int
    num_gpus: int
    shapes: Shapes
    loads: np.ndarray
    links: tuple[np.ndarray, np.ndarray]
    guides: dict[int, np.ndarray] = field(repr=False)
    forest: PhysicalForest | None = field(default=None, repr=False)

    @classmethod
    def of_trees(cls, topo: Topology, cut: set[str] | frozenset[str], k: int, shapes: Shapes,
                 loads: np.ndarray, *, forest: PhysicalForest | None = None,
                 mapped: MappedTrees | None = None,
                 tree_depths: np.ndarray | None = None) -> "KeptTrees":
        """The warm state of a new schedule on ``topo``; ``shapes`` by root, largest first,
        so the first shape of every root is its guide; the physical trees as a ``forest``
        (rerouted or restored) or as Phase 3's ``mapped`` trees with their
        ``tree_depths`` (the forest is built from them here: ~0.6 s of CPU at 4096 GPUs,
        spent when the schedule is made rather than when a failure strikes)."""
        roots, parents = shapes
        first = np.ones(roots.size, bool)
        first[1:] = roots[1:] != roots[:-1]
        arr = topo.arrays
        if forest is None and mapped is not None:      # built now, not when a failure strikes
            forest = PhysicalForest.from_mapped(mapped, k, tree_depths, topo)
        return cls(frozenset(cut), int(k), topo.num_gpus, shapes, loads, (arr.tail, arr.head),
                   {int(roots[i]): parents[i] for i in np.flatnonzero(first).tolist()},
                   forest)

    def with_cut(self, cut: set[str]) -> "KeptTrees":
        """This state with another tight set (a kept schedule, re-certified)."""
        return dataclasses.replace(self, cut=frozenset(cut))


@dataclass(frozen=True)
class TreeColumns:
    """The general method's tree columns with positive weight, over the links
    ``(tail, head)`` their arc indices refer to."""

    pool: TreePool
    links: tuple[np.ndarray, np.ndarray]

    def fits(self, topo: Topology) -> bool:
        """Whether the columns' arc indices are ``topo``'s links (capacities may differ)."""
        arr = topo.arrays
        return np.array_equal(self.links[0], arr.tail) and np.array_equal(self.links[1], arr.head)


@dataclass(frozen=True)
class AllGatherWarmState:
    """``Schedule.warm_state`` of every AllGather schedule: ForestColl's ``trees`` or the
    general method's ``columns`` (``None`` where the method that made it has none)."""

    trees: KeptTrees | None = None
    columns: TreeColumns | None = None
