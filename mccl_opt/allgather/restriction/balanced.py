"""The forwarding-only AllGather optimum as the best *balanced restriction* of a fabric.

Theorem (docs/allgather_history.md, "Balanced restriction"): on any fabric with capacities
``c``, the forwarding-only optimum is

    x_fwd(c) = max { x_cut(c') : 0 <= c' <= c,  c' balanced at every switch },

``x_cut`` being Phase 1's cut bound (:mod:`~mccl_opt.allgather.forestcoll.throughput`).  (<=) the link loads of a
forwarding-only schedule are balanced at every switch (each switch-only edge path
leaves a switch as often as it enters it), are ``<= c``, and every set ``S`` holding a
GPU receives every outside root's trees across ``δ⁻(S)``, so their cut bound is at
least the schedule's rate.  (>=) on a balanced ``c'`` ForestColl (paper §4.3) reaches
``x_cut(c')`` with forwarding-only switches, and its trees are valid on ``c >= c'``.

The maximum is a cutting-plane LP (:func:`balanced_restriction`): variables ``c'`` and
``x``, switch balance rows, and one row ``c'(δ⁻(S)) >= |V_c \\ S| x`` per cut ``S`` of a
working set, separated by Phase 1's rooted max-flow test at the LP's ``(x, c')``.  The
LP is a relaxation of the cut-bound condition, so when no cut is violated its ``x`` is
the optimum.  The LP's floats are then recovered as exact rationals, and the
restriction is kept only if it is *certified* in exact integers: ``c' <= c``, every
switch balanced, and Phase 1's exact cut bound of ``c'`` equal to the LP optimum (the
lower bound is exact; the upper bound is the LP relaxation's optimum, a floating-point
LP as the general method's column-generation bound is).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import scipy.sparse as sp

from formulations.lp import LinearProgram

from mccl_opt import anytime
from mccl_opt.backends import get_backend
from mccl_opt.backends.solution import SolveStatus
from mccl_opt.errors import SolveError
from mccl_opt.topology import Topology
from ..fabric import fabric_of
from ..forestcoll.throughput import Fabric, optimal_rate

__all__ = ["CERT_TOL", "Restriction", "balanced_restriction", "restricted_topology", "coarsened"]

#: relative tolerance of "no cut is violated" and of the exact certificate
CERT_TOL = 1e-9

#: cut rows added to the LP per clock check (:meth:`_CutLP.add_cuts`): ~2-3 ms CPU at
#: 1024 GPUs (the 2,049 starting cuts took 20-25 ms as one block)
CUT_ROWS_PER_CHECK = 256

#: how far (relative to the largest capacity) an LP float may lie from the rational it is
#: read as: far below ``CERT_TOL`` so that a coarser rational cannot pass for the vertex;
#: the loosest first (smallest denominators), then tighter ones when a coarser rational
#: passed for a coordinate and the reading does not certify (a switch left unbalanced, or
#: a cut bound below the LP's ``x``): the vertex's floats are exact to ~1e-15
_READ_TOLS = (1e-12, 1e-13, 1e-14)

#: largest denominator tried when the LP's floats are read back as rationals
_MAX_DENOMINATOR = 1 << 20


@dataclass
class Restriction:
    """A certified balanced restriction: integer capacities ``units`` (``units[a] *
    unit_gbps`` Gbps on link ``a``, ``<=`` the fabric's ``ceiling[a]`` in the same
    unit), its exact cut bound ``rate_gbps`` (the forwarding-only optimum) and the
    cutting-plane rounds taken."""

    units: np.ndarray
    unit_gbps: float
    rate_gbps: float
    rounds: int
    ceiling: np.ndarray

    def headroom(self) -> list[Fraction]:
        """``c_a / c'_a`` of every link :func:`restricted_topology` keeps (in its order):
        how far ForestColl's tree units may round up on the real fabric."""
        return [Fraction(int(c), int(u)) for c, u in zip(self.ceiling.tolist(),
                                                         self.units.tolist()) if u > 0]


