"""Baseline and reference schedules in the ``mccl-schedule/1`` model (docs/sim.md).

* :func:`ring_allgather` -- NCCL ring AllGather.  On a rail-optimized fabric (HPN,
  ``topo.extra["family"] == "hpn"``) one ring (channel) per rail ``c``: it enters a host
  on one rail, visits the host's GPUs through the NVSwitch in rotated rank order and
  leaves on another rail to the next host's GPU on that rail, so every inter-host hop
  stays on one rail (NCCL's "rings stay on a NIC" rule).  Even hosts are entered on rail
  ``c`` and left on ``c-1``, odd hosts the reverse; with an odd number of hosts the last
  host leaves on ``c-2``.  Each ring carries ``1/N`` of every shard as one chain tree per
  root.  Elsewhere: one ring in rank order, run as one channel per switch plane its hops
  share (a DGX's NVSwitches; channel ``c`` crosses plane ``c``), or one channel.
* :func:`direct_alltoall` -- NCCL's pairwise AllToAll without PXN: every pair on one
  fewest-hop path; a cross-rail pair goes out on the *source's* NIC to the destination
  host's GPU on the source's rail, which forwards over its NVSwitch.
* :func:`pxn_alltoall` -- with PXN (NCCL >= 2.12): a cross-rail pair first crosses the
  source host's NVSwitch to the GPU whose rail matches the destination, which sends
  over its own NIC.
* :func:`rail_alltoall` / :func:`rail_allgather` -- rail-aware reference schedules for
  exercising executors without a solver (relays, multi-chunk blocks, depth-2 trees;
  HPN only, paper §6.1 layout).  ``rail_alltoall`` is the PXN schedule; with
  ``split=True`` every cross-rail block goes 0.3 over the PXN relay and 0.7 over the
  direct one.  ``rail_allgather``: per root, one tree reaches the root's host mates
  through the NVSwitch and its rail peers through their ToR, each rail peer forwarding
  to its own host (depth 2); with ``split=True`` a second tree (share 1/2) is a chain
  along ranks where every hop crosses one switch (else the first tree again).

Each hop between two GPUs takes the fewest-hop, then lowest-latency, switch-only path
(ties broken by node order).  ``rate_gbps = lp_rate_gbps`` is the rate of the loads.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .errors import TopologyError
from .paths import path_nodes, switch_paths_from
from .schedule import (PathChunk, Schedule, TreeChunk, TreeChunks, TreeTable, bottleneck_links,
                       schedule_rate, share_loads)
from .topology import Topology

__all__ = ["ring_allgather", "direct_alltoall", "pxn_alltoall", "ring_orders", "rail_alltoall",
           "rail_allgather"]

Path = tuple[str, ...]


# ---------------------------------------------------------------------- paths
class _Paths:
    """Switch-only GPU-to-GPU paths as node ids (:func:`mccl_opt.paths.switch_paths_from`)."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo

    def get(self, u: str, v: str) -> Path | None:
        arcs = switch_paths_from(self.topo, self.topo.node_index(u)).get(self.topo.node_index(v))
        return None if arcs is None else path_nodes(self.topo, arcs)

    def need(self, u: str, v: str, why: str) -> Path:
        p = self.get(u, v)
        if p is None:
            raise TopologyError(f"{why}: no switch-only path from {u} to {v} in {self.topo.name!r}")
        return p


def _rail_grid(topo: Topology) -> tuple[int, int] | None:
    """``(hosts, gpus_per_host)`` of an HPN fabric (rank = host * N + rail), else None."""
    if topo.extra.get("family") != "hpn":
        return None
    shape = topo.extra.get("shape")
    if not (isinstance(shape, (list, tuple)) and len(shape) == 3):
        return None
    s, h, n = (int(x) for x in shape)
    if s * h * n != topo.num_gpus:
        return None
    return s * h, n


