"""Accumulate nodes and cables, then write a ``mccl-topology/1`` document.

The importers share it so that every one of them declares nodes once, refuses a node
declared twice with another kind, and turns a cable into two directed links.  It writes
the file format, not a :class:`~mccl_opt.topology.Topology`, so that the topology's own
constructors (``Topology.from_nccl_xml``...) can call the importers without an import
cycle; :meth:`mccl_opt.Topology.from_dict` validates the document.
"""

from __future__ import annotations

from typing import Any

from ..errors import TopologyError

__all__ = ["FabricBuilder"]


class FabricBuilder:
    """Nodes in declaration order (GPU ranks follow it) and directed links."""

    def __init__(self) -> None:
        self._kinds: dict[str, str] = {}
        self._extra: dict[str, dict[str, Any]] = {}
        self.links: list[dict[str, Any]] = []

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
        self.links.append({**extra, "src": src, "dst": dst, "capacity_gbps": float(gbps),
                           "latency_us": float(latency_us)})

    def cable(self, a: str, b: str, gbps: float, latency_us: float, **extra: Any) -> None:
        """Two directed links ``a -> b`` and ``b -> a`` of the same capacity."""
        self.link(a, b, gbps, latency_us, **extra)
        self.link(b, a, gbps, latency_us, **extra)

    def document(self, name: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ``mccl-topology/1`` document (``Topology.from_dict`` reads it)."""
        nodes = [{**self._extra[i], "id": i, "kind": k} for i, k in self._kinds.items()]
        return {**(extra or {}), "format": "mccl-topology/1", "name": name, "nodes": nodes,
                "links": self.links}
