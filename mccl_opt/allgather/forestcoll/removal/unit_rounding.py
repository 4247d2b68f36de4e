"""Tree units of a balanced restriction rounded so that every switch stays balanced.

ForestColl (paper §4.3) gives link ``e`` ``floor(c'_e / y)`` tree units.  On a balanced
restriction ``c'`` of a fabric ``c`` (:mod:`mccl_opt.allgather.restriction.balanced`) those floors can unbalance a
switch (in-units != out-units), and the greedy balancing (:func:`.splitting.
balance_switches`, one switch after another) then breaks the rooted cut condition or
leaves a switch unbalanced (docs/allgather.md, "Balanced restriction rounding").  But
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
from typing import Sequence

import numpy as np

from ...budget import FEWEST_TRIES
from ..maxflow import FlowNetwork
from ..throughput import Fabric, _violated_cut

__all__ = ["balanced_units", "rounded_restriction", "fewest_rounded", "MAX_LOSS", "MAX_STEPS"]

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
    y = Fraction(int(y.numerator), int(y.denominator))      # Python ints: no int64 overflow
    stop = y * (1 - MAX_LOSS)
    for _ in range(MAX_STEPS):
        floors = (fab.cap * y.denominator) // y.numerator
        room = _room(ceiling, y)
        units = balanced_units(fab, is_switch, floors, room, k)
        if units is not None:
            return units, y
        # the largest bandwidth below y at which a floor or a room gains a unit
        nxt = max([Fraction(int(c), int(f) + 1) for c, f in zip(fab.cap.tolist(), floors.tolist())]
                  + [Fraction(num, den * (int(r) + 1)) for (num, den), r in
                     zip(ceiling, room.tolist())])
        if nxt < stop:
            return None
        y = nxt
    return None


def fewest_rounded(fab: Fabric, is_switch: np.ndarray, k0: int, y0: Fraction,
                   headroom: Sequence[Fraction]) -> tuple[np.ndarray, int, Fraction] | None:
    """The exact optimum ``x* = k0·y0`` with fewer trees: the smallest ``k < k0`` (at most
    :data:`~mccl_opt.allgather.budget.FEWEST_TRIES`) whose balanced units at ``y = x*/k``
    (:func:`balanced_units`, room from ``headroom``) admit ``k`` trees per root, as
    ``(units, k, y)``; ``None`` if none.  A restriction's ``k0`` is large (its capacities
    are the LP's rationals: 1311 trees per root on shared aggregation 2x5x8 with one
    NIC degraded one way, 173 M repair-packer visits), and rounding up where the real
    fabric has room often reaches ``x*`` with a handful."""
    ceiling = _ceiling(fab, headroom)
    x = Fraction(int(k0)) * Fraction(int(y0.numerator), int(y0.denominator))
    outside = fab.num_gpus - 1
    for k in range(1, min(int(k0), FEWEST_TRIES + 1)):
        y = x / k
        room = _room(ceiling, y)
        if (np.bincount(fab.head, weights=room, minlength=fab.n)[fab.gpus] < k * outside).any():
            continue                                   # a GPU's ingress falls short
        units = balanced_units(fab, is_switch, (fab.cap * y.denominator) // y.numerator, room,
                               k, admitted=False)
        if units is not None:
            return units, k, y
    return None


def _ceiling(fab: Fabric, headroom: Sequence[Fraction]) -> list[tuple[int, int]]:
    """Every link's real capacity in quanta of ``fab``, as ``(numerator, denominator)``."""
    return [(int(c) * h.numerator, h.denominator) for c, h in zip(fab.cap.tolist(), headroom)]


def _room(ceiling: list[tuple[int, int]], y: Fraction) -> np.ndarray:
    """Tree units of bandwidth ``y`` each link carries on the real fabric."""
    return np.array([(num * y.denominator) // (den * y.numerator) for num, den in ceiling],
                    np.int64)


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
    if units is None or _violated_cut(fab, units, k, fab.num_gpus * k, fab.gpus)[0] >= 0:
        return None
    return units


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
