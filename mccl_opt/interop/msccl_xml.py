"""MSCCL XML algorithms (what TACCL, MSCCLang and ``mccl export msccl`` write) read back as
MCCL schedules of a topology (docs/interop.md "MSCCL XML and TACCL").

The XML is replayed by MCCL's own checker (:func:`mccl_opt.lowering.msccl.check_msccl_xml`:
it must deliver the collective without deadlock), which records every GPU-to-GPU move
of every input chunk.  AllGather: chunk ``k`` of GPU ``s`` is a tree carrying ``1/c`` of
its shard (``c``: chunks per GPU), its edges the first delivery to each GPU.  AllToAll:
input chunk ``d*c + k`` of GPU ``s`` is a path ``s -> ... -> d`` carrying ``1/c`` of that
block, along its moves.  Rank ``r`` is the topology's ``r``-th GPU; a move between two
GPUs takes the network's route between them (:func:`mccl_opt.paths.switch_path`: fewest
hops through switches only), since the XML names GPUs, not links.  The rate is
recomputed on the topology (paper §3.2).
"""

from __future__ import annotations

from ..errors import ScheduleError, TopologyError
from ..lowering.msccl import check_msccl_xml
from ..paths import path_nodes, switch_path
from ..schedule import PathChunk, Schedule, TreeChunk, bottleneck_links, schedule_rate, share_loads
from ..topology import Topology

__all__ = ["from_msccl_xml"]


def from_msccl_xml(text: str | bytes, topo: Topology) -> Schedule:
    """An MSCCL XML algorithm as an MCCL :class:`Schedule` of ``topo`` (module
    docstring).  Raises :class:`ScheduleError` for XML the checker refuses, a GPU count
    other than ``topo``'s, or a move between GPUs the network does not join directly."""
    raw = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    hops: dict[tuple[int, int], list[tuple[int, int]]] = {}
    check = check_msccl_xml(raw, hops=hops)
    n = check.ngpus
    if n != topo.num_gpus:
        raise ScheduleError(f"the algorithm is for {n} GPUs, topology {topo.name!r} has {topo.num_gpus}")
    routes: dict[tuple[int, int], tuple[str, ...]] = {}

    def route(u: int, v: int) -> tuple[str, ...]:
        if (u, v) not in routes:
            a, b = topo.node_index(topo.gpus[u]), topo.node_index(topo.gpus[v])
            try:
                routes[(u, v)] = path_nodes(topo, switch_path(topo, a, b))
            except TopologyError:
                raise ScheduleError(f"the algorithm sends from rank {u} to rank {v}, but {topo.name!r} joins "
                                    f"{topo.gpus[u]!r} and {topo.gpus[v]!r} only through another GPU") from None
        return routes[(u, v)]

    per_gpu = max((k for _, k in hops), default=0) + 1
    c = per_gpu if check.collective == "allgather" else per_gpu // n
    chunks: list = []
    for s in range(n):
        for k in range(per_gpu):
            moves = hops.get((s, k), [])
            if check.collective == "allgather":
                have, edges = {s}, []
                for u, v in moves:
                    if v not in have:
                        have.add(v)
                        edges.append(route(u, v))
                chunks.append(TreeChunk(topo.gpus[s], 1.0 / c, tuple(edges)))
            elif k // c != s:                                  # a GPU's chunk for itself never moves
                chunks.append(PathChunk(topo.gpus[s], topo.gpus[k // c], 1.0 / c,
                                        _path(s, k // c, moves, route, n)))
    loads = share_loads(topo, chunks)
    rate = schedule_rate(topo, loads)
    return Schedule(check.collective, topo.name, topo.gpus, rate, rate, c, chunks,
                    bottleneck_links(topo, loads, rate, c), solver={"backend": "msccl-import"})


def _path(s: int, d: int, moves: list[tuple[int, int]], route, n: int) -> tuple[str, ...]:
    """The node path of a chunk moved ``s -> ... -> d`` (its moves in replay order)."""
    at, left = s, list(moves)
    path: list[str] = []
    while at != d:
        step = next((m for m in left if m[0] == at), None)
        if step is None or len(path) > 2 * n:
            raise ScheduleError(f"AllToAll chunk of rank {s} for rank {d} does not reach it in the algorithm")
        left.remove(step)
        hop = route(*step)
        path.extend(hop if not path else hop[1:])
        at = step[1]
    return tuple(path)
