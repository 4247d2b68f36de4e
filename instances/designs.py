"""Fabric designs beyond HPN's uniform hosts and two switch tiers (docs/modelling.md,
"Fabric designs"), for the AllGather fuzz (issue 25: cliffs on fabrics the project has not
seen).  Hosts keep HPN's NVSwitch (2880 Gbps / 25 ns) and 0.5 µs NICs.

* :func:`rail_hosts` -- one rail-optimized switch layer (HPN segments, one ToR per rail,
  one aggregation switch per rail above several segments) whose hosts may differ: GPUs per
  host (4- and 8-GPU hosts mixed: rail ``g`` only joins hosts with a GPU ``g``), NIC speed
  per host (200 and 400 Gbps generations mixed), and GPUs per NIC (two GPUs behind one
  PCIe switch ``…pcie{j}`` and NIC, so a host has fewer rails than GPUs).
* :func:`fat_tree` -- a three-tier fat-tree: pods of edge switches (every NIC of a host on
  its edge), every edge to every aggregation switch of its pod (1:1), every aggregation
  switch to every core, ``core_oversubscription`` : 1 at the top (3:1 by default).
* :func:`dragonfly` -- groups of routers, all-to-all inside a group (local links), and one
  global link between every pair of groups, spread over the groups' routers (Kim et al.,
  ISCA 2008); every NIC of a host on its router.

Uplinks carry the sum of their switch's downlinks divided by the oversubscription (and by
the number of uplinks they are spread over), as in :mod:`instances.aggregation`.
"""

from __future__ import annotations

import itertools
from typing import Callable, Sequence, TypeVar

from mccl_opt.errors import TopologyError
from mccl_opt.topology import Topology

from .aggregation import (NVSWITCH_GBPS, _Builder, _positive_float, _positive_int)
from .limits import check_size

__all__ = ["rail_hosts", "fat_tree", "dragonfly", "DESIGN_FAMILIES"]

T = TypeVar("T")

PCIE_GBPS = 512.0           # a PCIe Gen5 x16 switch port
PCIE_LATENCY_US = 0.1


def _per_host(value: object, hosts: int, label: str, check: Callable[[object, str], T]) -> list[T]:
    """One value for every host, or a sequence of one per host."""
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        if len(value) != hosts:
            raise TopologyError(f"{label} lists {len(value)} values for {hosts} hosts")
        return [check(v, f"{label}[{i}]") for i, v in enumerate(value)]
    return [check(value, label)] * hosts


