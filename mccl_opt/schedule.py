"""Schedules and their files, ``mccl-schedule/2`` and ``/1`` (docs/architecture.md).

A :class:`Schedule` is what both synthesizers return and what the simulator, the
runtime and the executor consume.

* AllToAll: each :class:`PathChunk` carries ``share`` of the ``src -> dst`` block along
  ``path`` (node ids; interior nodes may be switches or relay GPUs).
* AllGather: each :class:`TreeChunk` carries ``share`` of ``src``'s shard over a
  spanning arborescence of GPU-to-GPU ``edges``; an edge's interior nodes are switches.
  A synthesizer may hand its trees over as arrays (:class:`TreeChunks`, module
  :mod:`.schedule_chunks`): ``chunks`` is then a sequence that builds each
  :class:`TreeChunk` when read, and the file writer and :func:`share_loads` read the
  arrays.  AllToAll chunks are held the same way (:class:`PathChunks`, module
  :mod:`.schedule_paths`) by the synthesizer and by a schedule read from a file.

Rates (README "Units and definitions"): with per-link *share load* ``L_a`` (the shares of
the chunks crossing link ``a``, an AllGather tree once per edge crossing it), the schedule
sustains ``rate = min_a cap_a / L_a`` Gbps per block (AllToAll) or per shard (AllGather).  :func:`share_loads` and :func:`schedule_rate` compute these.
"""

from __future__ import annotations

from itertools import chain
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from .errors import ScheduleError
from .files import read_json, write_json
from .link_rate import LOAD_NOISE, rate_of_loads
from .report import SolveReport
from .schedule_chunks import (Chunk, PathChunk, TreeChunk, TreeChunks, TreeTable, distinct_paths,
                              path_nodes)
from .schedule_format import (FORMAT_V1, FORMAT_V2, as_list, as_object, jsonable, number, pack_v1,
                              pack_v2, pack_v2_table, unpack_chunks, unpack_tree_table,
                              read_bottleneck, version_number)
from .schedule_format_v3 import FORMAT_V3, pack_v3, unpack_v2_paths, unpack_v3
from .schedule_paths import PathChunks, PathTable, path_table

if TYPE_CHECKING:
    from .allgather.warm.kept import AllGatherWarmState
    from .alltoall.state import AllToAllWarmState
    from .topology import Topology

__all__ = ["PathChunk", "TreeChunk", "TreeChunks", "TreeTable", "PathChunks", "PathTable",
           "BottleneckLink", "Schedule", "FORMAT_TAG", "FORMATS", "COLLECTIVES", "share_loads", "schedule_rate",
           "bottleneck_links", "chunk_counts", "distinct_paths"]

#: the format :meth:`Schedule.save` writes for AllGather (AllToAll: ``FORMAT_V3``;
#: :data:`FORMATS` are read)
FORMAT_TAG = FORMAT_V2
FORMATS = (FORMAT_V1, FORMAT_V2, FORMAT_V3)
COLLECTIVES = ("alltoall", "allgather")
SATURATION_TOL = 1e-6
#: relative slack of ``rate_gbps <= lp_rate_gbps`` when a schedule is read (as the validator's)
RATE_TOLERANCE = 1e-5
#: the largest rate (and LP rate) a schedule file may state: more than any fabric the project
#: loads can carry (links of at most 1e12 Gbps, ``topology.MAX_CAPACITY_GBPS``, and at most
#: ~2 million of them); ``1e308`` used to be read, resumed and exported
MAX_RATE_GBPS = 1e18
#: largest ``max_chunks`` a schedule file may name (the CLI's largest ``--max-chunks``; an
#: export sizing its share denominator by 10^29 ran until killed)
MAX_CHUNK_BUDGET = 1 << 20


