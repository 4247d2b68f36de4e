"""Chunk repair: move single chunks off the links a rounding overloads (paper §4.2).

On a degenerate LP optimum (HPN after degradations: 130 links saturated at exactly
560 chunks) largest-remainder and balanced rounding leave a few links one chunk over
the LP's load (561), a 0.18 % gap that the deep dive closed, when it did, with
1,000-2,600 dual pivots a step (docs/alltoall.md, *Chunk repair*).  The repair
re-routes one chunk at a time from an overloaded link onto a shortest path (step bound
respected) that crosses only links with room for one more chunk at the LP's ``t``, or
over one full link that another chunk then leaves (a two-move chain); new paths join
the master's pool.  It succeeds only when no link is left above the LP's
load, so the repaired schedule's rate is the LP rate: optimal, certified by the LP bound.
"""

from __future__ import annotations

import numpy as np

from .master import RestrictedMaster
from .pricing import price_sources
from .problem import Problem

__all__ = ["repair_overloads", "REPAIR_MAX_LINKS"]

#: The repair is tried only when at most this many links are over the LP's load (each
#: needs a few single-source shortest-path passes; a bad rounding is the dive's job).
REPAIR_MAX_LINKS = 64

#: ... and on at most this many GPUs: the moves are found one pair at a time (with a
#: step bound each search also allocates GPUs^2 arrays, :func:`.pricing.price_sources`).
REPAIR_MAX_GPUS = 256

#: Path searches one repair may run (the fuzz_loop jobs it repairs took 400-1,100).
REPAIR_MAX_SEARCHES = 2000

_BLOCKED = 1e12         # the price of a full link that may not be crossed
_FULL = 1e6             # the price of a full link that may be crossed (then relieved)

#: Chunk moves a relief may chain (each over a full link the next one relieves).
CHAIN_DEPTH = 1

#: Full links tried per chunk as the middle of a two-move chain.
CHAIN_TRIES = 4


def repair_overloads(master: RestrictedMaster, prob: Problem, counts: np.ndarray, k: int,
                     max_steps: int, lp_t: float,
                     background: np.ndarray | None = None) -> np.ndarray | None:
    """Chunk counts per pool column with no link above the LP's load (``cap_a·t·K``
    chunks at the LP's ``t``, ``background`` share loads included), from ``counts`` by
    single-chunk moves onto new or pool paths of the same pair; ``None`` when an
    overloaded link cannot be relieved (or more than :data:`REPAIR_MAX_LINKS` are
    over).  New paths are added to ``master`` (their LP shares stay 0), so the result
    is indexed by the grown pool."""
    pool = master.pool
    cap = master.capacity
    load = pool.loads(counts.astype(float), cap.size)
    if background is not None:
        load = load + background * k
    limit = cap * lp_t * k * (1 + 1e-9) + 1e-9
    over = np.flatnonzero(load > limit)
    if over.size == 0 or over.size > REPAIR_MAX_LINKS or prob.num_gpus > REPAIR_MAX_GPUS:
        return None
    fix = _Fix(master, prob, counts.astype(np.int64).copy(), load, limit, max_steps)
    if not fix.relieve_all(over):
        return None
    return _with_moved(master, fix.counts, fix.moved)


