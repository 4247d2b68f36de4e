"""Every hop of every slice of every chunk as arrays (issue 26: lowering on the reaction path).

:func:`alltoall_hops` and :func:`allgather_hops` give the hop transfers of
:func:`~mccl_opt.lowering.program.compile_schedule` in the order the per-hop lowering
listed them (AllToAll: source, destination, chunk, slice, hop; AllGather: root, chunk,
slice, tree edge by (depth of its tail, tail, head)), so coalescing keeps that order.
Rules of rounds and buffers: module docstring of :mod:`~mccl_opt.lowering.program`
(paper §3.3, §4.2).  A schedule that does not deliver every block raises
:class:`~mccl_opt.errors.ScheduleError`, the first fault in that order winning.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from mccl_opt.errors import ScheduleError
from mccl_opt.piece_rule import PieceRule
from mccl_opt.schedule import Schedule

INP, OUT, STAGE = 0, 1, 2
SHARE_TOL = 1e-6
Bounds = Callable[[Sequence[float], int], list[tuple[int, int]]]
#: slices per chunk: the same count for every chunk, or a rule on the chunk's size
Pipeline = int | PieceRule


@dataclass(frozen=True)
class Hops:
    """Hop ``i`` copies ``length[i]`` elements from ``(sbuf, soff)`` on rank ``src`` to
    ``(dbuf, doff)`` on rank ``dst`` in round ``rnd``; ``stage_top[r]`` is rank ``r``'s
    staging size."""

    rnd: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    sbuf: np.ndarray
    soff: np.ndarray
    dbuf: np.ndarray
    doff: np.ndarray
    length: np.ndarray
    stage_top: list[int]


def rank_index(schedule: Schedule) -> dict[str, int]:
    """GPU id -> rank; refuses a GPU listed twice."""
    if len(set(schedule.gpus)) != len(schedule.gpus):
        raise ScheduleError("schedule 'gpus' lists a GPU twice; ranks must be distinct")
    return {g: r for r, g in enumerate(schedule.gpus)}


def _group_by(chunks: Iterable, key) -> dict:
    groups: dict = defaultdict(list)
    for c in chunks:
        groups[key(c)].append(c)
    return groups


def _check_shares(where: str, chunks: Sequence) -> None:
    total = sum(c.share for c in chunks)
    if any(c.share < 0 for c in chunks) or abs(total - 1.0) > SHARE_TOL:
        raise ScheduleError(f"{where}: chunk shares must be >= 0 and sum to 1, got sum "
                            f"{total:.9g}; re-synthesize or fix the schedule file")


def _collect(blocks: Iterable[tuple[tuple[int, ...], list | None, str, str]], bounds: Bounds,
             numel: int) -> tuple[list, list[tuple[int, ...]], ScheduleError | None]:
    """Chunks of every block ``(key, chunks, where, missing)`` in order and a row
    ``key + (lo, hi)`` of element range each, up to the first block without chunks or with
    bad shares: that error is returned, to be raised after faults of earlier chunks."""
    chunks: list = []
    rows: list[tuple[int, ...]] = []
    for key, group, where, missing in blocks:
        try:
            if not group:
                raise ScheduleError(f"{where} {missing}")
            _check_shares(where, group)
        except ScheduleError as e:
            return chunks, rows, e
        chunks.extend(group)
        rows.extend(key + b for b in bounds([c.share for c in group], numel))
    return chunks, rows, None


def slice_counts(span: np.ndarray, hops: np.ndarray, pipeline: Pipeline) -> np.ndarray:
    """Slices of every chunk of ``span`` elements and ``hops`` GPU hops (deepest):
    ``pipeline`` each, or as the rule says."""
    if isinstance(pipeline, PieceRule):
        return pipeline.of_elements(span, hops)
    return np.full(span.shape, pipeline, np.int64)


def _slices(lo: np.ndarray, hi: np.ndarray, hops: np.ndarray, pipeline: Pipeline) -> tuple[np.ndarray, ...]:
    """Non-empty slices of chunk ranges ``[lo, hi)`` (``hops`` GPU hops each), chunk-major:
    (chunk, start, length); slice ``i`` of ``P`` starts at ``floor(i * span / P)``."""
    span = hi - lo
    parts = slice_counts(span, hops, pipeline)[:, None]
    top = int(parts.max(initial=1))
    cuts = np.minimum(np.arange(top + 1, dtype=np.int64)[None, :], parts) * span[:, None] // parts
    a, z = cuts[:, :-1], cuts[:, 1:]
    ci, pi = np.nonzero(z > a)
    return ci, pi, lo[ci] + a[ci, pi], (z - a)[ci, pi]


def _ranks(nodes: Iterable[str], rank: dict[str, int]) -> list[int]:
    return [rank[v] for v in nodes if v in rank]


def alltoall_hops(schedule: Schedule, rank: dict[str, int], block: int, pipeline: Pipeline,
                  bounds: Bounds) -> Hops:
    """AllToAll hops: relays receive into staging and forward from it a round later."""
    n, gpus = len(rank), schedule.gpus
    by_pair = _group_by(schedule.chunks, lambda c: (c.src, c.dst))
    blocks = (((s, d), by_pair.get((gpus[s], gpus[d])), f"alltoall block {gpus[s]} -> {gpus[d]}",
               "has no chunk; every ordered GPU pair needs a path")
              for s in range(n) for d in range(n) if s != d)
    chunks, rows, pending = _collect(blocks, bounds, block)
    hops = [_ranks(c.path, rank) for c in chunks]
    lengths = np.fromiter(map(len, hops), np.int64, count=len(hops))
    flat = np.fromiter((r for h in hops for r in h), np.int64, count=int(lengths.sum()))
    first = np.zeros(len(hops) + 1, np.int64)
    np.cumsum(lengths, out=first[1:])
    cs, cd, lo, hi = np.array(rows, np.int64).reshape(-1, 4).T
    _check_paths(chunks, cs, cd, flat, first, lengths, n)
    if pending is not None:
        raise pending
    ci, pi, a, ln = _slices(lo, hi, lengths - 1, pipeline)
    nh = lengths[ci] - 1
    hc = np.repeat(np.arange(ci.size), nh)
    h = np.arange(hc.size) - np.repeat(np.cumsum(nh) - nh, nh)
    c = ci[hc]
    u, v = flat[first[c] + h], flat[first[c] + h + 1]
    ln_h, a_h = ln[hc], a[hc]
    last = h == nh[hc] - 1
    stage_off, stage_top = _stage_offsets(np.flatnonzero(~last), v, ln_h, n)
    dbuf = np.where(last, OUT, STAGE)
    doff = np.where(last, cs[c] * block + a_h, stage_off)
    first_hop = h == 0
    sbuf = np.where(first_hop, INP, STAGE)
    prev = np.concatenate([[0], stage_off[:-1]]) if stage_off.size else stage_off
    soff = np.where(first_hop, cd[c] * block + a_h, prev)
    return Hops(h + pi[hc], u, v, sbuf, soff, dbuf, doff, ln_h, stage_top)


def _check_paths(chunks: list, cs: np.ndarray, cd: np.ndarray, flat: np.ndarray,
                 first: np.ndarray, lengths: np.ndarray, n: int) -> None:
    """Each path starts at its source GPU, ends at its destination, visits a GPU once."""
    bad = lengths < 2
    ok = ~bad
    bad[ok] = (flat[first[:-1][ok]] != cs[ok]) | (flat[first[1:][ok] - 1] != cd[ok])
    owner = np.repeat(np.arange(lengths.size), lengths)
    key = np.sort(owner * n + flat)
    bad[key[1:][key[1:] == key[:-1]] // n] = True
    if bad.any():
        c = chunks[int(np.argmax(bad))]
        raise ScheduleError(f"alltoall block {c.src} -> {c.dst}: path {list(c.path)} must start at the "
                            "source GPU, end at the destination and visit a GPU once")


def _stage_offsets(idx: np.ndarray, owner: np.ndarray, length: np.ndarray,
                   n: int) -> tuple[np.ndarray, list[int]]:
    """Staging offsets of hops ``idx`` (in order) on their ranks ``owner[idx]``: each
    rank's staging buffer is packed in hop order.  Offsets of other hops are 0."""
    off = np.zeros(owner.size, np.int64)
    o = idx[np.argsort(owner[idx], kind="stable")]
    r, ln = owner[o], length[o]
    excl = np.cumsum(ln) - ln
    top = np.zeros(n, np.int64)
    if o.size:
        starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
        base = np.repeat(excl[starts], np.diff(np.r_[starts, o.size]))
        off[o] = excl - base
        np.add.at(top, r, ln)
    return off, top.tolist()


