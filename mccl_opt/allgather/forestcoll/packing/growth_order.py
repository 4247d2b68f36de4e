"""The order in which the repair packer (:mod:`.repair`, paper §4.3) grows its trees.

Every logical link gets a *class*: wide (above its tail's mean link and half its
unit-weighted mean, :func:`wide_links`: NVLink-derived links on HPN and fat-trees), narrow
above its tail's narrow average, other narrow.  From
``RAIL_FIRST_MIN_RANKS`` ranks on, a tree takes wide links first, then the narrow links
out of its vertices in its root's *narrow component* (weakly connected over narrow
links: a rail on HPN), then those out of its other vertices, each above-average ones
first, and grows up to ``n // BATCH_PARTS`` vertices per turn; below, wide links then
narrow ones, one vertex per turn.  :class:`GrowthOrder` numbers the links class by
class, so a scan of one class touches that class's links only.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from mccl_opt.graph_components import weak_components

__all__ = ["GrowthOrder", "growth_order", "components", "wide_links",
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


class GrowthOrder(NamedTuple):
    """Links renumbered class by class (0 wide, 1 narrow above its tail's narrow
    average, 2 other narrow), each class by tail then head: ``perm[i]``, the original
    index of link ``i``; class ``c``'s links out of ``u`` are ``start[c, u] ..
    start[c, u + 1]``; ``fpos[i]``: link ``i``'s index in its tail's whole out-list by
    head (a scan rotated over that list starts there); ``comp``: every rank's narrow
    component; ``batch``: vertices a tree adds per turn.

    ``part_col[v, class_part[c]]``: the column of ``v``'s *part* for link class ``c``
    (weakly connected components over the class's links: hosts and rails on HPN)
    among all parts, ``part_size`` their sizes.  A link never leaves its class's part, so once a tree
    holds every rank of ``u``'s part, ``u``'s links of that class lead to ranks the
    tree has and its scan is skipped (the packer keeps a count of missing ranks per
    tree and part).  More than ``n // 4`` parts of a kind are merged into one (no
    skips, little memory)."""

    perm: np.ndarray
    start: np.ndarray
    fpos: np.ndarray
    comp: np.ndarray
    batch: int
    part_col: np.ndarray
    part_size: np.ndarray
    class_part: np.ndarray


def growth_order(n: int, tail: np.ndarray, head: np.ndarray, units: np.ndarray,
                 rail_first: bool | None = None) -> GrowthOrder:
    """The growth order of the logical links (``units``: tree units of each);
    ``rail_first``: the rail-first batched order whatever ``n`` (default: from
    ``RAIL_FIRST_MIN_RANKS`` ranks on)."""
    deg = np.bincount(tail, minlength=n)
    wide = wide_links(n, tail, units)
    if not (n >= RAIL_FIRST_MIN_RANKS if rail_first is None else rail_first):
        # wide, then narrow in scan order, one per turn
        cls, comp, batch = np.where(wide, 0, 1), np.zeros(n, np.int64), 1
    else:
        n_mean = np.bincount(tail, weights=np.where(wide, 0, units), minlength=n) / \
            np.maximum(np.bincount(tail, weights=~wide, minlength=n), 1)
        cls = np.where(wide, 0, np.where(units > n_mean[tail], 1, 2))
        rail = ~wide & ~_reverse_wide(n, tail, head, wide)
        comp, batch = components(n, tail[rail], head[rail]), max(1, n // BATCH_PARTS)
    labels: list[np.ndarray] = []          # distinct partitions (rails serve both narrow
    class_part = np.zeros(3, np.int64)      # classes on HPN)
    for c in range(3):
        label = components(n, tail[cls == c], head[cls == c])
        label = label if label.max() < n // 4 else np.zeros(n, np.int64)
        same = [j for j, other in enumerate(labels) if np.array_equal(other, label)]
        class_part[c] = same[0] if same else len(labels)
        if not same:
            labels.append(label + sum(int(lab.max()) + 1 for lab in labels))
    part_col = np.stack(labels, axis=1)
    part_size = np.bincount(part_col.ravel()).astype(np.int16)
    key = tail.astype(np.int64) * n + head   # one sort key (links usually come sorted)
    by_tail = np.argsort(key)
    fpos = np.empty(tail.size, np.int64)
    fpos[by_tail] = np.arange(tail.size) - (np.cumsum(deg) - deg)[tail[by_tail]]
    perm = np.argsort(cls * (n * n) + key)
    counts = np.bincount(cls * n + tail, minlength=3 * n)
    start = np.zeros((3, n + 1), np.int64)
    start[:, 1:] = np.cumsum(counts.ravel()).reshape(3, n)
    start[1:, 0] = start[:-1, -1]
    return GrowthOrder(perm, start, fpos[perm], comp, batch, part_col, part_size, class_part)


def wide_links(n: int, tail: np.ndarray, units: np.ndarray) -> np.ndarray:
    """Per link: is it *wide*, above the mean of its tail's links and above half their
    unit-weighted mean (``sum u² / sum u``: the units of the link an average unit of the
    tail is on)?

    The plain mean alone depends on how many narrow links a GPU has: a fat-tree's spread
    split cuts each NIC into ~105 logical links of 1-110 units, which pulls the mean down
    to ~46 units, so 156 NIC links were wide on fat-tree 4x2x2x8 at ``None`` and trees
    entered hosts through them before fanning out over NVLink (docs/allgather.md, *Wide
    NIC links*).  The weighted mean is ~580 units there and on HPN alike (thin links add
    little to it); halved, it keeps NVLink-derived links of uneven units wide (the split
    gives some 156-194 units on fat-tree 2x2x1x8)."""
    w = units.astype(np.float64)
    deg = np.bincount(tail, minlength=n)
    total = np.bincount(tail, weights=w, minlength=n)
    mean = total / np.maximum(deg, 1)
    weighted = np.bincount(tail, weights=w * w, minlength=n) / np.maximum(total, 1)
    return units > np.maximum(mean, weighted / 2)[tail]


def _reverse_wide(n: int, tail: np.ndarray, head: np.ndarray, wide: np.ndarray
                  ) -> np.ndarray:
    """Per link: is its reverse link wide (``False`` where there is none)?"""
    wide_keys = np.sort(tail[wide].astype(np.int64) * n + head[wide])
    if wide_keys.size == 0:
        return np.zeros(tail.size, bool)
    rev = head.astype(np.int64) * n + tail
    at = np.minimum(np.searchsorted(wide_keys, rev), wide_keys.size - 1)
    return wide_keys[at] == rev


def components(n: int, tail: np.ndarray, head: np.ndarray) -> np.ndarray:
    """Weakly connected components of the links ``tail -> head``, one label per rank.

    Over the wide links of HPN they are the hosts, over the links narrow both ways
    the rails: a tree that enters new hosts through its root's rail first and fans out
    over NVLink inside them enters every host once, which is what the exactly tight
    host ingress (every rail unit used) needs.  (A degraded NVLink link is narrow for
    the healthy GPU only; counting it would merge rails: HPN Fail3's backup GPU joined
    all eight rails into one at 2048 GPUs.)"""
    return weak_components(n, tail, head)