def balanced_restriction(topo: Topology, backend: str = "highs",
                         max_rounds: int = 200) -> Restriction | None:
    """The best balanced restriction of ``topo`` (module docstring), certified, or
    ``None`` when the cutting planes do not converge within ``max_rounds`` or the LP's
    solution cannot be certified in exact arithmetic.

    Two stages: the largest ``x``, then, with ``x`` held, the largest total capacity
    ``sum c'`` (a restriction close to ``c``, on which ForestColl's packing and chunk
    rounding behave as on the fabric itself rather than on an arbitrary LP vertex).

    When a round leaves ``x`` where it was (*stalled*: the cuts cut off that ``c'`` but
    not that ``x``; with a PCIe switch per GPU pair the face ``x = const`` has so many
    vertices that 200 rounds did not reach a feasible one, docs/allgather_history.md "Stalled
    cutting planes"), the second stage is tried at once on the cuts the first stage had
    at that ``x`` (so it is feasible): its ``c'``, the largest one, violates no cut where
    ``x`` is the optimum, and that ends both stages; its violated cuts go to both LPs."""
    fab, q = fabric_of(topo)
    is_switch = topo.arrays.is_switch
    lp = _CutLP(fab, is_switch, backend)
    lp.add_cuts(_starting_cuts(fab) + [optimal_rate(fab).cut])
    fill: _CutLP | None = None
    last = math.inf
    for rounds in range(1, max_rounds + 1):
        anytime.check("the balanced restriction's cutting planes")
        x, cap = lp.solve()
        found = _separate(fab, cap, x * (1 - CERT_TOL / 10))
        if not found:                               # x is the optimum: fill at it
            break
        if x >= last * (1 - CERT_TOL):              # x stalled: search its face instead
            if fill is None:
                fill = _CutLP(fab, is_switch, backend, rate_at_least=x)
            fill.hold(x)
            fill.add_cuts(lp.cuts[len(fill.cuts):])  # lp's cuts at x: feasible
            _, filled = fill.solve()
            more = _separate(fab, filled, x * (1 - CERT_TOL / 10))
            if not more:                            # x is reached and bounds the LP: done
                return _certified(fab, is_switch, filled, x, q, rounds)
            found += more
        last = x
        if not lp.add_cuts(found):
            return None
    else:
        return None
    fill = _CutLP(fab, is_switch, backend, rate_at_least=x)   # the vertex: small denominators
    fill.add_cuts(lp.cuts)
    filled = _cutting_planes(fill, fab, x, max_rounds - rounds)
    if filled is None:
        return None
    return _certified(fab, is_switch, filled[2], x, q, rounds + filled[0])


def _cutting_planes(lp: "_CutLP", fab: Fabric, rate: float,
                    max_rounds: int) -> tuple[int, float, np.ndarray] | None:
    """Solve ``lp``, add the cuts its ``c'`` violates at ``rate``, until none is violated:
    ``(rounds, x, c')`` of the last solve; ``None`` past ``max_rounds`` or when a round
    finds only cuts already in the LP (no progress)."""
    for rounds in range(1, max_rounds + 1):
        anytime.check("the balanced restriction's cutting planes")
        x, cap = lp.solve()
        found = _separate(fab, cap, rate * (1 - CERT_TOL / 10))
        if not found:
            return rounds, x, cap
        if not lp.add_cuts(found):
            return None
    return None


def restricted_topology(topo: Topology, r: Restriction) -> tuple[Topology, float]:
    """``topo`` with the capacities of ``r`` (links at 0 dropped), scaled so that
    :func:`~mccl_opt.allgather.fabric.fabric_of` quantizes them exactly, and the factor from that
    topology's Gbps to real Gbps; raises :class:`SolveError` if no such scaling
    exists (capacities too fine for the quantum)."""
    keep = r.units > 0
    if not keep.any():
        raise SolveError("balanced restriction: every capacity is zero")
    units = r.units[keep]
    g = math.gcd(*(int(u) for u in units))
    units = units // g
    digits = math.floor(math.log10(int(units.min())))
    if digits > 6:                                    # quantum would exceed one unit
        raise SolveError("balanced restriction: capacities too fine for exact quantization")
    scale = 10.0 ** (6 - digits)                      # smallest link in [1e6, 1e7) quanta
    links = [l for l, k in zip(topo.links, keep) if k]
    sub = Topology(topo.name, topo.nodes, links, topo.extra).with_capacities(units * scale)
    fab, q = fabric_of(sub)
    if not np.array_equal(fab.cap, units * round(scale / q)):
        raise SolveError("balanced restriction: the scaled capacities did not quantize exactly")
    return sub, r.unit_gbps * g / scale