# ---------------------------------------------------------------------- AllGather
def ring_orders(topo: Topology) -> list[list[int]]:
    """The rank sequence of every ring :func:`ring_allgather` uses."""
    grid = _rail_grid(topo)
    if grid is None or grid[0] == 1 or grid[1] == 1:
        return [list(range(topo.num_gpus))]
    hosts, n = grid
    if hosts % 2 == 1 and n < 3:
        raise TopologyError(
            f"rail-aligned rings need an even number of hosts or >= 3 GPUs per host; "
            f"{topo.name!r} has {hosts} hosts of {n} GPUs")
    rings = []
    for c in range(n):
        entry = [c if h % 2 == 0 else (c - 1) % n for h in range(hosts)]
        if hosts % 2 == 1:
            entry[-1] = (c - 2) % n
        order: list[int] = []
        for h in range(hosts):
            e, o = entry[h], entry[(h + 1) % hosts]
            middle = [(e + k) % n for k in range(1, n) if (e + k) % n != o]
            order += [h * n + r for r in [e, *middle, o]]
        rings.append(order)
    return rings


def _plane_routes(topo: Topology, paths: _Paths, u: str, v: str) -> list[Path]:
    """The hop ``u -> v`` through each lowest-latency switch both GPUs reach by one link
    (the NVSwitch planes of a DGX-like host, not its slower NIC leaf), else its one
    switch-only path."""
    delay = {s: topo.link(u, s).latency_us + topo.link(s, v).latency_us
             for s in topo.switches if topo.has_link(u, s) and topo.has_link(s, v)}
    planes = [(u, s, v) for s, d in delay.items() if d <= min(delay.values()) + 1e-9]
    if len(planes) > 1 and not topo.has_link(u, v):
        return planes
    return [paths.need(u, v, "ring AllGather")]


def _channels(topo: Topology, paths: _Paths, order: list[int]) -> list[list[Path]]:
    """Hop routes of each channel of the ring ``order``: on an HPN fabric one channel
    per ring; elsewhere as many channels as the hops have switch planes in common,
    channel ``c`` crossing plane ``c`` (NCCL spreads its channels over the NVSwitches)."""
    gpus = topo.gpus
    routes = [_plane_routes(topo, paths, gpus[order[k]], gpus[order[(k + 1) % len(order)]])
              for k in range(len(order))]
    width = 1 if _rail_grid(topo) is not None else max(1, min(len(r) for r in routes))
    return [[r[c % len(r)] for r in routes] for c in range(width)]


def ring_allgather(topo: Topology) -> Schedule:
    """NCCL-style ring AllGather (see module docstring); a chain tree per root and channel,
    held as arrays (:class:`TreeChunks`: at 2048 GPUs the rings have 33M tree edges)."""
    paths = _Paths(topo)
    n = topo.num_gpus
    channels = [(order, hops) for order in ring_orders(topo)
                for hops in _channels(topo, paths, order)]
    routes: dict[tuple[int, ...], int] = {}         # hop route (node indices) -> path id
    hop_ids = np.array([[routes.setdefault(tuple(map(topo.node_index, h)), len(routes)) for h in hops]
                        for _, hops in channels], np.int64).reshape(len(channels), n)
    ranks = np.array([order for order, _ in channels], np.int64).ravel()
    trees = np.argsort(ranks, kind="stable")         # by root rank, channels in order
    channel, start = np.divmod(trees, n)
    # the tree of the root at ring position i rides the hops i, i+1, ..., i+n-2 (mod n)
    window = sliding_window_view(np.concatenate([hop_ids, hop_ids], axis=1), n - 1, axis=1)
    gpu_nodes = np.array([topo.node_index(g) for g in topo.gpus], np.int64)
    table = TreeTable(tuple(nd.id for nd in topo.nodes), list(routes), gpu_nodes[ranks[trees]],
                      np.full(trees.size, 1.0 / len(channels)), window[channel, start])
    return _finish(topo, "allgather", TreeChunks(table), len(channels), "nccl-ring",
                   channels=len(channels))


# ---------------------------------------------------------------------- AllToAll
def _relay_path(paths: _Paths, src: str, dst: str, relay: str) -> Path:
    first = paths.need(src, relay, "AllToAll relay hop")
    second = paths.need(relay, dst, "AllToAll relay hop")
    return first + second[1:]


