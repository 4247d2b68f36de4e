"""Compiled Dinic max-flow on integer capacities with a reusable network.

The network is fixed once (:class:`FlowNetwork`: nodes, arcs, CSR residual adjacency);
each call takes a capacity vector, so the many max-flow calls of ForestColl's phases
(paper §4.3) reuse the same arrays.  Two extra nodes are always present: a super-source
``s = n`` and a super-sink ``T = n + 1``, with one auxiliary arc ``s -> v`` and one
``v -> T`` per real node ``v``.  Their capacities express the rooted test of Phase 1
(``s -> gpu`` of capacity x) and "force node v onto the source / sink side" (``INF``).
The scans over sinks (one ``g -> T`` opened at a time) build one flow from scratch and
repair it from each sink to the next instead of restarting (:func:`_move_sink`).

Kernels are ``numba.njit(cache=True)`` and compile on first use.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .sweep_spans import spans as _spans

__all__ = ["FlowNetwork", "INF"]

INF = np.int64(1) << np.int64(60)


@njit(cache=True)
def _bfs_levels(n_tot, start, arcs, head, res, s, t, level, queue):
    """BFS levels from ``s`` over arcs with residual capacity; return whether ``t`` is
    reached.  Stops as soon as ``t`` is labelled (Dinic uses no level beyond it);
    ``t = -1`` labels everything reachable."""
    for i in range(n_tot):
        level[i] = -1
    level[s] = 0
    qh = 0
    qt = 1
    queue[0] = s
    while qh < qt:
        u = queue[qh]
        qh += 1
        for p in range(start[u], start[u + 1]):
            a = arcs[p]
            if res[a] > 0:
                v = head[a]
                if level[v] < 0:
                    level[v] = level[u] + 1
                    if v == t:
                        return True
                    queue[qt] = v
                    qt += 1
    return False


@njit(cache=True)
def _dinic(n_tot, start, arcs, head, res, s, t, limit, level, queue, it, path):
    """Max-flow ``s -> t`` on residual capacities ``res`` (modified in place), stopping
    once ``limit`` units are routed.  Reverse of residual arc ``a`` is ``a ^ 1``."""
    total = 0
    while total < limit and _bfs_levels(n_tot, start, arcs, head, res, s, t, level, queue):
        for i in range(n_tot):
            it[i] = start[i]
        while total < limit:
            depth = 0
            u = s
            found = False
            while True:
                if u == t:
                    found = True
                    break
                advanced = False
                while it[u] < start[u + 1]:
                    a = arcs[it[u]]
                    v = head[a]
                    if res[a] > 0 and level[v] == level[u] + 1:
                        path[depth] = a
                        depth += 1
                        u = v
                        advanced = True
                        break
                    it[u] += 1
                if not advanced:
                    if depth == 0:
                        break
                    level[u] = -1
                    depth -= 1
                    u = head[path[depth] ^ 1]
                    it[u] += 1
            if not found:
                break
            f = limit - total
            for i in range(depth):
                if res[path[i]] < f:
                    f = res[path[i]]
            for i in range(depth):
                res[path[i]] -= f
                res[path[i] ^ 1] += f
            total += f
    return total


@njit(cache=True)
def _load_caps(res, caps):
    for i in range(caps.shape[0]):
        res[2 * i] = caps[i]
        res[2 * i + 1] = 0


@njit(cache=True)
def _set_cap(res, a, cap):
    """Give arc ``a`` capacity ``cap``, keeping as much of its flow as fits; return the
    flow removed (now stranded as excess at the arc's tail)."""
    flow = res[2 * a + 1]
    cut = max(flow - cap, 0)
    res[2 * a] = cap - flow + cut
    res[2 * a + 1] = flow - cut
    return cut


@njit(cache=True)
def _move_sink(n_tot, start, arcs, head, res, old_arc, old_cap, new_arc,
               level, queue, it, path):
    """Turn a max-flow (or a flow at its limit) with the sink arc ``old_arc`` open into
    one with ``old_arc`` back at ``old_cap`` and ``new_arc`` opened to INF; return the
    flow value lost (0: the value is unchanged).

    The excess ``x`` stranded at the old sink ``g`` is routed ``g -> T`` in the residual
    network (paths may pass through ``s``), at most ``x``.  What cannot be routed goes
    back ``g -> s``: the excess came from ``s``, so reverse residual arcs carry it.
    Exact: if ``g -> T`` is left short, the set ``A`` reachable from ``g`` holds ``s``
    (the excess reaches it) but not ``T``, and pushing ``g -> s`` only changes arcs
    inside ``A``, so no ``s -> T`` augmenting path exists: the flow is maximum."""
    s = n_tot - 2
    t = n_tot - 1
    g = head[2 * old_arc + 1]
    x = _set_cap(res, old_arc, old_cap)
    _set_cap(res, new_arc, INF)
    moved = _dinic(n_tot, start, arcs, head, res, g, t, x, level, queue, it, path)
    if moved < x:
        _dinic(n_tot, start, arcs, head, res, g, s, x - moved, level, queue, it, path)
    return x - moved


@njit(cache=True)
def _rooted_check(n_tot, start, arcs, head, res, caps, sink_arc0, sinks, lo, hi, demand,
                  level, queue, it, path):
    """Return the first position ``i`` in ``sinks[lo:hi]`` whose max-flow ``s -> T``
    (with ``sinks[i] -> T`` opened to INF) is below ``demand``, or -1 if every sink
    passes.  On failure ``res`` holds the residual network of that sink's max-flow.

    Only the first sink's flow is built from scratch (``lo = 0``); each next sink
    repairs the last flow (:func:`_move_sink`), which stays at ``demand`` while sinks
    pass, so a scan resumes at ``lo > 0`` from the flow the call ending at ``lo`` left."""
    if hi <= lo:
        return -1
    if lo == 0:
        _load_caps(res, caps)
        _set_cap(res, sink_arc0 + sinks[0], INF)
        if _dinic(n_tot, start, arcs, head, res, n_tot - 2, n_tot - 1, demand,
                  level, queue, it, path) < demand:
            return 0
    for i in range(max(lo, 1), hi):
        old = sink_arc0 + sinks[i - 1]
        if _move_sink(n_tot, start, arcs, head, res, old, caps[old], sink_arc0 + sinks[i],
                      level, queue, it, path) > 0:
            return i
    return -1


@njit(cache=True)
def _failing_sets(n_tot, start, arcs, head, res, caps, sink_arc0, sinks, lo, hi, demand,
                  level, queue, it, path, sets, skip, covered, state):
    """The rooted check of the sinks ``sinks[lo:hi]`` in one scan: for each sink below
    ``demand`` (that no earlier failing sink's set holds, with ``skip``), the sink side of
    its minimum cut (the nodes not reachable from ``s``) as the next row of ``sets``
    (bool, ``n`` columns); stops when ``sets`` is full.  ``covered`` (the nodes of the
    rows so far) and ``state`` (rows written, the last sink or -1, its flow) carry the
    scan from one call to the next; returns the rows written.

    As in :func:`_rooted_check` each next sink repairs the last flow
    (:func:`_move_sink`); a flow below ``demand`` that lost nothing in the move may not
    be maximum for the new sink, so it is augmented up to ``demand`` (a move that lost
    flow leaves a maximum one, :func:`_move_sink`)."""
    n = n_tot - 2
    found, prev, flow = state[0], state[1], state[2]
    if prev < 0:
        _load_caps(res, caps)
    for i in range(lo, hi):
        if found == sets.shape[0]:
            break
        g = sinks[i]
        if skip and covered[g]:
            continue
        if prev < 0:
            _set_cap(res, sink_arc0 + g, INF)
            flow = _dinic(n_tot, start, arcs, head, res, n, n + 1, demand,
                          level, queue, it, path)
        else:
            old = sink_arc0 + prev
            lost = _move_sink(n_tot, start, arcs, head, res, old, caps[old], sink_arc0 + g,
                              level, queue, it, path)
            flow -= lost
            if lost == 0 and flow < demand:
                flow += _dinic(n_tot, start, arcs, head, res, n, n + 1, demand - flow,
                               level, queue, it, path)
        prev = g
        if flow < demand:
            _bfs_levels(n_tot, start, arcs, head, res, n, -1, level, queue)
            for v in range(n):
                sets[found, v] = level[v] < 0
                covered[v] |= level[v] < 0
            found += 1
    state[0], state[1], state[2] = found, prev, flow
    return found


@njit(cache=True)
def _min_over_sinks(n_tot, start, arcs, head, res, caps, sink_arc0, sinks, lo, hi,
                    level, queue, it, path, upper, floor, state):
    """``min(upper, min over sinks[:hi] of the max-flow s -> T)`` (each sink opened in
    turn), the scan of ``sinks[lo:hi]`` carried on from ``state`` (the last flow and the
    minimum so far, from the call ending at ``lo``); the scan stops once the minimum is
    at most ``floor`` (the caller needs nothing below it).

    Only the first sink's flow is built from scratch, stopped at ``upper``; each next
    sink repairs the last flow (:func:`_move_sink`), which keeps its value, the running
    minimum, or loses some and is then a maximum flow: the new minimum."""
    if hi <= lo:
        return upper if lo == 0 else state[1]
    if lo == 0:
        _load_caps(res, caps)
        _set_cap(res, sink_arc0 + sinks[0], INF)
        state[0] = _dinic(n_tot, start, arcs, head, res, n_tot - 2, n_tot - 1, upper,
                          level, queue, it, path)
        state[1] = min(upper, state[0])
    for i in range(max(lo, 1), hi):
        if state[1] <= floor:
            break
        old = sink_arc0 + sinks[i - 1]
        state[0] -= _move_sink(n_tot, start, arcs, head, res, old, caps[old],
                               sink_arc0 + sinks[i], level, queue, it, path)
        state[1] = min(state[1], state[0])
    return state[1]


class FlowNetwork:
    """A fixed directed network over ``n`` real nodes plus super-source/super-sink.

    Arc layout of the capacity vector (length ``m + 2n``): the ``m`` real arcs in the
    order given, then ``s -> v`` for ``v = 0..n-1`` (index ``m + v``), then ``v -> T``
    (index ``m + n + v``).
    """

    def __init__(self, n: int, tail: np.ndarray, head: np.ndarray) -> None:
        self.n = int(n)
        self.m = int(len(tail))
        s, t = self.n, self.n + 1
        nodes = np.arange(self.n, dtype=np.int64)
        all_tail = np.concatenate([np.asarray(tail, np.int64), np.full(self.n, s), nodes])
        all_head = np.concatenate([np.asarray(head, np.int64), nodes, np.full(self.n, t)])
        self.num_arcs = all_tail.size
        n_tot = self.n + 2
        # residual arc 2i: forward i; 2i+1: reverse
        r_tail = np.empty(2 * self.num_arcs, np.int64)
        r_head = np.empty(2 * self.num_arcs, np.int64)
        r_tail[0::2], r_tail[1::2] = all_tail, all_head
        r_head[0::2], r_head[1::2] = all_head, all_tail
        # the same stable order; 16-bit keys take numpy's radix sort (4-6x faster at the
        # 2M residual arcs of a 1024-GPU switch's transport network)
        keys = r_tail.astype(np.uint16) if n_tot <= np.iinfo(np.uint16).max else r_tail
        order = np.argsort(keys, kind="stable")
        self._arcs = order.astype(np.int64)
        self._start = np.zeros(n_tot + 1, np.int64)
        np.cumsum(np.bincount(r_tail, minlength=n_tot), out=self._start[1:])
        self._head = r_head
        self.arc_tail = all_tail             # every arc, in the capacity vector's order
        self.arc_head = all_head
        self._res = np.zeros(2 * self.num_arcs, np.int64)
        self._level = np.empty(n_tot, np.int64)
        self._queue = np.empty(n_tot, np.int64)
        self._it = np.empty(n_tot, np.int64)
        self._path = np.empty(n_tot + 1, np.int64)
        self.s_arc0 = self.m
        self.t_arc0 = self.m + self.n
        self.span_sinks = 1 << 62      # sinks a span may hold, learned by :func:`_spans`

    def caps(self) -> np.ndarray:
        """A zero capacity vector of the right length."""
        return np.zeros(self.num_arcs, np.int64)

    def max_flow(self, caps: np.ndarray, limit: int = 1 << 62) -> int:
        """Max-flow from the super-source to the super-sink under ``caps``."""
        self._res[0::2], self._res[1::2] = caps, 0     # _load_caps, without loading a kernel
        return int(_dinic(self.n + 2, self._start, self._arcs, self._head, self._res,
                          self.n, self.n + 1, limit, self._level, self._queue, self._it,
                          self._path))

    def first_failing_sink(self, caps: np.ndarray, sinks: np.ndarray, demand: int) -> int:
        """Position in ``sinks`` of the first sink ``g`` whose max-flow (``g -> T``
        opened) is below ``demand``; -1 if all pass.  ``caps`` must have every
        ``v -> T`` arc closed.  Under a time limit the scan checks the clock between
        spans of sinks (:func:`.sweep_spans.spans`)."""
        caps, sinks = np.asarray(caps, np.int64), _writable(sinks)
        for lo, hi in _spans(sinks.size, self):
            pos = int(_rooted_check(self.n + 2, self._start, self._arcs, self._head, self._res,
                                    caps, self.t_arc0, sinks, lo, hi, int(demand), self._level,
                                    self._queue, self._it, self._path))
            if pos >= 0:
                return pos
        return -1

    def failing_sets(self, caps: np.ndarray, sinks: np.ndarray, demand: int,
                     most: int, skip: bool = True) -> np.ndarray:
        """The sink sides (bool rows over the ``n`` real nodes) of the minimum cuts of up to
        ``most`` sinks whose max-flow is below ``demand``, in sink order, with ``skip``
        each from a sink no earlier row holds (:func:`_failing_sets`); ``caps`` as for
        :meth:`first_failing_sink`, the clock checked as there."""
        caps, sinks = np.asarray(caps, np.int64), _writable(sinks)
        sets = np.zeros((max(int(most), 1), self.n), np.bool_)
        covered = np.zeros(self.n, np.bool_)
        state = np.array([0, -1, 0], np.int64)
        found = 0
        for lo, hi in _spans(sinks.size, self):
            found = int(_failing_sets(self.n + 2, self._start, self._arcs, self._head,
                                      self._res, caps, self.t_arc0, sinks, lo, hi, int(demand),
                                      self._level, self._queue, self._it, self._path, sets,
                                      bool(skip), covered, state))
            if found == sets.shape[0]:
                break
        return sets[:found]

    def min_flow_over_sinks(self, caps: np.ndarray, sinks: np.ndarray,
                            upper: int = 1 << 62, floor: int = -1) -> int:
        """``min(upper, minimum over sinks of the max-flow with that sink opened)``,
        exact above ``floor`` (the scan may stop at any value ``<= floor``); the clock
        checked as in :meth:`first_failing_sink`."""
        caps, sinks = np.asarray(caps, np.int64), _writable(sinks)
        state = np.zeros(2, np.int64)
        best = int(upper)
        for lo, hi in _spans(sinks.size, self):
            best = int(_min_over_sinks(self.n + 2, self._start, self._arcs, self._head,
                                       self._res, caps, self.t_arc0, sinks, lo, hi,
                                       self._level, self._queue, self._it, self._path,
                                       int(upper), int(floor), state))
            if best <= floor:
                break
        return best

    def breadth_first(self, source: int) -> np.ndarray:
        """The real nodes reachable from ``source`` along arcs taken either way (every
        residual arc of a real arc open), in breadth-first order."""
        res = np.zeros(2 * self.num_arcs, np.int64)
        res[: 2 * self.m] = 1
        _bfs_levels(self.n + 2, self._start, self._arcs, self._head, res, int(source), -1,
                    self._level, self._queue)
        return self._queue[: int(np.count_nonzero(self._level >= 0))].copy()

    def sink_side(self) -> np.ndarray:
        """Real nodes the super-source cannot reach in the residual network of the last
        flow: after a maximum flow, the sink side of a minimum cut."""
        _bfs_levels(self.n + 2, self._start, self._arcs, self._head, self._res, self.n, -1,
                    self._level, self._queue)
        return self._level[: self.n] < 0

    def flows(self, count: int) -> np.ndarray:
        """Flow on the first ``count`` arcs after the last :meth:`max_flow`."""
        return self._res[1: 2 * count: 2].copy()

    def source_side(self) -> np.ndarray:
        """Real nodes reachable from the super-source in the last residual network
        (the source side of a minimum cut)."""
        _bfs_levels(self.n + 2, self._start, self._arcs, self._head, self._res,
                    self.n, -1, self._level, self._queue)      # no target: full search
        return self._level[: self.n] >= 0


def _writable(sinks: np.ndarray) -> np.ndarray:
    """``sinks`` as a writable int64 array: the kernels take one array type, so a
    read-only view (a cached rank list) does not load a second compiled signature."""
    sinks = np.asarray(sinks, np.int64)
    return sinks if sinks.flags.writeable else sinks.copy()
