"""Iteration time of a layered workload on one fabric state (paper §6.3,
docs/training.md "Iteration model").

Each phase runs its critical path (compute ops and non-overlapped collectives, in
order) and its overlapped collectives (in order, from the phase's start) side by side
in the contention model (:func:`.contention.run_streams`); the phase's time counts
``repeat`` times.  A collective op runs on every instance of its group at once, each
instance's flow built from its schedule's loads (:mod:`.comms`):

* AllGather of shard ``b``: one stage, ``8 b L_a`` bits on link ``a``;
* AllToAll of send buffer ``b`` on ``n`` GPUs: ``8 (b/n) L_a``;
* ReduceScatter of buffer ``b``: the ring backwards, ``8 (b/n) L_a``;
* AllReduce: that ReduceScatter, then an AllGather of ``b/n`` (paper §3: MCCL splits
  an AllReduce and optimizes its AllGather half).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..topology import Topology
from .comms import Comm, LoadCache, communicators
from .contention import Flow, alone_seconds, run_streams
from .placement import place_groups
from .workload import Op, Workload

__all__ = ["FabricState", "fabric_state", "iteration_time", "IterationTime", "link_traffic", "Capacities"]


@dataclass(frozen=True)
class FabricState:
    """A fabric (healthy or degraded) with the workload's communicators on it."""

    topo: Topology
    comms: dict[str, list[Comm]]
    relay: str = "members"

    @property
    def capacity_bps(self) -> np.ndarray:
        return self.topo.arrays.capacity * 1e9


def fabric_state(topo: Topology, workload: Workload, relay: str = "members") -> FabricState:
    """Place the workload's groups on ``topo`` (:func:`.placement.place_groups`); ``relay``
    as in :func:`.comms.communicators`."""
    comms: dict[str, list[Comm]] = {}
    for c in communicators(topo, place_groups(workload, topo.gpus), relay):
        comms.setdefault(c.group, []).append(c)
    return FabricState(topo, comms, relay)


@dataclass(frozen=True)
class IterationTime:
    """``seconds`` per iteration; ``compute_s`` (compute ops alone) and ``collective_s``
    (every collective alone, one after the other, no overlap) for the collectives' share."""

    seconds: float
    compute_s: float
    collective_s: float
    phases: dict[str, float]

    @property
    def collective_share(self) -> float:
        return self.collective_s / (self.compute_s + self.collective_s)


Capacities = Mapping[tuple[str, int], np.ndarray]


def _flows(state: FabricState, cache: LoadCache, op: Op, method: str,
           capacity: Capacities) -> list[Flow]:
    flows = []
    for comm in state.comms.get(op.group, []):
        def stage(kind: str, unit: float):
            idx, loads = cache.comm_loads(comm, kind, method, capacity.get((comm.group, comm.index)))
            used = loads > 0
            return idx[used], 8.0 * unit * loads[used]

        n = comm.size
        if op.kind == "allgather":
            stages = (stage("allgather", op.bytes),)
        elif op.kind == "alltoall":
            stages = (stage("alltoall", op.bytes / n),)
        elif op.kind == "reducescatter":
            stages = (stage("reducescatter", op.bytes / n),)
        else:
            stages = (stage("reducescatter", op.bytes / n), stage("allgather", op.bytes / n))
        flows.append(Flow(stages))
    return flows


def iteration_time(workload: Workload, state: FabricState, cache: LoadCache, method: str,
                   capacity: Capacities | None = None) -> IterationTime:
    """One iteration of ``workload`` on ``state`` with ``method``'s schedules (``nccl`` or
    ``mccl``); ``capacity`` maps a communicator ``(group, index)`` to the parent
    capacities (Gbps) its MCCL schedules are synthesized for (joint re-synthesis),
    default the fabric's own."""
    capacity = capacity or {}
    cap = state.capacity_bps
    total = compute = alone = 0.0
    phases: dict[str, float] = {}
    for phase in workload.phases:
        front: list = []
        back: list = []
        for op in phase.ops:
            if op.kind == "compute":
                seconds = workload.compute_seconds(op)
                front.append(seconds)
                compute += seconds * phase.repeat
                continue
            flows = _flows(state, cache, op, method, capacity)
            alone += phase.repeat * max((alone_seconds(f, cap) for f in flows), default=0.0)
            (back if op.overlap else front).append(flows)
        seconds = run_streams([front, back], cap)
        phases[phase.name] = float(seconds * phase.repeat)
        total += seconds * phase.repeat
    return IterationTime(float(total), float(compute), float(alone), phases)


def link_traffic(workload: Workload, state: FabricState, cache: LoadCache, method: str,
                 capacity: Capacities | None = None) -> list[dict[tuple[str, int], np.ndarray]]:
    """Per phase, the bits each communicator ``(group, index)`` puts on every parent link."""
    capacity = capacity or {}
    out = []
    for phase in workload.phases:
        traffic: dict[tuple[str, int], np.ndarray] = {}
        for op in phase.ops:
            if op.kind == "compute":
                continue
            for comm, flow in zip(state.comms.get(op.group, []), _flows(state, cache, op, method, capacity)):
                total = traffic.setdefault((comm.group, comm.index), np.zeros(state.topo.num_links))
                for idx, bits in flow.stages:
                    np.add.at(total, idx, bits)
        out.append(traffic)
    return out
