"""Fabric families whose aggregation layer is not HPN's one-switch-per-rail (docs/modelling.md,
"Aggregation families").

Every family keeps HPN's hosts (``gpus`` GPUs on one NVSwitch, 2880 Gbps / 25 ns) and NICs
(``nic_gbps``, 0.5 µs) and varies what joins the hosts:

* :func:`shared_aggregation` -- HPN segments (one ToR per rail) whose ToRs all uplink to ONE
  aggregation switch.
* :func:`multi_spine` -- HPN segments whose ToRs each uplink to every one of ``spines`` spines.
* :func:`leaf_spine` -- a classic leaf-spine: every GPU of a host on the host's leaf, leaves
  uplinked to every spine, ``oversubscription`` : 1.
* :func:`superpod` -- a DGX SuperPOD-like two-tier: scalable units of hosts, one leaf per group
  of ``rails_per_leaf`` rails in each unit, every leaf to every spine.
* :func:`host_ring` / :func:`host_torus` -- hosts joined by direct NIC cables (no switch):
  GPU ``g`` of a host cabled to GPU ``g`` of each neighbouring host.

``hosts`` is an integer (every segment / leaf / unit alike) or a sequence of per-segment counts
(an unbalanced variant).  Uplink capacities are the downlinks' sum divided by the
``oversubscription`` (and by the number of uplinks a switch spreads them over).
"""

from __future__ import annotations

import numbers
from typing import Sequence

import numpy as np

from mccl_opt.errors import TopologyError
from mccl_opt.topology import Link, Node, Topology

__all__ = ["shared_aggregation", "multi_spine", "leaf_spine", "superpod", "host_ring",
           "host_torus", "scrambled", "AGGREGATION_FAMILIES"]

NVSWITCH_GBPS = 2880.0
NVSWITCH_LATENCY_US = 0.025
NIC_LATENCY_US = 0.5


