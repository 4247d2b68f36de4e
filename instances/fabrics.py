"""Small test fabrics: a DGX-like box, rings, full meshes and seeded irregular fabrics."""

from __future__ import annotations

import numbers

import numpy as np

from mccl_opt.errors import TopologyError
from mccl_opt.topology import Link, Node, Topology

from .limits import check_size

__all__ = ["dgx", "ring", "full_mesh", "irregular"]


def _cable(a: str, b: str, gbps: float, lat: float) -> list[Link]:
    return [Link(a, b, gbps, lat), Link(b, a, gbps, lat)]


def _check_count(n: int, label: str = "gpus") -> None:
    if not isinstance(n, int) or n < 2:
        raise TopologyError(f"{label} must be an integer >= 2, got {n!r}")


def dgx(gpus: int = 8, nvswitches: int = 4, nvlink_gbps: float = 1200.0,
        nic_gbps: float = 400.0) -> Topology:
    """A DGX-like box: every GPU has one NVLink bundle (``nvlink_gbps``, 25 ns) to each of
    ``nvswitches`` NVSwitches, plus a NIC to a shared leaf switch (``nic_gbps``, 0.5 µs)."""
    _check_count(gpus)
    if isinstance(nvswitches, bool) or not isinstance(nvswitches, int) or nvswitches < 1:
        raise TopologyError(f"nvswitches must be an integer >= 1, got {nvswitches!r}")
    check_size(f"dgx-{gpus}", 2 * gpus * (nvswitches + 1))
    nodes = [Node(f"g{i}", "gpu") for i in range(gpus)]
    nodes += [Node(f"nvs{k}", "switch") for k in range(nvswitches)] + [Node("leaf", "switch")]
    links: list[Link] = []
    for i in range(gpus):
        for k in range(nvswitches):
            links += _cable(f"g{i}", f"nvs{k}", nvlink_gbps, 0.025)
        links += _cable(f"g{i}", "leaf", nic_gbps, 0.5)
    return Topology(f"dgx-{gpus}", nodes, links, {"family": "dgx"})


def ring(gpus: int = 4, gbps: float = 100.0, *, bidirectional: bool = True,
         latency_us: float = 1.0) -> Topology:
    """GPUs on a ring of direct links (both directions unless ``bidirectional=False``)."""
    _check_count(gpus)
    check_size(f"ring-{gpus}", 2 * gpus)
    nodes = [Node(f"g{i}", "gpu") for i in range(gpus)]
    links: list[Link] = []
    for i in range(gpus):
        j = (i + 1) % gpus
        if gpus == 2 and i == 1:
            break
        links.append(Link(f"g{i}", f"g{j}", gbps, latency_us))
        if bidirectional:
            links.append(Link(f"g{j}", f"g{i}", gbps, latency_us))
    if gpus == 2 and not bidirectional:
        links.append(Link("g1", "g0", gbps, latency_us))
    kind = "ring" if bidirectional else "uniring"
    return Topology(f"{kind}-{gpus}", nodes, links, {"family": "ring"})


def full_mesh(gpus: int = 4, gbps: float = 100.0, latency_us: float = 1.0) -> Topology:
    """Every ordered GPU pair joined by a direct link."""
    _check_count(gpus)
    check_size(f"mesh-{gpus}", gpus * (gpus - 1))
    nodes = [Node(f"g{i}", "gpu") for i in range(gpus)]
    links = [Link(f"g{i}", f"g{j}", gbps, latency_us)
             for i in range(gpus) for j in range(gpus) if i != j]
    return Topology(f"mesh-{gpus}", nodes, links, {"family": "mesh"})


def irregular(seed: int, *, max_hosts: int = 3, max_gpus_per_host: int = 4,
              direct_link_prob: float = 0.3, degrade_prob: float = 0.2) -> Topology:
    """A seeded irregular fabric for property tests.

    Hosts of uneven size (1..``max_gpus_per_host`` GPUs), each with its own switch at a
    random capacity; a random subset of GPUs has a NIC to one shared spine switch (at
    least one per host, so the fabric is connected); random direct GPU-GPU cables; and
    random degradations of some cables (one direction only, to break symmetry).
    Deterministic for a given seed.
    """
    for label, value in (("max_hosts", max_hosts), ("max_gpus_per_host", max_gpus_per_host)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise TopologyError(f"{label} must be an integer >= 1, got {value!r}")
    for label, value in (("direct_link_prob", direct_link_prob), ("degrade_prob", degrade_prob)):
        if not 0 <= value <= 1:
            raise TopologyError(f"{label} must be a probability in [0, 1], got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise TopologyError(f"seed must be an integer >= 0, got {seed!r}")
    most = max_hosts * max_gpus_per_host                  # GPUs at most; direct cables among them
    check_size(f"irregular-{seed} of up to {most} GPUs", most * (most - 1) + 6 * most)
    rng = np.random.default_rng(seed)
    n_hosts = int(rng.integers(1, max_hosts + 1))
    sizes = [int(rng.integers(1, max_gpus_per_host + 1)) for _ in range(n_hosts)]
    if sum(sizes) < 2:
        sizes[0] = 2
    nodes: list[Node] = []
    links: list[Link] = []
    gpu_ids: list[str] = []
    for h, size in enumerate(sizes):
        for g in range(size):
            gpu_ids.append(f"h{h}g{g}")
    nodes += [Node(g, "gpu") for g in gpu_ids]
    nodes.append(Node("spine", "switch"))
    for h, size in enumerate(sizes):
        sw = f"h{h}sw"
        nodes.append(Node(sw, "switch"))
        cap = float(rng.choice([200.0, 400.0, 800.0, 1600.0]))
        for g in range(size):
            links += _cable(f"h{h}g{g}", sw, cap, 0.025)
        nic_mask = rng.random(size) < 0.6
        nic_mask[int(rng.integers(size))] = True
        for g in np.flatnonzero(nic_mask):
            links += _cable(f"h{h}g{int(g)}", "spine", float(rng.choice([50.0, 100.0, 200.0])), 0.5)
    for i in range(len(gpu_ids)):
        for j in range(i + 1, len(gpu_ids)):
            if rng.random() < direct_link_prob:
                links += _cable(gpu_ids[i], gpu_ids[j], float(rng.choice([25.0, 100.0])), 1.0)
    degraded = []
    for idx, link in enumerate(links):
        if rng.random() < degrade_prob:
            factor = float(rng.choice([0.125, 0.25, 0.5]))
            degraded.append(idx)
            links[idx] = Link(link.src, link.dst, link.capacity_gbps * factor, link.latency_us)
    return Topology(f"irregular-{seed}", nodes, links,
                    {"family": "irregular", "seed": seed, "degraded_links": len(degraded)})
