"""Cluster designs whose hosts or planes differ from every other generator here (issue 25:
AllGather on fabric families nobody here designed; docs/allgather.md "Fresh families").

* :func:`multi_plane` -- a rail-optimized fabric whose every NIC is split over ``planes``
  independent planes: port ``p`` of GPU ``g``'s NIC goes to plane ``p``'s rail ToR, and
  the planes meet nowhere above the ToRs.  Alibaba HPN's dual-plane design (Qian et al.,
  SIGCOMM 2024, §4: two 200 Gbps ports of each 400 Gbps NIC on two ToRs of two planes
  with disjoint aggregation layers); 800 Gbps NICs split in four planes are the same
  with ``planes=4``.
* :func:`nvlink_islands` -- hosts whose GPUs form NVLink islands smaller than the host
  (islands of 4 on their own NVSwitch; islands of 2 joined by an NVLink bridge, as PCIe
  H100 NVL pairs), the islands of a host meeting only through PCIe and the link between
  the CPU sockets (two-socket servers with one GPU board per socket); rail ToRs as HPN.
* :func:`gpu_mesh` -- hosts without an NVSwitch: every GPU directly linked to every other
  one of its host (AMD MI300X platforms, 8 GPUs on an Infinity Fabric mesh; Intel
  Aurora, 6 GPUs on an Xe Link mesh), 6 or 7 GPUs (an 8-GPU mesh with one GPU drained)
  included; every NIC of a pod's hosts on the pod's leaf, leaves to every spine.

Uplinks carry the sum of their switch's downlinks divided by the oversubscription and the
number of uplinks, as in :mod:`instances.aggregation`.
"""

from __future__ import annotations

import itertools

from mccl_opt.errors import TopologyError
from mccl_opt.topology import Topology

from .aggregation import NVSWITCH_GBPS, NVSWITCH_LATENCY_US, _Builder, _positive_float, _positive_int
from .designs import PCIE_GBPS, PCIE_LATENCY_US
from .limits import check_size

__all__ = ["multi_plane", "nvlink_islands", "gpu_mesh", "CLUSTER_FAMILIES"]

#: two-socket server: the sockets' link (three UPI links of 16 GT/s, about 600 Gbps each way)
SOCKET_GBPS = 600.0
SOCKET_LATENCY_US = 0.15
#: one GPU-to-GPU mesh link each way (MI300X: 64 GB/s each way per Infinity Fabric link)
MESH_GBPS = 512.0
#: an NVLink bridge between two PCIe GPUs (H100 NVL: 600 GB/s both ways together)
BRIDGE_GBPS = 2400.0


def _rail_aggs(b: _Builder, tors: list[list[str]], prefix: str, gbps: float) -> None:
    """One aggregation switch ``{prefix}agg{j}`` per rail ``j`` above the rail-``j`` ToRs of
    every segment (``tors[s][j]``), each ToR uplinked with ``gbps``."""
    if len(tors) < 2:
        return
    for j in range(len(tors[0])):
        agg = b.switch(f"{prefix}agg{j}")
        for seg in tors:
            b.cable(seg[j], agg, gbps)


def multi_plane(segments: int = 1, hosts: int = 2, gpus: int = 8, *, planes: int = 2,
                nic_gbps: float = 400.0, oversubscription: float = 1.0,
                nvswitch_gbps: float = NVSWITCH_GBPS) -> Topology:
    """HPN segments whose NICs are split over ``planes`` planes.

    Each GPU ``s{s}h{h}g{g}`` has ``planes`` ports of ``nic_gbps / planes``; port ``p`` goes
    to ToR ``p{p}s{s}tor{g}``.  With several segments, plane ``p`` has one aggregation
    switch ``p{p}agg{g}`` per rail above its rail-``g`` ToRs (downlinks' sum /
    ``oversubscription``); no switch joins two planes.
    """
    segments, hosts, gpus, planes = (_positive_int(v, label) for v, label in (
        (segments, "segments"), (hosts, "hosts"), (gpus, "gpus"), (planes, "planes")))
    nic, over, nvs = (_positive_float(nic_gbps, "nic_gbps"),
                      _positive_float(oversubscription, "oversubscription"),
                      _positive_float(nvswitch_gbps, "nvswitch_gbps"))
    check_size("multi_plane", segments * hosts * gpus * (2 + 2 * planes) + 2 * planes * segments * gpus)
    b = _Builder()
    tors = [[[b.switch(f"p{p}s{s}tor{g}") for g in range(gpus)] for s in range(segments)]
            for p in range(planes)]
    for s in range(segments):
        for h in range(hosts):
            for g, gpu in enumerate(b.host(f"s{s}h{h}", gpus, nvs)):
                for p in range(planes):
                    b.cable(gpu, tors[p][s][g], nic / planes)
    for p in range(planes):
        _rail_aggs(b, tors[p], f"p{p}", hosts * nic / (planes * over))
    return b.topology(f"multiplane{planes}-{segments}x{hosts}x{gpus}",
                      {"family": "multi_plane", "segments": segments, "hosts": hosts,
                       "gpus": gpus, "planes": planes, "oversubscription": over})