def rail_hosts(segments: int = 1, host_gpus: int | Sequence[int] = (8, 4), *, hosts: int = 2,
               nic_gbps: float | Sequence[float] = 400.0, gpus_per_nic: int = 1,
               pcie_gbps: float = PCIE_GBPS, oversubscription: float = 1.0,
               nvswitch_gbps: float = NVSWITCH_GBPS) -> Topology:
    """Rail-optimized segments of possibly unlike hosts.

    ``host_gpus`` gives the GPUs of each host of a segment (an integer: ``hosts`` alike
    hosts); ``nic_gbps`` one speed or one per host.  NIC ``j`` of a host joins the segment's
    rail ToR ``s{s}tor{j}``; with ``gpus_per_nic = 2`` GPUs ``2j`` and ``2j+1`` reach it
    through a PCIe switch ``s{s}h{h}pcie{j}`` (``pcie_gbps`` each way).  With several
    segments, ToR ``j`` of every segment uplinks to ``agg{j}`` with its downlinks' sum /
    ``oversubscription``.
    """
    segments = _positive_int(segments, "segments")
    if isinstance(host_gpus, Sequence) and not isinstance(host_gpus, (str, bytes)):
        hosts = len(host_gpus)
    sizes = _per_host(host_gpus, _positive_int(hosts, "hosts"), "host_gpus", _positive_int)
    nics = _per_host(nic_gbps, len(sizes), "nic_gbps", _positive_float)
    per_nic = _positive_int(gpus_per_nic, "gpus_per_nic")
    pcie, over, nvs = (_positive_float(pcie_gbps, "pcie_gbps"),
                       _positive_float(oversubscription, "oversubscription"),
                       _positive_float(nvswitch_gbps, "nvswitch_gbps"))
    if not sizes or any(g % per_nic for g in sizes):
        raise TopologyError(f"gpus_per_nic ({per_nic}) must divide every host's GPUs {sizes}")
    check_size("rail_hosts", segments * sum(sizes) * 8)
    rails = max(sizes) // per_nic
    b = _Builder()
    down = [[0.0] * rails for _ in range(segments)]
    for s in range(segments):
        tors = [b.switch(f"s{s}tor{j}") for j in range(rails)]
        for h, (size, nic) in enumerate(zip(sizes, nics)):
            ids = b.host(f"s{s}h{h}", size, nvs)
            for j in range(size // per_nic):
                down[s][j] += nic
                if per_nic == 1:
                    b.cable(ids[j], tors[j], nic)
                    continue
                pcie_sw = b.switch(f"s{s}h{h}pcie{j}")
                for gpu in ids[j * per_nic:(j + 1) * per_nic]:
                    b.cable(gpu, pcie_sw, pcie, PCIE_LATENCY_US)
                b.cable(pcie_sw, tors[j], nic)
    if segments > 1:
        for j in range(rails):
            agg = b.switch(f"agg{j}")
            for s in range(segments):
                b.cable(f"s{s}tor{j}", agg, down[s][j] / over)
    shape = "-".join(map(str, sizes)) if len(set(sizes)) > 1 else f"{len(sizes)}x{sizes[0]}"
    speeds = "" if len(set(nics)) == 1 and nics[0] == 400.0 else "-n" + "-".join(
        f"{n:g}" for n in (nics if len(set(nics)) > 1 else nics[:1]))
    name = f"railhosts-{segments}x{shape}{speeds}" + (f"-p{per_nic}" if per_nic > 1 else "")
    return b.topology(name, {"family": "rail_hosts", "host_gpus": sizes, "nic_gbps": nics,
                             "gpus_per_nic": per_nic, "segments": segments})


def fat_tree(pods: int = 2, edges: int = 2, hosts: int = 1, gpus: int = 8, *, aggs: int = 2,
             cores: int = 2, core_oversubscription: float = 3.0, nic_gbps: float = 400.0,
             nvswitch_gbps: float = NVSWITCH_GBPS) -> Topology:
    """A three-tier fat-tree of ``pods`` pods.

    Pod ``p`` has ``edges`` edge switches ``p{p}e{e}`` (each with ``hosts`` hosts, all their
    NICs on it) and ``aggs`` aggregation switches ``p{p}a{a}``; every edge uplinks to every
    aggregation switch of its pod at 1:1 (its downlinks' sum over ``aggs`` uplinks), every
    aggregation switch to every core ``core{c}`` with its downlinks' sum /
    ``core_oversubscription`` spread over ``cores`` uplinks.
    """
    pods, edges, hosts, gpus, aggs, cores = (
        _positive_int(v, label) for v, label in ((pods, "pods"), (edges, "edges"), (hosts, "hosts"),
                                                 (gpus, "gpus"), (aggs, "aggs"), (cores, "cores")))
    over, nic, nvs = (_positive_float(core_oversubscription, "core_oversubscription"),
                      _positive_float(nic_gbps, "nic_gbps"),
                      _positive_float(nvswitch_gbps, "nvswitch_gbps"))
    check_size("fat_tree", pods * edges * hosts * gpus * 4 + pods * aggs * (edges + cores) * 2)
    b = _Builder()
    core_ids = [b.switch(f"core{c}") for c in range(cores)] if pods > 1 else []
    edge_up = hosts * gpus * nic / aggs               # 1:1 from edge to its pod's aggs
    for p in range(pods):
        agg_ids = [b.switch(f"p{p}a{a}") for a in range(aggs)]
        for e in range(edges):
            edge = b.switch(f"p{p}e{e}")
            for h in range(hosts):
                for gpu in b.host(f"p{p}e{e}h{h}", gpus, nvs):
                    b.cable(gpu, edge, nic)
            if edges > 1 or pods > 1:
                for agg in agg_ids:
                    b.cable(edge, agg, edge_up)
        for agg in agg_ids if pods > 1 else []:
            for core in core_ids:
                b.cable(agg, core, edges * edge_up / (over * cores))
    return b.topology(f"fattree-{pods}x{edges}x{hosts}x{gpus}-a{aggs}c{cores}-o{over:g}",
                      {"family": "fat_tree", "pods": pods, "edges": edges, "hosts": hosts,
                       "gpus": gpus, "aggs": aggs, "cores": cores,
                       "core_oversubscription": over})


def dragonfly(groups: int = 3, routers: int = 2, hosts: int = 1, gpus: int = 8, *,
              global_gbps: float = 800.0, local_gbps: float | None = None,
              nic_gbps: float = 400.0, nvswitch_gbps: float = NVSWITCH_GBPS) -> Topology:
    """A dragonfly: ``groups`` groups of ``routers`` routers ``d{g}r{r}``, every router with
    ``hosts`` hosts (all their NICs on it); the routers of a group all-to-all (``local_gbps``,
    default one host's NICs); ONE global link (``global_gbps``) between every pair of
    groups, its ends spread round-robin over each group's routers."""
    groups = _positive_int(groups, "groups", 2)
    routers, hosts, gpus = (_positive_int(v, label) for v, label in
                            ((routers, "routers"), (hosts, "hosts"), (gpus, "gpus")))
    nic, glob, nvs = (_positive_float(nic_gbps, "nic_gbps"),
                      _positive_float(global_gbps, "global_gbps"),
                      _positive_float(nvswitch_gbps, "nvswitch_gbps"))
    local = hosts * gpus * nic if local_gbps is None else _positive_float(local_gbps, "local_gbps")
    check_size("dragonfly", groups * routers * (hosts * gpus * 4 + 2 * routers) + 2 * groups ** 2)
    b = _Builder()
    for g in range(groups):
        ids = [b.switch(f"d{g}r{r}") for r in range(routers)]
        for r, router in enumerate(ids):
            for h in range(hosts):
                for gpu in b.host(f"d{g}r{r}h{h}", gpus, nvs):
                    b.cable(gpu, router, nic)
        for x, y in itertools.combinations(ids, 2):
            b.cable(x, y, local)
    ends = [0] * groups                               # next router of each group to use
    for g, h in itertools.combinations(range(groups), 2):
        b.cable(f"d{g}r{ends[g] % routers}", f"d{h}r{ends[h] % routers}", glob)
        ends[g] += 1
        ends[h] += 1
    return b.topology(f"dragonfly-{groups}x{routers}x{hosts}x{gpus}-g{glob:g}",
                      {"family": "dragonfly", "groups": groups, "routers": routers,
                       "hosts": hosts, "gpus": gpus, "global_gbps": glob})


DESIGN_FAMILIES = {"rail_hosts": rail_hosts, "fat_tree": fat_tree, "dragonfly": dragonfly}
