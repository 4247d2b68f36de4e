"""Communicators of a job on one fabric and their schedules' link loads (paper §6.3,
docs/training.md "Synthesis once per distinct sub-fabric").

Every group instance is a communicator over its sub-fabric
(:func:`mccl_opt.subfabric.induced`).  What a collective puts on the parent fabric's
links is its schedule's share loads ``L_a`` lifted onto the parent's links: an AllGather
of shard ``s`` moves ``8 s L_a`` bits over link ``a``, an AllToAll of send buffer ``b``
on ``n`` GPUs ``8 (b/n) L_a``.

Many communicators are identical up to relabelling (every tensor-parallel group inside
a host, every data-parallel rail group of a healthy fabric).  A sub-fabric's *canonical
key* is its sorted list of links as (tail, head, capacity, latency) over its own node
indices (members in rank order, then switches in the parent's order); communicators with
equal keys are isomorphic by that index map, so one schedule is synthesized per key and
its loads are mapped onto each instance's links.  Two isomorphic sub-fabrics whose
switches are listed in another order only cost a second synthesis, never a wrong load.
NCCL baselines depend on the links only, so their key leaves capacities out.

Methods: ``nccl`` (ring AllGather; PXN AllToAll on a sub-fabric of whole HPN hosts,
direct otherwise; :mod:`mccl_opt.baselines`), ``mccl`` (:func:`mccl_opt.solve_allgather`,
:func:`mccl_opt.solve_alltoall` on the sub-fabric's capacities, or on the capacities a
joint re-synthesis gives it).  ReduceScatter is the ring run backwards under both
methods by default (MCCL keeps reductions on the vendor's schedule, paper §3); with
``reduce_scatter="mccl"`` MCCL runs it on its AllGather trees for the reversed fabric
(every link's capacity taken from the link the other way), backwards: a tree that
broadcasts a shard, reversed, reduces it (switches still only forward).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
import numpy as np

from ..subfabric import SubFabric, induced
from ..topology import Node, Topology
from .series import series_reduced

__all__ = ["Comm", "LoadCache", "communicators", "METHODS"]

METHODS = ("nccl", "mccl")


@dataclass(frozen=True)
class Comm:
    """One communicator: its group, its ``index`` among the group's instances, members
    and sub-fabric, with the permutation that sorts its links into canonical order
    (``order``) and the structure/capacity keys."""

    group: str
    index: int
    sub: SubFabric
    order: np.ndarray
    shape_key: bytes
    key: bytes

    @property
    def size(self) -> int:
        return len(self.sub.gpus)


def _hpn_tagged(parent: Topology, sub: SubFabric) -> Topology:
    """The sub-fabric, marked as an HPN fabric when its members are whole hosts of an HPN
    parent in rank order (so NCCL's rail rings and PXN apply to it as to the parent)."""
    shape = parent.extra.get("shape")
    if parent.extra.get("family") != "hpn" or not isinstance(shape, (list, tuple)) or len(shape) != 3:
        return sub.topology
    n = int(shape[2])
    ranks = [parent.rank(g) for g in sub.gpus]
    whole = (len(ranks) % n == 0 and ranks[0] % n == 0
             and ranks == list(range(ranks[0], ranks[0] + len(ranks))))
    if not whole:
        return sub.topology
    t = sub.topology
    return Topology(t.name, t.nodes, t.links, {**t.extra, "family": "hpn", "shape": [1, len(ranks) // n, n]})


def _canonical_labels(topo: Topology) -> np.ndarray:
    """A label per node: members first in rank order, then the other nodes in the order a
    breadth-first walk from the members reaches them, each node's new neighbours taken by
    (capacity out, capacity in, latency, kind, the parent's order).  The walk follows the
    fabric's structure, so communicators that differ by a relabelling of hosts or rails get
    the same labels wherever ties are broken alike (docs/training.md)."""
    a = topo.arrays
    label = np.full(topo.num_nodes, -1, dtype=np.int64)
    order = [int(v) for v in a.gpu_nodes]
    label[order] = np.arange(len(order))
    for u in order:                                  # the list grows while it is walked
        arcs = a.out_arcs[a.out_start[u]:a.out_start[u + 1]]
        new = [(-a.capacity[arc], -a.capacity[topo.link_index(topo.nodes[int(a.head[arc])].id,
                                                               topo.nodes[u].id)],
                a.latency[arc], bool(a.is_switch[a.head[arc]]), int(a.head[arc]))
               for arc in arcs if label[a.head[arc]] < 0]
        for *_, v in sorted(new):
            if label[v] < 0:
                label[v] = len(order)
                order.append(v)
    return label


def _keys(topo: Topology) -> tuple[np.ndarray, bytes, bytes]:
    a = topo.arrays
    label = _canonical_labels(topo)
    tail, head = label[a.tail], label[a.head]
    order = np.lexsort((head, tail))
    shape = np.stack([tail[order], head[order], a.is_switch[a.head[order]]]).astype(np.int64)
    values = np.stack([a.capacity[order], a.latency[order]]).round(9)
    top = f"{topo.num_gpus}:{topo.extra.get('family')}:".encode()
    return order, top + shape.tobytes(), top + shape.tobytes() + values.tobytes()


def _host_relays(topo: Topology, members: tuple[str, ...]) -> Topology:
    """``topo`` with the members' host-mates (the other GPUs on each member's
    lowest-latency switch, its NVSwitch) turned into forwarding-only nodes."""
    a = topo.arrays
    mates: set[int] = set()
    for g in members:
        v = topo.node_index(g)
        arcs = [int(x) for x in a.out_arcs[a.out_start[v]:a.out_start[v + 1]] if a.is_switch[a.head[x]]]
        if not arcs:
            continue
        nvs = int(a.head[min(arcs, key=lambda x: (a.latency[x], int(a.head[x])))])
        mates |= {int(a.head[x]) for x in a.out_arcs[a.out_start[nvs]:a.out_start[nvs + 1]]
                  if not a.is_switch[a.head[x]]}
    relays = {topo.nodes[v].id for v in mates} - set(members)
    if not relays:
        return topo
    nodes = [Node(n.id, "switch", n.extra) if n.id in relays else n for n in topo.nodes]
    return Topology(topo.name, nodes, topo.links, topo.extra)


def communicators(topo: Topology, groups: dict[str, list[tuple[str, ...]]],
                  relay: str = "members") -> list[Comm]:
    """Every group instance of ``groups`` (from :func:`.placement.place_groups`) as a
    :class:`Comm` over ``topo``.  ``relay="host"`` lets the other GPUs on the members'
    hosts forward the communicator's traffic (as forwarding-only nodes; docs/training.md
    "Relays"); ``"members"`` (default) keeps :func:`mccl_opt.subfabric.induced`'s rule."""
    out = []
    for name, instances in groups.items():
        for index, members in enumerate(instances):
            if len(members) < 2:
                continue
            sub = induced(_host_relays(topo, members) if relay == "host" else topo, members)
            tagged = _hpn_tagged(topo, sub)
            sub = SubFabric(topo.name, topo.num_links, sub.gpus, tagged, sub.links)
            order, shape_key, key = _keys(tagged)
            out.append(Comm(name, index, sub, order, shape_key, key))
    return out


@dataclass
class LoadCache:
    """Schedules' canonical share loads by (kind, method, key), shared by every fabric
    state of a sweep; counts syntheses, reuses and their wall time.  ``reduce_scatter``:
    ``ring`` (paper §3: reductions stay on the vendor's ring) or ``mccl``."""

    backend: str = "highs"
    reduce_scatter: str = "ring"
    loads: dict = field(default_factory=dict)
    synth_s: float = 0.0
    baseline_s: float = 0.0
    syntheses: int = 0
    reused: int = 0

    def comm_loads(self, comm: Comm, kind: str, method: str,
                   capacity: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(parent link indices, share loads)`` of ``kind`` (allgather | alltoall |
        reducescatter) under ``method`` on ``comm``; MCCL synthesizes on the parent
        capacities ``capacity`` when given (joint re-synthesis), else on the sub-fabric's
        own.  A ReduceScatter is the ring backwards unless ``reduce_scatter == "mccl"``
        (then MCCL's AllGather trees for the reversed fabric, run backwards)."""
        topo = comm.sub.topology
        key = comm.shape_key
        if kind == "reducescatter" and (method == "nccl" or self.reduce_scatter == "ring"):
            method = "nccl"
        elif method == "mccl":
            if capacity is not None:
                topo = comm.sub.measured(capacity)
                key = _keys(topo)[2]
            else:
                key = comm.key
        entry = (kind, method, key)
        canon = self.loads.get(entry)
        if canon is not None:
            self.reused += 1
        elif kind == "reducescatter" and method == "mccl" and _symmetric(topo):
            sub = np.empty(topo.num_links)           # the AllGather's trees, run backwards
            sub[comm.order] = self.comm_loads(comm, "allgather", method, capacity)[1]
            canon = self.loads[entry] = _reversed(topo, sub)[comm.order]
        else:
            canon = self.loads[entry] = self._schedule_loads(topo, kind, method)[comm.order]
        return comm.sub.links[comm.order], canon

    def _schedule_loads(self, topo: Topology, kind: str, method: str) -> np.ndarray:
        from ..schedule import share_loads

        start = time.perf_counter()
        if method == "nccl":
            loads = _baseline_loads(topo, "allgather" if kind == "reducescatter" else kind)
            if kind == "reducescatter":
                loads = _reversed(topo, loads)
        elif kind == "alltoall":
            from ..alltoall import solve_alltoall

            small = series_reduced(topo)
            loads = small.expand(share_loads(small.topology, solve_alltoall(small.topology, backend=self.backend).chunks))
        else:
            from ..allgather import solve_allgather

            on = topo if kind == "allgather" else topo.with_capacities(_reversed(topo, topo.arrays.capacity))
            small = series_reduced(on)
            loads = small.expand(share_loads(small.topology, solve_allgather(small.topology, backend=self.backend).chunks))
            if kind == "reducescatter":
                loads = _reversed(topo, loads)
        spent = time.perf_counter() - start
        if method == "nccl":
            self.baseline_s += spent
        else:
            self.synth_s += spent
            self.syntheses += 1
        return loads


def _baseline_loads(topo: Topology, kind: str) -> np.ndarray:
    from ..baselines import direct_alltoall, pxn_alltoall
    from ..schedule import share_loads

    if kind == "allgather":
        return _ring_loads(topo)
    sched = pxn_alltoall(topo) if topo.extra.get("family") == "hpn" else direct_alltoall(topo)
    return share_loads(topo, sched.chunks)


def _ring_loads(topo: Topology) -> np.ndarray:
    """NCCL's ring AllGather (:func:`mccl_opt.baselines.ring_allgather`).  When the ring in
    rank order has a hop with no switch-only path (members on two rails of two hosts),
    NCCL's topology search orders the ring another way; here: nearest member first
    (fewest switch hops, then rank) from rank 0, which keeps such hops on one rail."""
    from ..baselines import ring_allgather
    from ..errors import TopologyError
    from ..schedule import share_loads

    try:
        return share_loads(topo, ring_allgather(topo).chunks)
    except TopologyError:
        order = _nearest_ring(topo)
    gpus = [topo.node(topo.gpus[r]) for r in order]
    relisted = Topology(topo.name, gpus + [topo.node(s) for s in topo.switches], topo.links)
    loads = share_loads(relisted, ring_allgather(relisted).chunks)
    out = np.zeros(topo.num_links)
    for i, link in enumerate(relisted.links):
        out[topo.link_index(link.src, link.dst)] += loads[i]
    return out


def _nearest_ring(topo: Topology) -> list[int]:
    from ..paths import switch_paths_from

    a = topo.arrays
    hops = [{int(a.rank_of[v]): len(p) for v, p in switch_paths_from(topo, int(a.gpu_nodes[r])).items()}
            for r in range(topo.num_gpus)]
    order, left = [0], set(range(1, topo.num_gpus))
    while left:
        near = hops[order[-1]]
        nxt = min((r for r in left if r in near), key=lambda r: (near[r], r), default=None)
        if nxt is None:
            nxt = min(left)               # ring_allgather names the hop that has no route
        order.append(nxt)
        left.discard(nxt)
    return order


def _symmetric(topo: Topology) -> bool:
    """Every link has the capacity of the link the other way (the reversed fabric is itself)."""
    cap = topo.arrays.capacity
    return bool(np.array_equal(_reversed(topo, cap), cap))


def _reversed(topo: Topology, loads: np.ndarray) -> np.ndarray:
    """Loads of the schedule run backwards (a ReduceScatter along the AllGather ring):
    each link's load moves to the link in the other direction."""
    out = np.zeros_like(loads)
    for i, link in enumerate(topo.links):
        if loads[i] > 0:
            out[topo.link_index(link.dst, link.src)] += loads[i]
    return out

