"""The order in which the repair packer (:mod:`.repair`, paper §4.3) grows its trees.

Every logical link gets a *class*: wide (units above its tail's average: NVLink-derived
links on HPN), narrow above its tail's narrow average, other narrow.  From
``RAIL_FIRST_MIN_RANKS`` ranks on, a tree takes wide links first, then the narrow links
out of its vertices in its root's *narrow component* (weakly connected over narrow
links: a rail on HPN), then those out of its other vertices, each above-average ones
first, and grows up to ``n // BATCH_PARTS`` vertices per turn; below, wide links then
narrow ones, one vertex per turn.  :class:`ArcLists` stores the links class by class,
so a scan of one class touches that class's links only.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components

__all__ = ["ArcLists", "GrowthOrder", "growth_order", "narrow_components",
           "RAIL_FIRST_MIN_RANKS", "BATCH_PARTS"]

#: a tree adds up to ``n // BATCH_PARTS`` vertices per turn of the round robin (at
#: least one): its rows stay in cache, and every tree still grows in 64 steps or more,
#: which keeps the fairness that avoids repairs (n // 16 needed 30 at 2048 GPUs)
BATCH_PARTS = 64

#: from this many ranks on, trees grow rail first in batched turns (below: wide links,
#: then narrow ones in scan order, one vertex per turn, as that packs small fabrics
#: without repairs and with shallower trees under failures: HPN 1x2x8 Fail2 depth 5,
#: not 6, and 2-7 % more simulated bandwidth at 16 MiB; 8x8x8 needs >1000 repairs
#: without the rail-first order)
RAIL_FIRST_MIN_RANKS = 512


class ArcLists(NamedTuple):
    """The links of each class (0 wide, 1 and 2 narrow) in one array, class by class,
    each class by tail then head: class ``c``'s links out of ``u`` sit at positions
    ``start[c, u] .. start[c, u + 1]``; ``arc``: the link at a position, ``head`` its
    head, ``fpos`` its index in its tail's whole out-list (the rotated scan starts
    there), ``pos``: the position of each link; ``skip``: the live positions (a
    saturated link's position points past itself), with a live sentinel at the end."""

    start: np.ndarray
    arc: np.ndarray
    head: np.ndarray
    fpos: np.ndarray
    pos: np.ndarray
    skip: np.ndarray


class GrowthOrder(NamedTuple):
    """The class lists, every rank's narrow component and the vertices per turn."""

    lists: ArcLists
    comp: np.ndarray
    batch: int


def growth_order(n: int, tail: np.ndarray, head: np.ndarray, units: np.ndarray,
                 start: np.ndarray) -> GrowthOrder:
    """The growth order of links sorted by tail then head (``start``: tail offsets)."""
    deg = np.diff(start)
    mean = np.bincount(tail, weights=units, minlength=n) / np.maximum(deg, 1)
    wide = units > mean[tail]
    if n < RAIL_FIRST_MIN_RANKS:            # wide, then narrow in scan order, one per turn
        return GrowthOrder(arc_lists(n, tail, head, start, np.where(wide, 0, 1)),
                           np.zeros(n, np.int64), 1)
    n_mean = np.bincount(tail, weights=np.where(wide, 0, units), minlength=n) / np.maximum(
        np.bincount(tail, weights=~wide, minlength=n), 1)
    cls = np.where(wide, 0, np.where(units > n_mean[tail], 1, 2))
    return GrowthOrder(arc_lists(n, tail, head, start, cls),
                       narrow_components(n, tail, head, wide), max(1, n // BATCH_PARTS))


def arc_lists(n: int, tail: np.ndarray, head: np.ndarray, start: np.ndarray,
              cls: np.ndarray) -> ArcLists:
    """:class:`ArcLists` of links sorted by tail then head, ``cls``: each link's class."""
    m = tail.size
    arc = np.argsort(cls, kind="stable")
    counts = np.zeros((3, n), np.int64)
    np.add.at(counts, (cls, tail), 1)
    cstart = np.zeros((3, n + 1), np.int64)
    cstart[:, 1:] = np.cumsum(counts.ravel()).reshape(3, n)
    cstart[1:, 0] = cstart[:-1, -1]
    pos = np.empty(m, np.int64)
    pos[arc] = np.arange(m)
    return ArcLists(cstart, arc.astype(np.int64), head[arc].astype(np.int32),
                    (arc - start[tail[arc]]).astype(np.int32), pos,
                    np.arange(m + 1, dtype=np.int64))


def narrow_components(n: int, tail: np.ndarray, head: np.ndarray, wide: np.ndarray
                      ) -> np.ndarray:
    """Weakly connected components of the narrow (not wide) links, one label per rank.

    On HPN they are the rails: a tree that enters new hosts through its root's rail
    first and fans out over NVLink inside them enters every host once, which is what
    the exactly tight host ingress (every rail unit used) needs."""
    narrow = ~wide
    adj = coo_matrix((np.ones(int(narrow.sum()), np.int8), (tail[narrow], head[narrow])),
                     shape=(n, n))
    return connected_components(adj, directed=True, connection="weak")[1].astype(np.int64)
