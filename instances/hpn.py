"""HPN-style rail-optimized fabrics S×H×N (paper §6.1, docs/modelling.md).

Per host: N GPUs and one NVSwitch; each GPU has a 2880 Gbps / 25 ns link to its host's
NVSwitch (both directions) and one 400 Gbps / 0.5 µs NIC link to the ToR of its rail
(``s{s}tor{g}``: ToR ``g`` of segment ``s`` joins GPU ``g`` of every host of the segment).

Modelling choices (documented in docs/modelling.md):
* With more than one segment, one aggregation switch per rail (``agg{g}``) joins the
  rail-``g`` ToRs of all segments ("single plane").  The ToR-to-aggregation link has
  the capacity of the ToR's H downlinks (``H × 400`` Gbps, 1:1 oversubscription,
  adjustable with ``agg_oversubscription``) and 0.5 µs latency.  A single segment has
  no aggregation layer: nothing needs it.
* Cross-rail traffic between hosts has to relay through a GPU (NVSwitch then another
  rail), exactly as in a real rail-optimized fabric without a spine between rails.
"""

from __future__ import annotations

import re
from typing import Iterable

from mccl_opt.errors import TopologyError
from mccl_opt.topology import Link, Node, Topology

from .limits import check_size

__all__ = ["hpn", "hpn_part", "NVSWITCH_GBPS", "NVSWITCH_LATENCY_US", "NIC_GBPS", "NIC_LATENCY_US",
           "gpu_id", "nvswitch_id", "tor_id", "agg_id", "parse_shape"]

NVSWITCH_GBPS = 2880.0
NVSWITCH_LATENCY_US = 0.025
NIC_GBPS = 400.0
NIC_LATENCY_US = 0.5


def gpu_id(s: int, h: int, g: int) -> str:
    return f"s{s}h{h}g{g}"


def nvswitch_id(s: int, h: int) -> str:
    return f"s{s}h{h}nvs"


def tor_id(s: int, g: int) -> str:
    return f"s{s}tor{g}"


def agg_id(g: int) -> str:
    return f"agg{g}"


_SHAPE = re.compile(r"\s*([0-9]{1,9})x([0-9]{1,9})x([0-9]{1,9})\s*", re.ASCII)


def parse_shape(text: str) -> tuple[int, int, int]:
    """Parse ``"SxHxN"`` (e.g. ``"1x2x8"``) into integers, written in ASCII digits
    (``int()`` also reads other scripts' digits, ``+`` and ``_``: ``1x2x٢`` was 1x2x2)."""
    match = _SHAPE.fullmatch(text.lower())
    if match is None:
        raise TopologyError(f"shape must look like SxHxN in ASCII digits (e.g. 1x2x8), got {text[:40]!r}")
    s, h, n = (int(p) for p in match.groups())
    return s, h, n


def _cable(a: str, b: str, gbps: float, lat: float) -> list[Link]:
    return [Link(a, b, gbps, lat), Link(b, a, gbps, lat)]


def hpn(segments: int = 1, hosts: int = 2, gpus: int = 8, *,
        nvswitch_gbps: float = NVSWITCH_GBPS, nic_gbps: float = NIC_GBPS,
        agg_oversubscription: float = 1.0) -> Topology:
    """Build the HPN rail-optimized fabric ``segments × hosts × gpus``."""
    for label, v in (("segments", segments), ("hosts", hosts), ("gpus", gpus)):
        if not isinstance(v, int) or v < 1:
            raise TopologyError(f"{label} must be a positive integer, got {v!r}")
    if segments * hosts * gpus < 2:
        raise TopologyError("an HPN fabric needs at least 2 GPUs")
    if hosts * segments < 2 and gpus < 2:
        raise TopologyError("an HPN fabric needs at least 2 GPUs")
    if agg_oversubscription <= 0:
        raise TopologyError("agg_oversubscription must be > 0")
    check_size(f"hpn-{segments}x{hosts}x{gpus}", 4 * segments * hosts * gpus + 2 * segments * gpus)
    nodes: list[Node] = []
    links: list[Link] = []
    for s in range(segments):
        for h in range(hosts):
            for g in range(gpus):
                nodes.append(Node(gpu_id(s, h, g), "gpu"))
    for s in range(segments):
        for h in range(hosts):
            nodes.append(Node(nvswitch_id(s, h), "switch"))
        for g in range(gpus):
            nodes.append(Node(tor_id(s, g), "switch"))
    if segments > 1:
        for g in range(gpus):
            nodes.append(Node(agg_id(g), "switch"))
    for s in range(segments):
        for h in range(hosts):
            for g in range(gpus):
                links += _cable(gpu_id(s, h, g), nvswitch_id(s, h), nvswitch_gbps, NVSWITCH_LATENCY_US)
                links += _cable(gpu_id(s, h, g), tor_id(s, g), nic_gbps, NIC_LATENCY_US)
        if segments > 1:
            for g in range(gpus):
                links += _cable(tor_id(s, g), agg_id(g), hosts * nic_gbps / agg_oversubscription,
                                NIC_LATENCY_US)
    name = f"hpn-{segments}x{hosts}x{gpus}"
    return Topology(name, nodes, links, {"family": "hpn", "shape": [segments, hosts, gpus]})