def coarsened(topo: Topology, r: Restriction, backend: str = "highs") -> Restriction:
    """``r`` itself when :func:`restricted_topology` quantizes it exactly, else ``r``
    rounded onto a grid ``D`` times coarser (its smallest kept link below ``10^7`` grid
    steps, what :func:`~mccl_opt.allgather.fabric.quantum_for` keeps): each ``c'_a`` to
    ``floor`` or ``ceil`` of ``c'_a / D`` (never above ``c``), still balanced at every
    switch.  Such a rounding exists (``c' / D`` is a fractional point of that box and the
    balance rows form a network matrix, whose box polytope has integer vertices), and a
    simplex vertex is one.  Its ``rate_gbps`` is its own exact cut bound, within about
    ``D / c'_min`` (~1e-7 relative) of ``r``'s.  The LP's exact vertex can need more
    digits than that (leaf-spine 4x2x8 with one NIC at 160.889 Gbps one way: the
    smallest link is 10 296 896 units); raises :class:`SolveError` when no rounding
    within ``c`` is found."""
    keep = r.units > 0
    if not keep.any():
        return r
    g = math.gcd(*(int(u) for u in r.units[keep]))
    digits = math.floor(math.log10(int(r.units[keep].min()) // g))
    if digits <= 6:
        return r
    d = g * 10 ** (digits - 6)
    lo, hi = r.units // d, np.minimum(-(-r.units // d), r.ceiling // d)
    fab, _ = fabric_of(topo)
    sw = np.flatnonzero(topo.arrays.is_switch)
    row_of = np.full(fab.n, -1)
    row_of[sw] = np.arange(sw.size)
    m = fab.tail.size
    arcs = np.arange(m)
    rows = np.concatenate([row_of[fab.head], row_of[fab.tail]])
    vals = np.concatenate([np.ones(m), -np.ones(m)])
    ok = rows >= 0
    a = sp.csr_matrix((vals[ok], (rows[ok], np.concatenate([arcs, arcs])[ok])),
                      shape=(sw.size, m))
    at_limit = "the balanced restriction's coarser grid: the LP at the time limit"
    if not anytime.lp_room():                 # it would return past the limit
        anytime.run_out(at_limit)
    lp = get_backend(backend)
    lp.load(LinearProgram(c=np.ones(m), A=a, row_lo=np.zeros(sw.size), row_hi=np.zeros(sw.size),
                          col_lo=lo.astype(float), col_hi=hi.astype(float)))
    sol = lp.solve(time_limit=anytime.lp_time_limit())
    if sol.status is SolveStatus.TIME_LIMIT:
        anytime.run_out(at_limit)
    if sol.status is not SolveStatus.OPTIMAL or sol.x is None:
        raise SolveError("balanced restriction: capacities too fine for exact quantization, "
                         "and no balanced rounding onto a coarser grid fits the links")
    units = np.rint(sol.x).astype(np.int64)
    net = np.zeros(fab.n, np.int64)
    np.add.at(net, fab.head, units)
    np.subtract.at(net, fab.tail, units)
    if np.any(net[sw] != 0) or np.any(units < lo) or np.any(units > hi):
        raise SolveError("balanced restriction: the rounding onto a coarser grid is not "
                         "balanced")
    rate = float(optimal_rate(fab.with_caps(units)).rate)
    return Restriction(units * d, r.unit_gbps, rate * d * r.unit_gbps, r.rounds, r.ceiling)


def _starting_cuts(fab: Fabric) -> list[np.ndarray]:
    """Every GPU's ingress set ``{g}`` and egress set ``V \\ {g}`` (sink sides)."""
    cuts = []
    for g in fab.gpus:
        s = np.zeros(fab.n, bool)
        s[g] = True
        cuts += [s, ~s]
    return cuts


class _CutLP:
    """``max x`` over ``(c', x)``: ``0 <= c' <= c``, balance at switches, and the cut
    rows added so far, on a backend, in units of the largest capacity (O(1) numbers)."""

    def __init__(self, fab: Fabric, is_switch: np.ndarray, backend: str,
                 rate_at_least: float | None = None) -> None:
        self.fab = fab
        self.scale = float(fab.cap.max())
        m = fab.tail.size
        sw = np.flatnonzero(is_switch)
        row_of = np.full(fab.n, -1)
        row_of[sw] = np.arange(sw.size)
        arcs = np.arange(m)
        rows = np.concatenate([row_of[fab.head], row_of[fab.tail]])
        cols = np.concatenate([arcs, arcs])
        vals = np.concatenate([np.ones(m), -np.ones(m)])
        ok = rows >= 0
        a = sp.csr_matrix((vals[ok], (rows[ok], cols[ok])), shape=(sw.size, m + 1))
        zero = np.zeros(sw.size)
        self.backend = get_backend(backend)
        fill = rate_at_least is not None
        self.backend.load(LinearProgram(
            c=np.r_[np.ones(m) if fill else np.zeros(m), 0.0 if fill else 1.0], A=a,
            row_lo=zero, row_hi=zero, col_hi=np.r_[fab.cap / self.scale, np.inf],
            col_lo=np.r_[np.zeros(m), rate_at_least / self.scale if fill else 0.0]))
        self.seen: set[bytes] = set()
        self.cuts: list[np.ndarray] = []

    def hold(self, rate: float) -> None:
        """Hold ``x >= rate`` (quanta)."""
        m = self.fab.tail.size
        self.backend.set_column_bounds(np.array([m]), np.array([rate / self.scale]),
                                       np.array([np.inf]))

    def add_cuts(self, cuts: list[np.ndarray]) -> int:
        """Append the rows ``c'(δ⁻(S)) - |V_c \\ S| x >= 0`` of new sink sides ``S``;
        returns how many were new.  Built in arrays, :data:`CUT_ROWS_PER_CHECK` rows at a
        time, the clock checked before each block (a row per cut in Python took 0.1 s
        for the 2,049 starting cuts at 1,024 GPUs, all rows at once 8-25 ms CPU at 512-1024
        GPUs, past a time limit with no check point: docs/allgather_history.md "The first
        schedule at 50 ms", "Checks before every span")."""
        if not cuts:
            return 0
        is_gpu = self.fab.is_gpu()
        sides = np.asarray(cuts, bool)
        splits = (is_gpu & ~sides).any(axis=1) & (is_gpu & sides).any(axis=1)
        keys = np.packbits(sides, axis=1)
        fresh = []
        for i in np.flatnonzero(splits).tolist():
            key = keys[i].tobytes()
            if key not in self.seen:
                self.seen.add(key)
                fresh.append(i)
        for lo in range(0, len(fresh), CUT_ROWS_PER_CHECK):
            anytime.check("the balanced restriction's cut rows")
            block = fresh[lo: lo + CUT_ROWS_PER_CHECK]
            self.cuts += [cuts[i] for i in block]
            self._add_rows(sides[block], is_gpu)
        return len(fresh)

    def _add_rows(self, chosen: np.ndarray, is_gpu: np.ndarray) -> None:
        """The rows of the sink sides ``chosen`` (bool, cuts x nodes), in one call."""
        k, m = chosen.shape[0], self.fab.tail.size
        by_node = np.ascontiguousarray(chosen.T)              # arcs x cuts, gathered by rows
        arc, row = np.divmod(np.flatnonzero(~by_node[self.fab.tail] & by_node[self.fab.head]), k)
        order = np.lexsort((arc, row))                        # row by row, arcs ascending
        row, arc = row[order], arc[order]
        starts = np.zeros(k + 1, np.int64)
        np.cumsum(np.bincount(row, minlength=k) + 1, out=starts[1:])
        idx = np.full(starts[-1], m, np.int64)               # each row ends with x's column
        vals = np.empty(starts[-1])
        idx[np.arange(row.size) + row] = arc
        vals[np.arange(row.size) + row] = 1.0
        vals[starts[1:] - 1] = -np.count_nonzero(is_gpu & ~chosen, axis=1).astype(float)
        self.backend.add_rows(np.zeros(k), np.full(k, np.inf), starts, idx, vals)

    def solve(self) -> tuple[float, np.ndarray]:
        """The LP's ``x`` and ``c'``, in capacity quanta."""
        at_limit = "the balanced restriction's cutting planes: the LP at the time limit"
        if not anytime.lp_room():             # it would return past the limit
            anytime.run_out(at_limit)
        sol = self.backend.solve(time_limit=anytime.lp_time_limit())
        if sol.status is SolveStatus.TIME_LIMIT:
            anytime.run_out(at_limit)
        if sol.status is not SolveStatus.OPTIMAL or sol.x is None:
            raise SolveError(f"balanced restriction LP ended {sol.status.value}")
        return float(sol.x[-1]) * self.scale, np.clip(sol.x[:-1], 0.0, None) * self.scale


def _separate(fab: Fabric, cap: np.ndarray, x: float) -> list[np.ndarray]:
    """Sink sides of cuts violated by ``cap`` (quanta, floats) at rate ``x``: Phase 1's
    rooted test at every GPU (one minimum cut per failing GPU not inside an earlier cut:
    those repeat its cut or one like it, and their max-flows were 60% of a round on
    shared-nic 2x8x8-p2, whose 128 failing GPUs gave 16 distinct cuts).  Capacities are rounded
    *up* on a grid of ``1/grid`` quanta (``grid`` a power of two, as fine as int64
    max-flow allows up to ``2^20``), so every cut found is violated by the floats too."""
    span = max(float(cap.max()), 1.0) * fab.num_gpus
    grid = 2 ** max(0, min(20, math.floor(math.log2(2.0 ** 56 / span))))
    links = np.ceil(cap * grid).astype(np.int64)
    per_gpu = int(math.floor(x * grid))
    if per_gpu <= 0:
        return []
    caps = fab.net.caps()
    caps[: fab.net.m] = links
    caps[fab.net.s_arc0 + fab.gpus] = per_gpu
    return list(fab.net.failing_sets(caps, fab.sweep(), fab.num_gpus * per_gpu,
                                     fab.num_gpus, skip=True))


def _simplest_near(v: float, eps: float) -> Fraction:
    """The first continued-fraction convergent of ``v`` within ``eps`` of it (an LP
    vertex's coordinates are rationals of small denominator, computed to ~1e-15), in
    integers: ``v = p / q`` and ``eps = e / d`` exactly, so ``|h/k - v| <= eps`` is
    ``|h q - p k| d <= e k q``."""
    p, q = float(v).as_integer_ratio()
    e, d = float(eps).as_integer_ratio()
    h0, h1, k0, k1 = 0, 1, 1, 0
    num, den = p, q
    while True:
        a, r = divmod(num, den)
        h0, h1, k0, k1 = h1, a * h1 + h0, k1, a * k1 + k0
        if abs(h1 * q - p * k1) * d <= e * k1 * q or k1 > _MAX_DENOMINATOR or r == 0:
            return Fraction(h1, k1)
        num, den = den, r


def _certified(fab: Fabric, is_switch: np.ndarray, cap: np.ndarray, x: float, q: float,
               rounds: int) -> Restriction | None:
    """The LP's ``c'`` read back as exact rationals over a common denominator
    (:func:`_read`, at each of :data:`_READ_TOLS` until one certifies), kept only if it
    is ``<= c``, exactly balanced at every switch, and its exact cut bound is the LP
    optimum ``x`` within :data:`CERT_TOL`."""
    if x <= 0:
        return None
    for tol in _READ_TOLS:
        found = _read(fab, is_switch, cap, x, q, rounds, tol * float(fab.cap.max()))
        if found is not None:
            return found
    return None


def _read(fab: Fabric, is_switch: np.ndarray, cap: np.ndarray, x: float, q: float,
          rounds: int, eps: float) -> Restriction | None:
    """:func:`_certified` at one reading tolerance ``eps`` (quanta)."""
    fracs = [_simplest_near(float(v), eps) for v in cap]
    den = math.lcm(*(f.denominator for f in fracs))
    if den > _MAX_DENOMINATOR or int(fab.cap.max()) * den >= 1 << 40:
        return None
    units = np.array([f.numerator * (den // f.denominator) for f in fracs], np.int64)
    if (units > fab.cap * den).any() or (units < 0).any():
        return None
    net = np.zeros(fab.n, np.int64)
    np.add.at(net, fab.head, units)
    np.subtract.at(net, fab.tail, units)
    if np.any(net[is_switch] != 0):
        return None
    exact = fab.with_caps(units)
    rate = optimal_rate(exact).rate / den
    if float(rate) < x * (1 - CERT_TOL):
        return None
    return Restriction(units, q / den, float(rate) * q, rounds, fab.cap * den)
