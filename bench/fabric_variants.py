"""Failure-shaped variants of the generated fabrics for the AllGather fuzz families
(bench/allgather_chains.py, docs/benchmarks.md): a rail switch missing, a switch with part
of its uplinks unplugged.  Not fabric designs of their own (those are in
:mod:`instances.designs`), so they live with the benchmark."""

from __future__ import annotations

from mccl_opt.errors import TopologyError
from mccl_opt.topology import Topology

__all__ = ["without_node", "without_cables"]


def without_node(topo: Topology, node: str) -> Topology:
    """``topo`` with switch ``node`` and its cables removed (a rail ToR down: the GPUs of
    its rail keep only their NVSwitch).  ``TopologyError`` if the GPUs fall apart."""
    if not topo.has_node(node) or topo.is_gpu(node):
        raise TopologyError(f"{topo.name}: no switch {node!r} to remove")
    return Topology(f"{topo.name}-no-{node}", [n for n in topo.nodes if n.id != node],
                    [l for l in topo.links if node not in (l.src, l.dst)], dict(topo.extra))


def without_cables(topo: Topology, switch: str, peers: list[str]) -> Topology:
    """``topo`` without the cables (both directions) between ``switch`` and each of
    ``peers``: an asymmetric switch with part of its uplinks unplugged."""
    gone = {(switch, p) for p in peers} | {(p, switch) for p in peers}
    missing = [p for p in peers if not topo.has_link(switch, p)]
    if missing:
        raise TopologyError(f"{topo.name}: {switch!r} has no cable to {missing}")
    return Topology(f"{topo.name}-{switch}-less{len(peers)}",
                    topo.nodes, [l for l in topo.links if (l.src, l.dst) not in gone],
                    dict(topo.extra))
