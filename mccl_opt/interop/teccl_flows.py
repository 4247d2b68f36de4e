"""TE-CCL's AllGather output, its ``7-Flows`` lines, both ways (docs/interop.md "TE-CCL").

TE-CCL (an epoch-based MILP) reports an AllGather as lines ``Chunk c from S traveled over
U->V in epoch e`` (``via switches k`` when the hop crosses switch nodes), node numbers
being rows of its capacity matrix.  Each source's chunks are equal parts of its shard, so
chunk ``c`` of source ``S`` is one tree carrying ``1/C`` of it (``C``: the source's chunk
count), its edges the hops in epoch order.  :func:`from_teccl_flows` reads those trees as
an MCCL schedule of a topology (its rate recomputed there, paper §3.2's steady-state
rate; the epochs only order the hops); :func:`to_teccl_flows` writes an MCCL AllGather
schedule as such lines (a tree of share ``m/k`` as ``m`` chunks of ``1/k``, each hop in
the epoch of its tail's depth).  Node ``i`` is ``node_ids[i]`` (what
:func:`mccl_opt.interop.capacity_matrix.to_teccl` lists), else ``n{i}`` (what
:func:`~mccl_opt.interop.capacity_matrix.from_teccl` names).  TE-CCL's AllToAll output
is read by :mod:`.teccl_alltoall` (from its ``Chunk paths``).
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any, Mapping, Sequence

from ..errors import ScheduleError, TopologyError
from ..schedule import Schedule, TreeChunk, bottleneck_links, schedule_rate, share_loads
from ..topology import Topology
from .forestcoll import share_denominator

__all__ = ["from_teccl_flows", "to_teccl_flows", "FLOWS_KEY"]

FLOWS_KEY = "7-Flows"
_LINE = re.compile(r"\s*Chunk (\d+) from (\d+) traveled over (\d+)->(\d+) in epoch (\d+)"
                   r"(?: via switches ([\d ,>-]+))?\s*$", re.ASCII)      # switches "a -> b" (TE-CCL) or "a b"


def to_teccl_flows(schedule: Schedule, topo: Topology) -> dict[str, Any]:
    """``schedule`` (AllGather on ``topo``) as TE-CCL's flow lines (module docstring)."""
    if schedule.collective != "allgather":
        raise ScheduleError(f"TE-CCL flows describe AllGather here; this is an {schedule.collective} schedule")
    index = {n.id: i for i, n in enumerate(topo.nodes)}
    chunks = list(schedule.chunks)
    k = share_denominator([c.share for c in chunks], schedule.max_chunks)
    lines: list[str] = []
    next_chunk: dict[str, int] = defaultdict(int)
    for c in chunks:
        depth = c.depths()
        for _ in range(round(c.share * k)):
            cid = next_chunk[c.src]
            next_chunk[c.src] += 1
            for e in sorted(c.edges, key=lambda e: depth.get(e[0], 0)):
                via = f" via switches {' '.join(str(index[v]) for v in e[1:-1])}" if len(e) > 2 else ""
                lines.append(f"Chunk {cid} from {index[c.src]} traveled over {index[e[0]]}->{index[e[-1]]} "
                             f"in epoch {depth.get(e[0], 0)}{via}")
    return {FLOWS_KEY: lines, "node_ids": [n.id for n in topo.nodes], "topology": topo.name}


def from_teccl_flows(data: Mapping[str, Any], topo: Topology,
                     node_ids: Sequence[str] | None = None) -> Schedule:
    """TE-CCL AllGather flows as an MCCL :class:`Schedule` of ``topo`` (module docstring);
    raises :class:`ScheduleError` naming the bad line.  Not validated here
    (:func:`mccl_opt.check` it)."""
    if not isinstance(data, Mapping) or not isinstance(data.get(FLOWS_KEY), list):
        raise ScheduleError(f"a TE-CCL output is an object with a '{FLOWS_KEY}' list of lines")
    ids = list(node_ids or data.get("node_ids") or [f"n{i}" for i in range(topo.num_nodes)])

    def node(i: str, line: int) -> str:
        if int(i) >= len(ids) or not topo.has_node(str(ids[int(i)])):
            raise ScheduleError(f"{FLOWS_KEY}[{line}]: node {i} is not a node of {topo.name!r} "
                                f"(nodes are numbered as its capacity matrix rows)")
        return str(ids[int(i)])
    hops: dict[tuple[str, int], list[tuple[int, tuple[str, ...]]]] = defaultdict(list)
    for n, text in enumerate(data[FLOWS_KEY]):
        match = _LINE.match(str(text)[:400])
        if not match:
            raise ScheduleError(f"{FLOWS_KEY}[{n}]: {str(text)[:80]!r} is not 'Chunk c from S traveled over "
                                "U->V in epoch e [via switches k]'")
        chunk, src, u, v, epoch, via = match.groups()
        middle = tuple(node(w, n) for w in re.split(r"[ ,>-]+", via.strip()) if w) if via else ()
        hops[(node(src, n), int(chunk))].append((int(epoch), (node(u, n), *middle, node(v, n))))
    if not hops:
        raise ScheduleError(f"'{FLOWS_KEY}' is empty")
    per_source: dict[str, int] = defaultdict(int)
    for src, _ in hops:
        per_source[src] += 1
    if set(per_source) != set(topo.gpus) or len(set(per_source.values())) != 1:
        raise ScheduleError(f"every GPU of {topo.name!r} must send the same number of chunks; got "
                            f"{dict(list(per_source.items())[:4])}")
    count = next(iter(per_source.values()))
    chunks = []
    for (src, _), moves in hops.items():
        have, edges = {src}, []
        for _, path in sorted(moves, key=lambda m: m[0]):      # a hop leaves a GPU holding the chunk
            if path[-1] not in have:                          # a repeated delivery adds no edge
                have.add(path[-1])
                edges.append(path)
        chunks.append(TreeChunk(src, 1.0 / count, tuple(edges)))
    try:
        loads = share_loads(topo, chunks)
    except TopologyError as exc:
        raise ScheduleError(f"the flows do not fit {topo.name!r}: {exc}") from None
    rate = schedule_rate(topo, loads)
    return Schedule("allgather", topo.name, topo.gpus, rate, rate, count, chunks,
                    bottleneck_links(topo, loads, rate, count), solver={"backend": "teccl-import"})
