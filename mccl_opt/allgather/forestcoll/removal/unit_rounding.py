"""Tree units of a balanced restriction rounded so that every switch stays balanced.

ForestColl (paper §4.3) gives link ``e`` ``floor(c'_e / y)`` tree units.  On a balanced
restriction ``c'`` of a fabric ``c`` (:mod:`mccl_opt.allgather.restriction.balanced`) those floors can unbalance a
switch (in-units != out-units), and the greedy balancing of the time, one switch after
another, then broke the rooted cut condition or left a switch unbalanced
(docs/allgather_history.md, "Balanced restriction rounding").  But
``c'/y`` is itself balanced at every switch: with all GPUs merged into one node it is a
flow, and integer changes ``u - floor(c'/y)`` that rebalance every switch are a flow of
the floors' imbalances (:func:`balanced_units`, one max-flow): first rounding up only,
where the real fabric has room (``u_e·y <= c_e``), which keeps every cut at least as
large as the chunk budget's rooted test accepted; else also rounding down links into a
switch (never a link into a GPU: a GPU's ingress is the tightest cut), and the result is
kept only if it passes the rooted test for ``k`` trees per root.  On balanced units that
admit ``k``, Phase 2's splitting-off completes (Mader's theorem).
"""

from __future__ import annotations

from fractions import Fraction
from math import lcm
from typing import Iterable, Sequence

import numpy as np

from mccl_opt import anytime
from ...budget import EXACT_TREES_LIMIT, FEWEST_TRIES
from ..maxflow import FlowNetwork
from ..throughput import Fabric, _violated_cut
from .balancing import BALANCING

__all__ = ["balanced_units", "restriction_units", "rounded_restriction", "fewest_rounded",
           "exact_tries", "MAX_LOSS", "MAX_STEPS"]

#: :func:`rounded_restriction` lowers the tree bandwidth by at most this share ...
MAX_LOSS = Fraction(1, 20)
#: ... in at most this many steps (each one max-flow, plus a rooted test)
MAX_STEPS = 64


def rounded_restriction(fab: Fabric, is_switch: np.ndarray, k: int, y: Fraction,
                        headroom: Sequence[Fraction]) -> tuple[np.ndarray, Fraction] | None:
    """Balanced tree units admitting ``k`` trees per root on a restriction ``fab`` of a
    real fabric (``headroom``: ``c_e / c'_e``), and their tree bandwidth: at ``y`` if
    :func:`balanced_units` finds them, else at the next lower bandwidth where some
    link's floor or room gains a unit, and so on (the floors of a restriction can lose
    more than a balanced rounding can make up: 0.5 unit on each of 80 NIC links of
    shared aggregation 2x5x8 with one NIC degraded one way, more than the GPUs' ingress
    can spare); ``None`` past :data:`MAX_LOSS` or :data:`MAX_STEPS`."""
    ceiling = _ceiling(fab, headroom)
    real = _reals(ceiling)
    y = Fraction(int(y.numerator), int(y.denominator))      # Python ints: no int64 overflow
    stop = y * (1 - MAX_LOSS)
    for _ in range(MAX_STEPS):
        anytime.check(BALANCING)
        floors = (fab.cap * y.denominator) // y.numerator
        room = _room(ceiling, real, y)
        units = balanced_units(fab, is_switch, floors, room, k)
        if units is not None:
            return units, y
        nxt = _next_bandwidth(fab.cap, floors, ceiling, real, room)
        if nxt < stop:
            return None
        y = nxt
    return None


#: relative margin of :func:`_next_bandwidth`'s float screen (each float candidate is
#: within a few ulps, ~1e-15, of its exact value)
_SCREEN = 1e-9


def _next_bandwidth(cap: np.ndarray, floors: np.ndarray, ceiling: list[tuple[int, int]],
                    real: np.ndarray, room: np.ndarray) -> Fraction:
    """The largest bandwidth below the current one at which a link's floor or its room
    on the real fabric gains a unit: the largest of ``c_e / (floor_e + 1)`` and
    ``ceiling_e / (room_e + 1)`` (``real``: the ceilings as floats), screened in floats
    and decided in exact fractions among the candidates within :data:`_SCREEN` of the
    largest (one Fraction per link per step cost 60 ms of SuperPOD 2x4x8's seed)."""
    by_floor = cap / (floors + 1.0)
    by_room = real / (room + 1.0)
    near = max(float(by_floor.max(initial=0.0)), float(by_room.max(initial=0.0))) * (1 - _SCREEN)
    return max([Fraction(int(cap[i]), int(floors[i]) + 1) for i in np.flatnonzero(by_floor >= near)]
               + [Fraction(ceiling[i][0], ceiling[i][1] * (int(room[i]) + 1))
                  for i in np.flatnonzero(by_room >= near)])