def _alltoall(topo: Topology, pxn_share: float, name: str, max_chunks: int = 1,
              version: int = 1) -> Schedule:
    """Pairs with a switch-only path take it; on HPN the others (cross-rail) send
    ``pxn_share`` over the PXN relay (source host's GPU on the destination's rail) and
    the rest over the direct one (destination host's GPU on the source's rail)."""
    paths = _Paths(topo)
    gpus = topo.gpus
    grid = _rail_grid(topo)
    chunks: list[PathChunk] = []
    for si, s in enumerate(gpus):
        for di, d in enumerate(gpus):
            if si == di:
                continue
            p = paths.get(s, d)
            if p is not None:
                chunks.append(PathChunk(s, d, 1.0, p))
            elif grid is None:
                chunks.append(PathChunk(s, d, 1.0, _shortest_any(topo, s, d, pxn_share > 0)))
            else:
                n = grid[1]
                routes = ((pxn_share, si - si % n + di % n), (1.0 - pxn_share, di - di % n + si % n))
                chunks += [PathChunk(s, d, share, _relay_path(paths, s, d, gpus[relay]))
                           for share, relay in routes if share > 0]
    return _finish(topo, "alltoall", chunks, max_chunks, name, version=version)


def _shortest_any(topo: Topology, s: str, d: str, pxn: bool) -> Path:
    if pxn:
        raise TopologyError(f"PXN relays through the rail-matched GPU of an HPN fabric; {topo.name!r} "
                            f"is not one (use direct_alltoall)")
    import networkx as nx

    g = topo.to_networkx()
    try:
        return tuple(nx.shortest_path(g, s, d))
    except nx.NetworkXNoPath:  # pragma: no cover - Topology checks connectivity
        raise TopologyError(f"no path from {s} to {d}") from None


def direct_alltoall(topo: Topology) -> Schedule:
    """NCCL pairwise AllToAll without PXN (cross-rail relayed on the destination host)."""
    return _alltoall(topo, 0.0, "nccl-direct")


def pxn_alltoall(topo: Topology) -> Schedule:
    """NCCL pairwise AllToAll with PXN (cross-rail relayed on the source host's GPU whose
    rail matches the destination)."""
    return _alltoall(topo, 1.0, "nccl-pxn")


# ---------------------------------------------------------------------- rail references
def _need_grid(topo: Topology, what: str) -> tuple[int, int]:
    grid = _rail_grid(topo)
    if grid is None:
        raise TopologyError(f"{what} needs an HPN fabric (instances.hpn); {topo.name!r} is not one")
    return grid


def rail_alltoall(topo: Topology, split: bool = False, version: int = 1) -> Schedule:
    """Rail-aware reference AllToAll (module docstring); ``version`` is the schedule's."""
    _need_grid(topo, "rail_alltoall")
    if split:
        return _alltoall(topo, 0.3, "rail-split", max_chunks=10, version=version)
    return _alltoall(topo, 1.0, "nccl-pxn", max_chunks=10, version=version)


def rail_allgather(topo: Topology, split: bool = False, version: int = 1) -> Schedule:
    """Rail-aware reference AllGather (module docstring); ``version`` is the schedule's."""
    _, n = _need_grid(topo, "rail_allgather")
    paths = _Paths(topo)
    gpus = topo.gpus
    chunks: list[TreeChunk] = []
    for r, root in enumerate(gpus):
        host = r - r % n
        edges = [paths.need(root, gpus[g], "rail AllGather") for g in range(host, host + n) if g != r]
        for peer in range(r % n, len(gpus), n):
            if peer == r:
                continue
            edges.append(paths.need(root, gpus[peer], "rail AllGather"))
            mates = range(peer - peer % n, peer - peer % n + n)
            edges += [paths.need(gpus[peer], gpus[g], "rail AllGather") for g in mates if g != peer]
        chunks.append(TreeChunk(root, 0.5 if split else 1.0, tuple(edges)))
        if split:
            order = [gpus[(r + i) % len(gpus)] for i in range(len(gpus))]
            chain = [paths.get(u, v) for u, v in zip(order, order[1:])]
            one_switch = all(p is not None and len(p) == 3 for p in chain)
            chunks.append(TreeChunk(root, 0.5, tuple(chain) if one_switch else tuple(edges)))
    return _finish(topo, "allgather", chunks, 2 if split else 1, "rail-tree", version=version)


def _finish(topo: Topology, collective: str, chunks: Sequence, max_chunks: int, name: str,
            version: int = 1, **info: int) -> Schedule:
    loads = share_loads(topo, chunks)
    rate = schedule_rate(topo, loads)
    return Schedule(collective=collective, topology=topo.name, gpus=topo.gpus, rate_gbps=rate,
                    lp_rate_gbps=rate, max_chunks=max_chunks, chunks=chunks,
                    bottleneck=bottleneck_links(topo, loads, rate, max_chunks), version=version,
                    solver={"backend": "baseline", "algorithm": name, **info})