@dataclass(frozen=True)
class BottleneckLink:
    """A saturated link of the schedule's bottleneck cut (paper §3.2).

    ``chunks`` is ``n_a`` (chunks of size ``1/max_chunks`` crossing the link);
    ``base_slack`` the fraction of its capacity the rounded schedule leaves unused.
    """

    src: str
    dst: str
    chunks: float
    base_slack: float

    def to_dict(self) -> dict[str, Any]:
        n = self.chunks
        return {"src": self.src, "dst": self.dst,
                "chunks": int(n) if float(n).is_integer() else float(n),
                "base_slack": float(self.base_slack)}


@dataclass
class Schedule:
    """A synthesized collective schedule.

    ``warm_state`` holds the solver state a warm re-synthesis reuses, one typed state per
    collective (AllGather's trees or tree columns, AllToAll's master columns); it is not
    serialised: a schedule loaded from a file gets it back from its chunks
    (:func:`mccl_opt.restore_warm_state`).
    """

    collective: str
    topology: str
    gpus: tuple[str, ...]
    rate_gbps: float
    lp_rate_gbps: float
    max_chunks: int | None
    chunks: Sequence[Chunk]
    bottleneck: tuple[BottleneckLink, ...] = ()
    version: int = 1
    solver: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)
    warm_state: AllGatherWarmState | AllToAllWarmState | None = field(default=None, repr=False,
                                                                      compare=False)
    report: SolveReport | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.collective not in COLLECTIVES:
            raise ScheduleError(f"collective must be one of {COLLECTIVES}, got {self.collective!r}")
        self.gpus = tuple(self.gpus)
        if not isinstance(self.chunks, (TreeChunks, PathChunks)):     # arrays stay arrays
            self.chunks = tuple(self.chunks)
        self.bottleneck = tuple(self.bottleneck)

    @property
    def rounding_gap(self) -> float:
        """``1 - rate/lp_rate`` (0 when the schedule is exactly optimal)."""
        if self.lp_rate_gbps <= 0:
            return 0.0
        return max(0.0, 1.0 - self.rate_gbps / self.lp_rate_gbps)

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)

    # ------------------------------------------------------------------ result contract
    # One place for both collectives (README "Python API"), read from the typed report;
    # a schedule without one (a file from an older mccl, a hand-made schedule) says
    # ``unknown`` / ``None``.
    @property
    def status(self) -> str:
        """How the solve ended: ``optimal``, ``time_limit``, ``round_limit``, ``stalled``
        (:class:`mccl_opt.report.Termination`), or ``unknown`` without a report."""
        return "unknown" if self.report is None else self.report.termination.value

    @property
    def bound_gbps(self) -> float | None:
        """A certified upper bound on the rate of any schedule of the synthesizer's model
        (paper §4.2 / §4.3), ``None`` when the solve stopped before it had one."""
        return None if self.report is None else self.report.bound_gbps

    @property
    def certified_gap(self) -> float | None:
        """``1 - rate_gbps / bound_gbps``: what this schedule may still lose to the optimum."""
        return None if self.report is None else self.report.certified_gap(self.rate_gbps)

    @property
    def seconds(self) -> float | None:
        """The solve's wall seconds, kernel compilation/loading excluded."""
        return None if self.report is None else self.report.seconds

    # ------------------------------------------------------------------ serialisation
    def to_dict(self, compact: bool = True) -> dict[str, Any]:
        """The schedule as the dictionary files and the controller's messages use:
        ``mccl-schedule/3`` for AllToAll (chunk columns), ``mccl-schedule/2`` for
        AllGather (paths and trees stored once), or with ``compact=False`` as
        ``mccl-schedule/1`` (every chunk spelled out).  :meth:`from_dict` reads all three."""
        alltoall = self.collective == "alltoall"
        table = None
        if compact and alltoall:
            table = pack_v3(self.gpus, self._path_table())
        elif compact and isinstance(self.chunks, TreeChunks):
            table = pack_v2_table(self.gpus, self.chunks.table)
        raw = [] if table is not None else [
            (c.src, c.dst, c.share, c.path) if alltoall else (c.src, c.share, c.edges)
            for c in self.chunks]
        d: dict[str, Any] = {
            "format": (FORMAT_V3 if alltoall else FORMAT_TAG) if compact else FORMAT_V1,
            "collective": self.collective,
            "topology": self.topology,
            "gpus": list(self.gpus),
            "rate_gbps": float(self.rate_gbps),
            "lp_rate_gbps": float(self.lp_rate_gbps),
            "max_chunks": self.max_chunks,
        }
        if compact:
            d.update(table if table is not None else pack_v2(self.gpus, raw))
        else:
            d["chunks"] = pack_v1(alltoall, raw)
        d.update(bottleneck=[b.to_dict() for b in self.bottleneck], version=int(self.version),
                 solver=jsonable(self.solver))
        if self.stats:
            d["stats"] = jsonable(self.stats)
        if self.report is not None:
            d["report"] = jsonable(self.report.to_dict())
        return d

    def _path_table(self) -> PathTable:
        """The AllToAll chunks as a :class:`PathTable`; every chunk must be a path."""
        table, positions = path_table(self.chunks)
        if positions.size < len(self.chunks):
            bad = int(np.setdiff1d(np.arange(len(self.chunks)), positions)[0])
            raise ScheduleError(f"chunk {bad}: an AllToAll chunk must be a path")
        return table

    @classmethod
    def from_dict(cls, data: Any) -> "Schedule":
        """Parse a ``mccl-schedule/3``, ``/2`` or ``/1`` dictionary; raises :class:`ScheduleError`."""
        if not isinstance(data, Mapping):
            raise ScheduleError(f"a schedule must be a JSON object, got {type(data).__name__}")
        if data.get("format") not in FORMATS:
            raise ScheduleError(f"'format' must be one of {FORMATS}, got {str(data.get('format'))[:40]!r}")
        for key in ("collective", "gpus", "rate_gbps", "chunks"):
            if key not in data:
                raise ScheduleError(f"schedule lacks '{key}'")
        collective = data["collective"]
        if collective not in COLLECTIVES:
            raise ScheduleError(f"'collective' must be one of {COLLECTIVES}, got {collective!r}")
        gpus = tuple(str(g) for g in as_list(data["gpus"], "gpus"))
        fmt = data["format"]
        if fmt == FORMAT_V3 and collective != "alltoall":
            raise ScheduleError(f"'{FORMAT_V3}' holds AllToAll schedules; AllGather ones are "
                                f"written as '{FORMAT_V2}'")
        table = unpack_tree_table(data, gpus) if collective == "allgather" else None
        if table is not None:                             # trees of one size: arrays
            chunks: Sequence[Chunk] = TreeChunks(table)
        elif collective == "alltoall" and fmt != FORMAT_V1:
            chunks = PathChunks(unpack_v3(data, gpus) if fmt == FORMAT_V3 else unpack_v2_paths(data, gpus))
        else:
            raw = unpack_chunks(data, collective == "alltoall", gpus)
            chunks = [PathChunk(*c) for c in raw] if collective == "alltoall" else [TreeChunk(*c) for c in raw]
        bottleneck = [BottleneckLink(*b) for b in read_bottleneck(data.get("bottleneck", []))]
        rate = number(data["rate_gbps"], "rate_gbps")
        lp_rate = number(data.get("lp_rate_gbps", data["rate_gbps"]), "lp_rate_gbps")
        if not lp_rate <= MAX_RATE_GBPS:
            raise ScheduleError(f"'lp_rate_gbps' {lp_rate:.9g} is more than any fabric carries (at most "
                                f"{MAX_RATE_GBPS:g} Gbps); the file is corrupt or edited")
        if not 0 <= rate <= lp_rate * (1 + RATE_TOLERANCE) + 1e-9:
            raise ScheduleError(f"'rate_gbps' {rate:.9g} must be >= 0 and at most 'lp_rate_gbps' {lp_rate:.9g} "
                                "(no schedule beats its LP bound); the file is corrupt or edited")
        max_chunks = data.get("max_chunks")
        if max_chunks is not None and (not isinstance(max_chunks, int) or isinstance(max_chunks, bool)
                                       or not 1 <= max_chunks <= MAX_CHUNK_BUDGET):
            raise ScheduleError(f"'max_chunks' must be a positive integer (at most {MAX_CHUNK_BUDGET}, the largest "
                                f"chunk budget a solve takes) or null, got {str(max_chunks)[:40]}")
        return cls(
            collective=collective,
            topology=str(data.get("topology", "")),
            gpus=gpus,
            rate_gbps=rate,
            lp_rate_gbps=lp_rate,
            max_chunks=max_chunks,
            chunks=chunks,
            bottleneck=tuple(bottleneck),
            version=version_number(data.get("version", 1)),
            solver=as_object(data.get("solver", {}), "solver"),
            stats=as_object(data.get("stats", {}), "stats"),
            report=None if data.get("report") is None else SolveReport.from_dict(data["report"]),
        )

    def save(self, path: str | Path, compact: bool = True) -> None:
        """Write the schedule as ``mccl-schedule/3`` (AllToAll) or ``/2`` (AllGather;
        ``/1`` with ``compact=False``),
        gzip-compressed when ``path`` ends in ``.gz``."""
        write_json(path, self.to_dict(compact))

    @classmethod
    def load(cls, path: str | Path) -> "Schedule":
        """Read a ``mccl-schedule/3``, ``/2`` or ``/1`` file, plain or gzip-compressed."""
        path = Path(path)
        data = read_json(path, ScheduleError, "schedule")
        try:
            return cls.from_dict(data)
        except ScheduleError as exc:
            raise ScheduleError(f"{path}: {exc}") from None


