"""The schedule file formats: ``mccl-schedule/2`` (written for AllGather) and
``mccl-schedule/1`` (read).  AllToAll schedules are written as ``mccl-schedule/3``
(columns, :mod:`.schedule_format_v3`, which also reads the AllToAll chunks of ``/2``).

Both are documented in docs/architecture.md ("Schedule files").  ``mccl-schedule/1`` spells
every chunk out (an AllGather tree repeats the node ids of each of its edges), so a
512-GPU AllGather schedule is tens of MB and takes seconds to write and parse.
``mccl-schedule/2`` stores each distinct node path once and refers to it by index:

* node index ``i`` is ``gpus[i]`` for ``i < len(gpus)``, else ``nodes[i - len(gpus)]``;
* ``paths``: the distinct paths, as lists of node indices;
* AllToAll ``chunks``: ``[src, dst, share, path]`` (node, node, float, path index);
* AllGather ``trees``: the distinct trees, as lists of path indices (one per edge), and
  ``chunks``: ``[src, share, tree]`` (node, float, tree index).

Everything else (rates, ``bottleneck``, ``version``, ``solver``, ``stats``) is as in
``mccl-schedule/1``.  This module converts between a format's dictionary and plain chunk
tuples — ``(src, dst, share, path)`` or ``(src, share, edges)`` — and raises
:class:`~mccl_opt.errors.ScheduleError` naming the bad entry.
"""

from __future__ import annotations

import math
from itertools import chain
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .errors import ScheduleError
from .schedule_chunks import TreeTable, path_nodes

__all__ = ["FORMAT_V1", "FORMAT_V2", "FORMATS", "pack_v1", "pack_v2", "pack_v2_table", "unpack_chunks",
           "unpack_tree_table", "v2_parts",
           "as_list", "number", "read_bottleneck", "version_number", "as_object", "jsonable"]

FORMAT_V1 = "mccl-schedule/1"
FORMAT_V2 = "mccl-schedule/2"
FORMATS = (FORMAT_V1, FORMAT_V2)

PathTuple = tuple[str, ...]
#: ``(src, dst, share, path)`` for AllToAll, ``(src, share, edges)`` for AllGather
ChunkTuple = tuple


# ---------------------------------------------------------------------- writing
def pack_v1(alltoall: bool, chunks: Iterable[ChunkTuple]) -> list[dict[str, Any]]:
    """``mccl-schedule/1`` ``chunks``: every path spelled out."""
    if alltoall:
        return [{"src": s, "dst": d, "share": float(f), "path": list(p)} for s, d, f, p in chunks]
    return [{"src": s, "share": float(f), "edges": [{"path": list(e)} for e in edges]}
            for s, f, edges in chunks]


def pack_v2(gpus: Sequence[str], chunks: Sequence[ChunkTuple]) -> dict[str, Any]:
    """``mccl-schedule/2`` tables of AllGather tree tuples: ``{"trees", "nodes", "paths",
    "chunks"}`` (AllToAll schedules are written as ``mccl-schedule/3``,
    :mod:`.schedule_format_v3`)."""
    index: dict[str, int] = {g: i for i, g in enumerate(gpus)}
    extra: list[str] = []
    path_ids: dict[PathTuple, int] = {}
    paths: list[list[int]] = []

    def node(v: str) -> int:
        i = index.get(v)
        if i is None:
            i = index[v] = len(index)
            extra.append(v)
        return i

    def path(p: PathTuple) -> int:
        k = path_ids.get(p)
        if k is None:
            k = path_ids[p] = len(paths)
            ids = list(map(index.get, p))
            paths.append(ids if None not in ids else [node(v) for v in p])
        return k

    tree_ids: dict[tuple[int, ...], int] = {}
    trees: list[list[int]] = []
    rows = []
    for p in dict.fromkeys(chain.from_iterable(edges for _, _, edges in chunks)):
        path(p)                                     # every edge path numbered first
    for s, f, edges in chunks:
        key = tuple(map(path_ids.__getitem__, edges))
        t = tree_ids.get(key)
        if t is None:
            t = tree_ids[key] = len(trees)
            trees.append(list(key))
        rows.append([node(s), float(f), t])
    return {"trees": trees, "nodes": extra, "paths": paths, "chunks": rows}


