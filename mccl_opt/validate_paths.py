"""The validator's AllToAll checks, on chunk arrays (:mod:`mccl_opt.validate` calls them).

Every check of a path chunk is one numpy pass over a :class:`~mccl_opt.schedule_paths.PathTable`
(a schedule's own table, or one read in a single pass from chunk objects): the block ends
are two different GPUs, the path starts at ``src``, ends at ``dst`` and visits no node
twice (each path length's rows sorted at once), the share is positive and, in a rounded
schedule, a multiple of ``1/max_chunks``; the shares of every ordered GPU pair sum to 1
(paper §4.2: every block delivered).  Problems are reported as the per-chunk checks
reported them, chunk by chunk in order; messages past the 20 shown are counted, not
formatted.

Link loads are recomputed here with a link lookup of the validator's own (node ids ->
link index, from ``topo.links``), not with :func:`mccl_opt.schedule.share_loads`.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .schedule import Schedule
from .schedule_paths import PathTable, path_table
from .topology import Topology

__all__ = ["check_alltoall", "path_loads", "SHOWN"]

#: problems a validation error lists (the rest are counted)
SHOWN = 20
_UNSHOWN = "(not shown)"
#: node pairs of a dense hop -> link table (more: the hops' distinct pairs are looked up)
_DENSE_MAX = 1 << 24


def check_alltoall(topo: Topology, sched: Schedule, tol: float, problems: list[str]
                   ) -> tuple[int, PathTable]:
    """Check every chunk and block of an AllToAll ``sched``; returns the most steps of a
    path (hops into a GPU) and the chunks' table (for :func:`path_loads`)."""
    chunks = sched.chunks
    table, positions = path_table(chunks)
    ranks = {g: i for i, g in enumerate(topo.gpus)}
    rank = np.fromiter((ranks.get(v, -1) for v in table.node_ids), np.int64, count=len(table.node_ids))
    src, dst, shares = table.src, table.dst, table.shares
    ends_ok = (rank[src] >= 0) & (rank[dst] >= 0) & (src != dst)
    flat, first, lengths = table.paths.flat, table.paths.first, table.lengths
    starts_right, ends_right = _path_ends(flat, first, lengths, src, dst)
    flags = [~ends_ok,
             ends_ok & ~(starts_right & ends_right),
             ends_ok & _revisits(table),
             ends_ok & (shares <= 0)]
    k = sched.max_chunks
    if k:
        scaled = shares * k
        flags.append(ends_ok & ~(np.abs(scaled - np.round(scaled)) <= tol * max(1, k)))
    not_path = np.ones(len(chunks), bool)
    not_path[positions] = False
    _report_chunks(chunks, positions, not_path, flags, k, problems)

    g = len(topo.gpus)
    max_steps = _most_steps(flat, first, lengths, (rank >= 0).astype(np.int32), ends_ok)
    pair = rank[src[ends_ok]] * g + rank[dst[ends_ok]]
    totals = np.bincount(pair, weights=shares[ends_ok], minlength=g * g).reshape(g, g)
    off = ~np.eye(g, dtype=bool)
    for s, d in zip(*np.nonzero(off & (np.abs(totals - 1.0) > tol))):
        problems.append(f"block {topo.gpus[s]}->{topo.gpus[d]}: shares sum to "
                        f"{float(totals[s, d]):.9g}, not 1")
        if len(problems) > SHOWN:
            break
    return max_steps, table


def _most_steps(flat: np.ndarray, first: np.ndarray, lengths: np.ndarray, is_gpu: np.ndarray,
                which: np.ndarray) -> int:
    """The most hops into a GPU (steps, paper §4.2) on a path of the chunks ``which``."""
    some = np.flatnonzero(which & (lengths > 0))
    if some.size == 0:
        return 0
    on_gpu = is_gpu[flat]
    opens = first[:-1][lengths > 0]               # nonempty paths tile ``flat``
    steps = np.add.reduceat(on_gpu, opens) - on_gpu[opens]       # not the first node
    return int(steps[np.searchsorted(opens, first[some])].max())


