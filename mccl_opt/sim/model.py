"""Compile a schedule into simulator streams (docs/sim.md §Model).

A *segment* is one GPU-to-GPU transfer: the links between two consecutive GPUs of an
AllToAll path, or one AllGather tree edge (interior nodes are switches, which cut
through).  A *stream* is one chunk's traffic over one segment: the chunk's bytes cut
into ``npieces`` equal pieces that cross the segment one after another (one NCCL
channel).  Piece ``j`` of a stream may start once piece ``j`` has fully arrived at the
segment's tail GPU (store-and-forward at GPUs: the *parent* stream finished sending it
and its latency elapsed) and piece ``j-1`` of the same stream has left.

Identical chunks (same path or same tree, same share) are merged into one stream with
a multiplicity ``mult``: they move in lockstep, so the merge is exact.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from ..errors import MCCLError, ScheduleError, TopologyError
from ..piece_rule import MAX_PIECE_BYTES, PIECE_RULE
from ..schedule import PathChunk, Schedule, TreeChunk
from ..topology import Topology

__all__ = ["SimulationError", "Streams", "compile_streams", "CapacityChange",
           "parse_timeline", "DEFAULT_SLICE_BYTES"]

#: NCCL's Simple-protocol slice (``NCCL_BUFFSIZE`` 4 MiB / 8 slice steps): the largest
#: piece of the default rule (:mod:`mccl_opt.piece_rule`)
DEFAULT_SLICE_BYTES = MAX_PIECE_BYTES


class SimulationError(MCCLError, ValueError):
    """Bad simulator input: message size, slicing or capacity timeline."""


@dataclass(frozen=True)
class CapacityChange:
    """At ``time_s`` the links ``links`` (indices) get capacities ``gbps``."""

    time_s: float
    links: np.ndarray
    gbps: np.ndarray


@dataclass(frozen=True)
class Streams:
    """Array form of a schedule for the event loop (one row per stream).

    ``inc`` is the stream x link incidence (CSR, 0/1); ``parent[i]`` the stream that
    delivers stream ``i``'s pieces to its tail GPU (-1: the tail is the source);
    ``latency_s[i]`` the sum of the segment's link latencies; ``growth[i]`` the
    stream's weight in the fair sharing (ones: per-piece max-min fairness).
    """

    inc: sp.csr_matrix
    mult: np.ndarray
    npieces: np.ndarray
    piece_bytes: np.ndarray
    parent: np.ndarray
    latency_s: np.ndarray
    growth: np.ndarray

    @property
    def num_streams(self) -> int:
        return int(self.mult.size)


def _segments(topo: Topology, path: Sequence[str]) -> list[tuple[str, ...]]:
    """Split a node path at interior GPUs into GPU-to-GPU segments."""
    segs: list[tuple[str, ...]] = []
    start = 0
    for k in range(1, len(path)):
        if k == len(path) - 1 or topo.is_gpu(path[k]):
            segs.append(tuple(path[start:k + 1]))
            start = k
    return segs


def _check_match(topo: Topology, schedule: Schedule) -> None:
    if tuple(schedule.gpus) != tuple(topo.gpus):
        raise ScheduleError(
            f"schedule GPUs {list(schedule.gpus)[:4]}... do not match topology {topo.name!r} "
            f"ranks {list(topo.gpus)[:4]}...; simulate the schedule on the fabric it was "
            f"synthesized for (same GPU ids in the same rank order)")
    if not schedule.chunks:
        raise ScheduleError("schedule has no chunks; nothing to simulate")


def _chunk_groups(schedule: Schedule) -> list[tuple[object, int]]:
    """Identical chunks merged: ``(chunk, multiplicity)`` in first-seen order."""
    keys: Counter = Counter()
    first: dict = {}
    for c in schedule.chunks:
        if isinstance(c, PathChunk):
            key = ("p", c.path, c.share)
        elif isinstance(c, TreeChunk):
            key = ("t", c.src, c.edges, c.share)
        else:  # pragma: no cover - Schedule only holds these two
            raise ScheduleError(f"unknown chunk type {type(c).__name__}")
        if c.share <= 0:
            raise ScheduleError(f"chunk from {c.src} has share {c.share}; shares must be > 0")
        keys[key] += 1
        first.setdefault(key, c)
    return [(first[k], n) for k, n in keys.items()]


def _piece_count(chunk_bytes: float, hops: int, slice_bytes: float | None, pieces: int | None) -> int:
    """Exactly ``pieces``, else pieces of ``slice_bytes``, else the shared rule on the
    chunk's bytes and GPU hops (:mod:`mccl_opt.piece_rule`, what the executor's lowering uses)."""
    if pieces is not None:
        return pieces
    if slice_bytes is None:
        return PIECE_RULE.count(chunk_bytes, hops)
    return max(1, math.ceil(chunk_bytes / slice_bytes - 1e-9))


def compile_streams(topo: Topology, schedule: Schedule, message_bytes: float, *,
                    slice_bytes: float | None = None, pieces: int | None = None,
                    fluid: bool = False) -> Streams:
    """Build the :class:`Streams` of ``schedule`` for ``message_bytes`` per block.

    By default a chunk is cut as :data:`mccl_opt.piece_rule.PIECE_RULE` says (pieces of at
    most 512 KiB, 16 per relay hop while each stays >= 64 KiB), as the executor cuts it; an
    explicit ``slice_bytes`` gives pieces of that size (a chunk smaller is one piece); one
    larger than the largest chunk is an error, as is giving both ``slice_bytes`` and ``pieces``.  ``fluid=True`` gives one
    stream per chunk occupying all its links at once (infinitely fine pieces, see
    :func:`_to_fluid`).
    """
    if fluid and (slice_bytes is not None or pieces is not None):
        raise SimulationError("fluid mode has no pieces; do not combine it with slice_bytes or pieces")
    _check_match(topo, schedule)
    if not isinstance(message_bytes, (int, float)) or isinstance(message_bytes, bool) \
            or not math.isfinite(message_bytes) or message_bytes <= 0:
        raise SimulationError(f"message size must be a finite number of bytes > 0, got {message_bytes!r}")
    if slice_bytes is not None and pieces is not None:
        raise SimulationError("give either slice_bytes or pieces, not both")
    if pieces is not None and (not isinstance(pieces, int) or isinstance(pieces, bool) or pieces < 1):
        raise SimulationError(f"pieces must be an integer >= 1, got {pieces!r}")
    groups = _chunk_groups(schedule)
    if slice_bytes is not None:
        if not isinstance(slice_bytes, (int, float)) or not math.isfinite(slice_bytes) or slice_bytes <= 0:
            raise SimulationError(f"slice_bytes must be > 0, got {slice_bytes!r}")
        largest = max(c.share for c, _ in groups) * message_bytes
        if slice_bytes > largest * (1 + 1e-12):
            raise SimulationError(
                f"slice_bytes={slice_bytes:g} is larger than the largest chunk ({largest:g} bytes = "
                f"share x message size); use a smaller slice, pieces=1 for whole-chunk transfers, "
                f"or the default slicing")

    lat_us = topo.arrays.latency
    gpu_set = frozenset(topo.gpus)
    seg_ids: dict[tuple[str, ...], int] = {}
    seg_arcs: list[list[int]] = []
    seg: list[int] = []
    mult: list[int] = []
    npieces: list[int] = []
    pbytes: list[float] = []
    parent: list[int] = []

    def add(path: tuple[str, ...], m: int, n: int, size: float, par: int) -> int:
        sid = seg_ids.get(path)
        if sid is None:
            try:
                arcs = [topo.link_index(u, v) for u, v in zip(path[:-1], path[1:])]
            except TopologyError as exc:
                raise ScheduleError(f"schedule does not match topology {topo.name!r}: {exc}") from None
            sid = seg_ids[path] = len(seg_arcs)
            seg_arcs.append(arcs)
        seg.append(sid)
        mult.append(m)
        npieces.append(n)
        pbytes.append(size)
        parent.append(par)
        return len(seg) - 1

    firsts: list[int] = []
    for chunk, m in groups:
        firsts.append(len(seg))
        chunk_bytes = chunk.share * message_bytes
        if isinstance(chunk, PathChunk):
            if chunk.path[0] != chunk.src or chunk.path[-1] != chunk.dst:
                raise ScheduleError(f"chunk {chunk.src}->{chunk.dst}: path must start at src and end at dst")
            parts = _segments(topo, chunk.path)
            n = _piece_count(chunk_bytes, len(parts), slice_bytes, pieces)
            prev = -1
            for part in parts:
                prev = add(part, m, n, chunk_bytes / n, prev)
        else:
            n = _piece_count(chunk_bytes, max(chunk.depths().values()), slice_bytes, pieces)
            _add_tree(topo, chunk, gpu_set, lambda part, par: add(part, m, n, chunk_bytes / n, par))

    seg_arr = np.asarray(seg, dtype=np.int64)
    seg_len = np.array([len(a) for a in seg_arcs], dtype=np.int64)
    seg_ptr = np.zeros(len(seg_arcs) + 1, dtype=np.int64)
    np.cumsum(seg_len, out=seg_ptr[1:])
    seg_idx = np.fromiter((a for arcs in seg_arcs for a in arcs), dtype=np.int64, count=int(seg_ptr[-1]))
    seg_lat = np.array([lat_us[arcs].sum() for arcs in seg_arcs]) * 1e-6
    lens = seg_len[seg_arr]
    indptr = np.zeros(seg_arr.size + 1, dtype=np.int64)
    np.cumsum(lens, out=indptr[1:])
    starts = np.repeat(seg_ptr[seg_arr] - indptr[:-1], lens)
    indices = seg_idx[starts + np.arange(int(indptr[-1]))]
    inc = sp.csr_matrix((np.ones(indices.size), indices, indptr), shape=(seg_arr.size, topo.num_links))
    streams = Streams(inc, np.asarray(mult, dtype=np.float64), np.asarray(npieces, dtype=np.int64),
                      np.asarray(pbytes, dtype=np.float64), np.asarray(parent, dtype=np.int64),
                      seg_lat[seg_arr], np.ones(seg_arr.size))
    return _to_fluid(streams, np.asarray(firsts, dtype=np.int64)) if fluid else streams


def _to_fluid(st: Streams, firsts: np.ndarray) -> Streams:
    """One stream per chunk (its segment streams ``firsts[g]:firsts[g+1]``, contiguous):
    the chunk occupies every link of its path or tree at once, a link crossed by two
    edges counting twice (duplicate entries), and shares bandwidth in proportion to its
    size (weighted max-min, the schedule's own rate model); its latency is the largest
    root-to-GPU latency sum, paid once after its last byte is sent."""
    cum = st.latency_s.tolist()
    par = st.parent.tolist()
    for i, p in enumerate(par):
        if p >= 0:
            cum[i] += cum[p]
    latency = np.maximum.reduceat(np.asarray(cum), firsts)
    bounds = np.append(firsts, st.num_streams)
    indptr = st.inc.indptr[bounds].astype(np.int64)
    inc = sp.csr_matrix((st.inc.data[:indptr[-1]], st.inc.indices[:indptr[-1]], indptr),
                        shape=(firsts.size, st.inc.shape[1]))
    chunk_bytes = st.piece_bytes[firsts] * st.npieces[firsts]
    return Streams(inc, st.mult[firsts], np.ones(firsts.size, dtype=np.int64), chunk_bytes,
                   np.full(firsts.size, -1, dtype=np.int64), latency, chunk_bytes / chunk_bytes.max())


def _add_tree(topo: Topology, chunk: TreeChunk, gpu_set: frozenset, add) -> None:
    """Add one stream per tree edge, parents before children (edges in BFS order)."""
    by_tail: dict[str, list[tuple[str, ...]]] = {}
    for e in chunk.edges:
        if e[0] not in gpu_set or e[-1] not in gpu_set:
            raise ScheduleError(f"tree of {chunk.src}: edge {e[0]}->{e[-1]} must join two GPUs of "
                                f"topology {topo.name!r}")
        if len(e) > 2 and not gpu_set.isdisjoint(e[1:-1]):
            raise ScheduleError(f"tree of {chunk.src}: edge {list(e)} has a GPU inside; AllGather "
                                f"edges may only cross switches")
        by_tail.setdefault(e[0], []).append(e)
    stream_into: dict[str, int] = {chunk.src: -1}
    frontier = [chunk.src]
    placed = 0
    while frontier:
        nxt: list[str] = []
        for u in frontier:
            for e in by_tail.get(u, ()):
                if e[-1] in stream_into:
                    raise ScheduleError(f"tree of {chunk.src}: GPU {e[-1]} receives the shard twice")
                stream_into[e[-1]] = add(e, stream_into[u])
                nxt.append(e[-1])
                placed += 1
        frontier = nxt
    if placed != len(chunk.edges):
        raise ScheduleError(f"tree of {chunk.src}: {len(chunk.edges) - placed} edge(s) are not reachable "
                            f"from the root; the edges must form an arborescence")


def parse_timeline(topo: Topology, timeline: Iterable[tuple[float, Mapping[tuple[str, str], float]]] | None
                   ) -> list[CapacityChange]:
    """Validate a capacity timeline ``[(t_seconds, {(src, dst): gbps}), ...]``, sorted by time."""
    out: list[CapacityChange] = []
    for i, item in enumerate(timeline or ()):
        try:
            t, changes = item
        except (TypeError, ValueError):
            raise SimulationError(f"capacity timeline entry {i} must be (t_seconds, {{(src, dst): gbps}})") from None
        if not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise SimulationError(f"capacity timeline entry {i}: time must be a finite number >= 0, got {t!r}")
        if not isinstance(changes, Mapping) or not changes:
            raise SimulationError(f"capacity timeline entry {i}: changes must be a non-empty mapping")
        links, gbps = [], []
        for key, g in changes.items():
            if not (isinstance(key, tuple) and len(key) == 2 and topo.has_link(*key)):
                raise SimulationError(f"capacity timeline entry {i}: {key!r} is not a link (src, dst) "
                                      f"of topology {topo.name!r}")
            if not isinstance(g, (int, float)) or not math.isfinite(g) or g <= 0:
                raise SimulationError(f"capacity timeline entry {i}: capacity of {key} must be > 0 Gbps "
                                      f"(model a dead link by rerouting), got {g!r}")
            links.append(topo.link_index(*key))
            gbps.append(float(g))
        out.append(CapacityChange(float(t), np.asarray(links, dtype=np.int64), np.asarray(gbps)))
    out.sort(key=lambda c: c.time_s)
    return out
