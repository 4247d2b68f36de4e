"""The per-vertex mapping of logical tree classes to physical trees, kept as the tests'
reference for :func:`mccl_opt.allgather.forestcoll.mapping.map_classes` (which maps in
arrays and cuts classes that straddle two paths of a bundle): every class peels its
multiplicity off each logical link's bundle, in class order, and splits wherever the
units it takes come from several paths."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from mccl_opt.allgather.forestcoll.packing.trees import TreeClass
from mccl_opt.allgather.forestcoll.removal.splitting import LogicalGraph, peel

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
            pieces = peel(bundles[int(cls.parent_arc[v])], cls.mult)
            if len(pieces) == 1:
                for _, edges in subs:
                    edges.append(pieces[0][0])
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


def path_use(trees: Sequence[PhysicalTree]) -> dict[tuple[int, ...], int]:
    """Trees (with multiplicity) riding every path."""
    used: dict[tuple[int, ...], int] = {}
    for _, mult, paths in trees:
        for p in paths:
            used[p] = used.get(p, 0) + mult
    return used
