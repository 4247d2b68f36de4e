"""AllToAll chunks held as arrays: :class:`PathTable` and its chunk view :class:`PathChunks`.

A synthesized AllToAll schedule at 1024 GPUs has a million chunks, each a path of 5-9
nodes.  As :class:`~mccl_opt.schedule_chunks.PathChunk` objects they cost seconds to
build, write, read back and check; the table keeps them as a few arrays (one flat node
index array with offsets, and src/dst/share arrays), and :class:`PathChunks` builds a
``PathChunk`` only for the chunks a caller reads.  The consumers that handle every chunk
(the ``mccl-schedule/3`` writer and reader, :func:`~mccl_opt.schedule.share_loads`, the
validator and the warm-state restore) read the table through :func:`path_table`, which
also turns any other sequence of chunks into a table (one pass, no per-chunk arrays).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from itertools import chain
from typing import Any, Callable, Iterator, Sequence, overload

import numpy as np

from .errors import ScheduleError
from .schedule_chunks import FlatPaths, PathChunk

__all__ = ["PathTable", "PathChunks", "path_table"]


@dataclass(frozen=True, eq=False)
class PathTable:
    """Chunk ``i`` carries ``shares[i]`` of the block ``node_ids[src[i]] ->
    node_ids[dst[i]]`` along the node indices ``paths[i]``.  ``node_ids`` are distinct
    (a node has one index), so equal indices are equal nodes."""

    node_ids: Sequence[str]
    src: np.ndarray
    dst: np.ndarray
    shares: np.ndarray
    paths: FlatPaths

    def __post_init__(self) -> None:
        n = len(self.paths)
        if not self.src.shape == self.dst.shape == self.shares.shape == (n,):
            raise ScheduleError("a path table needs one src, dst, share and path per chunk")
        if len(set(self.node_ids)) != len(self.node_ids):
            raise ScheduleError("a path table lists a node id twice")

    @property
    def lengths(self) -> np.ndarray:
        """Node count of every chunk's path."""
        return self.paths.lengths

    def node_map(self, node_ids: Sequence[str]) -> np.ndarray:
        """Per node of this table, its index in ``node_ids`` (-1 where absent)."""
        where = {v: i for i, v in enumerate(node_ids)}
        return np.fromiter((where.get(v, -1) for v in self.node_ids), np.int64,
                           count=len(self.node_ids))

    def same_chunks(self, other: "PathTable") -> bool:
        """Whether both tables hold equal chunks in the same order (ids compared, not
        indices)."""
        if len(self.paths) != len(other.paths) or not np.array_equal(self.lengths, other.lengths):
            return False
        to_mine = other.node_map(self.node_ids)
        return bool(np.array_equal(self.shares, other.shares)
                    and np.array_equal(self.src, to_mine[other.src])
                    and np.array_equal(self.dst, to_mine[other.dst])
                    and np.array_equal(self.paths.flat, to_mine[other.paths.flat]))


