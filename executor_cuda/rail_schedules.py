"""Rail-aware reference schedules for HPN fabrics (tests, demos, GPU checks).

Not synthesized: these follow the rail-optimized layout of paper §6.1 directly, so the
executor can be exercised (relays, multi-chunk blocks, depth-2 trees) without a solver.

* :func:`rail_alltoall`: a block between GPUs of one host crosses the NVSwitch; between
  hosts on the same rail it crosses the rail's ToR; otherwise it relays through the
  source host's GPU on the destination's rail (NVSwitch, then that rail).  With
  ``split=True`` every inter-host block is split 0.3 / 0.7 over two routes (the second
  relays through the destination host's GPU on the source's rail).
* :func:`rail_allgather`: per root, one tree reaches the root's host mates through the
  NVSwitch and its rail peers through the ToR, each rail peer then forwarding to its own
  host (depth 2); with ``split=True`` a second tree (share 1/2) is a chain along ranks.
"""

from __future__ import annotations

from mccl_opt.errors import TopologyError
from mccl_opt.schedule import PathChunk, Schedule, TreeChunk, schedule_rate, share_loads
from mccl_opt.topology import Topology

__all__ = ["rail_alltoall", "rail_allgather"]


def _host_rail(topo: Topology) -> dict[str, tuple[str, str]]:
    """GPU id -> (its NVSwitch id, its ToR id), read from the GPU's links."""
    out = {}
    for g in topo.gpus:
        nvs = tor = ""
        for link in topo.links:
            if link.src == g:
                if link.dst.endswith("nvs"):
                    nvs = link.dst
                else:
                    tor = link.dst
        out[g] = (nvs, tor)
    return out


def _route(hr: dict[str, tuple[str, str]], s: str, d: str, via_dst_host: bool) -> tuple[str, ...]:
    (ns, ts), (nd, td) = hr[s], hr[d]
    if ns == nd:
        return (s, ns, d)
    if ts == td:
        return (s, ts, d)
    host, rail = (nd, ts) if via_dst_host else (ns, td)
    relay = next((g for g, (n, t) in hr.items() if n == host and t == rail), None)
    if relay is None:
        raise TopologyError(f"no GPU on host {host} and rail {rail} to relay {s} -> {d}; "
                            "rail schedules need a single-segment HPN fabric (1xHxN)")
    if via_dst_host:   # rail of s to the destination host's GPU on s's rail, then NVSwitch
        return (s, ts, relay, nd, d)
    return (s, ns, relay, td, d)


def _finish(topo: Topology, collective: str, chunks: list, max_chunks: int,
            version: int) -> Schedule:
    rate = schedule_rate(topo, share_loads(topo, chunks))
    return Schedule(collective=collective, topology=topo.name, gpus=topo.gpus, rate_gbps=rate,
                    lp_rate_gbps=rate, max_chunks=max_chunks, chunks=tuple(chunks),
                    version=version, solver={"backend": "rail-reference"})


def rail_alltoall(topo: Topology, split: bool = False, version: int = 1) -> Schedule:
    """Rail-aware AllToAll schedule (see module docstring)."""
    hr = _host_rail(topo)
    chunks = []
    for s in topo.gpus:
        for d in topo.gpus:
            if s == d:
                continue
            cross = hr[s][0] != hr[d][0] and hr[s][1] != hr[d][1]
            if split and cross:
                chunks.append(PathChunk(s, d, 0.3, _route(hr, s, d, False)))
                chunks.append(PathChunk(s, d, 0.7, _route(hr, s, d, True)))
            else:
                chunks.append(PathChunk(s, d, 1.0, _route(hr, s, d, False)))
    return _finish(topo, "alltoall", chunks, 10, version)


def rail_allgather(topo: Topology, split: bool = False, version: int = 1) -> Schedule:
    """Rail-aware AllGather schedule (see module docstring)."""
    hr = _host_rail(topo)
    gpus = topo.gpus
    chunks = []
    for r in gpus:
        nvs, tor = hr[r]
        edges = [(r, nvs, g) for g in gpus if g != r and hr[g][0] == nvs]
        for peer in (g for g in gpus if hr[g][1] == tor and hr[g][0] != nvs):
            edges.append((r, tor, peer))
            edges += [(peer, hr[peer][0], g) for g in gpus if g != peer and hr[g][0] == hr[peer][0]]
        share = 0.5 if split else 1.0
        chunks.append(TreeChunk(r, share, tuple(edges)))
        if split:
            order = [gpus[(gpus.index(r) + i) % len(gpus)] for i in range(len(gpus))]
            chain = tuple(_route(hr, u, v, False) for u, v in zip(order, order[1:]))
            if all(len(e) == 3 for e in chain):
                chunks.append(TreeChunk(r, 0.5, chain))
            else:   # a chain hop would relay through a GPU: reuse the first tree instead
                chunks.append(TreeChunk(r, 0.5, tuple(edges)))
    return _finish(topo, "allgather", chunks, 2 if split else 1, version)