def _path_ends(flat: np.ndarray, first: np.ndarray, lengths: np.ndarray, src: np.ndarray,
               dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per chunk, whether its path starts at ``src`` and whether it ends at ``dst``."""
    some = lengths > 0
    if flat.size == 0:
        return some, some
    head = flat[np.minimum(first[:-1], flat.size - 1)]
    tail = flat[np.maximum(first[1:] - 1, 0)]
    return some & (head == src), some & (tail == dst)


def _revisits(table: PathTable) -> np.ndarray:
    """Per chunk, whether its path lists a node twice (the paths of each length sorted as
    one matrix)."""
    out = np.zeros(len(table.paths), bool)
    for rows, nodes in table.paths.by_length(min_length=2):
        block = np.sort(nodes, axis=1)
        out[rows] = (block[:, 1:] == block[:, :-1]).any(axis=1)
    return out


def _report_chunks(chunks: Sequence, positions: np.ndarray, not_path: np.ndarray,
                   flags: list[np.ndarray], k: int | None, problems: list[str]) -> None:
    """The per-chunk problems in chunk order (each chunk's in check order), worded from
    the chunk itself; past :data:`SHOWN` only counted."""
    per_chunk = not_path.astype(np.int64)
    for f in flags:
        per_chunk[positions] += f
    total = int(per_chunk.sum())
    row_of = np.full(len(chunks), -1, np.int64)
    row_of[positions] = np.arange(positions.size)
    room = SHOWN + 1 - len(problems)
    shown = 0
    for i in np.flatnonzero(per_chunk).tolist():
        if shown >= room:
            break
        before = len(problems)
        _word(i, chunks[i], int(row_of[i]), flags, k, problems)
        shown += len(problems) - before
    problems.extend([_UNSHOWN] * (total - shown))


def _word(i: int, c, row: int, flags: list[np.ndarray], k: int | None, problems: list[str]) -> None:
    """The problems of chunk ``i`` (``row``: its table row, -1 for no path), as words."""
    if row < 0:
        problems.append(f"chunk {i}: an AllToAll chunk must be a path")
        return
    where = f"chunk {i} ({c.src}->{c.dst})"
    if flags[0][row]:
        problems.append(f"{where}: src and dst must be two different GPUs of the topology")
        return
    words = ["path must start at src and end at dst", "path visits a node twice",
             "share must be > 0", f"share {c.share} is not a multiple of 1/{k}"]
    problems.extend(f"{where}: {w}" for w, f in zip(words, flags[1:]) if f[row])


def path_loads(topo: Topology, table: PathTable, problems: list[str]) -> np.ndarray:
    """``L_a``: the shares crossing each link; a hop that is no link is a problem (the
    first five, sorted, are named) and loads nothing."""
    flat, lengths = table.paths.flat, table.lengths
    if flat.size == 0:
        return np.zeros(topo.num_links)
    n = len(table.node_ids)
    in_path = np.ones(flat.size - 1, bool)              # flat[i] -> flat[i+1] is a hop
    in_path[(np.cumsum(lengths) - 1)[(lengths > 0)][:-1]] = False
    hops = (flat[:-1] * n + flat[1:])[in_path]
    hop_share = np.repeat(table.shares, np.maximum(lengths - 1, 0))
    link = _hop_links(topo, table.node_ids, hops)
    bad = link < 0
    if bad.any():
        keys = np.unique(hops[bad])
        ids = table.node_ids
        missing = sorted((ids[u], ids[v]) for u, v in zip((keys // n).tolist(), (keys % n).tolist()))
        problems.extend(f"hop {u} -> {v} is not a link of the topology" for u, v in missing[:5])
    return np.bincount(link[~bad], weights=hop_share[~bad], minlength=topo.num_links)


def _hop_links(topo: Topology, node_ids: Sequence[str], hops: np.ndarray) -> np.ndarray:
    """The link index of every hop ``node_ids[u] -> node_ids[v]``, given as ``u * n + v``
    (``n`` node ids; -1: no link), from a node-pair table of ``topo.links`` (dense when
    small, else per distinct hop)."""
    n = len(node_ids)
    index = {v: i for i, v in enumerate(node_ids)}
    link_of: dict[int, int] = {}
    for a, lk in enumerate(topo.links):
        u, v = index.get(lk.src), index.get(lk.dst)
        if u is not None and v is not None:
            link_of[u * n + v] = a
    if n * n <= _DENSE_MAX:
        dense = np.full(n * n, -1, np.int32)
        dense[np.fromiter(link_of, np.int64, len(link_of))] = np.fromiter(link_of.values(), np.int32, len(link_of))
        return dense[hops]
    keys, inverse = np.unique(hops, return_inverse=True)
    found = np.fromiter((link_of.get(key, -1) for key in keys.tolist()), np.int64, count=keys.size)
    return found[inverse.ravel()]
