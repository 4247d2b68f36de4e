"""A static, topology-oblivious AllGather: one breadth-first tree per root.

Stands in for the vendor library's fixed schedule where the runtime needs one: the
static ReduceScatter half of an AllReduce (paper §3: AllReduce = ReduceScatter, kept on
the vendor's schedule, + AllGather, re-synthesized) and the "no re-optimisation"
baseline of the workload estimate.  Each root's tree is a BFS over GPU-to-GPU hops
whose interior nodes are switches (fewest switch hops, then lowest latency), parents
chosen by lowest rank, so the schedule is deterministic.  It ignores capacities, like
NCCL's rings and trees.
"""

from __future__ import annotations

import heapq

from mccl_opt.errors import TopologyError
from mccl_opt.schedule import Schedule, TreeChunk, bottleneck_links, schedule_rate, share_loads
from mccl_opt.topology import Topology

__all__ = ["bfs_allgather"]


def _gpu_hops(topo: Topology, src: int) -> dict[int, list[int]]:
    """Shortest switch-only paths (as node lists) from GPU node ``src`` to every GPU."""
    arr = topo.arrays
    best: dict[int, tuple[int, float]] = {src: (0, 0.0)}
    parent: dict[int, int] = {}
    heap = [(0, 0.0, src)]
    while heap:
        hops, lat, u = heapq.heappop(heap)
        if best[u] != (hops, lat) or (u != src and not arr.is_switch[u]):
            continue
        for k in range(arr.out_start[u], arr.out_start[u + 1]):
            a = int(arr.out_arcs[k])
            v = int(arr.head[a])
            cand = (hops + 1, lat + float(arr.latency[a]))
            if v not in best or cand < best[v]:
                best[v] = cand
                parent[v] = u
                heapq.heappush(heap, (cand[0], cand[1], v))
    paths = {}
    for g in arr.gpu_nodes:
        g = int(g)
        if g == src or g not in parent:
            continue
        path = [g]
        while path[-1] != src:
            path.append(parent[path[-1]])
        paths[g] = path[::-1]
    return paths


def bfs_allgather(topo: Topology) -> Schedule:
    """The BFS-tree AllGather of ``topo`` (one whole-shard tree per root)."""
    ids = [n.id for n in topo.nodes]
    hops = {int(g): _gpu_hops(topo, int(g)) for g in topo.arrays.gpu_nodes}
    chunks = []
    for root in topo.arrays.gpu_nodes:
        root = int(root)
        reached, frontier, edges = {root}, [root], []
        while frontier:
            nxt = []
            for g in sorted(int(x) for x in topo.arrays.gpu_nodes if int(x) not in reached):
                parents = [p for p in frontier if g in hops[p]]
                if parents:
                    p = min(parents, key=lambda q: (len(hops[q][g]), int(topo.arrays.rank_of[q])))
                    edges.append(tuple(ids[v] for v in hops[p][g]))
                    nxt.append(g)
            reached.update(nxt)
            frontier = sorted(nxt, key=lambda q: int(topo.arrays.rank_of[q]))
        if len(reached) != topo.num_gpus:
            raise TopologyError(f"GPU {ids[root]!r} cannot reach every GPU through switch-only hops")
        chunks.append(TreeChunk(ids[root], 1.0, tuple(edges)))
    loads = share_loads(topo, chunks)
    rate = schedule_rate(topo, loads)
    return Schedule("allgather", topo.name, topo.gpus, rate, rate, 1, tuple(chunks),
                    bottleneck_links(topo, loads, rate, 1), solver={"backend": "static-bfs"})
