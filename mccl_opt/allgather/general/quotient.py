"""The tree master on a fabric's symmetry quotient: the forwarding-only optimum of a
fabric with many identical hosts and rails from a master of orbit rows (docs/allgather_history.md
"Symmetric quotient").

For an automorphism group ``H`` of the fabric (:mod:`.symmetry`), averaging any optimal
tree packing over ``H`` gives an optimal one whose weights are equal on every orbit, so
the master (``general.tree_colgen``) may be restricted to symmetrised columns: a tree
``T`` of root ``r`` with weight ``z`` spread evenly over its orbit loads each link of a
link orbit ``L`` by ``z load_T(L) / |L|`` and gives each root of ``r``'s orbit ``R``
``z / |R|``.  The master keeps one row per link orbit and per root orbit (26 + 5 rows
instead of 544 + 128 on shared aggregation 2x8x8 with one NIC slowed one way), and a round
prices one root per orbit at the per-link prices ``pi_L / |L|``.  Those prices with
``sigma_R / |R|`` are a dual point of the full master, so the Lagrangian bound
``pi.cap / sum_R |R| c_R(pi)`` (``c_R`` the cheapest tree of ``R``'s root) is the full
master's and certifies the quotient's ``x`` as the forwarding-only optimum; so does a
caller's certified upper bound (the balanced restriction's optimum).

**Expansion.**  Each positive column is copied over ``H``'s elements with the weights of
:meth:`.symmetry.Symmetry.pieces` (each cluster's marginal uniform, so every link's load
is its orbit's average and every root gets ``z / |R|``), copies of one tree merged, the
tree table made from the columns and the pieces' maps (:mod:`.expansion`); the
schedule is built and re-rated from its own link loads by the general method's
``_schedule`` and kept only when that rate is the certified optimum.  Where the uniform
copies would be many (:data:`SPARSE_COPIES_MIN_RATIO`), each column is copied over
sparse per-cluster marginals instead, at the same loads' bounds and root shares
(:mod:`.sparse_copies`; the uniform copies again if that schedule falls short).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import scipy.sparse as sp

from formulations.lp import LinearProgram
from mccl_opt import anytime
from mccl_opt.backends import Backend, SolveStatus, get_backend
from mccl_opt.errors import SolveError
from mccl_opt.schedule import Schedule
from mccl_opt.topology import Topology
from .expansion import expand
from .sparse_copies import Copies, sparse_copies
from .symmetry import Symmetry, find_symmetry
from .sparse_arborescence import min_arborescences_sparse
from .switch_paths import from_sources
from .tree_colgen import TIE_BREAK, TreeCGResult, price_bound, pricing_points

__all__ = ["solve_quotient", "QUOTIENT_MAX_ROUNDS", "QUOTIENT_TIE_BREAK",
           "QUOTIENT_TIE_BREAK_MAX_GPUS", "REL_TOL", "SPARSE_COPIES_MIN_RATIO"]

#: where a time limit stops the quotient's column generation: it checks the clock before
#: the seed's pricing and before each master solve and each pricing point (docs/allgather.md,
#: "The leftovers past the deadline")
QUOTIENT_CG = "the symmetric quotient's column generation"

#: starting trees of the quotient: ``(root ranks, link indices of every tree)``
Columns = tuple[list[int], list[np.ndarray]]

#: rounds of column generation on the quotient before giving up (the caller's exact path
#: runs then); shared aggregation 2x8x8 / 2x16x8 with one NIC slowed one way close in 15-19
QUOTIENT_MAX_ROUNDS = 100

#: a round prices first at the duals plus this weight of a ``1/capacity`` term, then at
#: the duals themselves, and adds the trees of both that price out at the duals (the
#: general method's pricing points and weight, :func:`.tree_colgen.pricing_points`,
#: :data:`.tree_colgen.TIE_BREAK`): the quotient's duals are zero on most link orbits,
#: so the cheapest tree at them is an arbitrary crowded one.
#: Half-uplinks 2x8x8 one way (fuzz seed 3524): 37 / 68 rounds -> 8 / 8, the weight
#: flat over 1e-4 .. 1e-1 (docs/allgather_history.md "Half-uplinks 2x8x8 one way: the quotient's
#: tie-break")
QUOTIENT_TIE_BREAK = TIE_BREAK

#: ... on fabrics of at most this many GPUs; above, the plain duals alone (the rounds are
#: few and dear there, and the tie-break's other optimal vertex made the sparse copies'
#: cluster LPs dearer: shared aggregation 2x32x8 one way 17 -> 9 rounds, but 11.2 ->
#: 19.9 s CPU, 10.3 -> 18.4 s of it in those LPs; 2x16x8 2.2-2.4 -> 2.5 s)
QUOTIENT_TIE_BREAK_MAX_GPUS = 128

#: the general method's stopping tolerance (``TreeCGOptions.rel_tol``)
REL_TOL = 1e-9

#: the copies are put on sparse marginals (:mod:`.sparse_copies`) when the uniform
#: expansion has more than this many times the full master's rows in trees (then at
#: least half go): shared aggregation 2x8x8 one way 2 688 -> 399 trees for ~0.15 s of
#: cluster LPs, fat-tree 4x2x2x8 9 174 -> 534 for ~0.1 s; HPN 2x8x8 one way (ratio
#: 1.2-1.8) 1 014 -> 488 would cost 0.1-0.15 s on a 0.15 s solve (docs/allgather.md
#: "Fewer copies of the quotient's trees")
SPARSE_COPIES_MIN_RATIO = 2


class _Quotient:
    """The symmetrised master, live on a backend: column 0 is ``x``, then one column per
    tree (its crossings of every link orbit divided by the orbit's size and capacity,
    ``-1/|R|`` on its root orbit's row ``x - sum z/|R| <= 0``); trees are added between
    warm re-solves.  Link rows are in units of their capacity, so the LP solver's
    absolute feasibility tolerance is relative to every link's capacity (shared
    aggregation 2x8x8 with one NIC at 4 Gbps one way and another at 104.29: the
    expanded trees fell short of ``x`` by more than ``1e-9`` with rows in Gbps)."""

    def __init__(self, topo: Topology, sym: Symmetry, capacity: np.ndarray,
                 backend: Backend) -> None:
        self.sym = sym
        size = np.bincount(sym.link_orbit)
        self.capacity = np.zeros(size.size)          # per link orbit (scaled units)
        self.capacity[sym.link_orbit] = capacity
        self.orbit_size = size.astype(float)
        self.root_size = np.bincount(sym.root_orbit).astype(float)
        self.reps = np.array([int(np.flatnonzero(sym.root_orbit == o)[0])
                              for o in range(self.root_size.size)])
        self.roots: list[int] = []
        self.trees: list[np.ndarray] = []
        arr = topo.arrays
        self.node_map, self.link_map = sym.carriers(arr.gpu_nodes, self.reps)
        self.node_inv = np.empty_like(self.node_map)   # per rank, its carrier's inverse
        self.node_inv[np.arange(topo.num_gpus)[:, None], self.node_map] = np.arange(topo.num_nodes)
        rank_map = arr.rank_of[self.node_map[:, arr.gpu_nodes]]
        g = topo.num_gpus
        inverse = np.empty_like(rank_map)            # cost[s, t] = cost_r[o(s), h_s^-1(t)]
        inverse[np.arange(g)[:, None], rank_map] = np.arange(g)
        self.cost_index_t = np.ascontiguousarray((sym.root_orbit[:, None] * g + inverse).T)
        self.tail, self.gpu_nodes = arr.tail, arr.gpu_nodes
        self.rep_index = sym.root_orbit
        self.backend = backend
        n_r = self.root_size.size
        rows = n_r + self.capacity.size
        backend.load(LinearProgram(
            c=np.ones(1), A=sp.csr_matrix(np.concatenate([np.ones(n_r), np.zeros(rows - n_r)])[:, None]),
            row_lo=np.full(rows, -np.inf), row_hi=np.concatenate([np.zeros(n_r), np.ones(rows - n_r)]),
            col_lo=np.zeros(1), col_hi=np.full(1, np.inf), sense="max"))

    def add(self, roots: list[int], trees: list[np.ndarray]) -> None:
        """Append the symmetrised columns of ``trees`` (roots ``roots``)."""
        n_r, cols = self.root_size.size, []
        for root, arcs in zip(roots, trees):
            col = np.zeros(n_r + self.capacity.size)
            orbit = self.sym.root_orbit[root]
            col[orbit] = -1.0 / self.root_size[orbit]
            col[n_r:] = np.bincount(self.sym.link_orbit[arcs], minlength=self.capacity.size) \
                / (self.orbit_size * self.capacity)
            cols.append(col)
            self.roots.append(root)
            self.trees.append(arcs)
        block = sp.csc_matrix(np.stack(cols, axis=1))
        k = len(cols)
        self.backend.add_columns(np.zeros(k), np.zeros(k), np.full(k, np.inf),
                                 block.indptr, block.indices, block.data)

    def tree_arcs(self, pred_r: np.ndarray, root: int, parent: np.ndarray) -> np.ndarray:
        """Links of every edge path of the tree ``parent`` (rank space, edge of rank ``v``
        before rank ``v + 1``, each path in order), the path ``u -> v`` being the carrier
        ``h`` of ``u`` applied to the representative's path to ``h^-1(v)`` in its search
        tree ``pred_r[orbit of u]``: only the tree's own edges are mapped."""
        v = np.delete(np.arange(parent.size), root)
        u = parent[v]
        orbit = self.rep_index[u]
        src = self.gpu_nodes[self.reps[orbit]]
        cur = self.node_inv[u, self.gpu_nodes[v]]
        steps: list[np.ndarray] = []            # arcs walked back, -1 once arrived
        on = cur != src
        while on.any():
            arc = np.where(on, pred_r[orbit, cur], -1)
            if (arc[on] < 0).any():
                raise SolveError("the symmetry quotient: a tree edge has no mapped path")
            steps.append(arc)
            cur = np.where(on, self.tail[np.maximum(arc, 0)], cur)
            on = cur != src
        walk = np.stack(steps[::-1], axis=1)    # each row: -1s, then the path in order
        mapped = self.link_map[u[:, None], np.maximum(walk, 0)]
        return mapped[walk >= 0]

    def solve(self) -> tuple[float, np.ndarray, np.ndarray, np.ndarray]:
        """``max x`` over the columns so far: ``(x, z, sigma per root orbit, pi per link
        orbit)``."""
        sol = self.backend.solve(method="primal")
        if sol.status is not SolveStatus.OPTIMAL or sol.x is None or sol.row_duals is None:
            raise SolveError(f"the symmetry quotient's master ended with status "
                             f"{sol.status.value!r}")
        n_r = self.root_size.size
        duals = np.maximum(sol.row_duals, 0.0)
        return float(sol.x[0]), np.maximum(sol.x[1:], 0.0), duals[:n_r], duals[n_r:] / self.capacity