def _positive_int(value: object, label: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise TopologyError(f"{label} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _positive_float(value: object, label: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise TopologyError(f"{label} must be a number > 0, got {value!r}")
    return float(value)


def _host_counts(hosts: int | Sequence[int], groups: int, label: str) -> list[int]:
    """Hosts per group: one integer for all, or one per group (an unbalanced variant)."""
    if isinstance(hosts, numbers.Integral) and not isinstance(hosts, bool):
        return [_positive_int(hosts, "hosts")] * groups
    if isinstance(hosts, (str, bytes)) or not isinstance(hosts, Sequence):
        raise TopologyError(f"hosts must be an integer or a list of {groups} integers, got {hosts!r}")
    if len(hosts) != groups:
        raise TopologyError(f"hosts lists {len(hosts)} counts for {groups} {label}; give one per {label[:-1]}")
    return [_positive_int(h, f"hosts[{i}]") for i, h in enumerate(hosts)]


def _checked_sizes(gpus: object, nic_gbps: object, oversubscription: object,
                   nvswitch_gbps: object) -> tuple[int, float, float, float]:
    """GPUs per host, NIC speed, oversubscription and NVSwitch speed, checked."""
    return (_positive_int(gpus, "gpus"), _positive_float(nic_gbps, "nic_gbps"),
            _positive_float(oversubscription, "oversubscription"),
            _positive_float(nvswitch_gbps, "nvswitch_gbps"))


class _Builder:
    """Accumulates nodes and two-way cables of one fabric."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.links: list[Link] = []

    def gpu(self, node_id: str) -> str:
        self.nodes.append(Node(node_id, "gpu"))
        return node_id

    def switch(self, node_id: str) -> str:
        self.nodes.append(Node(node_id, "switch"))
        return node_id

    def cable(self, a: str, b: str, gbps: float, latency_us: float = NIC_LATENCY_US) -> None:
        self.links += [Link(a, b, gbps, latency_us), Link(b, a, gbps, latency_us)]

    def host(self, prefix: str, gpus: int, nvswitch_gbps: float) -> list[str]:
        """``gpus`` GPUs ``{prefix}g{i}`` on one NVSwitch ``{prefix}nvs``; returns the GPU ids."""
        ids = [self.gpu(f"{prefix}g{i}") for i in range(gpus)]
        nvs = self.switch(f"{prefix}nvs")
        for g in ids:
            self.cable(g, nvs, nvswitch_gbps, NVSWITCH_LATENCY_US)
        return ids

    def topology(self, name: str, extra: dict) -> Topology:
        if sum(n.kind == "gpu" for n in self.nodes) < 2:
            raise TopologyError(f"{name}: a fabric needs at least 2 GPUs")
        return Topology(name, self.nodes, self.links, extra)


def _weak_tag(weak_link_gbps: float | None) -> str:
    return "" if weak_link_gbps is None else f"-weak{weak_link_gbps:g}"


def _shape_name(hosts: list[int]) -> str:
    return str(hosts[0]) if len(set(hosts)) == 1 else "-".join(map(str, hosts))


def _rail_segments(segments: int, hosts: int | Sequence[int], gpus: int, uplinks: list[str],
                   nic_gbps: float, oversubscription: float,
                   nvswitch_gbps: float) -> tuple[_Builder, list[int]]:
    """HPN segments (hosts plus one ToR ``s{s}tor{g}`` per rail) whose every ToR uplinks to
    every switch of ``uplinks``, its ``hosts × nic / oversubscription`` spread evenly over
    them; returns the builder and the host counts."""
    gpus, nic, over, nvs = _checked_sizes(gpus, nic_gbps, oversubscription, nvswitch_gbps)
    counts = _host_counts(hosts, _positive_int(segments, "segments"), "segments")
    b = _Builder()
    for s, count in enumerate(counts):
        seg_tors = [b.switch(f"s{s}tor{g}") for g in range(gpus)]
        for h in range(count):
            for g, gpu in enumerate(b.host(f"s{s}h{h}", gpus, nvs)):
                b.cable(gpu, seg_tors[g], nic)
        for tor in seg_tors:
            for up in uplinks:
                b.cable(tor, up, count * nic / (over * len(uplinks)))
    for up in uplinks:
        b.switch(up)
    return b, counts


def shared_aggregation(segments: int = 2, hosts: int | Sequence[int] = 2, gpus: int = 8, *,
                       nic_gbps: float = 400.0, oversubscription: float = 1.0,
                       nvswitch_gbps: float = NVSWITCH_GBPS) -> Topology:
    """HPN segments whose rail ToRs all uplink to ONE aggregation switch ``agg``.

    Each ToR uplink carries its segment's ``hosts × nic_gbps`` / ``oversubscription``.
    """
    b, counts = _rail_segments(segments, hosts, gpus, ["agg"], nic_gbps, oversubscription,
                               nvswitch_gbps)
    return b.topology(f"sharedagg-{segments}x{_shape_name(counts)}x{gpus}",
                      {"family": "shared_aggregation", "hosts": counts, "gpus": gpus,
                       "oversubscription": oversubscription})


def multi_spine(segments: int = 2, hosts: int | Sequence[int] = 2, gpus: int = 8, *,
                spines: int = 2, nic_gbps: float = 400.0, oversubscription: float = 1.0,
                nvswitch_gbps: float = NVSWITCH_GBPS) -> Topology:
    """HPN segments whose rail ToRs each uplink to every one of ``spines`` spine switches.

    A ToR's ``hosts × nic_gbps`` / ``oversubscription`` is spread evenly over its ``spines``
    uplinks.
    """
    spine_ids = [f"spine{k}" for k in range(_positive_int(spines, "spines"))]
    b, counts = _rail_segments(segments, hosts, gpus, spine_ids, nic_gbps, oversubscription,
                               nvswitch_gbps)
    return b.topology(f"multispine{spines}-{segments}x{_shape_name(counts)}x{gpus}",
                      {"family": "multi_spine", "hosts": counts, "gpus": gpus, "spines": spines,
                       "oversubscription": oversubscription})


def _two_tier(units: int, hosts: int | Sequence[int], gpus: int, rails_per_leaf: int | None,
              spines: int, nic_gbps: float, oversubscription: float,
              nvswitch_gbps: float) -> tuple[_Builder, list[int], int]:
    """Units of hosts, one leaf per ``rails_per_leaf`` rails of a unit (all rails when None),
    every leaf uplinked to every spine; returns the builder, host counts and rails per leaf."""
    gpus, nic, over, nvs = _checked_sizes(gpus, nic_gbps, oversubscription, nvswitch_gbps)
    units = _positive_int(units, "units/leaves")
    per_leaf = gpus if rails_per_leaf is None else _positive_int(rails_per_leaf, "rails_per_leaf")
    if gpus % per_leaf:
        raise TopologyError(f"rails_per_leaf ({per_leaf}) must divide gpus ({gpus})")
    spines = _positive_int(spines, "spines")
    counts = _host_counts(hosts, units, "units")
    b = _Builder()
    spine_ids = [b.switch(f"spine{k}") for k in range(spines)]
    for u, count in enumerate(counts):
        unit_leaves = [b.switch(f"u{u}leaf{j}") for j in range(gpus // per_leaf)]
        for h in range(count):
            for g, gpu in enumerate(b.host(f"u{u}h{h}", gpus, nvs)):
                b.cable(gpu, unit_leaves[g // per_leaf], nic)
        if units > 1:
            for leaf in unit_leaves:
                for spine in spine_ids:
                    b.cable(leaf, spine, count * per_leaf * nic / (over * spines))
    return b, counts, per_leaf


def leaf_spine(leaves: int = 2, hosts: int | Sequence[int] = 2, gpus: int = 8, *,
               spines: int = 2, nic_gbps: float = 400.0, oversubscription: float = 2.0,
               nvswitch_gbps: float = NVSWITCH_GBPS) -> Topology:
    """A leaf-spine fabric (not rail-optimized): every GPU of a host has its NIC on the host's
    leaf ``u{l}leaf0``; each leaf uplinks to every spine with its downlinks' sum divided by
    ``oversubscription`` (default 2:1) and spread over the ``spines`` uplinks."""
    b, counts, _ = _two_tier(leaves, hosts, gpus, None, spines, nic_gbps, oversubscription,
                             nvswitch_gbps)
    return b.topology(f"leafspine{spines}-{leaves}x{_shape_name(counts)}x{gpus}-o{oversubscription:g}",
                      {"family": "leaf_spine", "hosts": counts, "gpus": gpus, "spines": spines,
                       "oversubscription": oversubscription})


def superpod(units: int = 2, hosts: int | Sequence[int] = 4, gpus: int = 8, *,
             rails_per_leaf: int = 2, spines: int = 2, nic_gbps: float = 400.0,
             oversubscription: float = 1.0, nvswitch_gbps: float = NVSWITCH_GBPS) -> Topology:
    """A DGX SuperPOD-like two-tier fabric.

    Each scalable unit ``u`` has hosts and ``gpus / rails_per_leaf`` leaves: leaf
    ``u{u}leaf{j}`` serves rails ``j*rails_per_leaf ..`` of every host of its unit.  Every leaf
    uplinks to every spine with its downlinks' sum / ``oversubscription`` spread evenly.
    """
    b, counts, per_leaf = _two_tier(units, hosts, gpus, rails_per_leaf, spines, nic_gbps,
                                    oversubscription, nvswitch_gbps)
    return b.topology(f"superpod-{units}x{_shape_name(counts)}x{gpus}-r{per_leaf}s{spines}",
                      {"family": "superpod", "hosts": counts, "gpus": gpus,
                       "rails_per_leaf": per_leaf, "spines": spines,
                       "oversubscription": oversubscription})


def host_ring(hosts: int = 4, gpus: int = 8, *, nic_gbps: float = 400.0,
              nvswitch_gbps: float = NVSWITCH_GBPS, weak_link_gbps: float | None = None) -> Topology:
    """Hosts on a ring, no switch between them: GPU ``g`` of host ``h`` is cabled to GPU ``g``
    of host ``h+1`` (mod ``hosts``).  ``weak_link_gbps`` (an unbalanced variant) slows the
    cables between host 0 and host 1 to that speed."""
    hosts = _positive_int(hosts, "hosts", 2)
    gpus = _positive_int(gpus, "gpus")
    nic = _positive_float(nic_gbps, "nic_gbps")
    weak = nic if weak_link_gbps is None else _positive_float(weak_link_gbps, "weak_link_gbps")
    nvs = _positive_float(nvswitch_gbps, "nvswitch_gbps")
    b = _Builder()
    ids = [b.host(f"h{h}", gpus, nvs) for h in range(hosts)]
    for h in range(hosts if hosts > 2 else 1):
        nxt = (h + 1) % hosts
        for g in range(gpus):
            b.cable(ids[h][g], ids[nxt][g], weak if h == 0 else nic)
    return b.topology(f"hostring-{hosts}x{gpus}{_weak_tag(weak_link_gbps)}",
                      {"family": "host_ring", "hosts": hosts, "gpus": gpus})


def host_torus(rows: int = 2, cols: int = 2, gpus: int = 8, *, nic_gbps: float = 400.0,
               nvswitch_gbps: float = NVSWITCH_GBPS, weak_link_gbps: float | None = None) -> Topology:
    """Hosts on a ``rows × cols`` 2-D torus of direct NIC cables: GPU ``g`` of host ``(r, c)``
    is cabled to GPU ``g`` of its (wrap-around) right and lower neighbours.  A dimension of
    size 2 has one cable per pair, not two.  ``weak_link_gbps`` slows the cables between
    hosts (0, 0) and (0, 1) (an unbalanced variant)."""
    rows = _positive_int(rows, "rows")
    cols = _positive_int(cols, "cols")
    if rows * cols < 2:
        raise TopologyError("a host torus needs at least 2 hosts")
    gpus = _positive_int(gpus, "gpus")
    nic = _positive_float(nic_gbps, "nic_gbps")
    weak = nic if weak_link_gbps is None else _positive_float(weak_link_gbps, "weak_link_gbps")
    nvs = _positive_float(nvswitch_gbps, "nvswitch_gbps")
    b = _Builder()
    ids = {(r, c): b.host(f"r{r}c{c}", gpus, nvs) for r in range(rows) for c in range(cols)}
    pairs: set[tuple[tuple[int, int], tuple[int, int]]] = set()
    for r in range(rows):
        for c in range(cols):
            for nb in (((r + 1) % rows, c), (r, (c + 1) % cols)):
                if nb != (r, c) and (nb, (r, c)) not in pairs:
                    pairs.add(((r, c), nb))
    for a, z in sorted(pairs):
        gbps = weak if {a, z} == {(0, 0), (0, 1 % cols)} else nic
        for g in range(gpus):
            b.cable(ids[a][g], ids[z][g], gbps)
    return b.topology(f"hosttorus-{rows}x{cols}x{gpus}{_weak_tag(weak_link_gbps)}",
                      {"family": "host_torus", "rows": rows, "cols": cols, "gpus": gpus})


AGGREGATION_FAMILIES = {
    "shared_aggregation": shared_aggregation,
    "multi_spine": multi_spine,
    "leaf_spine": leaf_spine,
    "superpod": superpod,
    "host_ring": host_ring,
    "host_torus": host_torus,
}


def scrambled(topo: Topology, seed: int) -> Topology:
    """``topo`` with every node renamed to an opaque random id and nodes and links listed in a
    random order (GPU ranks follow the new order): the same fabric, so every rate must match.
    Used to check that a solver depends neither on node names nor on their order."""
    seed = _positive_int(seed, "seed", 0)
    rng = np.random.default_rng(seed)
    codes = rng.permutation(len(topo.nodes))
    name = {n.id: f"n{int(codes[i]):05d}" for i, n in enumerate(topo.nodes)}
    nodes = [Node(name[topo.nodes[i].id], topo.nodes[i].kind)
             for i in rng.permutation(len(topo.nodes))]
    links = [Link(name[l.src], name[l.dst], l.capacity_gbps, l.latency_us)
             for l in (topo.links[i] for i in rng.permutation(len(topo.links)))]
    return Topology(f"{topo.name}-scrambled{seed}", nodes, links, dict(topo.extra))