def allgather_hops(schedule: Schedule, rank: dict[str, int], shard: int, pipeline: Pipeline,
                   bounds: Bounds) -> Hops:
    """AllGather hops: tree edge ``u -> v`` copies ``u``'s output (its input on the root)
    into ``v``'s output in round ``depth(u) + slice``."""
    n, gpus = len(rank), schedule.gpus
    by_root = _group_by(schedule.chunks, lambda c: c.src)
    blocks = (((r,), by_root.get(gpus[r]), f"allgather shard of {gpus[r]}",
               "has no tree; every GPU needs at least one tree") for r in range(n))
    chunks, rows, pending = _collect(blocks, bounds, shard)
    root, lo, hi = np.array(rows, np.int64).reshape(-1, 3).T
    tails, heads = _tree_edges(chunks, rank, n)
    depth_u = _tree_depths(chunks, root, tails, heads, n)
    if pending is not None:
        raise pending
    tree = np.broadcast_to(np.arange(len(chunks))[:, None], heads.shape)
    order = np.lexsort((heads.ravel(), tails.ravel(), depth_u.ravel(), tree.ravel()))
    u, v, du = (x.ravel()[order].reshape(heads.shape) for x in (tails, heads, depth_u))
    ci, pi, a, ln = _slices(lo, hi, du.max(axis=1, initial=-1) + 1, pipeline)
    e = n - 1
    rt = root[ci][:, None]
    from_root = u[ci] == rt
    off = rt * shard + a[:, None]
    full = (ci.size, e)
    return Hops((du[ci] + pi[:, None]).ravel(), u[ci].ravel(), v[ci].ravel(),
                np.where(from_root, INP, OUT).ravel(),
                np.where(from_root, a[:, None], off).ravel(),
                np.full(full, OUT).ravel(), np.broadcast_to(off, full).ravel(),
                np.broadcast_to(ln[:, None], full).ravel(), [0] * n)