class PathChunks(Sequence[PathChunk]):
    """The :class:`PathChunk` of every chunk of a :class:`PathTable`, built when read
    (``objects``: the chunks already built, e.g. by a synthesizer, returned as they
    are).  ``table`` may be a function that makes the table, called on first use of
    :attr:`table` (the synthesizer defers that work to the reader who needs the
    arrays); ``size`` (or ``objects``) then says how many chunks it will hold.  Equal to
    any sequence of equal chunks."""

    def __init__(self, table: PathTable | Callable[[], PathTable],
                 objects: Sequence[PathChunk] | None = None, size: int | None = None) -> None:
        self._table, self.objects = table, objects
        self._size = len(objects) if objects is not None else size
        if isinstance(table, PathTable):
            self._check(table)
        elif self._size is None:
            raise ScheduleError("a deferred path table needs its chunk count")

    @property
    def table(self) -> PathTable:
        """The chunks as arrays (made on first use when deferred)."""
        if not isinstance(self._table, PathTable):
            self._table = self._check(self._table())
        return self._table

    def _check(self, table: PathTable) -> PathTable:
        if self._size is not None and self._size != len(table.paths):
            raise ScheduleError(f"{self._size} chunks expected, a table of {len(table.paths)}")
        self._size = len(table.paths)
        return table

    def __len__(self) -> int:
        return int(self._size)

    @overload
    def __getitem__(self, i: int) -> PathChunk: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[PathChunk, ...]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self))))
        if self.objects is not None:
            return self.objects[i]
        t = self.table
        ids = t.node_ids
        path = t.paths[i]                              # IndexError for a bad index, as a tuple's
        return PathChunk(ids[int(t.src[i])], ids[int(t.dst[i])], float(t.shares[i]),
                         tuple([ids[v] for v in path]))

    def __iter__(self) -> Iterator[PathChunk]:
        return iter(self.objects if self.objects is not None else self._built())

    def _built(self) -> list[PathChunk]:
        """Every chunk, built from the table: node-id tuples made a path length at a time
        (``zip`` over the columns of a node-id matrix, no per-chunk slicing)."""
        t = self.table
        ids = np.array(t.node_ids, dtype=object)
        paths: list[tuple[str, ...]] = [()] * len(t.paths)
        for rows, nodes in t.paths.by_length():
            for i, path in zip(rows.tolist(), zip(*ids[nodes].T.tolist())):
                paths[i] = path
        return list(map(PathChunk, ids[t.src].tolist(), ids[t.dst].tolist(), t.shares.tolist(), paths))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PathChunks):
            return self.table.same_chunks(other.table)
        if not isinstance(other, Sequence) or isinstance(other, (str, bytes)):
            return NotImplemented
        return len(other) == len(self) and all(a == b for a, b in zip(self, other))

    __hash__ = None     # type: ignore[assignment]  (like a list: equal to tuples of chunks)

    def __repr__(self) -> str:
        return f"PathChunks({len(self)} paths)"

    def __getstate__(self) -> dict[str, Any]:
        """The chunk objects when built (they are shared with a warm state's) and the
        table when made (a deferred one is not made for pickling)."""
        state: dict[str, Any] = {}
        if self.objects is not None:
            state["objects"] = self.objects
        if self.objects is None or isinstance(self._table, PathTable):
            state["table"] = self.table
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        objects = state.get("objects")
        self.__init__(state["table"] if "table" in state else partial(_table_of, objects), objects)


def _table_of(chunks: Sequence[PathChunk]) -> PathTable:
    return path_table(chunks)[0]


def path_table(chunks: Sequence) -> tuple[PathTable, np.ndarray]:
    """``(table, positions)``: the :class:`PathChunk` items of ``chunks`` as a table and
    their positions in ``chunks`` (other items are left out).  A :class:`PathChunks`
    gives its own table; other sequences are read in one pass, node ids numbered in
    order of first use."""
    if isinstance(chunks, PathChunks):
        return chunks.table, np.arange(len(chunks))
    items = list(chunks)
    positions = np.fromiter((i for i, c in enumerate(items) if isinstance(c, PathChunk)), np.int64)
    if positions.size < len(items):
        items = [items[i] for i in positions.tolist()]
    srcs = [c.src for c in items]
    dsts = [c.dst for c in items]
    paths = [c.path for c in items]
    ids = list(dict.fromkeys(chain(srcs, dsts, chain.from_iterable(paths))))
    index = {v: i for i, v in enumerate(ids)}.__getitem__
    lengths = np.fromiter(map(len, paths), np.int64, count=len(paths))
    flat = np.fromiter(map(index, chain.from_iterable(paths)), np.int64, count=int(lengths.sum()))
    table = PathTable(ids, np.fromiter(map(index, srcs), np.int64, count=len(items)),
                      np.fromiter(map(index, dsts), np.int64, count=len(items)),
                      np.fromiter((c.share for c in items), float, count=len(items)),
                      FlatPaths.of_lengths(flat, lengths))
    return table, positions
