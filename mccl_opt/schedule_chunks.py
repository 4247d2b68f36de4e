"""Schedule chunks: AllToAll paths, AllGather trees, and AllGather trees held as arrays.

* :class:`PathChunk` (AllToAll): ``share`` of the ``src -> dst`` block along ``path``
  (node ids; interior nodes may be switches or relay GPUs).
* :class:`TreeChunk` (AllGather): ``share`` of ``src``'s shard over a spanning
  arborescence of GPU-to-GPU ``edges``; an edge's interior nodes are switches.
* :class:`TreeChunks`: a sequence of :class:`TreeChunk` kept as a :class:`TreeTable`, a
  path table and one row of path indices per tree.  A synthesized AllGather schedule at
  thousands of GPUs has tens of millions of tree edges (4096 GPUs: 4095 per tree); the
  table holds them in a few arrays, and a :class:`TreeChunk` with its node-id tuples is
  built only for the trees a caller reads (``chunks[i]``, iteration).  Consumers that
  handle every tree (the file writer, :func:`~mccl_opt.schedule.share_loads`, the
  validator) read the arrays through :meth:`TreeChunks.edge_paths` instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Any, Iterator, Sequence, Union, overload

import numpy as np

from .errors import ScheduleError

__all__ = ["PathChunk", "TreeChunk", "Chunk", "TreeTable", "TreeChunks", "FlatPaths",
           "path_nodes", "edge_paths", "distinct_paths"]


@dataclass(frozen=True)
class PathChunk:
    """An AllToAll chunk: ``share`` of the ``src -> dst`` block routed along ``path``."""

    src: str
    dst: str
    share: float
    path: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "share": float(self.share), "path": list(self.path)}


@dataclass(frozen=True)
class TreeChunk:
    """An AllGather chunk: ``share`` of ``src``'s shard sent over a spanning tree.

    ``edges[i]`` is the node path of one GPU-to-GPU transfer (interior nodes switches).
    """

    src: str
    share: float
    edges: tuple[tuple[str, ...], ...]

    def to_dict(self) -> dict[str, Any]:
        return {"src": self.src, "share": float(self.share),
                "edges": [{"path": list(e)} for e in self.edges]}

    def depths(self) -> dict[str, int]:
        """Depth (GPU hops from the root) of every GPU of the tree."""
        children: dict[str, list[str]] = {}
        for e in self.edges:
            children.setdefault(e[0], []).append(e[-1])
        depth = {self.src: 0}
        stack = [self.src]
        while stack:
            u = stack.pop()
            for v in children.get(u, ()):
                if v not in depth:
                    depth[v] = depth[u] + 1
                    stack.append(v)
        return depth


Chunk = Union[PathChunk, TreeChunk]


@dataclass(frozen=True, eq=False)
class TreeTable:
    """AllGather trees as arrays.  Tree ``t`` carries ``shares[t]`` of the shard of node
    ``node_ids[src[t]]``; its edges ride the paths ``edges[t]`` (parents first), path
    ``j`` being the node indices ``paths[j]`` (a tuple each: a synthesizer's paths are
    tuples already, so the table shares them).  Paths no tree uses may be listed."""

    node_ids: Sequence[str]
    paths: Sequence[tuple[int, ...]]
    src: np.ndarray
    shares: np.ndarray
    edges: np.ndarray

    def __post_init__(self) -> None:
        if self.edges.ndim != 2 or not self.src.shape == self.shares.shape == self.edges.shape[:1]:
            raise ScheduleError("a tree table needs one src, share and row of edge paths per tree")

    def used_paths(self) -> np.ndarray:
        """The paths some tree rides, in increasing index order."""
        mask = np.zeros(len(self.paths), bool)
        mask[self.edges.ravel()] = True
        return np.flatnonzero(mask)

    def path_shares(self) -> np.ndarray:
        """Per path, the shares of the trees riding it (once per edge)."""
        from mccl_opt.row_bincount import row_bincount       # numba: loaded when used
        return row_bincount(self.edges, self.shares, len(self.paths))


class TreeChunks(Sequence[TreeChunk]):
    """The :class:`TreeChunk` of every tree of a :class:`TreeTable`, built when read.

    Node-id tuples of paths are made once and shared by every tree that rides them
    (``chunks[i].edges[j] is chunks[i2].edges[j2]`` for the same path).  Equal to any
    sequence of equal chunks."""

    def __init__(self, table: TreeTable) -> None:
        self.table = table
        self._names: list[tuple[str, ...] | None] = [None] * len(table.paths)

    def __len__(self) -> int:
        return int(self.table.src.size)

    @overload
    def __getitem__(self, i: int) -> TreeChunk: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[TreeChunk, ...]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self))))
        t = self.table
        row = t.edges[i].tolist()            # IndexError for a bad index, as a tuple's
        self._name(np.unique(t.edges[i]))
        return TreeChunk(t.node_ids[int(t.src[i])], float(t.shares[i]),
                         tuple(map(self._names.__getitem__, row)))

    def __iter__(self) -> Iterator[TreeChunk]:
        t = self.table
        names = self._name(t.used_paths()).__getitem__
        ids = t.node_ids
        for s, f, row in zip(t.src.tolist(), t.shares.tolist(), t.edges):
            yield TreeChunk(ids[s], f, tuple(map(names, row.tolist())))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other))

    __hash__ = None     # type: ignore[assignment]  (like a list: equal to tuples of chunks)

    def __repr__(self) -> str:
        t = self.table
        return f"TreeChunks({len(self)} trees, {t.edges.shape[1]} edges each)"

    def __getstate__(self) -> dict[str, Any]:
        return {"table": self.table}                 # names are rebuilt on demand

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["table"])

    def _name(self, paths: np.ndarray) -> list:
        """The node-id tuples of ``paths``, made where missing; returns the name cache."""
        names, table = self._names, self.table
        ids, nodes = table.node_ids, table.paths
        for j in paths.tolist():
            if names[j] is None:
                names[j] = tuple([ids[v] for v in nodes[j]])
        return names

    def path_names(self, paths: np.ndarray) -> list[tuple[str, ...]]:
        """The node-id tuples of the paths ``paths`` (indices into the table)."""
        get = self._name(paths).__getitem__
        return list(map(get, paths.tolist()))


class FlatPaths(Sequence[tuple[int, ...]]):
    """Paths stored flat (path ``j``: ``flat[first[j]:first[j+1]]``), read as tuples of
    node indices (what a :class:`TreeTable` names paths by); a tuple is built per read,
    all of them in one pass when iterated."""

    def __init__(self, flat: np.ndarray, first: np.ndarray) -> None:
        self.flat, self.first = flat, first

    @classmethod
    def of_lengths(cls, flat: np.ndarray, lengths: np.ndarray) -> "FlatPaths":
        """The paths ``flat`` cut into pieces of ``lengths`` nodes."""
        first = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=first[1:])
        return cls(flat, first)

    @classmethod
    def of_tuples(cls, paths: Sequence[Sequence[int]]) -> "FlatPaths":
        """The node-index tuples ``paths``, stored flat."""
        lengths = np.fromiter(map(len, paths), np.int64, count=len(paths))
        return cls.of_lengths(np.fromiter(chain.from_iterable(paths), np.int64,
                                          count=int(lengths.sum())), lengths)

    @property
    def lengths(self) -> np.ndarray:
        """Node count of every path."""
        return np.diff(self.first)

    def by_length(self, min_length: int = 1) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``(rows, nodes)`` per path length of at least ``min_length``: the paths of
        that length and their nodes as one matrix (a row per path), so per-path work is
        one numpy operation per length."""
        lengths = self.lengths
        for length in np.flatnonzero(np.bincount(lengths)).tolist():
            if length >= min_length:
                rows = np.flatnonzero(lengths == length)
                yield rows, self.flat[self.first[rows, None] + np.arange(length)]

    def __len__(self) -> int:
        return int(self.first.size - 1)

    def __getitem__(self, j):
        if isinstance(j, slice):
            return [self[i] for i in range(*j.indices(len(self)))]
        if not -len(self) <= j < len(self):
            raise IndexError(f"path {j} of {len(self)}")
        j %= len(self)
        return tuple(self.flat[self.first[j]:self.first[j + 1]].tolist())

    def __iter__(self) -> Iterator[tuple[int, ...]]:
        flat, first = self.flat.tolist(), self.first.tolist()
        return (tuple(flat[a:b]) for a, b in zip(first[:-1], first[1:]))