def pack_v2_table(gpus: Sequence[str], table: TreeTable) -> dict[str, Any] | None:
    """:func:`pack_v2` of the AllGather trees of ``table``, from its arrays (the same
    dictionary, without a node-id tuple per edge); ``None`` if a tree's root is no GPU."""
    n = len(gpus)
    rank = {g: i for i, g in enumerate(gpus)}
    node_ids = table.node_ids
    node_rank = np.fromiter((rank.get(v, -1) for v in node_ids), np.int64, count=len(node_ids))
    src = node_rank[table.src]
    if (src < 0).any():
        return None
    flat = table.edges.ravel()
    uniq, first = np.unique(flat, return_index=True)
    used = uniq[np.argsort(first, kind="stable")]               # paths in first-use order
    lens, nodes = path_nodes(table.paths, used)
    extra = nodes[node_rank[nodes] < 0]
    found, at = np.unique(extra, return_index=True)
    extra = found[np.argsort(at, kind="stable")]                # switches in first-use order
    number = node_rank.copy()
    number[extra] = n + np.arange(extra.size)
    same = _first_equal_paths(number[nodes], lens)            # equal node lists: one path
    keep = np.flatnonzero(same == np.arange(same.size))
    path_id = np.full(len(table.paths), -1, np.int64)
    path_id[used] = np.searchsorted(keep, same)
    starts = np.cumsum(lens) - lens
    file_nodes = number[nodes].tolist()
    paths = [file_nodes[a:a + b] for a, b in zip(starts[keep].tolist(), lens[keep].tolist())]
    tree_of, firsts = _first_equal_rows(path_id[table.edges])
    return {"trees": path_id[table.edges[firsts]].tolist(),
            "nodes": [node_ids[v] for v in extra.tolist()], "paths": paths,
            "chunks": [list(c) for c in zip(src.tolist(), map(float, table.shares.tolist()),
                                            tree_of.tolist())]}


