"""From logical tree classes to physical ``TreeChunk`` trees.

Each logical link's units ride on one or more physical switch paths (its bundle from
Phase 2).  A class of multiplicity ``m`` peels ``m`` units off every link it uses; if a
link's units come from several paths the class splits so that every tree edge is one
path.  Tree edges are listed parents first (breadth-first).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from ..schedule import TreeChunk
from .splitting import LogicalGraph, _peel
from .trees import TreeClass

__all__ = ["PhysicalTree", "to_physical"]

PhysicalTree = tuple[int, int, list[tuple[int, ...]]]   # (root rank, mult, edge paths)


def _bfs_vertices(cls: TreeClass, lg: LogicalGraph) -> list[int]:
    kids: dict[int, list[int]] = {}
    for v in np.flatnonzero(cls.parent_arc >= 0).tolist():
        kids.setdefault(int(lg.tail[cls.parent_arc[v]]), []).append(v)
    seq = [cls.root]
    for u in seq:
        seq.extend(kids.get(u, ()))
    return seq[1:]


def to_physical(classes: Sequence[TreeClass], lg: LogicalGraph) -> list[PhysicalTree]:
    """Split classes along bundle boundaries; returns (root, mult, paths) per tree."""
    bundles = [[list(p) for p in b] for b in lg.bundles]
    out: list[PhysicalTree] = []
    for cls in classes:
        subs: list[tuple[int, list[tuple[int, ...]]]] = [(cls.mult, [])]
        for v in _bfs_vertices(cls, lg):
            pieces = _peel(bundles[int(cls.parent_arc[v])], cls.mult)
            if len(pieces) == 1:
                path = pieces[0][0]
                for _, edges in subs:
                    edges.append(path)
                continue
            new_subs = []
            i, left = 0, pieces[0][1]
            for mult, edges in subs:
                while mult > 0:
                    take = min(mult, left)
                    new_subs.append((take, edges + [pieces[i][0]]))
                    mult -= take
                    left -= take
                    if left == 0 and i + 1 < len(pieces):
                        i += 1
                        left = pieces[i][1]
            subs = new_subs
        out.extend((cls.root, m, edges) for m, edges in subs)
    return out


def tree_chunks(trees: Sequence[PhysicalTree], k: int, node_ids: Sequence[str],
                gpu_ids: Sequence[str]) -> list[TreeChunk]:
    """``TreeChunk`` objects (share ``mult/k``), ordered by root rank then share."""
    return [TreeChunk(gpu_ids[root], mult / k,
                      tuple(tuple(node_ids[v] for v in p) for p in paths))
            for root, mult, paths in trees]
