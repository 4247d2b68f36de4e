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

import numpy as np

from ..paths import switch_path
from ..schedule import Schedule
from ..topology import Topology
from .program import compile_schedule

__all__ = ["round_time"]

#: elements per block of the program the model is evaluated on (rounds its shares finely)
MODEL_BLOCK = 1 << 12


def round_time(schedule: Schedule, topo: Topology, capacity: np.ndarray | None = None) -> float:
    """Seconds per byte of block of ``schedule`` run round by round on ``capacity``
    (default the topology's): the sum over rounds of the round's slowest link drain."""
    cap = topo.arrays.capacity.astype(float) if capacity is None else np.asarray(capacity, dtype=float)
    prog = compile_schedule(schedule, MODEL_BLOCK)
    nodes = [topo.node_index(g) for g in schedule.gpus]
    routes: dict[tuple[int, int], np.ndarray] = {}
    loads: dict[int, np.ndarray] = {}
    for m in prog.messages:
        key = (m.src, m.dst)
        if key not in routes:
            routes[key] = np.asarray(switch_path(topo, nodes[m.src], nodes[m.dst]), dtype=np.int64)
        load = loads.setdefault(m.round, np.zeros(cap.size))
        np.add.at(load, routes[key], float(m.numel))
    return sum(float((8.0 * load / (cap * 1e9)).max()) for load in loads.values()) / MODEL_BLOCK