def _price(topo: Topology, q: _Quotient, pi: np.ndarray
           ) -> tuple[np.ndarray, list[np.ndarray]]:
    """Cheapest tree of each orbit's root at per-link prices ``pi_L / |L|``.  The prices
    are ``H``-invariant, so one Dijkstra per root orbit gives every source's paths: an
    element ``h`` carrying the representative ``r`` onto ``s`` (:meth:`.Symmetry.carriers`)
    maps ``r``'s search tree onto an equally cheap one of ``s`` (``cost[s, h(t)] =
    cost[r, t]``, the same sums of the same prices), which is all the arborescences
    need; they are the certified sparse ones (:mod:`.sparse_arborescence`)."""
    price = (pi / q.orbit_size)[q.sym.link_orbit]
    cost_r, pred_r = from_sources(topo, price, q.reps)
    parents, costs = min_arborescences_sparse(cost_r.ravel()[q.cost_index_t], q.reps)
    return costs, [q.tree_arcs(pred_r, int(r), parents[i]) for i, r in enumerate(q.reps.tolist())]


def _priced_out(q: _Quotient, pi: np.ndarray, sigma: np.ndarray, trees: list[np.ndarray]
                ) -> list[int]:
    """The root orbits whose tree in ``trees`` (one per orbit, priced at any point) has
    a negative reduced cost at the master's duals ``(sigma, pi)``."""
    per_link = (pi / q.orbit_size)[q.sym.link_orbit]
    tol = 1e-12 * max(float(sigma.max(initial=0.0)), 1e-300)
    return [o for o, arcs in enumerate(trees)
            if float(per_link[arcs].sum()) < sigma[o] / q.root_size[o] - tol]


