"""Independent AllGather oracle: the forwarding-only optimum, the cut bound and a
schedule checker, written from the model's definition (README "Units and definitions", docs/modelling.md) with
scipy only.  It shares no code with :mod:`mccl_opt.allgather`, :mod:`mccl_opt.schedule`
or :mod:`mccl_opt.validate`, so the tests can use it to judge them.

Model (README "Units and definitions").  GPUs ``G`` (``N = |G|``) and switches are joined by directed
links ``a`` of capacity ``c_a``.  An AllGather schedule at rate ``x`` gives, for every
root ``r``, trees with weights ``w_T >= 0`` summing to ``x``; a tree is a spanning
arborescence of the *logical* GPU graph rooted at ``r`` whose edge ``u -> v`` is a
physical path from GPU ``u`` to GPU ``v`` with switches only in its interior (switches
forward and never duplicate, GPUs forward and copy).  Link ``a`` carries
``sum_T w_T * (number of tree edges of T crossing a)``, which must be ``<= c_a``.

Compact LP (variables in Gbps)::

    max x
    s.t.  f^{r,d} is a flow of value x from r to d in the logical graph,   r != d in G
          f^{r,d}_{uv} <= g^r_{uv}                                            (1)
          p^u is a flow on physical links from u whose only sinks are the
          GPUs v != u, delivering sum_r g^r_{uv} to v; it may enter no GPU
          other than its sinks, leave no GPU other than u, and never enter u  (2)
          sum_u p^u_a <= c_a                                                  (3)
          f, g, p >= 0

Why it is exact.
* *Any schedule is feasible*: put ``g^r_{uv}`` = total weight of root ``r``'s trees
  using logical edge ``uv``.  Each tree of weight ``w`` contains an ``r -> d`` path, so
  the trees give a flow of value ``x`` within ``g^r``, i.e. (1).  The physical paths of
  all logical edges leaving ``u`` form ``p^u`` (2), and their sum is each link's load (3).
* *Any LP solution is a schedule*: by Edmonds' branching theorem in its polyhedral
  form (Fulkerson 1974: the dominant of the r-arborescence polytope is
  ``{y >= 0 : y(δ^in(S)) >= 1 for every S ∌ r}``), capacities ``g^r`` admit a
  fractional packing of r-arborescences of total weight ``x`` iff every ``r -> d``
  max-flow is ``>= x``, which (1) certifies.  The flow ``p^u`` decomposes into paths
  (cycles dropped) from ``u``; because it may not pass through any GPU but its
  endpoints, each path is a switch-only logical edge ``u -> v``, and the paths into
  ``v`` carry exactly ``sum_r g^r_{uv}``: split them between roots in proportion to
  ``g^r_{uv}``.  Link loads are then bounded by (3).
Aggregating the physical flow over roots (one ``p^u`` per source ``u`` instead of per
``(r, u)``) loses nothing, since only the source of a physical path matters.

The cut bound (:func:`cut_bound`) is ``min over node sets S holding a GPU and missing
another of cap(δ^in(S)) / |G \\ S|`` (every shard from outside ``S`` must enter ``S``
once).  It needs no enumeration: by max-flow/min-cut it is the largest ``x`` such that
for every GPU ``d`` a flow exists in which every other GPU supplies ``x`` and ``d``
absorbs ``(N-1) x`` within the capacities; that is one small LP.  With forwarding-only
switches the optimum can be strictly below it (a switch cannot duplicate).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Iterable

import numpy as np
import scipy.sparse as sp
from scipy.optimize import linprog

__all__ = ["Plain", "plain", "Optimum", "forwarding_optimum", "cut_bound", "brute_force_cut",
           "check_schedule", "CheckedSchedule", "topology_dict"]


@dataclass(frozen=True)
class Plain:
    """A fabric as plain arrays (node order as given, GPU order = rank order)."""

    names: tuple[str, ...]
    is_gpu: np.ndarray        # bool per node
    tail: np.ndarray          # int per link
    head: np.ndarray
    cap: np.ndarray           # Gbps per link

    @property
    def gpus(self) -> np.ndarray:
        return np.flatnonzero(self.is_gpu)


def plain(topo: Any) -> Plain:
    """Read a ``Topology`` (or a ``mccl-topology/1`` dict) through public fields only."""
    if isinstance(topo, dict):
        nodes = [(n["id"], n["kind"]) for n in topo["nodes"]]
        links = [(l["src"], l["dst"], float(l["capacity_gbps"])) for l in topo["links"]]
    else:
        nodes = [(n.id, n.kind) for n in topo.nodes]
        links = [(l.src, l.dst, float(l.capacity_gbps)) for l in topo.links]
    index = {name: i for i, (name, _) in enumerate(nodes)}
    return Plain(tuple(n for n, _ in nodes), np.array([k == "gpu" for _, k in nodes], bool),
                 np.array([index[s] for s, _, _ in links], np.int64),
                 np.array([index[d] for _, d, _ in links], np.int64),
                 np.array([c for _, _, c in links], float))


def _solve(c: np.ndarray, a_ub: sp.spmatrix | None, b_ub: np.ndarray | None,
           a_eq: sp.spmatrix, b_eq: np.ndarray, what: str) -> np.ndarray:
    res = linprog(c, A_ub=a_ub, b_ub=b_ub, A_eq=a_eq, b_eq=b_eq, bounds=(0, None),
                  method="highs", options={"primal_feasibility_tolerance": 1e-10,
                                           "dual_feasibility_tolerance": 1e-10})
    if res.status != 0:
        raise RuntimeError(f"oracle {what} LP failed: {res.message}")
    return res.x


class _Rows:
    """Accumulates sparse constraint rows as COO triplets."""

    def __init__(self) -> None:
        self.r: list[np.ndarray] = []
        self.c: list[np.ndarray] = []
        self.v: list[np.ndarray] = []
        self.n = 0

    def add(self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray | float) -> None:
        rows, cols = np.asarray(rows, np.int64), np.asarray(cols, np.int64)
        self.r.append(rows)
        self.c.append(cols)
        self.v.append(np.broadcast_to(np.asarray(vals, float), rows.shape).copy())

    def new(self, k: int) -> np.ndarray:
        out = np.arange(self.n, self.n + k)
        self.n += k
        return out

    def matrix(self, ncols: int) -> sp.csr_matrix:
        if not self.r:
            return sp.csr_matrix((self.n, ncols))
        return sp.csr_matrix((np.concatenate(self.v), (np.concatenate(self.r), np.concatenate(self.c))),
                             shape=(self.n, ncols))


def _switch_reach(f: Plain) -> list[tuple[int, int]]:
    """Logical edges: GPU pairs ``(u, v)`` joined by a path whose interior is switches."""
    n = f.is_gpu.size
    out: list[list[int]] = [[] for _ in range(n)]
    for t, h in zip(f.tail.tolist(), f.head.tolist()):
        out[t].append(h)
    pairs = []
    for u in f.gpus.tolist():
        seen = {u}
        stack = [u]
        hit = set()
        while stack:
            w = stack.pop()
            for h in out[w]:
                if h in seen:
                    continue
                seen.add(h)
                if f.is_gpu[h]:
                    hit.add(h)
                else:
                    stack.append(h)
        pairs += [(u, v) for v in sorted(hit)]
    return pairs


@dataclass(frozen=True)
class Optimum:
    """The forwarding-only optimum and its logical capacities ``g^r_uv`` (node indices)."""

    rate_gbps: float
    logical: dict[tuple[int, int, int], float]


#: optima already solved in this process, by the fabric's plain arrays (several test
#: modules ask for the same fabric's optimum; a 32-GPU LP takes seconds)
_OPTIMA: dict[tuple, Optimum] = {}


def forwarding_optimum(topo: Any) -> Optimum:
    """Solve the compact LP of the module docstring (scipy HiGHS), once per fabric."""
    f = plain(topo)
    key = (f.names, f.is_gpu.tobytes(), f.tail.tobytes(), f.head.tobytes(), f.cap.tobytes())
    if key not in _OPTIMA:
        _OPTIMA[key] = _forwarding_optimum(f)
    known = _OPTIMA[key]
    return Optimum(known.rate_gbps, dict(known.logical))


def _forwarding_optimum(f: Plain) -> Optimum:
    scale = float(f.cap.max())
    cap = f.cap / scale
    gpus = f.gpus.tolist()
    edges = _switch_reach(f)
    ne, ng, nl = len(edges), len(gpus), f.tail.size
    e_tail = np.array([u for u, _ in edges], np.int64)
    e_head = np.array([v for _, v in edges], np.int64)
    col = 1                                                   # column 0 is x
    g_col = {r: np.arange(col + i * ne, col + (i + 1) * ne) for i, r in enumerate(gpus)}
    col += ng * ne
    pairs = [(r, d) for r in gpus for d in gpus if r != d]
    f_col = {}
    f_mask = {}
    for r, d in pairs:
        m = (e_head != r) & (e_tail != d)
        f_mask[r, d] = np.flatnonzero(m)
        f_col[r, d] = np.arange(col, col + m.sum())
        col += int(m.sum())
    p_col, p_links = {}, {}
    for u in gpus:
        ok = ((f.tail == u) | ~f.is_gpu[f.tail]) & (f.head != u)
        p_links[u] = np.flatnonzero(ok)
        p_col[u] = np.arange(col, col + ok.sum())
        col += int(ok.sum())
    eq, ub = _Rows(), _Rows()
    for r, d in pairs:                                        # (1): flow r -> d of value x
        rows = {v: i for v, i in zip(gpus, eq.new(ng))}
        es, cs = f_mask[r, d], f_col[r, d]
        eq.add([rows[u] for u in e_tail[es]], cs, 1.0)
        eq.add([rows[v] for v in e_head[es]], cs, -1.0)
        eq.add([rows[r], rows[d]], [0, 0], [-1.0, 1.0])
        cap_rows = ub.new(es.size)                            # f <= g^r
        ub.add(cap_rows, cs, 1.0)
        ub.add(cap_rows, g_col[r][es], -1.0)
    for u in gpus:                                            # (2): physical flow from u
        rows = {w: i for w, i in zip([w for w in range(f.is_gpu.size) if w != u],
                                     eq.new(f.is_gpu.size - 1))}
        ls, cs = p_links[u], p_col[u]
        eq.add([rows[h] for h in f.head[ls]], cs, 1.0)
        inner = f.tail[ls] != u
        eq.add([rows[t] for t in f.tail[ls][inner]], cs[inner], -1.0)
        for j, (a, b) in enumerate(edges):
            if a == u:
                eq.add([rows[b]] * ng, [g_col[r][j] for r in gpus], -1.0)
    cap_rows = ub.new(nl)                                     # (3): link capacities
    for u in gpus:
        ub.add(cap_rows[p_links[u]], p_col[u], 1.0)
    c = np.zeros(col)
    c[0] = -1.0
    b_ub = np.zeros(ub.n)
    b_ub[cap_rows] = cap
    x = _solve(c, ub.matrix(col), b_ub, eq.matrix(col), np.zeros(eq.n), "forwarding-optimum")
    logical = {(r, a, b): float(x[g_col[r][j]]) * scale
               for r in gpus for j, (a, b) in enumerate(edges) if x[g_col[r][j]] > 1e-12}
    return Optimum(float(x[0]) * scale, logical)


def cut_bound(topo: Any) -> float:
    """min over node sets S (a GPU in, a GPU out) of cap(δ^in(S)) / |GPUs outside S|."""
    f = plain(topo)
    scale = float(f.cap.max())
    gpus = f.gpus.tolist()
    n, nl = f.is_gpu.size, f.tail.size
    eq, ub = _Rows(), _Rows()
    ncol = 1 + len(gpus) * nl
    for i, d in enumerate(gpus):
        cols = 1 + i * nl + np.arange(nl)
        rows = eq.new(n)                                      # out - in = x at GPUs != d
        eq.add(rows[f.tail], cols, 1.0)
        eq.add(rows[f.head], cols, -1.0)
        others = [v for v in gpus if v != d]
        eq.add(rows[others], np.zeros(len(others), np.int64), -1.0)
        eq.add(rows[[d]], [0], float(len(others)))            # d absorbs (N-1) x
        ub.add(ub.new(nl), cols, 1.0)
    c = np.zeros(ncol)
    c[0] = -1.0
    b_ub = np.tile(f.cap / scale, len(gpus))
    x = _solve(c, ub.matrix(ncol), b_ub, eq.matrix(ncol), np.zeros(eq.n), "cut-bound")
    return float(x[0]) * scale


def brute_force_cut(topo: Any) -> float:
    """The cut bound by enumerating node sets (exact fractions; at most 16 nodes)."""
    f = plain(topo)
    n = f.is_gpu.size
    if n > 16:
        raise ValueError("brute_force_cut enumerates 2^n node sets; use at most 16 nodes")
    caps = [Fraction(c) for c in f.cap.tolist()]
    best: Fraction | None = None
    for bits in range(1, 2 ** n):
        s = [(bits >> i) & 1 == 1 for i in range(n)]
        outside = sum(1 for v in range(n) if f.is_gpu[v] and not s[v])
        if outside == 0 or not any(s[v] and f.is_gpu[v] for v in range(n)):
            continue
        cut = sum((caps[a] for a in range(f.tail.size) if not s[f.tail[a]] and s[f.head[a]]),
                  Fraction(0))
        if best is None or cut / outside < best:
            best = cut / outside
    assert best is not None
    return float(best)


@dataclass(frozen=True)
class CheckedSchedule:
    """What :func:`check_schedule` recomputed: link loads (share units) and the rate."""

    loads: np.ndarray
    rate_gbps: float
    trees_per_root: dict[str, int]


def check_schedule(topo: Any, sched: Any, max_chunks: int | None = None,
                   rel: float = 1e-6) -> CheckedSchedule:
    """Check an AllGather schedule against the model (docs/modelling.md); raise
    ``AssertionError`` naming the first problem, else return recomputed loads and rate.

    Every GPU is a root; shares are positive and sum to 1 per root (multiples of ``1/k``
    for one ``k <= max_chunks`` when given); every tree is a spanning arborescence of
    the GPUs whose edges are switch-only paths over real links; the rate
    ``min_a cap_a / load_a`` matches ``sched.rate_gbps``.
    """
    f = plain(topo)
    index = {name: i for i, name in enumerate(f.names)}
    link = {(int(t), int(h)): a for a, (t, h) in enumerate(zip(f.tail, f.head))}
    gpu_names = [f.names[v] for v in f.gpus]
    assert tuple(sched.gpus) == tuple(gpu_names), "schedule GPUs are not the topology's ranks"
    assert sched.collective == "allgather", sched.collective
    loads = np.zeros(f.tail.size)
    shares: dict[str, list[float]] = {g: [] for g in gpu_names}
    for t_no, tree in enumerate(sched.chunks):
        where = f"tree #{t_no} (root {tree.src})"
        assert tree.src in shares, f"{where}: root is not a GPU"
        assert tree.share > 0, f"{where}: share {tree.share} is not positive"
        shares[tree.src].append(float(tree.share))
        heads: dict[str, str] = {}
        count = np.zeros(f.tail.size)
        for path in tree.edges:
            assert len(path) >= 2, f"{where}: edge {path} has no hop"
            for v in path:
                assert v in index, f"{where}: unknown node {v!r}"
            assert f.is_gpu[index[path[0]]] and f.is_gpu[index[path[-1]]], \
                f"{where}: edge {path} does not join two GPUs"
            assert not any(f.is_gpu[index[v]] for v in path[1:-1]), \
                f"{where}: edge {path} passes through a GPU"
            for a_, b_ in zip(path, path[1:]):
                key = (index[a_], index[b_])
                assert key in link, f"{where}: hop {a_}->{b_} is not a link"
                count[link[key]] += 1
            assert path[-1] not in heads, f"{where}: GPU {path[-1]} is reached twice"
            heads[path[-1]] = path[0]
        assert set(heads) == set(gpu_names) - {tree.src}, f"{where}: does not span the GPUs"
        for v in heads:                                       # every GPU leads back to the root
            seen = {v}
            while v != tree.src:
                v = heads[v]
                assert v not in seen, f"{where}: edges form a cycle"
                seen.add(v)
        loads += tree.share * count
    for root, s in shares.items():
        assert s, f"GPU {root} roots no tree"
        assert abs(sum(s) - 1) <= 1e-9, f"root {root}: shares sum to {sum(s)}"
        if max_chunks is not None:
            assert any(all(abs(v * k - round(v * k)) <= 1e-6 for v in s)
                       for k in range(1, max_chunks + 1)), \
                f"root {root}: shares {s} are not multiples of 1/k for any k <= {max_chunks}"
    used = loads > 0
    rate = float(np.min(f.cap[used] / loads[used]))
    assert abs(rate - sched.rate_gbps) <= rel * max(1.0, rate), \
        f"recomputed rate {rate} differs from rate_gbps {sched.rate_gbps}"
    return CheckedSchedule(loads, rate, {g: len(s) for g, s in shares.items()})


def topology_dict(nodes: Iterable[tuple[str, str]], links: Iterable[tuple[str, str, float]],
                  name: str = "r") -> dict[str, Any]:
    """A ``mccl-topology/1`` dict from ``(id, kind)`` nodes and ``(src, dst, gbps)`` links."""
    return {"format": "mccl-topology/1", "name": name,
            "nodes": [{"id": i, "kind": k} for i, k in nodes],
            "links": [{"src": a, "dst": b, "capacity_gbps": float(c), "latency_us": 1.0}
                      for a, b, c in links]}
