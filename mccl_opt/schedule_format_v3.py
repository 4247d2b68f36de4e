"""AllToAll schedule files as columns: ``mccl-schedule/3`` (written) and the AllToAll
chunks of ``mccl-schedule/2`` read into a :class:`~mccl_opt.schedule_paths.PathTable`.

An AllToAll chunk's path is almost never shared (it ends at its own pair's GPU), so the
path table of ``mccl-schedule/2`` only adds a list per path: at 1024 GPUs (a million
chunks) its million small lists cost 3 s of JSON parsing alone.  ``mccl-schedule/3``
stores the chunks as five flat lists instead (docs/modelling.md, "Schedules")::

    "nodes": ["s0h0nvs", ...],                # node index i: gpus[i], else nodes[i - len(gpus)]
    "chunks": {"src": [..], "dst": [..],      # node index of each chunk's block ends
               "share": [..],                 # fraction of the block each chunk carries
               "path_length": [..],           # nodes on each chunk's path (>= 2)
               "path_nodes": [..]}            # all paths' node indices, one after another

Everything else is as in ``mccl-schedule/2``.  AllGather schedules stay
``mccl-schedule/2`` (their trees share paths, which that format stores once).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .errors import ScheduleError
from .schedule_chunks import FlatPaths, path_nodes
from .schedule_format import as_list, number, v2_parts
from .schedule_paths import PathTable

__all__ = ["FORMAT_V3", "COLUMNS", "pack_v3", "unpack_v3", "unpack_v2_paths"]

FORMAT_V3 = "mccl-schedule/3"
#: the columns of a ``mccl-schedule/3`` ``chunks`` object
COLUMNS = ("src", "dst", "share", "path_length", "path_nodes")


def pack_v3(gpus: Sequence[str], table: PathTable) -> dict[str, Any]:
    """The ``nodes`` and ``chunks`` entries of ``table``'s ``mccl-schedule/3`` file
    (nodes other than GPUs numbered in table order)."""
    rank = {g: i for i, g in enumerate(gpus)}
    number_of = np.fromiter((rank.get(v, -1) for v in table.node_ids), np.int64,
                            count=len(table.node_ids))
    flat = table.paths.flat
    used = np.zeros(len(table.node_ids), bool)
    for part in (table.src, table.dst, flat):
        used[part] = True
    extra = np.flatnonzero(used & (number_of < 0))
    number_of[extra] = len(gpus) + np.arange(extra.size)
    return {"nodes": [table.node_ids[k] for k in extra.tolist()],
            "chunks": {"src": number_of[table.src].tolist(), "dst": number_of[table.dst].tolist(),
                       "share": table.shares.tolist(), "path_length": table.lengths.tolist(),
                       "path_nodes": number_of[flat].tolist()}}


def unpack_v3(data: Mapping[str, Any], gpus: Sequence[str]) -> PathTable:
    """The chunks of a ``mccl-schedule/3`` dictionary, every column checked in bulk (a bad
    entry is named: ``chunks.src[7]``)."""
    nodes = _node_table(data, gpus)
    raw = data["chunks"]
    if not isinstance(raw, Mapping) or not set(COLUMNS) <= set(raw):
        raise ScheduleError(f"'chunks' must be an object with the lists {list(COLUMNS)}")
    cols = {c: as_list(raw[c], f"chunks.{c}") for c in COLUMNS}
    n = len(cols["src"])
    for c in COLUMNS[1:4]:
        if len(cols[c]) != n:
            raise ScheduleError(f"'chunks.{c}' has {len(cols[c])} entries, 'chunks.src' {n}")
    size = len(nodes)
    src = _ints(cols["src"], 0, size, "chunks.src")
    dst = _ints(cols["dst"], 0, size, "chunks.dst")
    lengths = _ints(cols["path_length"], 2, None, "chunks.path_length")
    if len(cols["path_nodes"]) != lengths.sum():
        raise ScheduleError(f"'chunks.path_nodes' has {len(cols['path_nodes'])} entries, "
                            f"the path lengths add up to {int(lengths.sum())}")
    flat = _ints(cols["path_nodes"], 0, size, "chunks.path_nodes")
    return _table(nodes, src, dst, _floats(cols["share"], "chunks.share"),
                  FlatPaths.of_lengths(flat, lengths))


def unpack_v2_paths(data: Mapping[str, Any], gpus: Sequence[str]) -> PathTable:
    """The AllToAll chunks of a ``mccl-schedule/2`` dictionary as a table (each chunk's
    path gathered from the path list; checked as the tuple reader checks them)."""
    nodes, raw_paths, rows = v2_parts(data, True, gpus)
    cols = list(zip(*rows)) if rows else [()] * 4
    src = _ints(list(cols[0]), 0, len(nodes), "chunks[].src", rows=True)
    dst = _ints(list(cols[1]), 0, len(nodes), "chunks[].dst", rows=True)
    shares = _floats(list(cols[2]), "chunks[].share", rows=True)
    path = _ints(list(cols[3]), 0, len(raw_paths), "chunks[].path", rows=True)
    lengths, flat = path_nodes(FlatPaths.of_tuples(raw_paths), path)
    return _table(nodes, src, dst, shares, FlatPaths.of_lengths(flat, lengths))


def _node_table(data: Mapping[str, Any], gpus: Sequence[str]) -> list[str]:
    extra = as_list(data.get("nodes", []), "nodes")
    if not all(isinstance(v, str) for v in extra):
        raise ScheduleError("'nodes' must be a list of node ids")
    return list(gpus) + extra


def _table(nodes: list[str], src: np.ndarray, dst: np.ndarray, shares: np.ndarray,
           paths: FlatPaths) -> PathTable:
    """The table, a node id listed twice (a GPU again in ``nodes``) given one index."""
    distinct = list(dict.fromkeys(nodes))
    if len(distinct) < len(nodes):
        where = {v: i for i, v in enumerate(distinct)}
        canon = np.fromiter(map(where.__getitem__, nodes), np.int64, count=len(nodes))
        src, dst, paths = canon[src], canon[dst], FlatPaths(canon[paths.flat], paths.first)
    return PathTable(distinct, src, dst, shares, paths)


def _where(name: str, i: int, rows: bool) -> str:
    """``chunks.src[7]``, or for a list of chunk rows ``chunks[7] src``."""
    return f"chunks[{i}] {name.split('.')[1]}" if rows else f"{name}[{i}]"


def _ints(col: list, low: int, size: int | None, name: str, rows: bool = False) -> np.ndarray:
    """``col`` as an int64 array, every entry an integer in ``low..size-1`` (no upper
    bound when ``size`` is None); else the first bad entry is named."""
    arr = None
    if not col:
        return np.zeros(0, np.int64)
    if set(map(type, col)) == {int}:
        try:
            arr = np.array(col, np.int64)
        except OverflowError:
            arr = None
    if arr is not None and arr.min() >= low and (size is None or arr.max() < size):
        return arr
    top = "" if size is None else f"..{size - 1}"
    for i, v in enumerate(col):
        if type(v) is not int or v < low or (size is not None and v >= size):
            raise ScheduleError(f"'{_where(name, i, rows)}' must be an integer "
                                f"{'index in ' if size is not None else '>= '}{low}{top}, got {str(v)[:40]}")
    raise ScheduleError(f"'{name}' holds an integer beyond 64 bits")


def _floats(col: list, name: str, rows: bool = False) -> np.ndarray:
    """``col`` as a float array of finite numbers; else the first bad entry is named."""
    if set(map(type, col)) <= {float, int}:
        try:
            arr = np.array(col, float)
        except OverflowError:               # an int beyond float range
            arr = None
        if arr is not None and np.isfinite(arr).all():
            return arr
    for i, v in enumerate(col):
        number(v, _where(name, i, rows))
    raise ScheduleError(f"'{name}' must hold finite numbers")
