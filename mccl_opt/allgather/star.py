"""Phase 2's one-pass split of a star switch (ForestColl switch removal, paper §4.3).

When every arc at a switch ``w`` rides one physical path (every first-level switch),
the spread proposal's pair amounts are applied at once: pair ``p`` joins in-arc
``ins[i_in[p]] = (u, w)`` to out-arc ``outs[j_out[p]] = (w, t)``, so ``amounts[p]``
units of the logical arc ``u -> t`` ride the walk ``path(u, w) + path(w, t)[1:]``
with its cycles cut (a loop only adds load).  The result equals
:meth:`.splitting.SplitGraph.split` pair by pair, in pair order.  Within one star the
pairs ``(u, t)`` are distinct, so new logical arcs are written in bulk and only arcs
already present (from an earlier switch) merge into their bundles one by one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numba import njit

if TYPE_CHECKING:
    from .splitting import SplitGraph

__all__ = ["split_star", "star_paths"]


def split_star(g: "SplitGraph", ins: list, outs: list, i_in: np.ndarray, j_out: np.ndarray,
               amounts: list[int]) -> None:
    """Split every unit of a switch at once (module docstring); units left on an in-arc
    are forced loops ``u -> w -> u`` and vanish."""
    units, bundles = g.units, g.bundles
    paths = star_paths([bundles[a][0][0] for a in ins], [bundles[b][0][0] for b in outs],
                       i_in, j_out)
    src = np.array([a[0] for a in ins], np.int64)[i_in]
    dst = np.array([b[1] for b in outs], np.int64)[j_out]
    keys = list(zip(src.tolist(), dst.tolist()))
    fresh = np.array([key not in units for key in keys], bool)
    for p in np.flatnonzero(~fresh).tolist():           # merge into an existing bundle
        key, amt, path = keys[p], amounts[p], paths[p]
        units[key] += amt
        for entry in bundles[key]:
            if entry[0] == path:
                entry[1] += amt
                break
        else:
            bundles[key].append([path, amt])
    new = np.flatnonzero(fresh)
    new_keys = [keys[p] for p in new.tolist()]
    new_amts = [amounts[p] for p in new.tolist()]
    units.update(zip(new_keys, new_amts))
    bundles.update(zip(new_keys, [[[paths[p], a]] for p, a in zip(new.tolist(), new_amts)]))
    _add_neighbours(g.outs, src[new], dst[new])
    _add_neighbours(g.ins, dst[new], src[new])
    for key in ins + outs:
        g._set(key, 0)


def _add_neighbours(of: dict[int, set[int]], a: np.ndarray, b: np.ndarray) -> None:
    """``of[x] |= {b[i] : a[i] == x}`` for every ``x`` in ``a``."""
    if a.size == 0:
        return
    order = np.argsort(a, kind="stable")
    a, b = a[order], b[order]
    cut = np.flatnonzero(a[1:] != a[:-1]) + 1
    for x, group in zip(a[np.concatenate([[0], cut])].tolist(), np.split(b, cut)):
        of.setdefault(x, set()).update(group.tolist())


def star_paths(p_in: list[tuple[int, ...]], p_out: list[tuple[int, ...]],
               i_in: np.ndarray, j_out: np.ndarray) -> list[tuple[int, ...]]:
    """Simple paths ``p_in[i] + p_out[j][1:]`` (cycles cut) for every pair, by array
    operations on the pairs whose in- and out-path have the same lengths."""
    paths: list[tuple[int, ...]] = [()] * i_in.size
    len_in = np.array([len(p) for p in p_in], np.int64)[i_in]
    len_out = np.array([len(p) for p in p_out], np.int64)[j_out]
    for li in np.unique(len_in).tolist():
        rows_in = np.array([p if len(p) == li else (-1,) * li for p in p_in], np.int64)
        for lo in np.unique(len_out[len_in == li]).tolist():
            rows_out = np.array([p if len(p) == lo else (-1,) * lo for p in p_out], np.int64)
            sel = np.flatnonzero((len_in == li) & (len_out == lo))
            walk = np.concatenate([rows_in[i_in[sel]], rows_out[j_out[sel]][:, 1:]], axis=1)
            ordered = np.sort(walk, axis=1)
            loop = (ordered[:, 1:] == ordered[:, :-1]).any(axis=1)
            rows = walk.tolist()
            cyc = np.flatnonzero(loop)
            if cyc.size:
                cut, lens = _cut_cycles(walk[cyc])
                for r, row, n in zip(cyc.tolist(), cut.tolist(), lens.tolist()):
                    rows[r] = row[:n]
            for r, path in zip(sel.tolist(), map(tuple, rows)):
                paths[r] = path
    return paths


@njit(cache=True)
def _cut_cycles(walks):
    """Every row walked with its cycles cut (a node seen before truncates the path back
    to it, as :func:`.splitting.simple_path`): the paths, left-aligned, and lengths."""
    out = np.empty_like(walks)
    lens = np.zeros(walks.shape[0], np.int64)
    for r in range(walks.shape[0]):
        n = 0
        for v in walks[r]:
            i = 0
            while i < n and out[r, i] != v:
                i += 1
            if i < n:
                n = i + 1
            else:
                out[r, n] = v
                n += 1
        lens[r] = n
    return out, lens
