"""Capacity matrices of TE-CCL and TACCL (docs/interop.md "TE-CCL and TACCL").

* TE-CCL describes a fabric by ``capacity[i][j]`` (node ``i`` to node ``j``; 0: no
  link), ``alpha[i][j]`` (latency in seconds, -1: no link) and ``switch_indices``.  Its
  topologies state capacity in GB/s divided by a chunk size; :func:`from_teccl` takes
  the unit as ``gbps_per_unit`` (8: GB/s, the default).
* TACCL describes one by ``links[dst][src]`` (how many parallel links, note the order)
  and ``invbws[dst][src]`` (inverse bandwidth of one link, µs per MB = 10^6 bytes, its
  beta), plus a scalar ``alpha`` (µs).  One link of beta ``b`` carries ``8000 / b`` Gbps.

Nodes are named ``n{i}``; GPUs are the nodes not listed as switches (TACCL has none in
its matrices).  :func:`to_teccl` and :func:`to_taccl` write the same dictionaries, so a
fabric round-trips.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from ..errors import TopologyError
from ..topology import FORMAT_TAG, Topology

__all__ = ["from_teccl", "to_teccl", "from_taccl", "to_taccl", "MAX_MATRIX_NODES"]

#: nodes of a matrix read (dense: its square in cells; TE-CCL's and TACCL's have tens to hundreds)
MAX_MATRIX_NODES = 4096


def _matrix(data: Mapping[str, Any], key: str, n: int | None = None) -> list[list[float]]:
    rows = data.get(key)
    if not isinstance(rows, Sequence) or not rows or isinstance(rows, str):
        raise TopologyError(f"'{key}' must be a non-empty square matrix (a list of rows)")
    n = len(rows) if n is None else n
    if n > MAX_MATRIX_NODES:
        raise TopologyError(f"'{key}' has {n} rows; a matrix of at most {MAX_MATRIX_NODES} nodes is read")
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, Sequence) or isinstance(row, str) or len(row) != n:
            raise TopologyError(f"'{key}' row {i} must hold {n} numbers (a square matrix of the node count)")
        if any(isinstance(x, bool) for x in row):
            raise TopologyError(f"'{key}' row {i} holds true/false; give numbers")
        try:
            values = [float(x) for x in row]
        except (TypeError, ValueError):
            raise TopologyError(f"'{key}' row {i} holds something that is not a number") from None
        if not all(math.isfinite(v) for v in values):
            raise TopologyError(f"'{key}' row {i} holds a NaN or infinity")
        out.append(values)
    if len(out) != n:
        raise TopologyError(f"'{key}' has {len(out)} rows for {n} nodes")
    return out


def _document(name: str, n: int, switches: set[int], links: list[dict[str, Any]]) -> Topology:
    nodes = [{"id": f"n{i}", "kind": "switch" if i in switches else "gpu"} for i in range(n)]
    return Topology.from_dict({"format": FORMAT_TAG, "name": name, "nodes": nodes, "links": links})


def from_teccl(data: Mapping[str, Any], *, gbps_per_unit: float = 8.0, name: str | None = None) -> Topology:
    """A topology from TE-CCL's ``capacity`` / ``alpha`` / ``switch_indices`` (module docstring)."""
    if not isinstance(data, Mapping):
        raise TopologyError(f"a TE-CCL topology must be an object with 'capacity', got {type(data).__name__}")
    cap = _matrix(data, "capacity")
    n = len(cap)
    alpha = _matrix(data, "alpha", n) if "alpha" in data else None
    switches = set()
    for s in data.get("switch_indices", []) or []:
        if isinstance(s, bool) or not isinstance(s, int) or not 0 <= s < n:
            raise TopologyError(f"'switch_indices' entry {s!r} is not a node index in [0, {n})")
        switches.add(s)
    links = []
    for i in range(n):
        for j in range(n):
            if cap[i][j] < 0:
                raise TopologyError(f"capacity[{i}][{j}] = {cap[i][j]:g} is negative")
            if i == j and cap[i][j] != 0:
                raise TopologyError(f"capacity[{i}][{i}] = {cap[i][i]:g}: a node has no link to itself; "
                                    "put 0 on the diagonal")
            if cap[i][j] > 0 and i != j:
                lat = alpha[i][j] * 1e6 if alpha is not None and alpha[i][j] > 0 else 0.0
                links.append({"src": f"n{i}", "dst": f"n{j}", "capacity_gbps": cap[i][j] * gbps_per_unit,
                              "latency_us": lat})
    return _document(name or str(data.get("name", "teccl")), n, switches, links)


