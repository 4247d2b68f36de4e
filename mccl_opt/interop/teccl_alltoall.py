"""TE-CCL's AllToAll output, both ways (docs/interop.md "TE-CCL").

TE-CCL solves AllToAll as an LP over epochs (per-source fractional flows); its output
traces them back into per-demand paths.  ``7-Flows`` lines ``Chunk c from S traveled over
U->V with volume x in epoch e [via switches a->b]`` name no destination, so the reader uses
the ``Chunk paths`` object (``8-Chunk paths``; an older release numbers it differently):
``"Demand at D for chunk c from S met by epoch k"`` -> a list of paths, each a list of
``[epoch, "U->V with volume x in epoch e [via switches a->b]"]`` hops.  A path carries the
smallest volume of its hops; the share of the block ``S -> D`` a path carries is its volume
over the block's total (all chunks ``c``), so equal chunk volumes are what TE-CCL's epochs
schedule and MCCL rates them in the steady state (paper §3.2).  Hops are chained from ``S``
by their ends (a hop starts where the last one ended); the epochs only order them.

:func:`to_teccl_alltoall` writes an MCCL AllToAll schedule the same way: each path of a
block is one path of the block's chunk 0 with volume = its share, hop ``h`` (GPU to GPU,
switches in ``via switches``) in epoch ``h``; plus the matching ``7-Flows`` lines and
``0-Collective``.  Node ``i`` is ``node_ids[i]``, else ``n{i}`` (as
:mod:`.capacity_matrix` names TE-CCL's matrix rows).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from fractions import Fraction
from typing import Any, Mapping, Sequence

from ..errors import ScheduleError, TopologyError
from ..schedule import PathChunk, Schedule, bottleneck_links, schedule_rate, share_loads
from ..topology import Topology

__all__ = ["from_teccl_alltoall", "to_teccl_alltoall", "is_teccl_alltoall", "PATHS_KEY"]

PATHS_KEY = "8-Chunk paths"
FLOWS_KEY = "7-Flows"
_PATHS = re.compile(r"^\d+-Chunk paths$", re.ASCII)
_DEMAND = re.compile(r"\s*Demand at (\d+) for chunk (\d+) from (\d+) met by epoch (\d+)\s*$", re.ASCII)
_HOP = re.compile(r"\s*(\d+)\s*->\s*(\d+) with volume ([0-9.eE+-]+) in epoch (\d+)"
                  r"(?: via switches ([\d ,>-]+))?\s*$", re.ASCII)      # ASCII digits: int() reads others
MAX_TEXT = 400
#: the largest chunk count a share denominator is read as
MAX_K = 1024


def _paths_key(data: Mapping[str, Any]) -> str | None:
    return next((k for k in data if isinstance(k, str) and _PATHS.match(k)), None)


def is_teccl_alltoall(data: Any) -> bool:
    """Whether ``data`` looks like TE-CCL's AllToAll output: a ``Chunk paths`` object whose
    hops carry volumes (TE-CCL's AllGather paths have none), or ``0-Collective: alltoall``."""
    if not isinstance(data, Mapping):
        return False
    if str(data.get("0-Collective", "")).lower() == "alltoall":
        return True
    key = _paths_key(data)
    paths = data.get(key) if key else None
    if not isinstance(paths, Mapping):
        return False
    return "with volume" in str(next(iter(paths.values()), ""))[:MAX_TEXT]


def to_teccl_alltoall(schedule: Schedule, topo: Topology) -> dict[str, Any]:
    """``schedule`` (AllToAll on ``topo``) as TE-CCL's AllToAll output (module docstring)."""
    if schedule.collective != "alltoall":
        raise ScheduleError(f"this writes AllToAll schedules; this is an {schedule.collective} schedule")
    index = {n.id: i for i, n in enumerate(topo.nodes)}
    gpus = set(topo.gpus)
    paths: dict[tuple[str, str], list[list]] = defaultdict(list)
    flows: list[tuple[int, str]] = []
    for c in schedule.chunks:
        hops, start = [], 0
        for i, v in enumerate(c.path[1:], 1):
            if v not in gpus:
                continue
            seg = c.path[start:i + 1]
            via = f" via switches {'->'.join(str(index[w]) for w in seg[1:-1])}" if len(seg) > 2 else ""
            text = f"{index[seg[0]]}->{index[seg[-1]]} with volume {c.share!r} in epoch {len(hops)}{via}"
            hops.append([len(hops), text])
            flows.append((len(hops) - 1, f"Chunk 0 from {index[c.src]} traveled over {text}"))
            start = i
        paths[(c.src, c.dst)].append(hops)
    chunk_paths = {}
    for (s, d), multipath in paths.items():
        met = max(len(p) for p in multipath) - 1
        chunk_paths[f"Demand at {index[d]} for chunk 0 from {index[s]} met by epoch {met}"] = multipath
    return {"0-Collective": "alltoall", FLOWS_KEY: [f for _, f in sorted(flows, key=lambda f: f[0])],
            PATHS_KEY: chunk_paths, "node_ids": [n.id for n in topo.nodes], "topology": topo.name}


def from_teccl_alltoall(data: Mapping[str, Any], topo: Topology,
                        node_ids: Sequence[str] | None = None) -> Schedule:
    """TE-CCL AllToAll output as an MCCL AllToAll :class:`Schedule` of ``topo`` (module
    docstring); raises :class:`ScheduleError` naming the bad entry.  Not validated here
    (:func:`mccl_opt.check` it)."""
    key = _paths_key(data) if isinstance(data, Mapping) else None
    if key is None or not isinstance(data[key], Mapping) or not data[key]:
        raise ScheduleError("a TE-CCL AllToAll output has a non-empty 'N-Chunk paths' object "
                            "('Demand at D for chunk c from S met by epoch k' -> paths)")
    ids = list(node_ids or data.get("node_ids") or [f"n{i}" for i in range(topo.num_nodes)])

    def node(i: str, where: str) -> str:
        if int(i) >= len(ids) or not topo.has_node(str(ids[int(i)])):
            raise ScheduleError(f"{where}: node {i} is not a node of {topo.name!r} "
                                "(nodes are numbered as its capacity matrix rows)")
        return str(ids[int(i)])

    volume: dict[tuple[str, str], dict[tuple[str, ...], float]] = defaultdict(lambda: defaultdict(float))
    for demand, multipath in data[key].items():
        where = f"{key}[{str(demand)[:80]!r}]"
        match = _DEMAND.match(str(demand)[:MAX_TEXT])
        if not match or not isinstance(multipath, list):
            raise ScheduleError(f"{where}: expected 'Demand at D for chunk c from S met by epoch k' -> a list of paths")
        d, _, s, _ = match.groups()
        src, dst = node(s, where), node(d, where)
        if src == dst:
            continue
        for p, hops in enumerate(multipath):
            path, vol = _chain(src, dst, hops, f"{where}[{p}]", node)
            if vol > 0:
                volume[(src, dst)][path] += vol
    return _schedule(topo, volume)


def _chain(src: str, dst: str, hops: Any, where: str, node) -> tuple[tuple[str, ...], float]:
    """The node path ``src -> ... -> dst`` of one TE-CCL path and its (smallest) volume."""
    if not isinstance(hops, list) or not hops:
        raise ScheduleError(f"{where}: a path is a non-empty list of [epoch, 'U->V with volume x in epoch e'] hops")
    parsed = []
    for h, hop in enumerate(hops):
        text = hop[-1] if isinstance(hop, list) and hop else hop
        match = _HOP.match(str(text)[:MAX_TEXT])
        if not match:
            raise ScheduleError(f"{where}[{h}]: {str(text)[:80]!r} is not 'U->V with volume x in epoch e "
                                "[via switches a->b]'")
        u, v, vol, _, via = match.groups()
        middle = [node(w, where) for w in re.split(r"[ ,>-]+", via.strip()) if w] if via else []
        try:
            amount = float(vol)
        except ValueError:
            amount = -1.0
        if not amount >= 0:
            raise ScheduleError(f"{where}[{h}]: volume {vol!r} is not a number >= 0")
        parsed.append((node(u, where), middle, node(v, where), amount))
    path, at, left = [src], src, list(parsed)
    while left:
        nxt = next((x for x in left if x[0] == at), None)
        if nxt is None:
            raise ScheduleError(f"{where}: no hop leaves {at!r} (the hops must chain from {src!r} to {dst!r})")
        left.remove(nxt)
        path += [*nxt[1], nxt[2]]
        at = nxt[2]
    if at != dst or len(set(path)) != len(path):
        raise ScheduleError(f"{where}: the hops go {' -> '.join(path)}, not once from {src!r} to {dst!r}")
    return tuple(path), min(x[3] for x in parsed)


def _schedule(topo: Topology, volume: dict) -> Schedule:
    pairs = {(s, d) for s in topo.gpus for d in topo.gpus if s != d}
    if set(volume) != pairs:
        missing = sorted(pairs - set(volume))[:3]
        raise ScheduleError(f"every ordered GPU pair of {topo.name!r} needs a path with positive volume; "
                            f"missing {missing}" if missing else
                            f"paths between nodes that are not GPUs of {topo.name!r}: "
                            f"{sorted(set(volume) - pairs)[:3]}")
    chunks = []
    for (s, d), paths in volume.items():
        total = sum(paths.values())
        chunks += [PathChunk(s, d, v / total, path) for path, v in paths.items()]
    try:
        loads = share_loads(topo, chunks)
    except TopologyError as exc:
        raise ScheduleError(f"the paths do not fit {topo.name!r}: {exc}") from None
    rate = schedule_rate(topo, loads)
    k = _chunk_size([c.share for c in chunks])
    return Schedule("alltoall", topo.name, topo.gpus, rate, rate, k, chunks,
                    bottleneck_links(topo, loads, rate, k), solver={"backend": "teccl-import"})


def _chunk_size(shares: list[float]) -> int | None:
    """``max_chunks``: the ``K`` (at most :data:`MAX_K`) making every share a multiple of
    ``1/K`` (a rounded schedule, what :func:`to_teccl_alltoall` writes), else None
    (fractional shares, as TE-CCL's LP gives)."""
    k = math.lcm(*(Fraction(s).limit_denominator(MAX_K).denominator for s in shares))
    return k if k <= MAX_K and all(abs(s * k - round(s * k)) <= 1e-6 for s in shares) else None
