"""The fabric model: GPUs, switches and directed links (README "Units and definitions", docs/modelling.md).

A :class:`Topology` is immutable.  Nodes are GPUs or switches; links are directed
(a cable is two links) with a capacity in Gbps and a latency in microseconds.  GPU
rank order is the order of the GPU nodes.  Numeric code uses the array views
(:attr:`Topology.arrays`), built once and cached: arc tails/heads/capacities, a switch
mask and CSR out-/in-adjacency.

At most one link per ordered node pair: a schedule path is a node sequence, so a pair
must name one link.  Parallel links listed for one pair are merged into one link of
their summed capacity and smallest latency, recorded in the metadata
(:attr:`Topology.parallel_links`, :mod:`mccl_opt.parallel_links`).

Longer than ~400 lines on purpose: one immutable class with its validation, its array
view, its derived copies (capacities changed, renamed, relisted) and its
``mccl-topology/1`` file format; every part reads the same private fields, and the
validation must see every constructor path.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Mapping
from unicodedata import is_normalized

import numpy as np

from .errors import InputError, TopologyError
from .files import TOPOLOGY_PARSE_BYTES, read_json
from .parallel_links import METADATA_KEY, check_link_ids, merge_parallel

__all__ = ["Node", "Link", "Topology", "TopologyArrays", "FORMAT_TAG", "MIN_CAPACITY_GBPS",
           "MAX_CAPACITY_GBPS", "MAX_LATENCY_US"]

FORMAT_TAG = "mccl-topology/1"
NODE_KINDS = ("gpu", "switch")
#: longest node id or topology name (generated ones are a few dozen characters; they are
#: printed and quoted in error messages)
MAX_ID_CHARS = 256


def _plain_text(text: str) -> bool:
    """At most :data:`MAX_ID_CHARS` printable characters in NFC: no control, escape,
    format or bidi character, no lone surrogate, and one spelling for what looks alike."""
    return len(text) <= MAX_ID_CHARS and text.isprintable() and is_normalized("NFC", text)


@dataclass(frozen=True)
class Node:
    """A GPU or a switch.  ``extra`` keeps unknown keys of the file, round-tripped."""

    id: str
    kind: str
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def is_gpu(self) -> bool:
        return self.kind == "gpu"


@dataclass(frozen=True)
class Link:
    """A directed link ``src -> dst`` with capacity (Gbps) and latency (µs)."""

    src: str
    dst: str
    capacity_gbps: float
    latency_us: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class TopologyArrays:
    """Array views of a topology for numeric code (all read-only).

    Arc ``a`` goes ``tail[a] -> head[a]`` with ``capacity[a]`` Gbps.  ``out_start``/
    ``out_arcs`` is the CSR out-adjacency (arcs leaving node ``v`` are
    ``out_arcs[out_start[v]:out_start[v+1]]``), ``in_start``/``in_arcs`` the in-adjacency.
    ``gpu_nodes[r]`` is the node index of rank ``r``; ``rank_of[v]`` is -1 for switches.
    """

    tail: np.ndarray
    head: np.ndarray
    capacity: np.ndarray
    latency: np.ndarray
    is_switch: np.ndarray
    gpu_nodes: np.ndarray
    rank_of: np.ndarray
    out_start: np.ndarray
    out_arcs: np.ndarray
    in_start: np.ndarray
    in_arcs: np.ndarray


def _arrays(tail: np.ndarray, head: np.ndarray, cap: np.ndarray, lat: np.ndarray,
            is_switch: np.ndarray) -> TopologyArrays:
    """The :class:`TopologyArrays` of arcs ``tail -> head`` over nodes ``is_switch``."""
    n = is_switch.size
    gpu_nodes = np.flatnonzero(~is_switch).astype(np.int64)
    rank_of = np.full(n, -1, dtype=np.int64)
    rank_of[gpu_nodes] = np.arange(gpu_nodes.size)
    out_order = np.lexsort((head, tail)).astype(np.int64)
    out_start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(tail, minlength=n), out=out_start[1:])
    in_order = np.lexsort((tail, head)).astype(np.int64)
    in_start = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(head, minlength=n), out=in_start[1:])
    return TopologyArrays(*(_freeze(a) for a in (
        tail, head, cap, lat, is_switch, gpu_nodes, rank_of,
        out_start, out_order, in_start, in_order)))


def _picked(items: tuple[Any, ...], order: np.ndarray) -> tuple[Any, ...]:
    """``items`` in ``order`` (indices), as a tuple."""
    return tuple(map(items.__getitem__, order.tolist()))


def _freeze(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


class Topology:
    """An immutable GPU fabric.

    Build one with :meth:`from_dict`, :meth:`load`, the generators in :mod:`instances`,
    or the constructor (which validates exactly as loading does, and merges parallel
    links, :mod:`mccl_opt.parallel_links`).
    """

    def __init__(self, name: str, nodes: Iterable[Node], links: Iterable[Link],
                 extra: Mapping[str, Any] | None = None) -> None:
        self._name = str(name)
        self._nodes = tuple(nodes)
        self._links = tuple(links)
        self._extra = dict(extra or {})
        self._node_index: dict[str, int] = {}
        self._link_index = {}
        self._validate()

    # ------------------------------------------------------------------ validation
    def _validate(self) -> None:
        if not _plain_text(self._name):
            raise TopologyError(f"the topology's name {self._name[:40]!r} must be at most {MAX_ID_CHARS} printable "
                                "characters in Unicode NFC form (it is printed: no control, escape or bidi characters)")
        for i, node in enumerate(self._nodes):
            if not isinstance(node.id, str) or not node.id:
                raise TopologyError(f"node #{i}: id must be a non-empty string, got {node.id!r}")
            if not _plain_text(node.id):
                raise TopologyError(f"node #{i}: id {node.id[:40]!r} must be at most {MAX_ID_CHARS} printable "
                                    "characters in Unicode NFC form (no control, format or bidi characters; "
                                    "ids that look the same must be the same)")
            if node.kind not in NODE_KINDS:
                raise TopologyError(
                    f"node {node.id!r}: kind must be one of {NODE_KINDS}, got {node.kind!r}")
            if node.id in self._node_index:
                raise TopologyError(f"node {node.id!r} is defined twice (node #{i}); ids must be unique")
            self._node_index[node.id] = i
        gpus = [n.id for n in self._nodes if n.is_gpu]
        if len(gpus) < 2:
            raise TopologyError(f"topology {self._name!r} has {len(gpus)} GPU(s); a collective needs at least 2")
        for i, link in enumerate(self._links):
            where = f"link #{i} ({link.src!r} -> {link.dst!r})"
            for end in (link.src, link.dst):
                if end not in self._node_index:
                    raise TopologyError(f"{where}: unknown node id {end!r}; declare it in 'nodes'")
            if link.src == link.dst:
                raise TopologyError(f"{where}: self-loop; a link must join two different nodes")
            cap = link.capacity_gbps
            if isinstance(cap, bool) or not isinstance(cap, (int, float)) or not _finite(cap) \
                    or not MIN_CAPACITY_GBPS <= cap <= MAX_CAPACITY_GBPS:
                raise TopologyError(
                    f"{where}: capacity_gbps must be a finite number > 0 (in [{MIN_CAPACITY_GBPS:g}, "
                    f"{MAX_CAPACITY_GBPS:g}] Gbps), got {cap!r}")
            lat = link.latency_us
            if isinstance(lat, bool) or not isinstance(lat, (int, float)) or not _finite(lat) \
                    or not 0 <= lat <= MAX_LATENCY_US:
                raise TopologyError(f"{where}: latency_us must be a finite number in [0, {MAX_LATENCY_US:g}] "
                                    f"µs, got {lat!r}")
            self._link_index.setdefault((link.src, link.dst), i)
        check_link_ids(self._links)
        if len(self._link_index) < len(self._links):
            self._merge_parallel()
        self._check_gpus_connected(gpus)

    def _merge_parallel(self) -> None:
        """Merge parallel links (:func:`mccl_opt.parallel_links.merge_parallel`) and
        append the merge records to the metadata."""
        links, records = merge_parallel(self._links)
        earlier = self._extra.get(METADATA_KEY, [])
        if not isinstance(earlier, list):
            raise TopologyError(f"top-level {METADATA_KEY!r} must be a list of merge records "
                                f"(MCCL writes it when it merges parallel links), got {earlier!r}")
        self._links = tuple(links)
        self._extra[METADATA_KEY] = earlier + records
        self._link_index = {(l.src, l.dst): i for i, l in enumerate(self._links)}

    def _check_gpus_connected(self, gpus: list[str]) -> None:
        """Every GPU must reach every other GPU (strong connectivity of the GPU set)."""
        n = len(self._nodes)
        out_adj: list[list[int]] = [[] for _ in range(n)]
        in_adj: list[list[int]] = [[] for _ in range(n)]
        for link in self._links:
            u, v = self._node_index[link.src], self._node_index[link.dst]
            out_adj[u].append(v)
            in_adj[v].append(u)
        root = self._node_index[gpus[0]]
        for adj, direction in ((out_adj, "reach"), (in_adj, "be reached from")):
            seen = {root}
            stack = [root]
            while stack:
                u = stack.pop()
                for v in adj[u]:
                    if v not in seen:
                        seen.add(v)
                        stack.append(v)
            missing = [g for g in gpus if self._node_index[g] not in seen]
            if missing:
                shown = ", ".join(repr(g) for g in missing[:5])
                more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
                verb = "cannot reach" if direction == "reach" else "cannot be reached from"
                raise TopologyError(
                    f"GPU {gpus[0]!r} {verb} GPU(s) {shown}{more}; every GPU pair needs a directed "
                    f"path both ways (add the missing links)")

    # ------------------------------------------------------------------ accessors
    @property
    def name(self) -> str:
        return self._name

    @property
    def nodes(self) -> tuple[Node, ...]:
        return self._nodes

    @property
    def links(self) -> tuple[Link, ...]:
        return self._links

    @property
    def extra(self) -> Mapping[str, Any]:
        return dict(self._extra)

    @property
    def parallel_links(self) -> list[dict[str, Any]]:
        """The merges of parallel links (one record per node pair: ``src``, ``dst``,
        ``links``, merged ``capacity_gbps``/``latency_us`` and the ``parts``), including
        those recorded by the file this topology was loaded from."""
        records = self._extra.get(METADATA_KEY, [])
        return list(records) if isinstance(records, list) else []

    @cached_property
    def gpus(self) -> tuple[str, ...]:
        """GPU ids in rank order."""
        return tuple(n.id for n in self._nodes if n.is_gpu)

    @cached_property
    def _link_index(self) -> dict[tuple[str, str], int]:
        """Link index by ``(src, dst)``: the constructor builds it as it validates; a
        relisted topology builds it here, when first used."""
        return {(l.src, l.dst): i for i, l in enumerate(self._links)}

    @cached_property
    def switches(self) -> tuple[str, ...]:
        return tuple(n.id for n in self._nodes if not n.is_gpu)

    @property
    def num_nodes(self) -> int:
        return len(self._nodes)

    @property
    def num_links(self) -> int:
        return len(self._links)

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)

    def node_index(self, node_id: str) -> int:
        """Index of a node id; raises :class:`TopologyError` for an unknown id."""
        try:
            return self._node_index[node_id]
        except KeyError:
            raise TopologyError(f"unknown node id {node_id!r} in topology {self._name!r}") from None

    def has_node(self, node_id: str) -> bool:
        return node_id in self._node_index

    def node(self, node_id: str) -> Node:
        return self._nodes[self.node_index(node_id)]

    def is_gpu(self, node_id: str) -> bool:
        return self.node(node_id).is_gpu

    def rank(self, gpu_id: str) -> int:
        """Rank of a GPU id."""
        r = int(self.arrays.rank_of[self.node_index(gpu_id)])
        if r < 0:
            raise TopologyError(f"node {gpu_id!r} is a switch, not a GPU")
        return r

    def link_index(self, src: str, dst: str) -> int:
        """Index of the link ``src -> dst``; raises :class:`TopologyError` if absent."""
        try:
            return self._link_index[(src, dst)]
        except KeyError:
            raise TopologyError(f"no link {src!r} -> {dst!r} in topology {self._name!r}") from None

    def has_link(self, src: str, dst: str) -> bool:
        return (src, dst) in self._link_index

    def link(self, src: str, dst: str) -> Link:
        return self._links[self.link_index(src, dst)]

    @cached_property
    def arrays(self) -> TopologyArrays:
        """Array views for numeric code, built once."""
        return _arrays(
            np.array([self._node_index[l.src] for l in self._links], dtype=np.int64),
            np.array([self._node_index[l.dst] for l in self._links], dtype=np.int64),
            np.array([float(l.capacity_gbps) for l in self._links], dtype=np.float64),
            np.array([float(l.latency_us) for l in self._links], dtype=np.float64),
            np.array([not nd.is_gpu for nd in self._nodes], dtype=bool))

    # ------------------------------------------------------------------ derived topologies
    def with_capacity(self, changes: Mapping[tuple[str, str], float] | None = None,
                      **kwargs: Any) -> "Topology":
        """A new topology with some link capacities replaced.

        ``changes`` maps ``(src, dst)`` to the new capacity in Gbps.  For convenience
        ``with_capacity(src=..., dst=..., gbps=..., both_directions=True)`` changes one
        cable.  Unknown links raise :class:`TopologyError`; so do bad capacities.
        """
        changes = dict(changes or {})
        if kwargs:
            missing = {"src", "dst", "gbps"} - set(kwargs)
            unknown = set(kwargs) - {"src", "dst", "gbps", "both_directions"}
            if missing or unknown:
                raise InputError(f"with_capacity(src=..., dst=..., gbps=..., both_directions=True): "
                                 f"missing {sorted(missing)}, unexpected {sorted(unknown)}")
            src, dst, gbps = kwargs["src"], kwargs["dst"], kwargs["gbps"]
            both = kwargs.get("both_directions", True)
            changes[(src, dst)] = gbps
            if both:
                changes[(dst, src)] = gbps
        for key in changes:
            self.link_index(*key)
        links = [
            Link(l.src, l.dst, changes.get((l.src, l.dst), l.capacity_gbps), l.latency_us, l.extra)
            for l in self._links
        ]
        return Topology(self._name, self._nodes, links, self._extra)

    def with_capacities(self, capacity: np.ndarray, name: str | None = None) -> "Topology":
        """A new topology with every link's capacity taken from ``capacity[a]`` (link order)."""
        capacity = np.asarray(capacity, dtype=float)
        if capacity.shape != (self.num_links,):
            raise TopologyError(
                f"capacity vector has shape {capacity.shape}, expected ({self.num_links},)")
        bad = np.flatnonzero(~((capacity >= MIN_CAPACITY_GBPS) & (capacity <= MAX_CAPACITY_GBPS)))
        if name is not None or bad.size:   # the constructor names the first bad value
            links = [Link(l.src, l.dst, float(c), l.latency_us, l.extra)
                     for l, c in zip(self._links, capacity)]
            return Topology(name or self._name, self._nodes, links, self._extra)
        # same nodes and links, every capacity valid and > 0 (so every GPU still reaches
        # every other): nothing else to validate (0.1-0.3 s at 1024 GPUs, inside a
        # time-limited solve, docs/allgather_history.md "Steps no check point reached")
        out = Topology.__new__(Topology)
        out._name, out._extra, out._nodes = self._name, dict(self._extra), self._nodes
        out._links = tuple(Link(l.src, l.dst, c, l.latency_us, l.extra)
                           for l, c in zip(self._links, capacity.tolist()))
        out._node_index, out._link_index = self._node_index, self._link_index
        if "gpus" in self.__dict__:                        # the same GPUs
            out.__dict__["gpus"] = self.gpus
        if "arrays" in self.__dict__:
            out.__dict__["arrays"] = dataclasses.replace(self.arrays,
                                                         capacity=_freeze(capacity.copy()))
        return out

    def renamed(self, name: str) -> "Topology":
        return Topology(name, self._nodes, self._links, self._extra)

    def relisted(self, node_order: Iterable[int], link_order: Iterable[int]) -> "Topology":
        """The same fabric with its nodes and links listed in another order (permutations
        of their indices; GPU ranks follow the new node order).  Nothing is re-validated:
        a permutation of a valid topology is valid.  The link index is built when first
        used, and the GPU list is kept when the GPUs keep their order (AllGather lists
        every fabric canonically before a time-limited solve: 1-2 ms at 1024 GPUs before,
        docs/allgather_history.md "The first schedule at 50 ms")."""
        nodes, links = np.asarray(node_order, np.int64), np.asarray(link_order, np.int64)
        for order, size in ((nodes, len(self._nodes)), (links, len(self._links))):
            if order.shape != (size,) or not np.array_equal(np.sort(order), np.arange(size)):
                raise TopologyError("relisted: node_order and link_order must be permutations")
        out = Topology.__new__(Topology)
        out._name, out._extra = self._name, self._extra
        out._nodes = _picked(self._nodes, nodes)
        out._links = _picked(self._links, links)
        out._node_index = {n.id: i for i, n in enumerate(out._nodes)}
        if "arrays" in self.__dict__:            # permuted, not rebuilt from the links
            a = self.arrays
            position = np.empty(nodes.size, np.int64)
            position[nodes] = np.arange(nodes.size)
            out.__dict__["arrays"] = _arrays(position[a.tail[links]], position[a.head[links]],
                                             a.capacity[links], a.latency[links],
                                             a.is_switch[nodes])
            if "gpus" in self.__dict__ and bool(np.all(np.diff(nodes[~a.is_switch[nodes]]) > 0)):
                out.__dict__["gpus"] = self.gpus
        return out

    # ------------------------------------------------------------------ serialisation
    def to_dict(self) -> dict[str, Any]:
        """The ``mccl-topology/1`` dictionary (extra keys preserved)."""
        d: dict[str, Any] = dict(self._extra)
        d.update({
            "format": FORMAT_TAG,
            "name": self._name,
            "nodes": [{**n.extra, "id": n.id, "kind": n.kind} for n in self._nodes],
            "links": [{**l.extra, "src": l.src, "dst": l.dst,
                       "capacity_gbps": float(l.capacity_gbps), "latency_us": float(l.latency_us)}
                      for l in self._links],
        })
        return d

    @classmethod
    def from_dict(cls, data: Any) -> "Topology":
        """Parse and validate a ``mccl-topology/1`` dictionary."""
        if not isinstance(data, Mapping):
            raise TopologyError(f"a topology must be a JSON object, got {type(data).__name__}")
        fmt = data.get("format")
        if fmt != FORMAT_TAG:
            raise TopologyError(f"'format' must be {FORMAT_TAG!r}, got {fmt!r}")
        for key, typ in (("nodes", list), ("links", list)):
            if not isinstance(data.get(key), typ):
                raise TopologyError(f"'{key}' must be a list")
        nodes = []
        for i, nd in enumerate(data["nodes"]):
            if not isinstance(nd, Mapping):
                raise TopologyError(f"nodes[{i}] must be an object with 'id' and 'kind'")
            for key in ("id", "kind"):
                if key not in nd:
                    raise TopologyError(f"nodes[{i}] lacks '{key}'")
            extra = {k: v for k, v in nd.items() if k not in ("id", "kind")}
            nodes.append(Node(nd["id"], nd["kind"], extra))
        links = []
        for i, ln in enumerate(data["links"]):
            if not isinstance(ln, Mapping):
                raise TopologyError(f"links[{i}] must be an object with src, dst, capacity_gbps")
            for key in ("src", "dst", "capacity_gbps"):
                if key not in ln:
                    raise TopologyError(f"links[{i}] lacks '{key}'")
            extra = {k: v for k, v in ln.items()
                     if k not in ("src", "dst", "capacity_gbps", "latency_us")}
            links.append(Link(ln["src"], ln["dst"], ln["capacity_gbps"], ln.get("latency_us", 0.0), extra))
        extra = {k: v for k, v in data.items() if k not in ("format", "name", "nodes", "links")}
        if not isinstance(data.get("name", ""), str):
            raise TopologyError(f"'name' must be a string, got {type(data['name']).__name__}")
        return cls(data.get("name", "unnamed"), nodes, links, extra)

    @classmethod
    def load(cls, path: str | Path) -> "Topology":
        """Read a ``mccl-topology/1`` JSON file."""
        path = Path(path)
        data = read_json(path, TopologyError, "topology", TOPOLOGY_PARSE_BYTES)
        try:
            return cls.from_dict(data)
        except TopologyError as exc:
            raise TopologyError(f"{path}: {exc}") from None

    def save(self, path: str | Path) -> None:
        """Write the topology as ``mccl-topology/1`` JSON."""
        from .files import write_output

        write_output(path, json.dumps(self.to_dict(), indent=1) + "\n")

    def to_networkx(self):
        """A ``networkx.DiGraph`` with node attribute ``kind`` and edge attributes
        ``capacity_gbps`` (Gbps), ``capacity`` (the same number, the name networkx's flow
        algorithms read), ``latency_us`` and ``link_index`` (the link's place in
        :attr:`links`); :meth:`from_networkx` reads it back, links in the same order."""
        import networkx as nx

        g = nx.DiGraph(name=self._name)
        for n in self._nodes:
            g.add_node(n.id, kind=n.kind)
        for a, l in enumerate(self._links):
            g.add_edge(l.src, l.dst, capacity=float(l.capacity_gbps), capacity_gbps=float(l.capacity_gbps),
                       latency_us=float(l.latency_us), link_index=a)
        return g

    @classmethod
    def from_networkx(cls, graph: Any, name: str | None = None, *, gpus: Iterable[Any] | None = None,
                      gbps_per_unit: float = 1.0) -> "Topology":
        """A topology from a networkx (di)graph: node attribute ``kind`` (``gpu`` or
        ``switch``; default ``gpu``), or ``gpus`` (the compute nodes, every other node a
        switch, as ForestColl passes them); edge attribute ``capacity_gbps`` or
        ``capacity`` (``capacity_gbps`` wins when both are set) times ``gbps_per_unit``
        (8 for a graph in GB/s, as ForestColl's), optional ``latency_us``.  An undirected
        graph's edge is a cable (both directions); node ids become strings (GPU ranks in
        the graph's node order).  ``to_networkx`` and ``from_networkx`` round-trip."""
        if not hasattr(graph, "nodes") or not hasattr(graph, "edges"):
            raise TopologyError(f"from_networkx needs a networkx graph, got {type(graph).__name__}")
        compute = None if gpus is None else {str(g) for g in gpus}
        nodes = [{"id": str(v), "kind": attrs.get("kind", "gpu") if compute is None
                  else "gpu" if str(v) in compute else "switch"} for v, attrs in graph.nodes(data=True)]
        both = not graph.is_directed()
        links = []
        edges = list(graph.edges(data=True))
        if all(isinstance(e[2].get("link_index"), int) for e in edges):     # written by to_networkx
            edges.sort(key=lambda e: e[2]["link_index"])
        for u, v, attrs in edges:
            cap = attrs.get("capacity_gbps", attrs.get("capacity"))
            if cap is None:
                raise TopologyError(f"edge {u!r} -> {v!r} has neither 'capacity_gbps' nor 'capacity' (Gbps)")
            for a, b in ((u, v), (v, u)) if both else ((u, v),):
                if isinstance(cap, bool) or not isinstance(cap, (int, float)):
                    raise TopologyError(f"edge {u!r} -> {v!r}: capacity {cap!r} is not a number")
                links.append({"src": str(a), "dst": str(b), "capacity_gbps": cap * gbps_per_unit,
                              "latency_us": attrs.get("latency_us", 0.0)})
        return cls.from_dict({"format": FORMAT_TAG, "name": name or graph.graph.get("name") or "networkx",
                              "nodes": nodes, "links": links})

    @classmethod
    def from_nccl_xml(cls, paths: "str | Path | Iterable[str | Path]", network: str | None = None, *,
                      hosts: int | None = None, name: str | None = None, **options: Any) -> "Topology":
        """A cluster from NCCL topology XML, one file per host (or one file for ``hosts``
        identical hosts), joined by ``network`` (``rail``, ``switch`` or ``none``;
        :mod:`mccl_opt.interop.nccl_xml`, :mod:`mccl_opt.interop.cluster`)."""
        from .interop.nccl_xml import nccl_cluster

        files = [paths] if isinstance(paths, (str, Path)) else list(paths)
        return cls.from_dict(nccl_cluster(files, network, hosts=hosts, name=name, **options))

    @classmethod
    def from_nvidia_smi(cls, paths: "str | Path | Iterable[str | Path]", network: str | None = None, *,
                        hosts: int | None = None, name: str | None = None, **options: Any) -> "Topology":
        """A cluster from saved ``nvidia-smi topo -m`` output, one file per host
        (:mod:`mccl_opt.interop.nvidia_smi`; capacities are options there)."""
        from .interop.nvidia_smi import smi_cluster

        files = [paths] if isinstance(paths, (str, Path)) else list(paths)
        return cls.from_dict(smi_cluster(files, network, hosts=hosts, name=name, **options))

    # ------------------------------------------------------------------ dunder
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Topology):
            return NotImplemented
        return (self._name, self._nodes, self._links) == (other._name, other._nodes, other._links)

    def __hash__(self) -> int:
        return hash((self._name, self._nodes, self._links))

    def __repr__(self) -> str:
        return (f"Topology({self._name!r}: {self.num_gpus} GPUs, {len(self.switches)} switches, "
                f"{self.num_links} links)")


#: the smallest and largest link capacity (Gbps): beyond them rates and times leave the
#: range where a float division is exact enough (1e-320 is a denormal: 1/it overflows)
MIN_CAPACITY_GBPS = 1e-6
MAX_CAPACITY_GBPS = 1e12
#: the largest link latency (µs): one second, beyond any network (1e300 was taken and gave
#: 4e-300 GB/s in `mccl eval`)
MAX_LATENCY_US = 1e6


def _finite(x: int | float) -> bool:
    """``math.isfinite`` that says False for an int beyond float range."""
    try:
        return math.isfinite(x)
    except OverflowError:
        return False