# ---------------------------------------------------------------------- load helpers
def share_loads(topo: "Topology", chunks: Iterable[Chunk]) -> np.ndarray:
    """Per-link share load ``L_a`` (sum of shares crossing link ``a``, link order).

    Vectorised: shares are summed per distinct path (:func:`distinct_paths`), every
    hop's node ids are mapped to indices in one pass, the hops to link indices by
    a sorted-key search, and the shares summed with ``np.bincount``.
    Raises :class:`mccl_opt.TopologyError` if a hop is not a link of ``topo``.
    """
    if isinstance(chunks, TreeChunks):
        return _table_loads(topo, chunks)
    if isinstance(chunks, PathChunks):           # array paths: one share per hop, no tuples
        t = chunks.table
        index = t.node_map([n.id for n in topo.nodes])
        return _hop_loads(topo, index[t.paths.flat], t.lengths, t.shares,
                          lambda pos: t.node_ids[int(t.paths.flat[pos])])
    hops: list[Sequence[str]] = []
    shares: list[float] = []
    counts: list[int] = []
    for c in chunks:
        if isinstance(c, PathChunk):
            hops.append(c.path)
            counts.append(1)
        else:
            hops.extend(c.edges)
            counts.append(len(c.edges))
        shares.append(c.share)
    if not hops:
        return np.zeros(topo.num_links)
    paths, ids = distinct_paths(hops)
    shares = np.bincount(ids, weights=np.repeat(np.asarray(shares, float), counts),
                         minlength=len(paths))
    return _path_loads(topo, paths, shares)


