"""Compile a ``mccl-schedule/1`` schedule into per-rank point-to-point programs.

The executor (paper §3.3) runs a schedule as *rounds*.  A schedule chunk is cut into
``pipeline`` slices, or as a :class:`~mccl_opt.piece_rule.PieceRule` says for its size
(the simulator's rule, so both pay the same pipeline fill); along a chunk's GPU hops,
hop ``h`` of slice ``p`` runs in round ``h + p`` (paper §4.2 steps: arcs into switches
are instantaneous, every GPU-to-GPU hop advances one step), so a relay forwards slice ``p`` while it receives slice ``p + 1``.

* AllToAll (:class:`~mccl_opt.schedule.PathChunk`): block ``s -> d`` is
  ``inp[d*B:(d+1)*B]`` on rank ``s`` and lands in ``out[s*B:(s+1)*B]`` on rank ``d``.
  An interior GPU of a path (a relay) receives the slice into its *staging* buffer and
  forwards it from there one round later.
* AllGather (:class:`~mccl_opt.schedule.TreeChunk`): every GPU of a tree is a
  destination, so a tree edge ``u -> v`` at depth ``depth(u)`` copies the slice from
  ``u``'s output (its input on the root) into ``v``'s output; ``v`` forwards from its
  output after it received.

Remainder handling (documented in docs/executor.md): with ``B`` elements per block and
cumulative chunk shares ``m_j / K`` (a rounded schedule), chunk ``j`` ends at element
``floor(m_j * B / K)`` (other shares are first rounded to multiples of ``2**-20``);
slice ``i`` of ``P`` of a range of ``L`` elements starts at ``floor(i * L / P)``.  Any
block size works; empty slices are skipped.

All messages from one rank to one peer in one round are coalesced into a single
point-to-point message whose segments are listed in the same order on both sides.
The lowering depends only on the schedule, the element count and ``pipeline``, so
every rank computes the same global program independently (no communication).  The hops
are numpy arrays (:mod:`.hops`, issue 26: this runs on the loop's reaction path);
Python objects are made per coalesced segment and message only.
"""

from __future__ import annotations

import gc
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from mccl_opt.errors import InputError, ScheduleError
from mccl_opt.piece_rule import PieceRule
from mccl_opt.schedule import PathChunk, Schedule, TreeChunk

from .hops import INP, OUT, SHARE_TOL, STAGE, Hops, Pipeline, allgather_hops, alltoall_hops, rank_index

__all__ = ["COLLECTIVES_EXEC", "INP", "OUT", "STAGE", "Segment", "Message", "RankProgram", "GlobalProgram",
           "compile_schedule", "ProgramCache", "chunk_denominator", "direct_schedule", "slice_bounds", "chunk_bounds"]

COLLECTIVES_EXEC = ("allgather", "alltoall")
BUFFER_NAMES = ("inp", "out", "stage")
QUANTUM = 1 << 20
MAX_DENOMINATOR = 64


@dataclass(frozen=True)
class Segment:
    """``length`` elements of buffer ``buf`` (INP, OUT or STAGE) starting at ``offset``."""

    buf: int
    offset: int
    length: int


@dataclass(frozen=True)
class Message:
    """One coalesced transfer ``src -> dst`` in ``round``: ``src_segs`` are read on
    ``src`` and written, in the same order, to ``dst_segs`` on ``dst``."""

    round: int
    src: int
    dst: int
    src_segs: tuple[Segment, ...]
    dst_segs: tuple[Segment, ...]

    @property
    def numel(self) -> int:
        return sum(s.length for s in self.src_segs)


@dataclass(frozen=True)
class RankProgram:
    """What one rank executes: local copies first, then ``rounds[t] = (sends, recvs)``."""

    rank: int
    copies: tuple[tuple[Segment, Segment], ...]
    rounds: tuple[tuple[tuple[Message, ...], tuple[Message, ...]], ...]
    stage_numel: int


@dataclass(frozen=True)
class GlobalProgram:
    """The lowered schedule for one element count; ``ranks[r]`` is rank ``r``'s program."""

    collective: str
    version: int
    block_numel: int
    pipeline: Pipeline
    num_rounds: int
    messages: tuple[Message, ...]
    ranks: tuple[RankProgram, ...]