def _first_equal_paths(nodes: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Per path (``lens`` nodes each, concatenated in ``nodes``), the first path with the
    same nodes."""
    out = np.arange(lens.size)
    starts = np.cumsum(lens) - lens
    for length in np.unique(lens).tolist():
        members = np.flatnonzero(lens == length)
        block = nodes[starts[members][:, None] + np.arange(length)]
        _, first, inverse = np.unique(block, axis=0, return_index=True, return_inverse=True)
        out[members] = members[first[inverse.ravel()]]
    return out


def _first_equal_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(class of every row, first row of every class)``: equal rows form one class,
    classes numbered in order of first row.  Rows are hashed by blocks (bounded memory)
    and rows of equal hash compared."""
    weights = np.random.default_rng(0).integers(1, 2**62, rows.shape[1], dtype=np.int64)
    hashes = np.empty(rows.shape[0], np.int64)
    for lo in range(0, rows.shape[0], 1024):
        hashes[lo:lo + 1024] = (rows[lo:lo + 1024].astype(np.int64) * weights).sum(axis=1)
    firsts: list[int] = []
    seen: dict[int, list[int]] = {}
    tree_of = np.empty(rows.shape[0], np.int64)
    for r, h in enumerate(hashes.tolist()):
        for c in seen.get(h, ()):
            if np.array_equal(rows[firsts[c]], rows[r]):
                tree_of[r] = c
                break
        else:
            seen.setdefault(h, []).append(len(firsts))
            tree_of[r] = len(firsts)
            firsts.append(r)
    return tree_of, np.array(firsts, np.int64)


# ---------------------------------------------------------------------- reading
def unpack_chunks(data: Mapping[str, Any], alltoall: bool, gpus: Sequence[str]) -> list[ChunkTuple]:
    """The chunk tuples of a ``mccl-schedule/1`` dictionary, or of a ``/2`` one's AllGather
    trees (``format`` checked by the caller; AllToAll chunks of ``/2`` and ``/3`` are read
    as arrays, :mod:`.schedule_format_v3`)."""
    if data.get("format") == FORMAT_V2 and not alltoall:
        return _unpack_v2_trees(data, gpus)
    return _unpack_v1(as_list(data["chunks"], "chunks"), alltoall)


def _unpack_v1(raw: list, alltoall: bool) -> list[ChunkTuple]:
    out: list[ChunkTuple] = []
    for i, c in enumerate(raw):
        where = f"chunks[{i}]"
        if not isinstance(c, Mapping):
            raise ScheduleError(f"{where} must be an object")
        share = number(c.get("share"), f"{where}.share")
        if alltoall:
            p = _path(c.get("path"), f"{where}.path")
            out.append((str(c.get("src", p[0])), str(c.get("dst", p[-1])), share, p))
        else:
            edges = tuple(_path(e.get("path") if isinstance(e, Mapping) else None, f"{where}.edges[{j}].path")
                          for j, e in enumerate(as_list(c.get("edges"), f"{where}.edges")))
            if "src" not in c:
                raise ScheduleError(f"{where} lacks 'src'")
            out.append((str(c["src"]), share, edges))
    return out


def _unpack_v2_trees(data: Mapping[str, Any], gpus: Sequence[str]) -> list[ChunkTuple]:
    table, raw_paths, rows = v2_parts(data, False, gpus)
    paths = _named(raw_paths, table)
    trees = _named(_v2_trees(data, len(paths)), paths)
    src, share, tree = _columns(rows, 3)
    return list(zip(_column(src, table, "src"), _shares(share), _column(tree, trees, "tree")))


def unpack_tree_table(data: Mapping[str, Any], gpus: Sequence[str]) -> TreeTable | None:
    """The AllGather trees of a ``mccl-schedule/2`` dictionary as a :class:`TreeTable`
    (no tuple per tree edge), checked as :func:`unpack_chunks` checks them; ``None`` for
    another format, no chunks, or trees of different edge counts (read those as tuples)."""
    if data.get("format") != FORMAT_V2:
        return None
    table, raw_paths, rows = v2_parts(data, False, gpus)
    raw_trees = _v2_trees(data, len(raw_paths))
    if not rows or len(set(map(len, raw_trees))) != 1:
        return None
    src, share, tree = _columns(rows, 3)
    src = _column(src, range(len(table)), "src")
    shares = _shares(share)
    tree = _column(tree, range(len(raw_trees)), "tree")
    edges = np.array(raw_trees, np.int64)[np.array(tree, np.int64)]
    return TreeTable(tuple(table), list(map(tuple, raw_paths)), np.array(src, np.int64),
                     np.array(shares, float), edges)


def v2_parts(data: Mapping[str, Any], alltoall: bool, gpus: Sequence[str]
              ) -> tuple[list[str], list, list]:
    """The node table, the checked path lists (node indices) and the chunk rows."""
    extra = as_list(data.get("nodes", []), "nodes")
    if not all(isinstance(v, str) for v in extra):
        raise ScheduleError("'nodes' must be a list of node ids")
    table = list(gpus) + extra
    raw_paths = as_list(data.get("paths"), "paths")
    _check_index_lists(raw_paths, len(table), "paths", 2)
    rows = as_list(data["chunks"], "chunks")
    width = 4 if alltoall else 3
    if not all(isinstance(r, list) and len(r) == width for r in rows):
        bad = next(i for i, r in enumerate(rows) if not (isinstance(r, list) and len(r) == width))
        form = "[src, dst, share, path]" if alltoall else "[src, share, tree]"
        raise ScheduleError(f"'chunks[{bad}]' must be a list {form}")
    return table, raw_paths, rows


def _v2_trees(data: Mapping[str, Any], num_paths: int) -> list:
    """The checked tree lists (path indices)."""
    raw_trees = as_list(data.get("trees"), "trees")
    _check_index_lists(raw_trees, num_paths, "trees", 0)
    return raw_trees


def _columns(rows: list, width: int) -> list[tuple]:
    return list(zip(*rows)) if rows else [()] * width


def _column(col: tuple, table: Sequence, what: str) -> list:
    """``[table[i] for i in col]``: the ``what`` index of every chunk, checked in bulk."""
    if col and not (set(map(type, col)) == {int} and 0 <= min(col) and max(col) < len(table)):
        for i, v in enumerate(col):
            _lookup(v, table, f"chunks[{i}] {what}")
    return list(map(table.__getitem__, col))


def _shares(col: tuple) -> list[float]:
    try:
        if set(map(type, col)) <= {float, int} and all(map(math.isfinite, col)):
            return list(map(float, col))
    except OverflowError:                       # an int beyond float range
        pass
    return [number(f, f"chunks[{i}] share") for i, f in enumerate(col)]


def _check_index_lists(lists: list, size: int, name: str, min_len: int) -> None:
    """Every ``v`` of ``lists`` a list of at least ``min_len`` integers in ``0..size-1``;
    checked in bulk, then the first bad entry is named."""
    flat = list(chain.from_iterable(v for v in lists if isinstance(v, list)))
    ok = (all(isinstance(v, list) and len(v) >= min_len for v in lists)
          and (not flat or (set(map(type, flat)) == {int} and 0 <= min(flat) and max(flat) < size)))
    if not ok:
        for k, v in enumerate(lists):
            if not isinstance(v, list) or len(v) < min_len:
                raise ScheduleError(f"'{name}[{k}]' must be a list of at least {min_len} indices")
            if v and not (set(map(type, v)) == {int} and 0 <= min(v) and max(v) < size):
                raise ScheduleError(f"'{name}[{k}]' must hold integer indices in 0..{size - 1}")


def _named(lists: list, table: Sequence) -> list[tuple]:
    """``[tuple(table[i] for i in v) for v in lists]`` (indices checked)."""
    get = table.__getitem__
    return [tuple(map(get, v)) for v in lists]


def _lookup(i: Any, table: Sequence, where: str) -> Any:
    if type(i) is not int or not 0 <= i < len(table):
        raise ScheduleError(f"'{where}' must be an integer index in 0..{len(table) - 1}, got {str(i)[:40]}")
    return table[i]


# ---------------------------------------------------------------------- field checks
def as_list(v: Any, where: str) -> list:
    if not isinstance(v, list):
        raise ScheduleError(f"'{where}' must be a list")
    return v


def number(v: Any, where: str) -> float:
    try:
        ok = not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)
    except OverflowError:                       # an int beyond float range
        ok = False
    if not ok:
        raise ScheduleError(f"'{where}' must be a finite number, got {str(v)[:40]}")
    return float(v)