def path_nodes(paths: Sequence[tuple[int, ...]], which: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(lengths, nodes)``: the node count of every path ``which[i]`` and their nodes
    one after another (flat paths gathered without a tuple per path)."""
    if isinstance(paths, FlatPaths):
        lo, hi = paths.first[which], paths.first[which + 1]
        lens = hi - lo
        ends = np.cumsum(lens)
        nodes = paths.flat[np.repeat(lo - (ends - lens), lens) + np.arange(int(ends[-1]) if ends.size else 0)]
        return lens, nodes
    rows = [paths[j] for j in which.tolist()]
    lens = np.fromiter(map(len, rows), np.int64, count=len(rows))
    return lens, np.fromiter(chain.from_iterable(rows), np.int64, count=int(lens.sum()))


def edge_paths(chunks: Sequence[TreeChunk]) -> tuple[list[tuple[str, ...]], np.ndarray, np.ndarray]:
    """``(paths, ids, sizes)``: the distinct edge paths of ``chunks`` (node-id tuples), the
    index among them of every edge, trees in order, and every tree's edge count.  Array
    trees (:class:`TreeChunks`) are read from their table without building chunks."""
    if isinstance(chunks, TreeChunks):
        table = chunks.table
        used = table.used_paths()
        index = np.full(len(table.paths), -1, np.int64)
        index[used] = np.arange(used.size)
        sizes = np.full(len(chunks), table.edges.shape[1], np.int64)
        return chunks.path_names(used), index[table.edges.ravel()], sizes
    sizes = np.fromiter((len(c.edges) for c in chunks), np.int64, count=len(chunks))
    paths, ids = distinct_paths(list(chain.from_iterable(c.edges for c in chunks)))
    return paths, ids, sizes


def distinct_paths(paths: list[Sequence[str]]) -> tuple[list[Sequence[str]], np.ndarray]:
    """``(distinct paths in first-use order, index of every path among them)``; AllGather
    trees share most of their edges, so per-path work is done once per distinct path."""
    first = {p: i for i, p in enumerate(dict.fromkeys(paths))}
    return list(first), np.fromiter(map(first.__getitem__, paths), np.int64, count=len(paths))