def slice_bounds(length: int, parts: int) -> list[tuple[int, int]]:
    """Split ``[0, length)`` into ``parts`` ranges at ``floor(i*length/parts)``."""
    cuts = [(i * length) // parts for i in range(parts + 1)]
    return [(cuts[i], cuts[i + 1]) for i in range(parts)]


def chunk_denominator(shares: Sequence[float], max_denominator: int = MAX_DENOMINATOR) -> int | None:
    """Smallest ``K <= max_denominator`` making every cumulative share a multiple of
    ``1/K`` (within 1e-6), or None.  Rounded schedules have ``K | max_chunks``."""
    total = float(sum(shares))
    cums, acc = [], 0.0
    for s in shares:
        acc += s
        cums.append(acc / total)
    for k in range(1, max_denominator + 1):
        if all(abs(c * k - round(c * k)) < SHARE_TOL for c in cums):
            return k
    return None


def chunk_bounds(shares: Sequence[float], numel: int) -> list[tuple[int, int]]:
    """Element ranges of consecutive chunks with ``shares`` of a ``numel`` block.

    If the cumulative shares are ``m_j / K`` (a rounded schedule, :func:`chunk_denominator`)
    the boundaries are ``floor(m_j * numel / K)``; otherwise the cumulative shares are
    rounded to multiples of ``2**-20`` first.  The last boundary is always ``numel``.
    """
    if len(shares) == 1:
        return [(0, numel)]                    # what the rule gives (K = 1), without the search
    total = float(sum(shares))
    k = chunk_denominator(shares) or QUANTUM
    cum, q = 0.0, [0]
    for s in shares:
        cum += s
        q.append(min(k, int(round(cum / total * k))))
    q[-1] = k
    cuts = [(x * numel) // k for x in q]
    return [(cuts[i], cuts[i + 1]) for i in range(len(shares))]


def direct_schedule(collective: str, gpus: Sequence[str], version: int = 0) -> Schedule:
    """The fallback schedule before any synthesized one arrives: AllToAll sends each block
    directly; AllGather sends each shard from its root directly to every GPU (a star)."""
    gpus = tuple(gpus)
    if collective == "alltoall":
        chunks: tuple = tuple(PathChunk(s, d, 1.0, (s, d)) for s in gpus for d in gpus if s != d)
    elif collective == "allgather":
        chunks = tuple(TreeChunk(r, 1.0, tuple((r, v) for v in gpus if v != r)) for r in gpus)
    else:
        raise ScheduleError(f"collective must be 'alltoall' or 'allgather', got {collective!r}")
    return Schedule(collective=collective, topology="direct", gpus=gpus, rate_gbps=0.0,
                    lp_rate_gbps=0.0, max_chunks=1, chunks=chunks, version=version,
                    solver={"backend": "direct"})


# ------------------------------------------------------------------------ compilation
def _segments(triples: np.ndarray, half: int) -> tuple[list[Segment], list[Segment]]:
    """:class:`Segment` objects of the (buf, offset, length) columns of ``triples``, one
    object per distinct triple (an AllGather slice's output segment recurs on every
    edge); the first ``half`` columns, then the rest."""
    if not triples.shape[1]:
        return [], []
    order = np.lexsort(triples)
    srt = triples[:, order]
    new = np.r_[True, (srt[:, 1:] != srt[:, :-1]).any(axis=0)]
    objs = list(map(Segment, *srt[:, new].tolist()))
    inv = np.empty(order.size, np.int64)
    inv[order] = np.cumsum(new) - 1
    segs = list(map(objs.__getitem__, inv.tolist()))
    return segs[:half], segs[half:]


def _program(collective: str, version: int, block: int, pipeline: Pipeline, n: int,
             copies: list[tuple[Segment, Segment]], hops: Hops) -> GlobalProgram:
    """Coalesce ``hops`` per (round, src, dst), hop order kept inside each message, and
    fuse consecutive segments contiguous on both ends."""
    order = np.lexsort((hops.dst, hops.src, hops.rnd))       # stable: hop order kept
    rnd, src, dst, sbuf, soff, dbuf, doff, ln = (
        np.asarray(x)[order] for x in (hops.rnd, hops.src, hops.dst, hops.sbuf, hops.soff,
                                       hops.dbuf, hops.doff, hops.length))
    new = np.ones(rnd.size, bool)
    new[1:] = (rnd[1:] != rnd[:-1]) | (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])
    fused = ~new
    fused[1:] &= ((sbuf[1:] == sbuf[:-1]) & (dbuf[1:] == dbuf[:-1])
                  & (soff[:-1] + ln[:-1] == soff[1:]) & (doff[:-1] + ln[:-1] == doff[1:]))
    starts = np.flatnonzero(~fused)
    seg_len = np.add.reduceat(ln, starts) if starts.size else starts
    src_segs, dst_segs = _segments(np.stack([np.r_[sbuf[starts], dbuf[starts]],
                                             np.r_[soff[starts], doff[starts]],
                                             np.r_[seg_len, seg_len]]), starts.size)
    first = np.flatnonzero(new[starts])
    cuts = np.r_[first, starts.size].tolist()
    heads = starts[first]
    messages = tuple(map(Message, rnd[heads].tolist(), src[heads].tolist(), dst[heads].tolist(),
                         (tuple(src_segs[a:b]) for a, b in zip(cuts, cuts[1:])),
                         (tuple(dst_segs[a:b]) for a, b in zip(cuts, cuts[1:]))))
    num_rounds = 1 + max((m.round for m in messages), default=-1)
    sends: list[list[list[Message]]] = [[[] for _ in range(num_rounds)] for _ in range(n)]
    recvs: list[list[list[Message]]] = [[[] for _ in range(num_rounds)] for _ in range(n)]
    for m in messages:
        sends[m.src][m.round].append(m)
        recvs[m.dst][m.round].append(m)
    ranks = tuple(RankProgram(r, (copies[r],),
                              tuple((tuple(sends[r][t]), tuple(recvs[r][t])) for t in range(num_rounds)),
                              hops.stage_top[r]) for r in range(n))
    return GlobalProgram(collective, version, block, pipeline, num_rounds, messages, ranks)


def compile_schedule(schedule: Schedule, block_numel: int, pipeline: Pipeline = 1) -> GlobalProgram:
    """Lower ``schedule`` for blocks (AllToAll) or shards (AllGather) of ``block_numel``
    elements into the global round program, every chunk in ``pipeline`` slices (an int)
    or as many as the :class:`~mccl_opt.piece_rule.PieceRule` gives its size.  Raises
    :class:`ScheduleError` if the schedule does not deliver every block."""
    if not isinstance(pipeline, PieceRule):
        if block_numel < 0 or pipeline < 1:
            raise InputError("block_numel must be >= 0 and pipeline >= 1")
        pipeline = int(pipeline)
    elif block_numel < 0:
        raise InputError("block_numel must be >= 0")
    with _gc_paused():
        return _compile(schedule, int(block_numel), pipeline)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: the lowering makes ~1e5 acyclic objects, and
    the collections they trigger cost as much as making them."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _compile(schedule: Schedule, block: int, pipeline: Pipeline) -> GlobalProgram:
    rank = rank_index(schedule)
    n = len(rank)
    if schedule.collective == "alltoall":
        hops = alltoall_hops(schedule, rank, block, pipeline, chunk_bounds)
        copies = [(Segment(INP, s * block, block), Segment(OUT, s * block, block)) for s in range(n)]
    else:
        hops = allgather_hops(schedule, rank, block, pipeline, chunk_bounds)
        copies = [(Segment(INP, 0, block), Segment(OUT, r * block, block)) for r in range(n)]
    return _program(schedule.collective, schedule.version, block, pipeline, n, copies, hops)


class ProgramCache:
    """LRU cache of lowered programs per (schedule version, element count, pipeline).

    Keys include the schedule object's identity (the cache keeps it alive), so two
    different schedules that happen to share a version number never collide.
    """

    def __init__(self, maxsize: int = 32) -> None:
        self.maxsize = maxsize
        self._data: OrderedDict[tuple, tuple[Schedule, GlobalProgram]] = OrderedDict()

    def get(self, schedule: Schedule, block_numel: int, pipeline: Pipeline) -> GlobalProgram:
        key = (schedule.collective, schedule.version, id(schedule), block_numel, pipeline)
        hit = self._data.get(key)
        if hit is not None:
            self._data.move_to_end(key)
            return hit[1]
        prog = compile_schedule(schedule, block_numel, pipeline)
        self._data[key] = (schedule, prog)
        while len(self._data) > self.maxsize:
            self._data.popitem(last=False)
        return prog