class _Fix:
    """The repair's state: chunk counts, link loads (chunks), the moved chunks' paths."""

    def __init__(self, master: RestrictedMaster, prob: Problem, counts: np.ndarray,
                 load: np.ndarray, limit: np.ndarray, max_steps: int) -> None:
        self.pool, self.prob, self.counts, self.load, self.limit = \
            master.pool, prob, counts, load, limit
        self.max_steps = max_steps
        cols = self.pool.column_of_arc()
        order = np.argsort(self.pool.arcs, kind="stable")
        self.by_arc = cols[order]                            # columns crossing each link
        self.arc_start = np.searchsorted(self.pool.arcs[order], np.arange(load.size + 1))
        self.stuck = np.zeros((CHAIN_DEPTH + 1, load.size), dtype=bool)  # not relievable
        self.moved: list[tuple[int, np.ndarray]] = []     # (pair, arcs) of each chunk moved
        self.searches = REPAIR_MAX_SEARCHES

    def relieve_all(self, over: np.ndarray) -> bool:
        """Bring every link of ``over`` to at most its limit, no other link past it."""
        for a in over:
            while self.load[a] > self.limit[a]:
                if not self.relieve(int(a), CHAIN_DEPTH):
                    return False
        return True

    def relieve(self, a: int, depth: int) -> bool:
        """Move one chunk off link ``a`` onto a path with room on every link; else, with
        ``depth > 0``, onto a path over one full link ``b`` that is then relieved in
        turn with ``depth - 1`` (at most :data:`CHAIN_TRIES` such links ``b`` per chunk)."""
        if self.stuck[depth, a]:
            return False
        on_a = np.unique(self.by_arc[self.arc_start[a]:self.arc_start[a + 1]])
        on_a = on_a[self.counts[on_a] > 0]
        if self._direct(on_a):
            return True
        for j in on_a if depth else ():
            if self.counts[j] > 0 and self._move_chunk(int(j), depth):
                return True
        self.stuck[depth, a] = True
        return False

    def _direct(self, cols: np.ndarray) -> bool:
        """Move a chunk of one of ``cols`` onto a path with room on every link."""
        if self.max_steps < self.prob.graph.n_nodes - 1:     # a step bound: path by path
            return any(self.counts[j] > 0 and self._move_chunk(int(j), 0) for j in cols)
        from ._kernels import direct_relief

        if self.searches <= 0:
            return False
        graph = self.prob.graph
        pair = self.pool.pair[cols]
        self.searches -= cols.size
        j, arcs = direct_relief(cols.astype(np.int64), self.counts, self.pool.start,
                                self.pool.arcs, graph.gpu_nodes[self.prob.pair_src[pair]],
                                graph.gpu_nodes[self.prob.pair_dst[pair]], self.load,
                                self.limit, graph.n_nodes, graph.tail, graph.head, _BLOCKED)
        if j < 0:
            return False
        self._move(int(j), self.pool.path(int(j)), arcs)
        return True

    def _move_chunk(self, j: int, depth: int) -> bool:
        """Move one chunk of column ``j``: onto a path with room everywhere, or (with
        ``depth > 0``) over one full link that is then relieved."""
        path = self.pool.path(j)
        load = self.load.copy()
        load[path] -= 1.0
        full = load + 1.0 > self.limit
        skip = self.stuck[depth - 1].copy() if depth else None
        for _ in range(CHAIN_TRIES if depth else 1):
            arcs, over = self._path(int(self.pool.pair[j]), load, full, skip)
            if arcs is None:
                return False
            self._move(j, path, arcs)
            if over < 0:
                return True
            if self.relieve(over, depth - 1):
                return True
            self._undo(j, path, arcs)
            skip[over] = True
        return False

    def _path(self, p: int, load: np.ndarray, full: np.ndarray, skip: np.ndarray | None
              ) -> tuple[np.ndarray | None, int]:
        """A shortest path of pair ``p`` crossing no full link (with ``skip``: at most
        one, not in ``skip``), preferring less loaded links; ``(arcs, the full link
        crossed or -1)``, ``(None, -1)`` when there is none or the searches are spent."""
        if self.searches <= 0:
            return None, -1
        self.searches -= 1
        price = 1.0 + load / np.maximum(self.limit, 1.0)
        price[full] = _BLOCKED if skip is None else _FULL
        if skip is not None:
            price[full & skip] = _BLOCKED
        graph = self.prob.graph
        s, d = graph.gpu_nodes[self.prob.pair_src[p]], graph.gpu_nodes[self.prob.pair_dst[p]]
        if self.max_steps >= graph.n_nodes - 1:
            from ._kernels import cheapest_path

            cost, arcs = cheapest_path(graph.n_nodes, graph.tail, graph.head, price, s, d)
        else:                               # a step bound: the pricing kernel's levels
            g = graph.num_gpus
            rs, rd = int(self.prob.pair_src[p]), int(self.prob.pair_dst[p])
            want = np.zeros((g, g), dtype=np.bool_)
            want[rs, rd] = True
            found = price_sources(graph, price, np.array([rs], dtype=np.int64),
                                  self.max_steps, want)
            cost = found.shortest[rs, rd] if found.count else np.inf
            arcs = found.arcs[found.start[0]:found.start[-1]]
        if not cost < 2 * _FULL:
            return None, -1
        crossed = arcs[full[arcs]]
        return arcs, (int(crossed[0]) if crossed.size else -1)

    def _move(self, j: int, path: np.ndarray, arcs: np.ndarray) -> None:
        self.counts[j] -= 1
        self.load[path] -= 1.0
        self.load[arcs] += 1.0
        self.moved.append((int(self.pool.pair[j]), arcs))

    def _undo(self, j: int, path: np.ndarray, arcs: np.ndarray) -> None:
        self.counts[j] += 1
        self.load[path] += 1.0
        self.load[arcs] -= 1.0
        self.moved.pop()


def _with_moved(master: RestrictedMaster, counts: np.ndarray,
                moved: list[tuple[int, np.ndarray]]) -> np.ndarray:
    """``counts`` plus one chunk on each moved path: an identical pool column when there
    is one, else a new column added to ``master``."""
    pool = master.pool
    for p, arcs in moved:
        same = np.flatnonzero(pool.pair == p)
        hit = [int(j) for j in same if np.array_equal(pool.path(int(j)), arcs)]
        if hit:
            counts[hit[0]] += 1
            continue
        master.add(np.array([p], dtype=np.int64), np.array([0, arcs.size], dtype=np.int64),
                   arcs.astype(np.int64))
        counts = np.concatenate([counts, np.zeros(len(pool) - counts.size, dtype=np.int64)])
        counts[-1] += 1
    return counts