_GPU_ID = re.compile(r"s([0-9]{1,9})h([0-9]{1,9})g([0-9]{1,9})", re.ASCII)


def hpn_part(segments: int, hosts: int, gpus: int, members: Iterable[str]) -> Topology:
    """The part of ``hpn(segments, hosts, gpus)`` a communicator of ``members`` can use:
    the GPUs of host ``s0h0`` (which joins every rail, so the part is connected; its
    ``s0h0g0`` is the GPU a paper failure hits) and every member that is a GPU of the
    shape, their hosts' NVSwitches, the ToRs of their (segment, rail) pairs and, with
    several segments, their rails' aggregation switches, with the nodes and links in
    :func:`hpn`'s order.  No path between members uses another node (a ToR or
    aggregation switch without a member below it is a dead end), so
    :func:`mccl_opt.subfabric.induced` of the members is the same on it as on the whole
    fabric, at a cost in the members instead of the fabric (issue 27, eighth pass: an
    8-GPU schedule of ``hpn-960x64x8/group-8-...`` built 2 million links to be checked).
    Member ids that are no GPU of the shape are left out (``induced`` names them)."""
    if min(segments, hosts, gpus) < 1:
        raise TopologyError(f"hpn-{segments}x{hosts}x{gpus}: every dimension must be at least 1")
    check_size(f"hpn-{segments}x{hosts}x{gpus}", 4 * segments * hosts * gpus + 2 * segments * gpus)
    kept = {(0, 0, g) for g in range(gpus)}
    for m in members:
        match = _GPU_ID.fullmatch(m) if isinstance(m, str) else None
        if match:
            s, h, g = (int(p) for p in match.groups())
            if s < segments and h < hosts and g < gpus and gpu_id(s, h, g) == m:
                kept.add((s, h, g))
    order = sorted(kept)
    hosts_of = sorted({(s, h) for s, h, _ in order})
    rails = sorted({(s, g) for s, _, g in order})
    nodes = [Node(gpu_id(*c), "gpu") for c in order]
    for seg in sorted({s for s, _ in hosts_of}):
        nodes += [Node(nvswitch_id(s, h), "switch") for s, h in hosts_of if s == seg]
        nodes += [Node(tor_id(s, g), "switch") for s, g in rails if s == seg]
    agg_rails = sorted({g for _, g in rails}) if segments > 1 else []
    nodes += [Node(agg_id(g), "switch") for g in agg_rails]
    links: list[Link] = []
    for seg in sorted({s for s, _ in hosts_of}):
        for s, h, g in (c for c in order if c[0] == seg):
            links += _cable(gpu_id(s, h, g), nvswitch_id(s, h), NVSWITCH_GBPS, NVSWITCH_LATENCY_US)
            links += _cable(gpu_id(s, h, g), tor_id(s, g), NIC_GBPS, NIC_LATENCY_US)
        for s, g in (r for r in rails if r[0] == seg and segments > 1):
            links += _cable(tor_id(s, g), agg_id(g), hosts * NIC_GBPS, NIC_LATENCY_US)
    return Topology(f"hpn-{segments}x{hosts}x{gpus}", nodes, links,
                    {"family": "hpn", "shape": [segments, hosts, gpus]})
