"""Hosts joined into one fabric through their NICs (docs/interop.md "Clusters").

A per-host description (:class:`HostSpec`, from NCCL's topology XML or from
``nvidia-smi topo -m``) says nothing about the network between hosts, so the user
says it (:data:`NETWORKS`):

* ``rail``: rail-optimised, as in the paper's HPN fabric (§6.1): NIC port ``k`` of
  every host (ports in the order the host lists them) joins switch ``rail{k}``; rails
  meet only inside hosts (a rail-only network: cross-rail traffic relays through a GPU);
* ``switch``: every NIC port joins one non-blocking switch ``net``;
* ``none``: one host, no network (the NICs are left out).

Node ids are the host's local ids prefixed with ``h{i}`` (``h1g3``: host 1's GPU 3);
GPU ranks are host 0's GPUs in order, then host 1's, and so on.

CPU paths: NCCL moves GPU-to-NIC data through the PCIe switch the two share (GPUDirect
RDMA; ``NCCL_NET_GDR_LEVEL`` defaults to PXB) and GPU-to-GPU data over NVLink, never
through a CPU's root complex or the SMP link while those exist.  So by default a host's
CPUs are left out when its GPUs stay joined (NVLink) and every NIC stays joined to a GPU
without them; ``cpu_paths=True`` keeps them (paths a schedule may then use).  Besides
modelling NCCL, this keeps the synthesizers fast: with the CPUs, every PCIe switch of a
host is one hop from every other, and ForestColl's exact packing on 64 GPUs passed its
budget (docs/interop.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import TopologyError
from .fabric_builder import FabricBuilder

__all__ = ["HostSpec", "NETWORKS", "join_hosts", "join_host_files", "host_prefix"]

NETWORKS = ("rail", "switch", "none")


@dataclass
class HostSpec:
    """One host with local node ids.  ``nodes``: ``(id, kind, extra)`` with the GPUs in
    rank order; ``links``: directed ``(src, dst, gbps, latency_us, medium)``;
    ``nic_ports``: ``(nic node id, gbps, latency_us)`` in the host's port order."""

    name: str
    nodes: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    links: list[tuple[str, str, float, float, str]] = field(default_factory=list)
    nic_ports: list[tuple[str, float, float]] = field(default_factory=list)

    @property
    def gpus(self) -> list[str]:
        return [i for i, kind, _ in self.nodes if kind == "gpu"]

    def without_cpus(self) -> "HostSpec":
        """This host without its CPU nodes (and their PCIe root, SMP and C2C links), when
        its GPUs stay joined to each other and every NIC to a GPU without them; else
        itself (module docstring, "CPU paths")."""
        cpus = {i for i, _, extra in self.nodes if extra.get("role") == "cpu"}
        if not cpus:
            return self
        links = [l for l in self.links if l[0] not in cpus and l[1] not in cpus]
        adjacent: dict[str, set[str]] = {}
        for src, dst, *_ in links:
            adjacent.setdefault(src, set()).add(dst)
            adjacent.setdefault(dst, set()).add(src)
        gpus = self.gpus
        seen, stack = {gpus[0]}, [gpus[0]]
        while stack:
            for v in adjacent.get(stack.pop(), ()):
                if v not in seen:
                    seen.add(v)
                    stack.append(v)
        if not set(gpus) <= seen or any(nic not in seen for nic, _, _ in self.nic_ports):
            return self
        return HostSpec(self.name, [n for n in self.nodes if n[0] not in cpus], links, list(self.nic_ports))


def host_prefix(index: int) -> str:
    return f"h{index}"


def join_hosts(hosts: Sequence[HostSpec], network: str = "rail", *, name: str | None = None,
               source: str = "", cpu_paths: bool = False) -> dict[str, Any]:
    """The ``mccl-topology/1`` document of ``hosts`` joined by ``network`` (module
    docstring; ``Topology.from_dict`` reads it)."""
    if network not in NETWORKS:
        raise TopologyError(f"network must be one of {', '.join(NETWORKS)}; got {network!r}")
    if not hosts:
        raise TopologyError("no host given; give at least one host description")
    if network == "none" and len(hosts) > 1:
        raise TopologyError(f"{len(hosts)} hosts with network 'none' cannot reach each other; "
                            "say how their NICs meet: network 'rail' or 'switch'")
    b = FabricBuilder()
    hosts = list(hosts) if cpu_paths else [h.without_cpus() for h in hosts]
    for i, host in enumerate(hosts):
        if not host.gpus:
            raise TopologyError(f"host {i} ({host.name}) has no GPU")
        if network != "none" and len(hosts) > 1 and not host.nic_ports:
            raise TopologyError(f"host {i} ({host.name}) has no NIC port; it cannot reach the other hosts")
        p = host_prefix(i)
        for node_id, kind, extra in host.nodes:
            b.node(p + node_id, kind, host=i, **extra)
        for src, dst, gbps, lat, medium in host.links:
            b.link(p + src, p + dst, gbps, lat, medium=medium)
        if network == "none":
            continue
        for k, (nic, gbps, lat) in enumerate(host.nic_ports):
            sw = b.node(f"rail{k}" if network == "rail" else "net", "switch")
            b.cable(p + nic, sw, gbps, lat, medium="net")
    sizes = {len(h.gpus) for h in hosts}
    shape = f"{len(hosts)}x{sizes.pop()}" if len(sizes) == 1 else f"{sum(len(h.gpus) for h in hosts)}gpus"
    label = name or f"{source or 'cluster'}-{shape}"
    return b.document(label, {"source": {"format": source, "hosts": [h.name for h in hosts],
                                            "network": network, "cpu_paths": cpu_paths}})


def join_host_files(paths: Sequence[str | Path], read: Callable[..., HostSpec], network: str | None = None, *,
                    hosts: int | None = None, name: str | None = None, source: str = "",
                    cpu_paths: bool = False, **options: Any) -> dict[str, Any]:
    """Read one host per file with ``read(path, **options)`` (or one file for ``hosts``
    identical hosts) and join them (:func:`join_hosts`; default network ``rail`` for
    several hosts, ``none`` for one)."""
    specs = [read(p, **options) for p in paths]
    if hosts is not None:
        if len(specs) != 1:
            raise TopologyError(f"hosts={hosts} copies one host file; {len(specs)} were given")
        specs = specs * hosts
    return join_hosts(specs, network or ("rail" if len(specs) > 1 else "none"), name=name, source=source,
                      cpu_paths=cpu_paths)