def read_bottleneck(entries: Any) -> list[tuple[str, str, float, float]]:
    """A schedule file's ``bottleneck`` as ``(src, dst, chunks, base_slack)``: each entry a link (``src``, ``dst`` strings) once,
    ``chunks`` >= 0 and ``base_slack`` in [0, 1] (the fraction of a capacity left unused);
    a list as ``src`` was read as its text, a slack of 7 or -3 as given."""
    out: list[tuple[str, str, float, float]] = []
    seen: set[tuple[str, str]] = set()
    for i, b in enumerate(as_list(entries, "bottleneck")):
        if not isinstance(b, Mapping) or not {"src", "dst"} <= set(b):
            raise ScheduleError(f"bottleneck[{i}] needs 'src' and 'dst'")
        if not isinstance(b["src"], str) or not isinstance(b["dst"], str):
            raise ScheduleError(f"bottleneck[{i}]: 'src' and 'dst' must be node ids (strings)")
        chunks = number(b.get("chunks", 0), f"bottleneck[{i}].chunks")
        slack = number(b.get("base_slack", 0.0), f"bottleneck[{i}].base_slack")
        if chunks < 0 or not 0.0 <= slack <= 1.0:
            raise ScheduleError(f"bottleneck[{i}]: 'chunks' must be >= 0 and 'base_slack' (the capacity left "
                                f"unused) in [0, 1], got {chunks:.6g} and {slack:.6g}; the file is corrupt or edited")
        if (b["src"], b["dst"]) in seen:
            raise ScheduleError(f"bottleneck[{i}]: the link {b['src'][:40]!r} -> {b['dst'][:40]!r} is listed twice")
        seen.add((b["src"], b["dst"]))
        out.append((b["src"], b["dst"], chunks, slack))
    return out


def version_number(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 2**63:
        raise ScheduleError(f"'version' must be a non-negative integer, got {str(v)[:40]}")
    return v


def as_object(v: Any, where: str) -> dict:
    if not isinstance(v, Mapping):
        raise ScheduleError(f"'{where}' must be an object, got {type(v).__name__}")
    return dict(v)


def _path(v: Any, where: str) -> PathTuple:
    if not isinstance(v, list) or len(v) < 2 or not all(isinstance(x, str) for x in v):
        raise ScheduleError(f"'{where}' must be a list of at least two node ids")
    return tuple(v)


def jsonable(obj: Any) -> Any:
    """``obj`` with numpy scalars and arrays as plain Python values."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return obj