def _column_generation(topo: Topology, q: _Quotient, upper: float,
                       deadline: float | None, seed: Columns | None = None,
                       max_rounds: int = QUOTIENT_MAX_ROUNDS
                       ) -> tuple[float, np.ndarray, float, int]:
    """Quotient column generation from ``seed``'s trees ``(roots, links)``, symmetrised
    (by default one cheapest tree per root orbit at prices ``1/cap``): ``(x, z, best
    bound, rounds)``; each round prices at the tie-broken duals, then at the duals
    (:data:`QUOTIENT_TIE_BREAK`, up to :data:`QUOTIENT_TIE_BREAK_MAX_GPUS` GPUs; every
    point's bound counts); stops at ``upper`` or the
    Lagrangian bound (within :data:`REL_TOL`), when no column prices out at the duals,
    or at ``max_rounds`` / the deadline."""
    if seed is None:
        anytime.check(QUOTIENT_CG)
        _, first = _price(topo, q, 1.0 / q.capacity)
        seed = (q.reps.tolist(), first)
    q.add(*seed)
    best = upper
    tie = QUOTIENT_TIE_BREAK if topo.num_gpus <= QUOTIENT_TIE_BREAK_MAX_GPUS else 0.0
    x, z = 0.0, np.zeros(0)
    for rnd in range(1, max_rounds + 1):
        anytime.check(QUOTIENT_CG)     # round 1 was 0.34-0.54 s CPU in one piece at 512 GPUs
        x, z, sigma, pi = q.solve()
        if best - x <= REL_TOL * max(x, 1e-300):
            return x, z, best, rnd
        new_r: list[int] = []
        new_t: list[np.ndarray] = []
        for price in pricing_points(None, pi, q.capacity, 0.0, tie):
            anytime.check(QUOTIENT_CG)
            costs, trees = _price(topo, q, price)
            best = min(best, price_bound(price, q.capacity, float(costs @ q.root_size)))
            if best - x <= REL_TOL * max(x, 1e-300):
                return x, z, best, rnd
            for o in _priced_out(q, pi, sigma, trees):
                if not any(r == q.reps[o] and np.array_equal(t, trees[o])
                           for r, t in zip(new_r, new_t)):     # found at both points
                    new_r.append(int(q.reps[o]))
                    new_t.append(trees[o])
        if new_r:
            q.add(new_r, new_t)
        if not new_r or (deadline is not None and time.perf_counter() >= deadline):
            return x, z, best, rnd
    return x, z, best, max_rounds


