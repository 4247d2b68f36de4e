"""Compile a ``mccl-schedule/1`` schedule into per-rank point-to-point programs.

The executor (paper §3.3) runs a schedule as *rounds*.  A schedule chunk is cut into
``pipeline`` slices; along a chunk's GPU hops, hop ``h`` of slice ``p`` runs in round
``h + p`` (paper §4.2 steps: arcs into switches are instantaneous, every GPU-to-GPU hop
advances one step), so a relay forwards slice ``p`` while it receives slice ``p + 1``.

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
every rank computes the same global program independently (no communication).
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from dataclasses import dataclass
from typing import Iterable, Sequence

from mccl_opt.errors import InputError, ScheduleError
from mccl_opt.schedule import PathChunk, Schedule, TreeChunk

__all__ = ["COLLECTIVES_EXEC", "INP", "OUT", "STAGE", "Segment", "Message", "RankProgram", "GlobalProgram",
           "compile_schedule", "ProgramCache", "chunk_denominator", "direct_schedule", "slice_bounds", "chunk_bounds"]

COLLECTIVES_EXEC = ("allgather", "alltoall")
INP, OUT, STAGE = 0, 1, 2
BUFFER_NAMES = ("inp", "out", "stage")
QUANTUM = 1 << 20
MAX_DENOMINATOR = 64
SHARE_TOL = 1e-6


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
    pipeline: int
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


def _rank_index(schedule: Schedule) -> dict[str, int]:
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


def compile_schedule(schedule: Schedule, block_numel: int, pipeline: int = 1) -> GlobalProgram:
    """Lower ``schedule`` for blocks (AllToAll) or shards (AllGather) of ``block_numel``
    elements into the global round program.  Raises :class:`ScheduleError` if the
    schedule does not deliver every block."""
    if block_numel < 0 or pipeline < 1:
        raise InputError("block_numel must be >= 0 and pipeline >= 1")
    if schedule.collective == "alltoall":
        return _lower_alltoall(schedule, int(block_numel), int(pipeline))
    return _lower_allgather(schedule, int(block_numel), int(pipeline))


class ProgramCache:
    """LRU cache of lowered programs per (schedule version, element count, pipeline).

    Keys include the schedule object's identity (the cache keeps it alive), so two
    different schedules that happen to share a version number never collide.
    """

    def __init__(self, maxsize: int = 32) -> None:
        self.maxsize = maxsize
        self._data: OrderedDict[tuple, tuple[Schedule, GlobalProgram]] = OrderedDict()

    def get(self, schedule: Schedule, block_numel: int, pipeline: int) -> GlobalProgram:
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
