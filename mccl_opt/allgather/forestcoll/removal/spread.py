"""Phase 2 by the spread proposal, in arrays (ForestColl switch removal, paper §4.3, Fig. 18).

Switches are split one at a time in :func:`.splitting.switch_order`.  Splitting ``w``
pairs its in-links ``u -> w`` with its out-links ``w -> t`` (``u != t``) by the
integral transport of :func:`.transport.transport`, seeded with the proportional
share ``a_u b_t / (C - b_u)`` (rounded up) so every GPU gets logical links to all its
switch peers, pairs whose ends share another switch last (:mod:`.siblings`); then every
unit at ``w`` is gone: paired units become logical links ``u -> t``, units left on an
in-link are forced loops ``u -> w -> u`` and units no pair takes (an unbalanced switch)
are dropped.

The graph lives in arrays: every arc (logical or physical) has its units and a linked
list of bundle segments, each segment its units and its path in a node buffer; an
open-addressing hash table finds the arc ``u -> t``.  A compiled kernel applies one switch's pairs in pair
order (in-links by tail, out-links by head): pair ``(u, t)`` of ``m`` units takes
``m`` units off the front of both bundles, zips them, and every piece rides the walk
``path(u, w) + path(w, t)[1:]`` with its cycles cut (a loop only adds load), merged
into the segment of ``u -> t`` with the same path if there is one.  This is
:meth:`.splitting.SplitGraph.split` pair by pair, so the logical graph and its bundles
equal the dictionary form's (``tests/test_allgather_split_arrays.py`` compares them).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from .... import anytime
from .bundles import Bundles
from .cut_guard import KnownCuts, SweepGuard
from .siblings import SwitchNeighbours, spread_stages
from .splitting import LogicalGraph, SplitGraph, gpu_links, switch_order
from .transport import transport

__all__ = ["spread_split", "TRANSPORT_PAIRS_PER_S"]

Guard = KnownCuts | SweepGuard

#: the spread proposal's transport at one switch (:func:`_pair_amounts`, one compiled
#: max-flow), in-link x out-link pairs per CPU second: ~1,000 x 1,000 pairs at the last
#: ToRs of shared aggregation 2x64x8 took 0.17-0.26 s each, with no check inside
TRANSPORT_PAIRS_PER_S = 4_000_000


class ArcTable(NamedTuple):
    """Per arc (logical or physical): its ends, units, segment list (``first``,
    ``last``, ``nseg``) and whether it is in ``switch_arcs`` (``listed``); ``keys`` and
    ``slots`` the hash map ``tail·n + head -> arc``."""

    keys: np.ndarray
    slots: np.ndarray
    tail: np.ndarray
    head: np.ndarray
    units: np.ndarray
    nseg: np.ndarray
    first: np.ndarray
    last: np.ndarray
    listed: np.ndarray
    switch_arcs: np.ndarray


class SegmentTable(NamedTuple):
    """Per bundle segment: its units, the next segment of its arc's list, and its path
    ``buf[pstart : pstart + plen]`` in the node buffer."""

    units: np.ndarray
    next: np.ndarray
    pstart: np.ndarray
    plen: np.ndarray
    buf: np.ndarray


class Pairs(NamedTuple):
    """One switch's pairing: in-arcs ``ins`` and out-arcs ``outs`` (arc ids), and per
    pair the positions ``i_in``, ``j_out`` in them and its ``amounts`` (units)."""

    ins: np.ndarray
    outs: np.ndarray
    i_in: np.ndarray
    j_out: np.ndarray
    amounts: np.ndarray


class _Arrays:
    """The growing arrays of the split (module docstring): arcs, segments, node buffer."""

    def __init__(self, g: SplitGraph, siblings_last: bool = True) -> None:
        keys = list(g.units)
        m = len(keys)
        segs = [seg for key in keys for seg in g.bundles[key]]
        self.tail = np.array([a for a, _ in keys], np.int64).reshape(-1)
        self.head = np.array([b for _, b in keys], np.int64).reshape(-1)
        self.units = np.array([g.units[key] for key in keys], np.int64).reshape(-1)
        counts = np.array([len(g.bundles[key]) for key in keys], np.int64).reshape(-1)
        self.nseg = counts.copy()
        first = np.zeros(m, np.int64)
        np.cumsum(counts[:-1], out=first[1:])
        self.first = np.where(counts > 0, first, -1)
        self.last = np.where(counts > 0, first + counts - 1, -1)
        self.seg_units = np.array([u for _, u in segs], np.int64).reshape(-1)
        self.seg_next = np.arange(1, len(segs) + 1, dtype=np.int64)
        self.seg_next[self.last[counts > 0]] = -1
        lens = np.array([len(p) for p, _ in segs], np.int64).reshape(-1)
        self.seg_plen = lens
        self.seg_pstart = np.zeros(len(segs), np.int64)
        np.cumsum(lens[:-1], out=self.seg_pstart[1:])
        self.buf = np.array([v for p, _ in segs for v in p], np.int64).reshape(-1)
        self.maxlen = int(lens.max()) if lens.size else 0
        self.n_arcs, self.n_segs, self.top = m, len(segs), int(lens.sum())
        at_switch = g.is_switch[self.tail] | g.is_switch[self.head]
        self.listed = at_switch.copy()
        self.switch_arcs = np.zeros(m, np.int64)             # as long as the arc arrays
        self.n_listed = int(at_switch.sum())
        self.switch_arcs[: self.n_listed] = np.flatnonzero(at_switch)
        self.n = g.n
        self.neighbours = SwitchNeighbours(g.n, self.tail, self.head, g.is_switch) \
            if siblings_last else None
        self.keys = self.slots = np.zeros(0, np.int64)
        self.reserve(0, 0, 0)

    def reserve(self, arcs: int, segs: int, nodes: int) -> None:
        """Room for ``arcs`` more arcs, ``segs`` more segments and ``nodes`` more nodes."""
        for names, used, more in ((("tail", "head", "units", "nseg", "first", "last",
                                    "listed", "switch_arcs"), self.n_arcs, arcs),
                                  (("seg_units", "seg_next", "seg_plen", "seg_pstart"),
                                   self.n_segs, segs),
                                  (("buf",), self.top, nodes)):
            for name in names:
                arr = getattr(self, name)
                if used + more > arr.size:
                    grown = np.empty(max(2 * arr.size, used + more), arr.dtype)
                    grown[:used] = arr[:used]
                    setattr(self, name, grown)
        if 2 * (self.n_arcs + arcs) > self.keys.size:        # the hash map at most half full
            size = 1 << max(4, int(2 * (self.n_arcs + arcs)).bit_length())
            self.keys, self.slots = np.full(size, -1, np.int64), np.empty(size, np.int64)
            _index_arcs(self.keys, self.slots, self.tail, self.head, self.n_arcs, self.n)

    def arcs(self) -> ArcTable:
        """The arc arrays as they are now (:meth:`reserve` may replace them)."""
        return ArcTable(self.keys, self.slots, self.tail, self.head, self.units, self.nseg,
                        self.first, self.last, self.listed, self.switch_arcs)

    def segments(self) -> SegmentTable:
        """The segment arrays as they are now (:meth:`reserve` may replace them)."""
        return SegmentTable(self.seg_units, self.seg_next, self.seg_pstart, self.seg_plen,
                            self.buf)

    def at(self, w: int) -> tuple[np.ndarray, np.ndarray]:
        """The live in-arcs of ``w`` by tail and its live out-arcs by head (arc ids)."""
        cand = self.switch_arcs[: self.n_listed]
        live = self.units[cand] > 0
        if live.sum() * 2 < cand.size:                     # drop dead arcs from the list
            self.listed[cand[~live]] = False
            cand = cand[live]
            self.switch_arcs[: cand.size] = cand
            self.n_listed = cand.size
            live = np.ones(cand.size, bool)
        ins = cand[live & (self.head[cand] == w)]
        outs = cand[live & (self.tail[cand] == w)]
        return ins[np.argsort(self.tail[ins])], outs[np.argsort(self.head[outs])]


def spread_split(g: SplitGraph, rank_of: np.ndarray, guard: Guard | None = None,
                 order: list[int] | None = None, siblings_last: bool = True
                 ) -> LogicalGraph | None:
    """Split off every switch of ``g`` by the spread proposal (module docstring), in
    ``order`` (default :func:`.splitting.switch_order`); ``g`` is left as it was.
    ``guard`` (:mod:`.cut_guard`) adjusts every switch's pairing to keep the rooted cut
    condition; ``None`` if it could not.  ``siblings_last=False``: the proportional
    shares alone, sibling pairs not held back (the general method's seed trees,
    :func:`mccl_opt.allgather.general.restriction_seed.forestcoll_trees`)."""
    st = _Arrays(g, siblings_last)
    if guard is not None:
        guard.start()
    for w in switch_order(g) if order is None else order:
        ins, outs = st.at(w)
        # a limit stops between switches, and before one whose transport would outlast it
        anytime.check_room("Phase 2: switch removal",
                           ins.size * outs.size / TRANSPORT_PAIRS_PER_S / anytime.cpu_share())
        if ins.size == 0 and outs.size == 0:
            continue
        i_in, j_out, amounts = _pair_amounts(st, w, ins, outs)
        anytime.check("Phase 2: switch removal")      # the transport and the split: ~half each
        if guard is not None:
            pairs = _guarded(st, guard, w, ins, outs, i_in, j_out, amounts)
            if pairs is None:
                return None
            i_in, j_out, amounts = pairs
        reach = int((st.nseg[ins[i_in]] + st.nseg[outs[j_out]]).sum())
        st.reserve(i_in.size, reach, reach * 2 * st.maxlen)
        (st.n_arcs, st.n_segs, st.top, st.n_listed, st.maxlen) = _split_switch(
            Pairs(ins, outs, i_in, j_out, amounts), g.is_switch, g.n, st.arcs(), st.segments(),
            (st.n_arcs, st.n_segs, st.top, st.n_listed, st.maxlen))
    return _logical(st, g, rank_of)


def _guarded(st: _Arrays, guard: Guard, w: int, ins: np.ndarray, outs: np.ndarray,
             i_in: np.ndarray, j_out: np.ndarray, amounts: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Switch ``w``'s pairs as ``guard`` adjusts them (row-major), or ``None``."""
    def rest() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        live = st.units[: st.n_arcs] > 0
        live[ins] = live[outs] = False
        return st.tail[: st.n_arcs][live], st.head[: st.n_arcs][live], st.units[: st.n_arcs][live]

    dense = np.zeros((ins.size, outs.size), np.int64)
    dense[i_in, j_out] = amounts
    ends = (st.tail[ins], st.head[outs], st.units[ins], st.units[outs])
    guarded = guard.pairing(w, ends, dense, rest)
    if guarded is None:
        return None
    # np.nonzero of a matrix gives strided views: copied to contiguous arrays so that
    # _split_switch keeps the one signature the warm-up compiles (mccl_runtime.warmup)
    i_in, j_out = (np.ascontiguousarray(a) for a in np.nonzero(guarded))
    return i_in, j_out, guarded[i_in, j_out]