def restriction_units(fab: Fabric, is_switch: np.ndarray, k: int, y: Fraction,
                      headroom: Sequence[Fraction], exact: bool, optimum: Fraction | None
                      ) -> tuple[tuple[np.ndarray, int] | None, tuple[np.ndarray, Fraction] | None]:
    """Balanced units of a restriction for :func:`..pipeline.balanced_split`: ``(found,
    rounded)``, ``found`` the ``(units, trees per root)`` to keep, else ``None`` and
    :func:`rounded_restriction`'s answer at a lower ``y`` to weigh.  ``exact``
    (``max_chunks=None``): the optimum ``x`` (``optimum``, Phase 1's ``x*``, else ``k·y``)
    is sought first with fewer trees than ``k``, then at ``k`` itself, then with more
    (:func:`exact_tries`: the budget can stop below ``x*``); a rounding at ``y`` below
    ``x*`` is kept only when none of these reaches it."""
    x = k * y if optimum is None else optimum
    if exact:
        fewer = fewest_rounded(fab, is_switch, x, range(1, min(k, FEWEST_TRIES + 1)), headroom)
        if fewer is not None:                          # the exact optimum in fewer trees
            return fewer[:2], None
    rounded = rounded_restriction(fab, is_switch, k, y, headroom)
    kept = rounded is not None and rounded[1] == y     # no bandwidth given up
    if kept and (k * y == x or not exact):
        return (rounded[0], k), None
    more = fewest_rounded(fab, is_switch, x, ([] if kept else [k]) +
                          exact_tries(fab, x, k, headroom, EXACT_TREES_LIMIT),
                          headroom) if exact else None
    if more is not None:                               # the exact optimum in more trees
        return more[:2], None
    return ((rounded[0], k), None) if kept else (None, rounded)


def fewest_rounded(fab: Fabric, is_switch: np.ndarray, x: Fraction, tries: Iterable[int],
                   headroom: Sequence[Fraction]) -> tuple[np.ndarray, int, Fraction] | None:
    """The exact optimum ``x`` (quanta) with the first ``k`` of ``tries`` whose balanced
    units at ``y = x/k`` (:func:`balanced_units`, room from ``headroom``) admit ``k``
    trees per root, as ``(units, k, y)``; ``None`` if none.  A restriction's ``k0`` is
    large (its capacities are the LP's rationals: 1311 trees per root on shared
    aggregation 2x5x8 with one NIC degraded one way, 173 M repair-packer visits), and
    rounding up where the real fabric has room often reaches ``x`` with a handful
    (:func:`exact_tries` lists the ``k`` worth trying)."""
    ceiling = _ceiling(fab, headroom)
    real = _reals(ceiling)
    x = Fraction(int(x.numerator), int(x.denominator))     # Python ints: no int64 overflow
    outside = fab.num_gpus - 1
    for k in tries:
        anytime.check(BALANCING)
        y = x / k
        room = _room(ceiling, real, y)
        if (np.bincount(fab.head, weights=room, minlength=fab.n)[fab.gpus] < k * outside).any():
            continue                                   # a GPU's ingress falls short
        units = balanced_units(fab, is_switch, (fab.cap * y.denominator) // y.numerator, room,
                               k, admitted=False)
        if units is not None:
            return units, k, y
    return None


def exact_tries(fab: Fabric, x: Fraction, k0: int, headroom: Sequence[Fraction],
                limit: int) -> list[int]:
    """The ``k`` worth trying for the exact optimum ``x`` of a restriction after the
    budget's ``k0`` and those below it: ``k0 < k <= FEWEST_TRIES``, then the *real*
    fabric's exact ``k`` (every ``c_e·k/x`` an integer, so ``room`` loses nothing) if
    above ``FEWEST_TRIES`` and at most ``limit``.  The restriction's own
    budget can stop below ``x`` (its exact ``k`` overflows the unit counts) and need not
    balance: HPN 2x8x8 with one NVLink at half capacity one way has ``k0 = 8`` and its
    optimum only at ``k = 155``, the real fabric's exact ``k``."""
    tries = list(range(int(k0) + 1, FEWEST_TRIES + 1))
    real = 1
    for num, den in _ceiling(fab, headroom):
        real = lcm(real, (Fraction(num, den) / x).denominator)
        if real > limit:
            return tries
    return tries + [real] if real > FEWEST_TRIES and real != k0 else tries


def _ceiling(fab: Fabric, headroom: Sequence[Fraction]) -> list[tuple[int, int]]:
    """Every link's real capacity in quanta of ``fab``, as ``(numerator, denominator)``."""
    return [(int(c) * h.numerator, h.denominator) for c, h in zip(fab.cap.tolist(), headroom)]


def _reals(ceiling: list[tuple[int, int]]) -> np.ndarray:
    """The ceilings as floats (each correctly rounded), for :func:`_room`'s screen."""
    return np.array([num / den for num, den in ceiling], np.float64)