def to_teccl(topo: Topology, *, gbps_per_unit: float = 8.0) -> dict[str, Any]:
    """TE-CCL's matrices of ``topo`` (node order; ``node_ids`` names them)."""
    index = {n.id: i for i, n in enumerate(topo.nodes)}
    n = len(index)
    cap = [[0.0] * n for _ in range(n)]
    alpha = [[-1.0] * n for _ in range(n)]
    for l in topo.links:
        cap[index[l.src]][index[l.dst]] = l.capacity_gbps / gbps_per_unit
        alpha[index[l.src]][index[l.dst]] = l.latency_us * 1e-6
    return {"name": topo.name, "capacity": cap, "alpha": alpha,
            "switch_indices": [i for i, nd in enumerate(topo.nodes) if not nd.is_gpu],
            "node_ids": [nd.id for nd in topo.nodes]}


def from_taccl(data: Mapping[str, Any], *, name: str | None = None) -> Topology:
    """A topology from TACCL's ``links[dst][src]`` and ``invbws[dst][src]`` (µs/MB)."""
    if not isinstance(data, Mapping):
        raise TopologyError(f"a TACCL topology must be an object with 'links' and 'invbws', got {type(data).__name__}")
    count = _matrix(data, "links")
    n = len(count)
    invbw = _matrix(data, "invbws", n)
    try:
        alpha = float(data.get("alpha", 0.0))
    except (TypeError, ValueError):
        raise TopologyError(f"'alpha' must be a number of µs, got {data.get('alpha')!r}") from None
    links = []
    for dst in range(n):
        for src in range(n):
            k = count[dst][src]
            if k < 0 or k != int(k):
                raise TopologyError(f"links[{dst}][{src}] = {k:g} must be a whole number >= 0")
            if k and src == dst:
                raise TopologyError(f"links[{dst}][{dst}] = {k:g}: a node has no link to itself; put 0 on the diagonal")
            if k > 0 and src != dst:
                if invbw[dst][src] <= 0:
                    raise TopologyError(f"invbws[{dst}][{src}] must be > 0 µs/MB where links[{dst}][{src}] > 0")
                links.append({"src": f"n{src}", "dst": f"n{dst}", "capacity_gbps": k * 8000.0 / invbw[dst][src],
                              "latency_us": max(alpha, 0.0)})
    return _document(name or str(data.get("name", "taccl")), n, set(), links)


def to_taccl(topo: Topology) -> dict[str, Any]:
    """TACCL's matrices of ``topo``: one link per pair, ``invbws`` from its capacity;
    switches are refused (TACCL models them as sketches, not nodes)."""
    if topo.switches:
        raise TopologyError(f"{topo.name!r} has switches ({topo.switches[0]!r}...); TACCL's matrices hold "
                            "GPU-to-GPU links only")
    index = {g: i for i, g in enumerate(topo.gpus)}
    n = len(index)
    count = [[0] * n for _ in range(n)]
    invbw = [[0.0] * n for _ in range(n)]
    for l in topo.links:
        count[index[l.dst]][index[l.src]] = 1
        invbw[index[l.dst]][index[l.src]] = 8000.0 / l.capacity_gbps
    lat = {l.latency_us for l in topo.links}
    return {"name": topo.name, "links": count, "invbws": invbw, "alpha": max(lat) if lat else 0.0,
            "node_ids": list(topo.gpus)}