def _pair_amounts(st: _Arrays, w: int, ins: np.ndarray, outs: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The spread proposal's transport at switch ``w``: pairs ``(i, j)`` (row-major, ``u
    != t``) with positive amounts, as in-arc positions, out-arc positions and units;
    siblings (:mod:`.siblings`) paired last."""
    us, ts = st.tail[ins], st.head[outs]
    a_u, b_t = st.units[ins], st.units[outs]
    tail, col = np.nonzero(us[:, None] != ts[None, :])
    pos = np.minimum(np.searchsorted(ts, us), max(ts.size - 1, 0))
    back = (ts[pos] == us) if ts.size else np.zeros(us.size, bool)
    loop_of = np.where(back, pos, -1)                   # out-arc back to each in-arc's tail
    rest = np.maximum(int(a_u.sum()) - np.where(back, b_t[pos] if ts.size else 0, 0), 1)
    siblings = np.zeros(tail.size, bool) if st.neighbours is None else \
        st.neighbours.siblings(w, us, ts, tail, col)
    stages = spread_stages(-(-a_u[tail] * b_t[col] // rest[tail]), siblings)
    amounts = transport(us.size, ts.size, tail, col, a_u.copy(), b_t.copy(), stages, loop_of)
    keep = np.flatnonzero(amounts > 0)
    return tail[keep], col[keep], amounts[keep]


@njit(cache=True)
def _slot(keys, key):
    """The slot of ``key`` in the open-addressing table ``keys`` (linear probing), or
    the empty slot (``-1``) where it goes."""
    mask = keys.size - 1
    i = ((key * 2654435761) >> 16) & mask
    while keys[i] != -1 and keys[i] != key:
        i = (i + 1) & mask
    return i


@njit(cache=True)
def _index_arcs(keys, slots, tail, head, count, n):
    """Enter arcs ``0..count-1`` (key ``tail·n + head``) into an empty table."""
    for a in range(count):
        key = tail[a] * n + head[a]
        i = _slot(keys, key)
        keys[i], slots[i] = key, a


@njit(cache=True)
def _split_switch(pairs, is_switch, n, arcs, segs, sizes):
    """Apply one switch's :class:`Pairs` in order (module docstring) to the
    :class:`ArcTable` and :class:`SegmentTable`, then drop every arc at the switch;
    ``sizes`` and the result: the counts ``(arcs, segments, buffer top, listed, longest
    path)``."""
    n_arcs, n_segs, top, n_listed, maxlen = sizes
    for p in range(pairs.i_in.size):
        a, b, m = pairs.ins[pairs.i_in[p]], pairs.outs[pairs.j_out[p]], pairs.amounts[p]
        u, t = arcs.tail[a], arcs.head[b]
        key = u * n + t
        i = _slot(arcs.keys, key)
        if arcs.keys[i] == key:
            c = arcs.slots[i]
        else:
            c = n_arcs
            n_arcs += 1
            arcs.keys[i], arcs.slots[i] = key, c
            arcs.tail[c], arcs.head[c], arcs.units[c], arcs.nseg[c] = u, t, 0, 0
            arcs.first[c], arcs.last[c], arcs.listed[c] = -1, -1, False
        if not arcs.listed[c] and (is_switch[u] or is_switch[t]):
            arcs.listed[c] = True
            arcs.switch_arcs[n_listed] = c
            n_listed += 1
        arcs.units[a] -= m
        arcs.units[b] -= m
        arcs.units[c] += m
        while m > 0:
            sa, sb = arcs.first[a], arcs.first[b]
            take = min(m, segs.units[sa], segs.units[sb])
            length = _walk(segs.buf, top, segs.pstart[sa], segs.plen[sa], segs.pstart[sb],
                           segs.plen[sb])
            same = _find_path(segs, top, length, arcs.first[c])
            if same >= 0:
                segs.units[same] += take
            else:
                s = n_segs
                n_segs += 1
                segs.units[s], segs.next[s] = take, -1
                segs.pstart[s], segs.plen[s] = top, length
                top += length
                maxlen = max(maxlen, length)
                if arcs.last[c] >= 0:
                    segs.next[arcs.last[c]] = s
                else:
                    arcs.first[c] = s
                arcs.last[c] = s
                arcs.nseg[c] += 1
            for arc, seg in ((a, sa), (b, sb)):
                segs.units[seg] -= take
                if segs.units[seg] == 0:
                    arcs.first[arc] = segs.next[seg]
                    arcs.nseg[arc] -= 1
                    if arcs.first[arc] < 0:
                        arcs.last[arc] = -1
            m -= take
    for group in (pairs.ins, pairs.outs):
        for a in group:
            arcs.units[a], arcs.nseg[a], arcs.first[a], arcs.last[a] = 0, 0, -1, -1
    return n_arcs, n_segs, top, n_listed, maxlen


@njit(cache=True)
def _walk(buf, top, start_a, len_a, start_b, len_b):
    """Write the walk ``path a + path b[1:]`` at ``buf[top:]`` with its cycles cut (a
    node seen before truncates the path back to it); returns its length."""
    n = 0
    for i in range(len_a + len_b - 1):
        v = buf[start_a + i] if i < len_a else buf[start_b + i - len_a + 1]
        j = 0
        while j < n and buf[top + j] != v:
            j += 1
        if j < n:
            n = j + 1
        else:
            buf[top + n] = v
            n += 1
    return n


@njit(cache=True)
def _find_path(segs, top, length, s):
    """The segment of the list from ``s`` whose path equals ``segs.buf[top:top+length]``;
    -1 if none."""
    buf = segs.buf
    while s >= 0:
        if segs.plen[s] == length:
            lo = segs.pstart[s]
            j = 0
            while j < length and buf[lo + j] == buf[top + j]:
                j += 1
            if j == length:
                return s
        s = segs.next[s]
    return -1


def _logical(st: _Arrays, g: SplitGraph, rank_of: np.ndarray) -> LogicalGraph:
    """The live arcs as a :class:`.splitting.LogicalGraph` (links by tail, head rank)."""
    live = np.flatnonzero(st.units[: st.n_arcs] > 0)
    order, tail, head = gpu_links(g.is_switch, rank_of, st.tail[live], st.head[live])
    arcs = live[order]
    start = np.zeros(arcs.size + 1, np.int64)
    np.cumsum(st.nseg[arcs], out=start[1:])
    seg_units, path_start, nodes = _gather(arcs, start, st.first, st.segments())
    return LogicalGraph(int(g.gpus.size), tail, head, st.units[arcs].copy(),
                        Bundles(start, seg_units, path_start, nodes))


@njit(cache=True)
def _gather(arcs, start, first, segs):
    """The segments of ``arcs`` in order (CSR ``start``; ``first``: each arc's first
    segment in the :class:`SegmentTable`), with their paths compacted."""
    num = start[-1]
    units = np.empty(num, np.int64)
    path_start = np.zeros(num + 1, np.int64)
    k = 0
    for a in arcs:
        s = first[a]
        while s >= 0:
            units[k] = segs.units[s]
            path_start[k + 1] = path_start[k] + segs.plen[s]
            k += 1
            s = segs.next[s]
    nodes = np.empty(path_start[-1], np.int64)
    k = 0
    for a in arcs:
        s = first[a]
        while s >= 0:
            lo = segs.pstart[s]
            nodes[path_start[k]: path_start[k + 1]] = segs.buf[lo: lo + segs.plen[s]]
            k += 1
            s = segs.next[s]
    return units, path_start, nodes