def _room(ceiling: list[tuple[int, int]], real: np.ndarray, y: Fraction) -> np.ndarray:
    """Tree units of bandwidth ``y`` each link carries on the real fabric:
    ``floor(ceiling / y)``, in floats (``real``: :func:`_reals`) where the quotient is not
    within :data:`_SCREEN` of an integer, exactly in Python integers where it is (one
    Python division per link per bandwidth tried was 30-40 % of the exact restriction
    rounding at ``max_chunks=None``: leaf-spine 2x2x8 one way, 65 bandwidths)."""
    quotient = real / (y.numerator / y.denominator)
    units = np.floor(quotient)
    near = (quotient - units < _SCREEN * np.maximum(quotient, 1.0)) | \
        (units + 1 - quotient < _SCREEN * np.maximum(quotient, 1.0)) | (quotient > 2.0 ** 50)
    units = units.astype(np.int64)
    for i in np.flatnonzero(near).tolist():
        num, den = ceiling[i]
        units[i] = (num * y.denominator) // (den * y.numerator)
    return units


def balanced_units(fab: Fabric, is_switch: np.ndarray, floors: np.ndarray,
                   room: np.ndarray, k: int, admitted: bool = True) -> np.ndarray | None:
    """Integer units ``u`` (``u <= max(floors, room)``) with in-units equal to out-units
    at every switch (GPUs unconstrained) that admit ``k`` trees per root, or ``None``
    (module doc).  ``admitted``: ``floors`` are known to admit ``k`` trees per root, so
    units rounded up only need no rooted test; balanced ``floors`` are then returned
    unchanged."""
    floors = np.asarray(floors, np.int64)
    n = is_switch.size
    excess = np.bincount(fab.head, weights=floors, minlength=n) - \
        np.bincount(fab.tail, weights=floors, minlength=n)
    excess = np.rint(excess).astype(np.int64)[is_switch]
    units = floors if not excess.any() else _rebalanced(fab, is_switch, floors, room, excess,
                                                        down=False)
    if units is not None and admitted:
        return units
    if units is None:
        units = _rebalanced(fab, is_switch, floors, room, excess, down=True)
    if units is None or _gpu_short(fab, units, k) or \
            _violated_cut(fab, units, k, fab.num_gpus * k, fab.sweep())[0] >= 0:
        return None
    return units


def _gpu_short(fab: Fabric, units: np.ndarray, k: int) -> bool:
    """Whether some GPU's in-units fall short of the ``k (n - 1)`` trees owed to it: the
    rooted test's one-GPU sets, a bincount instead of a sweep (dragonfly 4x4x1x8 one way,
    fuzz seed 3511: every one of the ~30 roundings the exact search rejected failed at a
    lone GPU, ~3.4 ms a sweep; docs/allgather_history.md "Lossless balancing first")"""
    ingress = np.bincount(fab.head, weights=units, minlength=fab.n)[fab.gpus]
    return bool((ingress < k * (fab.num_gpus - 1)).any())


def _rebalanced(fab: Fabric, is_switch: np.ndarray, floors: np.ndarray, room: np.ndarray,
                excess: np.ndarray, down: bool) -> np.ndarray | None:
    """One max-flow of the switches' ``excess`` (in- minus out-units) over the network of
    switches and one merged GPU node: link ``a -> b`` rounds up along ``a -> b`` (its
    room) and, with ``down``, down along ``b -> a`` (its floor; ``b`` a switch)."""
    tail, head = fab.tail, fab.head
    gpu_node = int(excess.size)
    node = np.full(is_switch.size, gpu_node, np.int64)
    node[is_switch] = np.arange(gpu_node)
    at_switch = is_switch[tail] | is_switch[head]
    extra = np.maximum(np.asarray(room, np.int64) - floors, 0)
    ups = np.flatnonzero(at_switch & (extra > 0))
    downs = np.flatnonzero(is_switch[head] & (floors > 0)) if down else ups[:0]
    net = FlowNetwork(gpu_node + 1, np.r_[node[tail[ups]], node[head[downs]]],
                      np.r_[node[head[ups]], node[tail[downs]]])
    caps = net.caps()
    caps[: ups.size] = extra[ups]
    caps[ups.size: ups.size + downs.size] = floors[downs]
    # a switch with more in- than out-units must send the difference out
    total = int(excess.sum())
    caps[net.s_arc0: net.s_arc0 + gpu_node + 1] = np.r_[np.maximum(excess, 0), max(0, -total)]
    caps[net.t_arc0: net.t_arc0 + gpu_node + 1] = np.r_[np.maximum(-excess, 0), max(0, total)]
    need = int(np.maximum(excess, 0).sum()) + max(0, -total)
    if net.max_flow(caps) < need:
        return None
    flow = net.flows(ups.size + downs.size)
    units = floors.copy()
    units[ups] += flow[: ups.size]
    units[downs] -= flow[ups.size:]
    return units