def _table_loads(topo: "Topology", chunks: TreeChunks) -> np.ndarray:
    """:func:`share_loads` of array trees: shares summed per path, node indices mapped in
    one array step (node-id tuples cost a warm solve 0.06-0.1 s CPU on 2366 trees)."""
    t = chunks.table
    per_path = t.path_shares()
    used = np.flatnonzero(per_path)
    lengths, nodes = path_nodes(t.paths, used)
    return _hop_loads(topo, _indices(topo, t.node_ids)[nodes], lengths, per_path[used],
                      lambda pos: t.node_ids[int(nodes[pos])])


def _path_loads(topo: "Topology", paths: Sequence[Sequence[str]], shares: np.ndarray) -> np.ndarray:
    """Share load per link of node-id ``paths`` carrying ``shares``."""
    flat = list(chain.from_iterable(paths))
    lengths = np.fromiter(map(len, paths), dtype=np.int64, count=len(paths))
    return _hop_loads(topo, _indices(topo, flat), lengths, shares, flat.__getitem__)


def _indices(topo: "Topology", ids: Sequence[str]) -> np.ndarray:
    """The node indices of ``ids`` in ``topo`` (-1: no node of ``topo``)."""
    index = {n.id: i for i, n in enumerate(topo.nodes)}
    return np.fromiter((index.get(v, -1) for v in ids), dtype=np.int64, count=len(ids))