def solve_quotient(topo: Topology, upper_gbps: float | None = None,
                   cut_bound_gbps: float | None = None, sym: Symmetry | None = None,
                   backend: str = "highs", time_limit: float | None = None,
                   seed: Columns | None = None, max_rounds: int = QUOTIENT_MAX_ROUNDS,
                   max_copies: float = np.inf) -> Schedule | None:
    """The forwarding-only optimum of ``topo`` (``max_chunks=None``) from the master on
    its symmetry quotient (module docstring), or ``None`` when no symmetry is found, the
    quotient does not certify its optimum within ``max_rounds``, its expansion would copy
    more than ``max_copies`` trees (positive columns times the group's pieces), or the
    expanded schedule's rate falls short of it.  ``upper_gbps``: a certified upper bound on the
    forwarding-only optimum (the balanced restriction's optimum) at which the column
    generation may stop; ``seed``: starting trees ``(root ranks, links)`` of ``topo``
    (the restriction seed's, docs/allgather_history.md "Seeded quotient"); ``cut_bound_gbps``:
    the cut bound, for the report."""
    from .method import _schedule, rate_scale

    t_start = time.perf_counter()
    sym = sym if sym is not None else find_symmetry(topo)
    if sym is None:
        return None
    scale = rate_scale(topo)
    upper = np.inf if upper_gbps is None else upper_gbps / scale
    deadline = None if time_limit is None else t_start + time_limit
    with get_backend(backend) as lp:
        q = _Quotient(topo, sym, topo.arrays.capacity / scale, lp)
        x, z, bound, rounds = _column_generation(topo, q, upper, deadline, seed, max_rounds)
    if not bound - x <= REL_TOL * max(x, 1e-300) or \
            int((z > 0).sum()) * len(sym.pieces()) > max_copies:
        return None
    stats: dict[str, Any] = {
        "warm": False, "method": "general",
        "seed": "symmetric quotient" if seed is None else "seeded symmetric quotient",
        "seed_columns": len(q.trees), "quotient_rows": int(q.capacity.size + q.root_size.size),
        "quotient_columns": int((z > 0).sum()), "group_pieces": len(sym.pieces()),
        "warm_columns": 0, "cg_rounds": rounds, "cg_status": "optimal",
        "cg_gap": max(0.0, (bound - x) / bound), "bound_gbps": bound * scale,
        "dropped": 0, "link_rows": topo.num_links}

    def expanded(copies: Copies | None) -> tuple[Schedule, bool]:
        """The schedule of ``copies`` (uniform: ``None``), and whether every rank roots
        one of its trees and its own rate is ``x``."""
        expansion = expand(topo, sym, q.roots, q.trees, z, copies)
        res = TreeCGResult(expansion.pool, expansion.weights, x, max(bound, x), "optimal", rounds)
        sched = _schedule(topo, res, scale, None, cut_bound_gbps,
                          {**stats, "columns": len(expansion.pool)}, t_start, backend,
                          expansion.chunks)
        rooted = np.unique(expansion.pool.root[expansion.weights > 0]).size == topo.num_gpus
        return sched, rooted and sched.rate_gbps >= x * scale * (1 - REL_TOL)

    copies = _fewer_copies(topo, sym, q, z, topo.arrays.capacity / scale, backend)
    sched, exact = expanded(copies)
    if not exact and copies is not None:
        stats["copies_short"] = sched.rate_gbps         # the uniform copies reach x
        sched, exact = expanded(None)
    return sched if exact else None


def _fewer_copies(topo: Topology, sym: Symmetry, q: _Quotient, z: np.ndarray,
                  capacity: np.ndarray, backend: str) -> Copies | None:
    """The positive columns' copies on sparse marginals (:mod:`.sparse_copies`) when the
    uniform expansion copies more than :data:`SPARSE_COPIES_MIN_RATIO` times as many
    trees as the full master has rows (roots + links: a vertex of the full master has
    no more positive trees); else ``None`` (uniform)."""
    pos = np.flatnonzero(z > 0)
    if pos.size * len(sym.pieces()) <= SPARSE_COPIES_MIN_RATIO * (topo.num_gpus + topo.num_links):
        return None
    return sparse_copies(topo, sym, np.asarray(q.roots, np.int64)[pos],
                         [np.asarray(q.trees[j], np.int64) for j in pos.tolist()], z[pos],
                         capacity, backend)

