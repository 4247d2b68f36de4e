"""The schedule compiler as it was before issue 26's vectorized lowering: one Python
object per hop.  Kept only as the reference the vectorized
:func:`~mccl_opt.lowering.program.compile_schedule` must reproduce exactly."""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from mccl_opt.errors import InputError, ScheduleError
from mccl_opt.lowering.hops import _check_shares, _group_by
from mccl_opt.lowering.hops import rank_index as _rank_index
from mccl_opt.lowering.program import (INP, OUT, STAGE, GlobalProgram, Message, RankProgram, Segment,
                                       chunk_bounds, slice_bounds)
from mccl_opt.schedule import Schedule


class _Builder:
    """Accumulates hop transfers, then coalesces them per (round, src, dst)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.parts: dict[tuple[int, int, int], list[tuple[Segment, Segment]]] = defaultdict(list)
        self.stage_top = [0] * n
        self.copies: list[list[tuple[Segment, Segment]]] = [[] for _ in range(n)]

    def hop(self, rnd: int, src: int, dst: int, s: Segment, d: Segment) -> None:
        self.parts[(rnd, src, dst)].append((s, d))

    def stage(self, rank: int, length: int) -> Segment:
        seg = Segment(STAGE, self.stage_top[rank], length)
        self.stage_top[rank] += length
        return seg

    def build(self, collective: str, version: int, block: int, pipeline: int) -> GlobalProgram:
        messages = []
        for (rnd, src, dst) in sorted(self.parts):
            pairs = _merge(self.parts[(rnd, src, dst)])
            messages.append(Message(rnd, src, dst, tuple(p[0] for p in pairs),
                                    tuple(p[1] for p in pairs)))
        num_rounds = 1 + max((m.round for m in messages), default=-1)
        sends: list[list[list[Message]]] = [[[] for _ in range(num_rounds)] for _ in range(self.n)]
        recvs: list[list[list[Message]]] = [[[] for _ in range(num_rounds)] for _ in range(self.n)]
        for m in messages:
            sends[m.src][m.round].append(m)
            recvs[m.dst][m.round].append(m)
        ranks = tuple(RankProgram(r, tuple(self.copies[r]),
                                  tuple((tuple(sends[r][t]), tuple(recvs[r][t]))
                                        for t in range(num_rounds)),
                                  self.stage_top[r]) for r in range(self.n))
        return GlobalProgram(collective, version, block, pipeline, num_rounds,
                             tuple(messages), ranks)


def _merge(pairs: Iterable[tuple[Segment, Segment]]) -> list[tuple[Segment, Segment]]:
    """Fuse consecutive hop segments that are contiguous on both sides."""
    out: list[tuple[Segment, Segment]] = []
    for s, d in pairs:
        if out:
            ps, pd = out[-1]
            if (ps.buf == s.buf and pd.buf == d.buf and ps.offset + ps.length == s.offset
                    and pd.offset + pd.length == d.offset):
                out[-1] = (Segment(s.buf, ps.offset, ps.length + s.length),
                           Segment(d.buf, pd.offset, pd.length + d.length))
                continue
        out.append((s, d))
    return out


def _lower_alltoall(schedule: Schedule, block: int, pipeline: int) -> GlobalProgram:
    rank = _rank_index(schedule)
    n = len(rank)
    b = _Builder(n)
    by_pair = _group_by(schedule.chunks, lambda c: (c.src, c.dst))
    for s in range(n):
        b.copies[s].append((Segment(INP, s * block, block), Segment(OUT, s * block, block)))
        for d in range(n):
            if s == d:
                continue
            chunks = by_pair.get((schedule.gpus[s], schedule.gpus[d]))
            where = f"alltoall block {schedule.gpus[s]} -> {schedule.gpus[d]}"
            if not chunks:
                raise ScheduleError(f"{where} has no chunk; every ordered GPU pair needs a path")
            _check_shares(where, chunks)
            for chunk, (lo, hi) in zip(chunks, chunk_bounds([c.share for c in chunks], block)):
                hops = [rank[v] for v in chunk.path if v in rank]
                if hops[0] != s or hops[-1] != d or len(set(hops)) != len(hops):
                    raise ScheduleError(f"{where}: path {list(chunk.path)} must start at the "
                                        "source GPU, end at the destination and visit a GPU once")
                for p, (a, z) in enumerate(slice_bounds(hi - lo, pipeline)):
                    if z == a:
                        continue
                    length = z - a
                    src_seg = Segment(INP, d * block + lo + a, length)
                    for h in range(len(hops) - 1):
                        last = h == len(hops) - 2
                        dst_seg = (Segment(OUT, s * block + lo + a, length) if last
                                   else b.stage(hops[h + 1], length))
                        b.hop(h + p, hops[h], hops[h + 1], src_seg, dst_seg)
                        src_seg = dst_seg
    return b.build("alltoall", schedule.version, block, pipeline)


def _lower_allgather(schedule: Schedule, shard: int, pipeline: int) -> GlobalProgram:
    rank = _rank_index(schedule)
    n = len(rank)
    b = _Builder(n)
    by_root = _group_by(schedule.chunks, lambda c: c.src)
    for r in range(n):
        b.copies[r].append((Segment(INP, 0, shard), Segment(OUT, r * shard, shard)))
        chunks = by_root.get(schedule.gpus[r])
        where = f"allgather shard of {schedule.gpus[r]}"
        if not chunks:
            raise ScheduleError(f"{where} has no tree; every GPU needs at least one tree")
        _check_shares(where, chunks)
        for chunk, (lo, hi) in zip(chunks, chunk_bounds([c.share for c in chunks], shard)):
            depth = chunk.depths()
            heads = [e[-1] for e in chunk.edges]
            if (len(heads) != n - 1 or set(heads) | {chunk.src} != set(rank)
                    or set(depth) != set(rank)):
                raise ScheduleError(f"{where}: tree edges must form a spanning arborescence "
                                    "rooted at its source (every other GPU the head of one edge)")
            edges = sorted(chunk.edges, key=lambda e: (depth[e[0]], rank[e[0]], rank[e[-1]]))
            for p, (a, z) in enumerate(slice_bounds(hi - lo, pipeline)):
                if z == a:
                    continue
                off = r * shard + lo + a
                for e in edges:
                    u, v = rank[e[0]], rank[e[-1]]
                    src_seg = Segment(INP, lo + a, z - a) if u == r else Segment(OUT, off, z - a)
                    b.hop(depth[e[0]] + p, u, v, src_seg, Segment(OUT, off, z - a))
    return b.build("allgather", schedule.version, shard, pipeline)


def reference_compile(schedule: Schedule, block_numel: int, pipeline: int = 1) -> GlobalProgram:
    """The old ``compile_schedule``."""
    if block_numel < 0 or pipeline < 1:
        raise InputError("block_numel must be >= 0 and pipeline >= 1")
    if schedule.collective == "alltoall":
        return _lower_alltoall(schedule, int(block_numel), int(pipeline))
    return _lower_allgather(schedule, int(block_numel), int(pipeline))
