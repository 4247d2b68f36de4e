"""The store-and-forward round model of a schedule (docs/executor.md, "Emulated fabric";
paper §4.2's step model).

The torch.distributed executor runs a schedule as the rounds of its global program
(:func:`~mccl_opt.lowering.program.compile_schedule`, pipeline 1: one round per GPU hop),
and a round lasts as long as its busiest link drains: ``max_l 8 load_l / cap_l``, where
``load_l`` sums every message of the round whose GPU pair's switch-only path crosses
``l``.  The fluid LP (paper §4) values only the total load per link, so two schedules of
one rate can differ here: on HPN 1x2x4 with a NIC at 50 of 400 Gbps, AllToAll schedules
of the same rate took 86 and 132 ms of emulated time, because one sends over the slow
NIC in two rounds.  :func:`round_time` is that model in relative units, to choose
between schedules of equal rate for such an executor.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

import numpy as np

from ..errors import ScheduleError
from ..paths import switch_path
from ..schedule import Schedule
from ..topology import Topology
from .program import chunk_bounds

__all__ = ["round_time"]

#: elements per block of the program the model is evaluated on (rounds its shares finely)
MODEL_BLOCK = 1 << 12


def round_time(schedule: Schedule, topo: Topology, capacity: np.ndarray | None = None) -> float:
    """Seconds per byte of block of ``schedule`` run round by round on ``capacity``
    (default the topology's): the sum over rounds of the round's slowest link drain.

    Evaluated from the schedule's hops directly (the element counts
    :func:`~mccl_opt.lowering.program.compile_schedule` gives each message of a
    ``MODEL_BLOCK`` program, pipeline 1), without building the program: the same loads,
    at a fraction of the CPU of a re-synthesis job (docs/executor.md)."""
    cap = topo.arrays.capacity.astype(float) if capacity is None else np.asarray(capacity, dtype=float)
    rank = {g: r for r, g in enumerate(schedule.gpus)}
    hops = _alltoall_hops if schedule.collective == "alltoall" else _allgather_hops
    per_round: dict[int, dict[tuple[int, int], int]] = defaultdict(lambda: defaultdict(int))
    for rnd, src, dst, numel in hops(schedule, rank):
        per_round[rnd][src, dst] += numel
    nodes = [topo.node_index(g) for g in schedule.gpus]
    routes: dict[tuple[int, int], np.ndarray] = {}
    total = 0.0
    for rnd in sorted(per_round):
        load = np.zeros(cap.size)
        for pair, numel in per_round[rnd].items():
            route = routes.get(pair)
            if route is None:
                route = routes[pair] = np.asarray(switch_path(topo, nodes[pair[0]], nodes[pair[1]]), dtype=np.int64)
            load[route] += float(numel)             # a switch path crosses a link once
        total += float((8.0 * load / (cap * 1e9)).max())
    return total / MODEL_BLOCK


def _bounds(chunks: list) -> list[tuple[int, int]]:
    """:func:`chunk_bounds` of ``chunks`` in a ``MODEL_BLOCK`` (a lone chunk: all of it)."""
    return [(0, MODEL_BLOCK)] if len(chunks) == 1 else chunk_bounds([c.share for c in chunks], MODEL_BLOCK)


def _grouped(chunks, key) -> dict:
    groups: dict = defaultdict(list)
    for c in chunks:
        groups[key(c)].append(c)
    return groups


def _gpu_rank(rank: dict[str, int], gpu: str) -> int:
    if gpu not in rank:
        raise ScheduleError(f"schedule hop at {gpu!r}, which is not one of its GPUs")
    return rank[gpu]


def _alltoall_hops(schedule: Schedule, rank: dict[str, int]) -> Iterator[tuple[int, int, int, int]]:
    """``(round, src rank, dst rank, elements)`` of every GPU hop: hop ``h`` of a path in round ``h``."""
    for chunks in _grouped(schedule.chunks, lambda c: (c.src, c.dst)).values():
        for chunk, (lo, hi) in zip(chunks, _bounds(chunks)):
            if hi > lo:
                gpus = [rank[v] for v in chunk.path if v in rank]
                for h in range(len(gpus) - 1):
                    yield h, gpus[h], gpus[h + 1], hi - lo


def _allgather_hops(schedule: Schedule, rank: dict[str, int]) -> Iterator[tuple[int, int, int, int]]:
    """``(round, src rank, dst rank, elements)`` of every tree edge: in the round of its tail's depth."""
    for chunks in _grouped(schedule.chunks, lambda c: c.src).values():
        for chunk, (lo, hi) in zip(chunks, _bounds(chunks)):
            if hi > lo:
                depth = chunk.depths()
                for e in chunk.edges:
                    yield depth[e[0]], _gpu_rank(rank, e[0]), _gpu_rank(rank, e[-1]), hi - lo