def _hop_loads(topo: "Topology", nodes: np.ndarray, lengths: np.ndarray, shares: np.ndarray,
               name: Callable[[int], str]) -> np.ndarray:
    """Share load per link of the paths whose node indices (-1: no node of ``topo``) are
    ``nodes``, ``lengths[i]`` nodes each, carrying ``shares``; ``name(pos)``: the node id
    at flat position ``pos`` (to name a hop that is no link)."""
    if nodes.size == 0:
        return np.zeros(topo.num_links)
    ends = np.cumsum(lengths)
    is_tail = np.ones(nodes.size, dtype=bool)
    is_tail[ends[lengths > 0] - 1] = False        # a path's last node starts no hop
    tails = nodes[is_tail]
    heads = nodes[np.flatnonzero(is_tail) + 1]
    hop_share = np.repeat(shares, np.maximum(lengths - 1, 0))
    arcs = _link_indices(topo, tails, heads)
    bad = np.flatnonzero(arcs < 0)
    if bad.size:
        pos = int(np.flatnonzero(is_tail)[bad[0]])
        topo.link_index(name(pos), name(pos + 1))   # raises TopologyError naming the hop
    return np.bincount(arcs, weights=hop_share, minlength=topo.num_links)


def _link_indices(topo: "Topology", tails: np.ndarray, heads: np.ndarray) -> np.ndarray:
    """Link index of each ``tails[i] -> heads[i]`` (node indices; -1 where no link)."""
    ar = topo.arrays
    n = topo.num_nodes
    keys = ar.tail * n + ar.head
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    want = tails * n + heads
    pos = np.minimum(np.searchsorted(sorted_keys, want), max(keys.size - 1, 0))
    found = (tails >= 0) & (heads >= 0) & (sorted_keys[pos] == want) if keys.size else tails < -1
    return np.where(found, order[pos], -1)


def schedule_rate(topo: "Topology", loads: np.ndarray) -> float:
    """``min_a cap_a / L_a`` over loaded links (``inf`` if nothing is loaded)."""
    return rate_of_loads(topo.arrays.capacity, loads, noise=LOAD_NOISE)


def chunk_counts(loads: np.ndarray, max_chunks: int | None) -> np.ndarray:
    """``n_a``: chunks of size ``1/max_chunks`` crossing each link (share load if None)."""
    if max_chunks is None:
        return loads.copy()
    return np.rint(loads * max_chunks)


def bottleneck_links(topo: "Topology", loads: np.ndarray, rate: float, max_chunks: int | None,
                     saturated: np.ndarray | None = None,
                     tol: float = SATURATION_TOL) -> tuple[BottleneckLink, ...]:
    """The bottleneck cut ``K_s`` with ``n_a`` and ``base_slack`` (paper §3.2).

    ``saturated`` is a boolean mask of the links the *optimal* (LP / max-flow) solution
    saturates; when omitted, the links the rounded schedule itself saturates are used.
    ``base_slack[a] = 1 - rate * L_a / cap_a``: capacity left unused at the schedule's rate.
    """
    cap = topo.arrays.capacity
    slack = 1.0 - rate * loads / cap
    if saturated is None:
        saturated = (loads > 0) & (slack <= tol)
    counts = chunk_counts(loads, max_chunks)
    out = []
    links = topo.links
    for a in np.flatnonzero(saturated & (loads > 0)):
        link = links[a]
        out.append(BottleneckLink(link.src, link.dst, float(counts[a]), float(max(0.0, slack[a]))))
    return tuple(out)
