"""The store-and-forward round model of a schedule (docs/executor.md, "Emulated fabric" and
"The round model in pieces"; paper §4.2's step model).

The torch.distributed executor runs a schedule as the rounds of its global program
(:func:`~mccl_opt.lowering.program.compile_schedule`: piece ``p`` of a chunk crosses its
GPU hop ``h`` in round ``h + p``), and a round lasts as long as its busiest link drains:
``max_l 8 load_l / cap_l``, where ``load_l`` sums every message of the round whose GPU
pair's switch-only path crosses ``l``.  The fluid LP (paper §4) values only the total
load per link, so two schedules of one rate can differ here: on HPN 1x2x4 with a NIC at
50 of 400 Gbps, AllToAll schedules of the same rate took 86 and 132 ms of emulated time,
because one sends over the slow NIC in two rounds.  :func:`round_time` is that model, to
choose between schedules of equal rate for such an executor.

The chunks are cut into pieces by the lowering's own hops (:mod:`.hops`, with the
:class:`~mccl_opt.piece_rule.PieceRule` the simulator and the executor share), so the
model's rounds are the program's rounds; only the messages' Python objects are not made.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..errors import InputError
from ..paths import switch_path
from ..piece_rule import PIECE_RULE, PieceRule
from ..schedule import Schedule
from ..topology import Topology
from .hops import Pipeline, allgather_hops, alltoall_hops, rank_index
from .program import chunk_bounds

__all__ = ["round_time", "round_messages", "RoundPieces", "MODEL_BLOCK"]

#: elements per block of the program the model is evaluated on (rounds its shares finely)
MODEL_BLOCK = 1 << 12


@dataclass(frozen=True)
class RoundPieces:
    """How the executor cuts chunks: blocks of ``message_bytes`` (per GPU pair for
    AllToAll, per shard for AllGather), each chunk in the pieces ``rule`` gives its bytes
    and GPU hops (the simulator's rule by default; real ranks: ``executor_cuda.scenario_run.rank_pipeline``)."""

    message_bytes: float
    rule: PieceRule = PIECE_RULE

    def __post_init__(self) -> None:
        b = self.message_bytes
        if not isinstance(b, (int, float)) or isinstance(b, bool) or not math.isfinite(b) or b <= 0:
            raise InputError(f"the round model's message size must be a finite number of bytes > 0, got {b!r}")

    @classmethod
    def parse(cls, text: str) -> RoundPieces:
        """``BYTES`` (the simulator's rule) or ``BYTES,FLOOR`` (the real ranks' rule: no
        512 KiB cap, pieces of at least ``FLOOR`` bytes; docs/executor.md "Pieces per chunk")."""
        parts = text.split(",")
        try:
            nums = [float(p) for p in parts]
        except ValueError:
            nums = []
        if not 1 <= len(nums) <= 2 or len(nums) != len(parts):
            raise InputError(f"expected BYTES or BYTES,FLOOR (numbers of bytes), got {text[:40]!r}")
        rule = PieceRule(max_bytes=math.inf, floor_bytes=nums[1]) if len(nums) == 2 else PIECE_RULE
        return cls(nums[0], rule)


def round_messages(schedule: Schedule, block_numel: int = MODEL_BLOCK,
                   pipeline: Pipeline = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(round, src rank, dst rank, elements)`` of every coalesced message of
    ``compile_schedule(schedule, block_numel, pipeline)``, sorted by round, then pair: the
    lowering's hops summed per round and GPU pair.  Raises
    :class:`~mccl_opt.errors.ScheduleError` for a schedule the lowering refuses."""
    rank = rank_index(schedule)
    lower = alltoall_hops if schedule.collective == "alltoall" else allgather_hops
    hops = lower(schedule, rank, block_numel, pipeline, chunk_bounds)
    n = len(rank)
    keys, inv = np.unique((hops.rnd * n + hops.src) * n + hops.dst, return_inverse=True)
    numel = np.bincount(inv.ravel(), weights=hops.length, minlength=keys.size).astype(np.int64)
    return keys // (n * n), keys // n % n, keys % n, numel


def round_time(schedule: Schedule, topo: Topology, capacity: np.ndarray | None = None,
               pieces: RoundPieces | None = None) -> float:
    """Seconds of ``schedule`` run round by round on ``capacity`` (Gbps, default the
    topology's): the sum over rounds of the round's slowest link drain.

    ``pieces``: every chunk cut as the executor cuts it (:mod:`mccl_opt.piece_rule`, on a
    block of ``MODEL_BLOCK`` elements of ``pieces.message_bytes / MODEL_BLOCK`` bytes), in
    seconds of one collective.  ``None``: one piece per chunk (a time linear in the
    block), in seconds per byte of block."""
    cap = topo.arrays.capacity.astype(float) if capacity is None else np.asarray(capacity, dtype=float)
    if pieces is None:
        pipeline: Pipeline = 1
        element_bytes = 1.0 / MODEL_BLOCK
    else:
        element_bytes = float(pieces.message_bytes) / MODEL_BLOCK
        pipeline = replace(pieces.rule, element_bytes=element_bytes)
    rnd, src, dst, numel = round_messages(schedule, MODEL_BLOCK, pipeline)
    if not rnd.size:
        return 0.0
    n = len(schedule.gpus)
    pairs, inv = np.unique(src * n + dst, return_inverse=True)
    flat, first, size = _routes(schedule, topo, pairs // n, pairs % n)
    per_msg = size[inv.ravel()]
    at = np.arange(int(per_msg.sum())) - np.repeat(np.cumsum(per_msg) - per_msg, per_msg)
    link = flat[np.repeat(first[inv.ravel()], per_msg) + at]
    load = np.bincount(np.repeat(rnd, per_msg) * cap.size + link,
                       weights=np.repeat(numel * element_bytes, per_msg),
                       minlength=int(rnd[-1] + 1) * cap.size).reshape(-1, cap.size)
    return float(sum((8.0 * load / (cap * 1e9)).max(axis=1).tolist()))


def _routes(schedule: Schedule, topo: Topology, src: np.ndarray,
            dst: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The switch-only path of every rank pair ``(src[i], dst[i])`` (a path crosses a link
    once), as link indices ``flat[first[i]:first[i] + size[i]]``."""
    nodes = [topo.node_index(g) for g in schedule.gpus]
    routes = [np.asarray(switch_path(topo, nodes[s], nodes[d]), dtype=np.int64)
              for s, d in zip(src.tolist(), dst.tolist())]
    size = np.fromiter(map(len, routes), np.int64, count=len(routes))
    return np.concatenate(routes), np.cumsum(size) - size, size
