"""Accumulate nodes and cables, then build a :class:`~mccl_opt.topology.Topology`.

The importers share it so that every one of them declares nodes once, refuses a node
declared twice with another kind, and turns a cable into two directed links.
"""

from __future__ import annotations

from typing import Any

from ..errors import TopologyError
from ..topology import Link, Node, Topology

__all__ = ["FabricBuilder"]


class FabricBuilder:
    """Nodes in declaration order (GPU ranks follow it) and directed links."""

    def __init__(self) -> None:
        self._kinds: dict[str, str] = {}
        self._extra: dict[str, dict[str, Any]] = {}
        self.links: list[Link] = []

    def node(self, node_id: str, kind: str, **extra: Any) -> str:
        """Declare ``node_id`` (again with the same kind is a no-op); returns the id."""
        known = self._kinds.get(node_id)
        if known is not None and known != kind:
            raise TopologyError(f"node {node_id!r} is declared both as a {known} and as a {kind}")
        if known is None:
            self._kinds[node_id] = kind
            self._extra[node_id] = dict(extra)
        return node_id

    def has(self, node_id: str) -> bool:
        return node_id in self._kinds

    def link(self, src: str, dst: str, gbps: float, latency_us: float, **extra: Any) -> None:
        """One directed link ``src -> dst``."""
        self.links.append(Link(src, dst, float(gbps), float(latency_us), dict(extra)))

    def cable(self, a: str, b: str, gbps: float, latency_us: float, **extra: Any) -> None:
        """Two directed links ``a -> b`` and ``b -> a`` of the same capacity."""
        self.link(a, b, gbps, latency_us, **extra)
        self.link(b, a, gbps, latency_us, **extra)

    def build(self, name: str, extra: dict[str, Any] | None = None) -> Topology:
        nodes = [Node(i, k, self._extra[i]) for i, k in self._kinds.items()]
        return Topology(name, nodes, self.links, extra)
