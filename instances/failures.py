"""The paper's gray failures Fail1/Fail2/Fail3 (§6.1) and generic degradations.

Each takes a topology and the GPU to fail (a rank or a GPU id, default rank 0) and
returns a new topology; the input is not modified.

* **Fail1**: 13 of the 18 NVLink lanes of the GPU fail: its NVSwitch cable (both
  directions) drops from 2880 to 800 Gbps.
* **Fail2**: the GPU's NIC cable to its ToR (both directions) drops from 400 to 50 Gbps.
* **Fail3**: the GPU is replaced by a backup GPU in another rack.  The backup takes the
  failed GPU's rank (same position in the GPU order) and id ``<old>-bk``.  It has a
  dedicated 50 Gbps cable to its old host's NVSwitch and a 100 Gbps NIC to a backup ToR
  (``bk-tor``) that joins the failed GPU's ToR, with 1 µs of extra latency on each
  cable (1.525 µs and 1.5 µs).  The failed GPU's own links disappear.
"""

from __future__ import annotations

from mccl_opt.errors import TopologyError
from mccl_opt.topology import Link, Node, Topology

__all__ = ["fail1", "fail2", "fail3", "FAILURES", "degrade", "apply_failure"]

FAIL1_GBPS = 800.0
FAIL2_GBPS = 50.0
FAIL3_HOST_GBPS = 50.0
FAIL3_NIC_GBPS = 100.0
FAIL3_EXTRA_LATENCY_US = 1.0


def _gpu(topo: Topology, gpu: int | str) -> str:
    if isinstance(gpu, int) and not isinstance(gpu, bool):
        if not 0 <= gpu < topo.num_gpus:
            raise TopologyError(f"GPU rank {gpu} out of range 0..{topo.num_gpus - 1}")
        return topo.gpus[gpu]
    if not topo.has_node(gpu) or not topo.is_gpu(gpu):
        raise TopologyError(f"{gpu!r} is not a GPU of topology {topo.name!r}")
    return gpu


def _neighbour_switch(topo: Topology, gpu: str, prefer_latency_below: bool) -> str:
    """The GPU's NVSwitch (lowest-latency switch neighbour) or NIC ToR (the other one)."""
    switch_links = [l for l in topo.links if l.src == gpu and not topo.is_gpu(l.dst)]
    if not switch_links:
        raise TopologyError(f"GPU {gpu!r} has no link to a switch")
    switch_links.sort(key=lambda l: (l.latency_us, l.dst))
    if prefer_latency_below:
        return switch_links[0].dst
    if len(switch_links) < 2:
        raise TopologyError(f"GPU {gpu!r} has no NIC link (only one switch neighbour)")
    return switch_links[-1].dst


def _suffix(topo: Topology, tag: str) -> str:
    return f"{topo.name}-{tag}"


def degrade(topo: Topology, src: str, dst: str, gbps: float, *, both_directions: bool = True,
            name: str | None = None) -> Topology:
    """A copy with the cable ``src``–``dst`` set to ``gbps``."""
    out = topo.with_capacity(src=src, dst=dst, gbps=gbps, both_directions=both_directions)
    return out.renamed(name) if name else out


def fail1(topo: Topology, gpu: int | str = 0) -> Topology:
    """Fail1: the GPU's NVSwitch cable drops to 800 Gbps."""
    g = _gpu(topo, gpu)
    return degrade(topo, g, _neighbour_switch(topo, g, True), FAIL1_GBPS, name=_suffix(topo, "fail1"))


def fail2(topo: Topology, gpu: int | str = 0) -> Topology:
    """Fail2: the GPU's NIC cable to its ToR drops to 50 Gbps."""
    g = _gpu(topo, gpu)
    return degrade(topo, g, _neighbour_switch(topo, g, False), FAIL2_GBPS, name=_suffix(topo, "fail2"))


def fail3(topo: Topology, gpu: int | str = 0) -> Topology:
    """Fail3: the GPU is replaced by a backup in another rack (see module docstring)."""
    g = _gpu(topo, gpu)
    nvs = _neighbour_switch(topo, g, True)
    tor = _neighbour_switch(topo, g, False)
    backup, bk_tor = f"{g}-bk", "bk-tor"
    for new in (backup, bk_tor):
        if topo.has_node(new):
            raise TopologyError(f"cannot apply fail3: node {new!r} already exists")
    nodes = [Node(backup, "gpu") if n.id == g else n for n in topo.nodes]
    nodes.append(Node(bk_tor, "switch"))
    links = [l for l in topo.links if g not in (l.src, l.dst)]
    nvs_lat = topo.link(g, nvs).latency_us + FAIL3_EXTRA_LATENCY_US
    nic_lat = topo.link(g, tor).latency_us + FAIL3_EXTRA_LATENCY_US
    tor_gbps = topo.link(g, tor).capacity_gbps
    for a, b, gbps, lat in ((backup, nvs, FAIL3_HOST_GBPS, nvs_lat),
                            (backup, bk_tor, FAIL3_NIC_GBPS, nic_lat),
                            (bk_tor, tor, tor_gbps, FAIL3_EXTRA_LATENCY_US)):
        links += [Link(a, b, gbps, lat), Link(b, a, gbps, lat)]
    return Topology(_suffix(topo, "fail3"), nodes, links, topo.extra)


FAILURES = {"fail1": fail1, "fail2": fail2, "fail3": fail3}


def apply_failure(topo: Topology, failure: str | None, gpu: int | str = 0) -> Topology:
    """Apply a failure by name (``None``/``"none"`` returns ``topo``)."""
    if failure in (None, "", "none", "healthy"):
        return topo
    try:
        return FAILURES[failure](topo, gpu)
    except KeyError:
        raise TopologyError(f"unknown failure {failure!r}; choose one of {sorted(FAILURES)}") from None