def nvlink_islands(segments: int = 1, hosts: int = 2, gpus: int = 8, *, island: int = 4,
                   nic_gbps: float = 400.0, socket_gbps: float = SOCKET_GBPS,
                   pcie_gbps: float = PCIE_GBPS, nvswitch_gbps: float = NVSWITCH_GBPS,
                   bridge_gbps: float = BRIDGE_GBPS) -> Topology:
    """Hosts of ``gpus`` GPUs in NVLink islands of ``island``.

    Island ``i`` of host ``s{s}h{h}`` is GPUs ``i*island ..``: on an NVSwitch
    ``s{s}h{h}nvs{i}`` (``nvswitch_gbps``), or, for ``island = 2``, joined by one NVLink
    bridge (``bridge_gbps``).  Every GPU of island ``i`` has PCIe (``pcie_gbps``) to CPU
    socket ``s{s}h{h}cpu{i}``; the sockets of a host are joined pairwise (``socket_gbps``).
    GPU ``g``'s NIC is on rail ToR ``s{s}tor{g}``, with several segments one aggregation
    switch ``agg{g}`` per rail (1:1), as in :func:`instances.hpn.hpn`.
    """
    segments, hosts, gpus = (_positive_int(v, label) for v, label in (
        (segments, "segments"), (hosts, "hosts"), (gpus, "gpus")))
    island = _positive_int(island, "island", 2)
    if gpus % island or gpus == island:
        raise TopologyError(f"island ({island}) must divide gpus ({gpus}) into 2 or more islands")
    nic, sock, pcie, nvs, bridge = (_positive_float(v, label) for v, label in (
        (nic_gbps, "nic_gbps"), (socket_gbps, "socket_gbps"), (pcie_gbps, "pcie_gbps"),
        (nvswitch_gbps, "nvswitch_gbps"), (bridge_gbps, "bridge_gbps")))
    islands = gpus // island
    check_size("nvlink_islands", segments * hosts * (gpus * 6 + islands ** 2) + 2 * segments * gpus)
    b = _Builder()
    tors = [[b.switch(f"s{s}tor{g}") for g in range(gpus)] for s in range(segments)]
    for s in range(segments):
        for h in range(hosts):
            ids = [b.gpu(f"s{s}h{h}g{g}") for g in range(gpus)]
            cpus = [b.switch(f"s{s}h{h}cpu{i}") for i in range(islands)]
            for i, cpu in enumerate(cpus):
                members = ids[i * island:(i + 1) * island]
                if island == 2:
                    b.cable(members[0], members[1], bridge, NVSWITCH_LATENCY_US)
                else:
                    nvswitch = b.switch(f"s{s}h{h}nvs{i}")
                    for gpu in members:
                        b.cable(gpu, nvswitch, nvs, NVSWITCH_LATENCY_US)
                for gpu in members:
                    b.cable(gpu, cpu, pcie, PCIE_LATENCY_US)
            for x, y in itertools.combinations(cpus, 2):
                b.cable(x, y, sock, SOCKET_LATENCY_US)
            for g, gpu in enumerate(ids):
                b.cable(gpu, tors[s][g], nic)
    _rail_aggs(b, tors, "", hosts * nic)
    return b.topology(f"nvlislands{island}-{segments}x{hosts}x{gpus}",
                      {"family": "nvlink_islands", "segments": segments, "hosts": hosts,
                       "gpus": gpus, "island": island})


def gpu_mesh(pods: int = 1, hosts: int = 4, gpus: int = 6, *, spines: int = 2,
             mesh_gbps: float = MESH_GBPS, nic_gbps: float = 400.0,
             oversubscription: float = 1.0) -> Topology:
    """Hosts of ``gpus`` directly meshed GPUs (no NVSwitch) on a leaf-spine.

    GPUs ``p{p}h{h}g{i}`` and ``…g{j}`` of a host share one direct link (``mesh_gbps``);
    every NIC of pod ``p``'s hosts is on leaf ``leaf{p}``; with several pods every leaf
    uplinks to every ``spine{k}`` with its downlinks' sum / (``oversubscription`` ×
    ``spines``).
    """
    pods, hosts, gpus, spines = (_positive_int(v, label) for v, label in (
        (pods, "pods"), (hosts, "hosts"), (gpus, "gpus"), (spines, "spines")))
    mesh, nic, over = (_positive_float(mesh_gbps, "mesh_gbps"), _positive_float(nic_gbps, "nic_gbps"),
                       _positive_float(oversubscription, "oversubscription"))
    check_size("gpu_mesh", pods * hosts * (gpus * gpus + 2 * gpus) + 2 * pods * spines)
    b = _Builder()
    spine_ids = [b.switch(f"spine{k}") for k in range(spines)] if pods > 1 else []
    for p in range(pods):
        leaf = b.switch(f"leaf{p}")
        for h in range(hosts):
            ids = [b.gpu(f"p{p}h{h}g{i}") for i in range(gpus)]
            for x, y in itertools.combinations(ids, 2):
                b.cable(x, y, mesh, NVSWITCH_LATENCY_US)
            for gpu in ids:
                b.cable(gpu, leaf, nic)
        for spine in spine_ids:
            b.cable(leaf, spine, hosts * gpus * nic / (over * spines))
    return b.topology(f"gpumesh-{pods}x{hosts}x{gpus}-s{spines}",
                      {"family": "gpu_mesh", "pods": pods, "hosts": hosts, "gpus": gpus,
                       "spines": spines, "oversubscription": over})


CLUSTER_FAMILIES = {"multi_plane": multi_plane, "nvlink_islands": nvlink_islands,
                    "gpu_mesh": gpu_mesh}