def _tree_edges(chunks: list, rank: dict[str, int], n: int) -> tuple[np.ndarray, np.ndarray]:
    """(tail, head) rank of every edge, shape (trees, n - 1); -1 for a node that is no
    GPU.  Trees with another edge count get a row of -1 (refused by :func:`_tree_depths`)."""
    tails = np.full((len(chunks), n - 1), -1, np.int64)
    heads = np.full((len(chunks), n - 1), -1, np.int64)
    get = rank.get
    for i, c in enumerate(chunks):
        if len(c.edges) == n - 1 and n > 1:
            tails[i] = [get(x[0], -1) for x in c.edges]
            heads[i] = [get(x[-1], -1) for x in c.edges]
    return tails, heads


def _tree_depths(chunks: list, root: np.ndarray, tails: np.ndarray, heads: np.ndarray,
                 n: int) -> np.ndarray:
    """Depth of every edge's tail; refuses a tree that is no spanning arborescence rooted
    at its source (every other GPU the head of exactly one edge, all reached)."""
    t = len(chunks)
    bad = np.array([len(c.edges) != n - 1 for c in chunks], bool)
    bad |= ((heads < 0) | (heads == root[:, None])).any(axis=1)
    rows = np.broadcast_to(np.arange(t)[:, None], heads.shape)
    ok = heads >= 0
    seen = np.zeros((t, n), np.int64)
    np.add.at(seen, (rows[ok], heads[ok]), 1)
    bad |= (seen > 1).any(axis=1)
    # pointer doubling (list ranking): column n is a sink for unknown parents
    anc = np.full((t, n + 1), n, np.int64)
    anc[rows[ok], heads[ok]] = np.where(tails[ok] >= 0, tails[ok], n)
    anc[np.arange(t), root] = root
    depth = np.ones((t, n + 1), np.int64)
    depth[np.arange(t), root] = 0
    depth[:, n] = 0
    for _ in range(max(1, n).bit_length() + 1):
        depth += np.take_along_axis(depth, anc, axis=1)
        anc = np.take_along_axis(anc, anc, axis=1)
    bad |= (anc[:, :n] != root[:, None]).any(axis=1)
    if bad.any():
        c = chunks[int(np.argmax(bad))]
        raise ScheduleError(f"allgather shard of {c.src}: tree edges must form a spanning arborescence "
                            "rooted at its source (every other GPU the head of one edge)")
    return np.where(tails >= 0, depth[rows, np.maximum(tails, 0)], -1)
