"""The sub-fabric a communicator's GPUs induce in a measured fabric.

A job runs many communicators (tensor-, data-, expert-parallel groups), each over a
subset of the cluster's GPUs.  A communicator's schedule is synthesized on the fabric
its members induce:

* its **member GPUs**, in the communicator's rank order (rank ``r`` is ``gpus[r]``);
* every **switch** and every link between kept nodes, with the parent fabric's
  capacities and latencies;
* **no other GPU**.  GPUs outside the group do not forward or relay the group's
  traffic: a GPU forwards only by running the collective's program (paper §4: GPUs
  forward and copy, switches only forward), and a GPU of another communicator runs
  another job's kernels, not this schedule.  ForestColl and TE-CCL define a collective
  over the GPUs that take part, and NCCL's communicators send only between members;
  a schedule that relayed through a non-member would never run.

Two reductions keep the synthesis small without changing its optimum: switches that no
member reaches or that reach no member carry nothing, and a switch with a single
neighbour can only send traffic back where it came from, which no simple path does
(removed repeatedly, so a chain of dead ends goes too).

Members that cannot reach each other through switches and other members raise
:class:`~mccl_opt.errors.TopologyError` (on a rail-only HPN fabric, GPUs on different
rails of different hosts with no member on their host to relay).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from .errors import TopologyError
from .topology import Topology

__all__ = ["SubFabric", "induced", "check_members"]


@dataclass(frozen=True)
class SubFabric:
    """A communicator's sub-fabric: ``topology`` (members first, in rank order) and, for
    each of its links, the index of that link in the parent fabric (``links``)."""

    parent_name: str
    parent_links: int
    gpus: tuple[str, ...]
    topology: Topology
    links: np.ndarray

    def capacities(self, parent_capacity: np.ndarray) -> np.ndarray:
        """The sub-fabric's link capacities taken from the parent's (link order)."""
        parent_capacity = np.asarray(parent_capacity, dtype=float)
        if parent_capacity.shape != (self.parent_links,):
            raise TopologyError(f"capacity vector has shape {parent_capacity.shape}; the fabric "
                                f"{self.parent_name!r} has {self.parent_links} links")
        return parent_capacity[self.links]

    def measured(self, parent_capacity: np.ndarray) -> Topology:
        """The sub-fabric with the parent's measured capacities."""
        return self.topology.with_capacities(self.capacities(parent_capacity))

    def lift(self, values: np.ndarray, fill: float = 0.0) -> np.ndarray:
        """A per-link array of the sub-fabric spread onto the parent's links (``fill``
        elsewhere)."""
        out = np.full(self.parent_links, fill, dtype=np.asarray(values).dtype)
        out[self.links] = values
        return out


def check_members(topo: Topology, gpus: Any) -> tuple[str, ...]:
    """The member list as a tuple, or :class:`TopologyError` saying what is wrong with it:
    not a list of strings, fewer than two GPUs, an id that is no node or a switch, a GPU
    listed twice."""
    if isinstance(gpus, (str, bytes)) or not isinstance(gpus, Sequence):
        raise TopologyError(f"a communicator's members must be a list of GPU ids, got {type(gpus).__name__}")
    members = tuple(gpus)
    if len(members) < 2:
        raise TopologyError(f"a communicator needs at least 2 GPUs, got {len(members)}")
    first: dict[str, int] = {}
    for i, g in enumerate(members):
        if not isinstance(g, str):
            raise TopologyError(f"member #{i} must be a GPU id string, got {type(g).__name__}")
        if not topo.has_node(g):
            raise TopologyError(f"member #{i} {g[:40]!r} is not a node of fabric {topo.name!r}; "
                                f"its GPUs are named like {topo.gpus[0]!r}")
        if not topo.is_gpu(g):
            raise TopologyError(f"member #{i} {g[:40]!r} is a switch, not a GPU; list GPU ids only")
        if g in first:
            raise TopologyError(f"GPU {g!r} is listed twice (members #{first[g]} and #{i}); "
                                "each GPU is one rank of a communicator")
        first[g] = i
    return members


def _kept_switches(topo: Topology, members: tuple[str, ...]) -> np.ndarray:
    """Mask of the switches a member-to-member path can use (module docstring)."""
    a = topo.arrays
    n = topo.num_nodes
    member = np.zeros(n, dtype=bool)
    member[[topo.node_index(g) for g in members]] = True
    keep = member | a.is_switch
    while True:
        live = keep[a.tail] & keep[a.head]
        tail, head = a.tail[live], a.head[live]
        fwd = _reach(n, tail, head, member)
        back = _reach(n, head, tail, member)
        # distinct neighbours of each node among kept links (either direction)
        pairs = np.unique(np.concatenate([tail * n + head, head * n + tail]))
        degree = np.bincount(pairs // n, minlength=n)
        new = member | (a.is_switch & fwd & back & (degree >= 2))
        if np.array_equal(new, keep):
            return keep
        keep = new


def _reach(n: int, tail: np.ndarray, head: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Nodes reachable from ``start`` along the arcs ``tail -> head``."""
    order = np.argsort(tail, kind="stable")
    starts = np.searchsorted(tail[order], np.arange(n + 1))
    heads = head[order]
    seen = start.copy()
    stack = list(np.flatnonzero(start))
    while stack:
        u = stack.pop()
        for v in heads[starts[u]:starts[u + 1]]:
            if not seen[v]:
                seen[v] = True
                stack.append(int(v))
    return seen


def induced(topo: Topology, gpus: Sequence[str]) -> SubFabric:
    """The sub-fabric the GPUs ``gpus`` (a communicator's ranks, in order) induce in
    ``topo`` (module docstring).  The whole GPU set in ``topo``'s order keeps every
    link, in ``topo``'s order, and the topology's name."""
    members = check_members(topo, gpus)
    keep = _kept_switches(topo, members)
    a = topo.arrays
    links = np.flatnonzero(keep[a.tail] & keep[a.head])
    switches = [nd for nd, k, sw in zip(topo.nodes, keep, a.is_switch) if k and sw]
    nodes = [topo.node(g) for g in members] + switches
    tag = hashlib.sha256("\0".join(members).encode()).hexdigest()[:8]
    name = topo.name if members == topo.gpus else f"{topo.name}/group-{len(members)}-{tag}"
    try:
        sub = Topology(name, nodes, [topo.links[i] for i in links], {"subfabric_of": topo.name})
    except TopologyError as exc:
        raise TopologyError(f"the {len(members)} members do not form a connected sub-fabric of "
                            f"{topo.name!r} (GPUs outside a communicator do not forward its traffic): "
                            f"{exc}") from None
    links.setflags(write=False)
    return SubFabric(topo.name, topo.num_links, members, sub, links)
