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
  cable (1.525 µs and 1.5 µs).  The failed GPU's own links disappear.  On a host
  whose GPUs reach several NVSwitch planes (a DGX-like box: every switch neighbour
  but the NIC's), the 50 Gbps are split evenly over one cable to each plane the
  failed GPU reached, so every host switch the old schedules used stays reachable.
  A GPU with no switch neighbour, or no NIC besides its NVSwitch, cannot be failed
  this way (:class:`~mccl_opt.errors.TopologyError` saying why).
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


def _switch_neighbours(topo: Topology, gpu: str) -> list[str]:
    """The GPU's switch neighbours by (latency, id): NVSwitch planes first, NIC ToR last."""
    switch_links = [l for l in topo.links if l.src == gpu and not topo.is_gpu(l.dst)]
    if not switch_links:
        raise TopologyError(f"GPU {gpu!r} has no link to a switch (its fabric has direct GPU links only)")
    switch_links.sort(key=lambda l: (l.latency_us, l.dst))
    return [l.dst for l in switch_links]


def _neighbour_switch(topo: Topology, gpu: str, prefer_latency_below: bool) -> str:
    """The GPU's NVSwitch (lowest-latency switch neighbour) or NIC ToR (the other one)."""
    switches = _switch_neighbours(topo, gpu)
    if prefer_latency_below:
        return switches[0]
    if len(switches) < 2:
        raise TopologyError(f"GPU {gpu!r} has no NIC link (only one switch neighbour)")
    return switches[-1]


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
    tor = _neighbour_switch(topo, g, False)
    planes = _switch_neighbours(topo, g)[:-1]
    backup, bk_tor = f"{g}-bk", "bk-tor"
    for new in (backup, bk_tor):
        if topo.has_node(new):
            raise TopologyError(f"cannot apply fail3: node {new!r} already exists "
                                "(the fabric already has a Fail3 backup)")
    nodes = [Node(backup, "gpu") if n.id == g else n for n in topo.nodes]
    nodes.append(Node(bk_tor, "switch"))
    links = [l for l in topo.links if g not in (l.src, l.dst)]
    nic_lat = topo.link(g, tor).latency_us + FAIL3_EXTRA_LATENCY_US
    tor_gbps = topo.link(g, tor).capacity_gbps
    cables = [(backup, nvs, FAIL3_HOST_GBPS / len(planes),
               topo.link(g, nvs).latency_us + FAIL3_EXTRA_LATENCY_US) for nvs in planes]
    for a, b, gbps, lat in (*cables, (backup, bk_tor, FAIL3_NIC_GBPS, nic_lat),
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
