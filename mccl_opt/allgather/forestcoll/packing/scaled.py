"""Phase 3 with many trees per root: a scaled packing plus a residual one (paper §4.3).

ForestColl's optimum is ``k`` trees per root of bandwidth ``y``; at ``max_chunks=None``
``k`` is the exact ``k0``, in the thousands when capacities are odd floats (shared
aggregation 2x5x8 after a two-way degradation: 3411 trees per root, 80 GPUs).  The
repair packer (:mod:`.repair`) grows every unit tree, ``k·n`` trees of ``n - 1`` edges:
5.2 s there, for a packing whose 272 880 unit trees merge into 797 classes.

A packing of ``k`` trees per root in units ``u`` may instead be built as ``s`` copies of
a packing of ``k1`` trees per root in units ``u1`` plus a packing of ``k2 = k - s·k1``
trees per root in the residual ``u - s·load1`` (``load1``: the first packing's trees per
link).  ``s = ceil(k / SCALED_TREES)``, ``k1 = k // s - 1`` (so ``k2 >= s``: the residual
keeps room for the rounding), and ``u1`` is ``u·k1/k`` rounded down, then up on links into
the node sets that violate the rooted cut condition for ``k1`` (each round one rooted
sweep that goes on past a failing sink, :func:`.removal.cut_guard.violated_sets`: every
violated set it meets), only where ``s·u1 <= u`` stays true.
The residual must pass the rooted test for ``k2`` (a tight cut of ``u`` that the first
packing crosses more often than it must fails it); it is packed the same way while
``k2 >= SCALED_MIN_K``.  A repair packing found proves the condition a rooted test checks,
so where one is likely (a residual of one repair packing, a rounding whose sets were
lifted) a capped packing runs first and the test only after it fails: the same packings.  Each packing completes or the whole attempt returns ``None``
and the caller runs the plain repair packer: a completed scaled packing is a packing of
``k`` trees per root in ``u`` (every tree spans, every link's units are respected), so
the rate is the same ``k·y``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from mccl_opt import anytime
from ..removal.cut_guard import violated_set, violated_sets
from ..sized import limited_repair
from .trees import TreeClass

__all__ = ["scaled_pack", "many_trees_pack", "plain_pack", "scaled_only", "raise_ingress", "SCALED_MIN_K",
           "SCALED_TREES", "ROUNDING_ROUNDS", "MARGINS", "PLAIN_FIRST_ENTRIES"]

#: from this many trees per root :func:`scaled_pack` is tried before the repair packer
SCALED_MIN_K = 64
#: trees per root of the scaled packing (``k1`` is about this)
SCALED_TREES = 32
#: margins ``d`` tried (``k1 = k // s - d``), smallest first
MARGINS = (1, 2, 4, 8)
#: up to this many tree entries ``k·n²`` the plain repair packing runs before the scaled
#: one with wide margins (it grows every unit tree: 0.2 s at 1.2 M entries, HPN 2x4x8
#: Fail2, 293 trees per root), above it after it (shared aggregation 2x8x8 with one NIC
#: at 1 % both ways, 721 trees per root, 11.8 M entries: 8 s with one repair search, 20 s in
#: all, where the wide scaled packing takes ~1 s)
PLAIN_FIRST_ENTRIES = 1 << 21
#: rooted sweeps that may round ``u1`` up before the attempt gives up
ROUNDING_ROUNDS = 32


class Logical(NamedTuple):
    """A logical graph on ``n`` GPUs (ranks): arcs ``tail -> head``."""

    n: int
    tail: np.ndarray
    head: np.ndarray


def scaled_pack(n: int, tail: np.ndarray, head: np.ndarray, units: np.ndarray, k: int,
                wide: bool = False, known: list[np.ndarray] | None = None
                ) -> tuple[list[TreeClass] | None, dict[str, int]]:
    """``k`` trees per root in ``units`` as tree classes (module doc), or ``None`` when a
    step fails; with the repair packer's counters summed, ``scaled``: the largest scale
    ``s`` used (0 when none), ``scaled_tries``: first packings tried (one per level when
    every first margin works), ``rounding_sweeps`` and ``ingress_raised`` (units raised
    by :func:`raise_ingress`).  ``wide``: the wider margins of :data:`MARGINS` and
    several units per link when rounding (for thin links into tight sets, module doc).
    ``known``: node sets an earlier attempt on the same ``units`` found violated (filled
    in place): the rooted cut condition of a node set does not depend on the margin, so
    a wide attempt after a narrow one lifts them before its first sweep instead of
    finding them again (module doc)."""
    counters = {"repairs": 0, "repair_visits": 0, "reused_trees": 0, "scaled": 0,
                "scaled_tries": 0, "ingress_raised": 0, "rounding_sweeps": 0}
    classes = _scaled(Logical(n, tail, head), units.astype(np.int64), k, counters,
                      MARGINS if wide else MARGINS[:1], wide, [] if known is None else known)
    if classes is not None:               # by root, widest first (stable), as one array sort
        roots = np.fromiter((c.root for c in classes), np.int64, len(classes))
        mults = np.fromiter((c.mult for c in classes), np.int64, len(classes))
        classes = [classes[i] for i in np.lexsort((-mults, roots)).tolist()]
    return classes, counters


def many_trees_pack(n: int, tail: np.ndarray, head: np.ndarray, units: np.ndarray, k: int,
                    shapes: tuple[np.ndarray, np.ndarray] | None, stats: dict[str, int],
                    plain: bool = True) -> list[TreeClass] | None:
    """``k >= SCALED_MIN_K`` trees per root: the scaled packing, then, where it fails, the
    plain repair packing (:func:`plain_pack`) and the scaled one with wide margins, the
    plain one first up to :data:`PLAIN_FIRST_ENTRIES` tree entries; the counters of the
    last one in ``stats``.  ``plain=False``: the scaled packings only (the caller tries
    the plain one itself, later)."""
    known: list[np.ndarray] = []          # the narrow attempt's violated sets, for the wide one
    classes, info = scaled_pack(n, tail, head, units, k, known=known)
    stats.update(info)

    def wide() -> list[TreeClass] | None:
        found, counters = scaled_pack(n, tail, head, units, k, wide=True, known=known)
        stats.update(counters)
        return found

    def plain_one() -> list[TreeClass] | None:
        return plain_pack(n, tail, head, units, k, shapes, stats)

    attempts = [plain_one, wide] if k * n * n <= PLAIN_FIRST_ENTRIES else [wide, plain_one]
    for attempt in attempts if plain else [wide]:
        if classes is not None:
            break
        classes = attempt()
    return classes


def plain_pack(n: int, tail: np.ndarray, head: np.ndarray, units: np.ndarray, k: int,
               shapes: tuple[np.ndarray, np.ndarray] | None, stats: dict[str, int]
               ) -> list[TreeClass] | None:
    """The plain repair packing of ``k`` trees per root (``shapes``: previous trees
    seeded), its repair searches limited to ``k·n²`` tree visits; counters in ``stats``."""
    found, counters = limited_repair("Phase 3: the plain packing of many trees", n, tail, head,
                                     units, k, shapes, max_visits=k * n * n)
    stats.update(counters)
    return found


def scaled_only(n: int, tail: np.ndarray, head: np.ndarray, units: np.ndarray, k: int,
                stats: dict[str, int]) -> list[TreeClass] | None:
    """The scaled packing with wide margins, and nothing else (more trees per root than
    the plain repair packer could grow), its counters in ``stats``.  No narrow attempt
    first: wherever it fails, the wide one repeats it up to the failing step."""
    classes, info = scaled_pack(n, tail, head, units, k, wide=True)
    stats.update(info)
    return classes


def _scaled(g: Logical, units: np.ndarray, k: int, counters: dict[str, int],
            margins: tuple[int, ...], wide: bool, known: list[np.ndarray]
            ) -> list[TreeClass] | None:
    """``k`` trees per root in ``units`` (module doc); ``known``: the node sets found
    violated so far, checked before each rooted sweep (HPN-like fabrics: a host's ingress,
    at every level and margin)."""
    s = -(-k // SCALED_TREES)
    shapes = _shapes(k, margins)
    if not shapes:
        return _repair(g, units, k, counters)
    for i, k1 in enumerate(shapes):     # a wider margin where this one's rounding, first
        # packing or residual fails; the residual starts at the margin that worked: the
        # sets that made the narrower ones fail (a host's ingress of many thin links) are
        # the residual's too
        found = _first(g, units, k, k1, s, wide, counters, known, margins[i:])
        if found is None:
            continue
        first, residual, rest = found
        counters["scaled"] = max(counters["scaled"], s)
        if rest is None:
            rest = _scaled(g, residual, k - s * k1, counters, margins[i:], wide, known)
        if rest is None:
            return None
        return [TreeClass(c.root, c.mult * s, c.parent_arc) for c in first] + rest
    return None


def _shapes(k: int, margins: tuple[int, ...]) -> list[int]:
    """The ``k1`` of each margin at ``k`` trees per root; none: one repair packing."""
    s = -(-k // SCALED_TREES)
    return [] if k < SCALED_MIN_K else [k // s - d for d in margins if k // s - d >= 1]


def _first(g: Logical, units: np.ndarray, k: int, k1: int, s: int, several: bool,
           counters: dict[str, int], known: list[np.ndarray], margins: tuple[int, ...]
           ) -> tuple[list[TreeClass], np.ndarray, list[TreeClass] | None] | None:
    """The packing of ``k1`` trees per root in the rounded ``u1``, the residual
    ``units - s·load1`` and, where the residual's level is one repair packing (no shape
    at ``margins``) that succeeds capped, its packing; ``None`` when the rounding or the
    packing fails or the residual fails the rooted test for ``k - s·k1``.  A packing found
    proves the rooted condition, so the test runs only after a failed capped packing
    (the same packings as testing first: half-uplinks 2x8x8, 0.13 s less)."""
    anytime.check("Phase 3: the scaled packing, before a level")
    counters["scaled_tries"] += 1
    rounded = _rounded(g, units, k, k1, s, several, counters, known)
    if rounded is None:
        return None
    u1, first = rounded
    if first is None:
        first = _repair(g, u1, k1, counters)
    if first is None:
        return None
    residual = units - s * _loads(first, units.size)
    k2 = k - s * k1
    if not _shapes(k2, margins):
        rest = _repair(g, residual, k2, counters, k2 * g.n * g.n)
        if rest is not None:
            return first, residual, rest
    hit = _violated(g, residual, k2)
    if hit is not None:
        known.append(hit[0])
        return None
    return first, residual, None


def _repair(g: Logical, units: np.ndarray, k: int, counters: dict[str, int],
            max_visits: int = 1 << 62) -> list[TreeClass] | None:
    """The repair packing of ``k`` trees per root, every link's units capped at the ``k·n``
    unit trees that could use it: a residual keeps the slack of links no tight cut needs
    (superpod 2x2x8 at 2.9 M trees per root: 9.5 M units on a link at the last level, 3.6e8
    in all), and the repair index holds a slot per unit (1.4 GB there).  Under a limit, sized
to its time left (:func:`..sized.limited_repair`): one level's packing at 512 GPUs is
``32·n²`` = 8.4 M tree entries, about a second.  ``max_visits``: a capped try (``None``
where its searches outgrow it)."""
    classes, info = limited_repair("Phase 3: a scaled packing's repair packing", g.n, g.tail,
                                   g.head, np.minimum(units, k * g.n), k, max_visits=max_visits)
    for key, value in info.items():
        counters[key] = counters.get(key, 0) + value
    return classes


def _violated(g: Logical, units: np.ndarray, k: int) -> tuple[np.ndarray, int, int] | None:
    ranks = np.arange(g.n, dtype=np.int64)
    return violated_set(g.n, ranks, k, (g.tail, g.head, units))


def _rounded(g: Logical, units: np.ndarray, k: int, k1: int, s: int, several: bool,
             counters: dict[str, int], known: list[np.ndarray]
             ) -> tuple[np.ndarray, list[TreeClass] | None] | None:
    """Units ``u1`` admitting ``k1`` trees per root with ``s·u1 <= units``: ``units·k1/k``
    rounded down, every GPU's ingress raised at once (:func:`raise_ingress`, no max-flow),
    then up on links into each ``known`` set and each violated set a rooted sweep finds
    (all of one sweep's, added to ``known``) by its deficit (:func:`_lift`), the GPUs
    still short alone after those (:func:`_short_gpus`) before the first sweep; ``None`` when
    the links into a set lack the room (often found on a known set, without a sweep) or
    the rounds run out.  One sweep per round, not one set: HPN 4x16x8's restriction
    leaves 64 hosts short, and a sweep per host (each failing 8 sinks later than the last)
    took 64 sweeps and ran margins 1 and 2 out of rounds (8 s of 11 s).  The limit is
    checked before each sweep (``n`` max-flows in one compiled call).  Once sets have
    been lifted, a repair packing of ``k1`` trees per root capped at ``k1·n²`` visits
    runs before each sweep: one found proves the condition the sweep tests, and is
    returned with ``u1`` (``None`` beside ``u1`` otherwise; half-uplinks 2x8x8: a
    passing sweep of 0.2 s for a 0.04 s packing)."""
    scaled = units * k1
    u1 = scaled // k
    remainder = scaled - u1 * k
    fresh = (u1 + 1) * s <= units                 # room for one unit, not raised yet
    counters["ingress_raised"] += raise_ingress(g, u1, k1, remainder, fresh)
    room = _Room(units, s, remainder, fresh, several)
    short = _short_gpus(g, u1, k1)
    if not all(_lift(g, u1, k1, room, inside) for inside in known + short):
        return None
    if short:                    # the sets around the GPUs short alone: their sinks first
        found = _sweep(g, u1, k1, np.flatnonzero(np.any(short, axis=0)))
        known.extend(found)
        if not all(_lift(g, u1, k1, room, inside) for inside in found):
            return None
    for _ in range(ROUNDING_ROUNDS):
        anytime.check("Phase 3: the scaled packing's rounding, before a rooted sweep")
        first = _repair(g, u1, k1, counters, k1 * g.n * g.n) if known else None
        if first is not None:
            return u1, first
        counters["rounding_sweeps"] += 1
        found = _sweep(g, u1, k1, np.arange(g.n, dtype=np.int64))
        if not len(found):
            return u1, None
        known.extend(found)
        if not all(_lift(g, u1, k1, room, inside) for inside in found):
            return None
    return None


def _sweep(g: Logical, u1: np.ndarray, k1: int, sinks: np.ndarray) -> np.ndarray:
    """The node sets violating the rooted cut condition for ``k1`` trees per root in ``u1``
    that a rooted sweep of ``sinks`` finds (:func:`.removal.cut_guard.violated_sets`)."""
    return violated_sets(g.n, np.arange(g.n, dtype=np.int64), k1, (g.tail, g.head, u1),
                         g.n, sinks)


def _lift(g: Logical, u1: np.ndarray, k1: int, room: "_Room", inside: np.ndarray) -> bool:
    """``inside``'s deficit for ``k1`` trees per root under the current ``u1`` raised
    (:func:`_raise_set`; sets found in one sweep may share links, so each deficit is
    taken after the raises before it); whether it fits."""
    deficit = k1 * int(g.n - inside.sum()) - int(u1[inside[g.head] & ~inside[g.tail]].sum())
    return deficit <= 0 or _raise_set(g, u1, room, inside, deficit)


class _Room(NamedTuple):
    """Where a rounding may raise ``u1``: ``s·u1 <= units``; ``fresh`` links not raised
    yet, largest ``remainder`` first; ``several`` units per link when those are too few."""

    units: np.ndarray
    s: int
    remainder: np.ndarray
    fresh: np.ndarray
    several: bool


def _raise_set(g: Logical, u1: np.ndarray, room: _Room, inside: np.ndarray, deficit: int
               ) -> bool:
    """``deficit`` more units on the links into ``inside``: one on each link not raised yet
    (largest remainders first); where those are too few and ``several`` (``room``'s last
    entry), the rest as further units on any link into the set with room (a tight GPU
    ingress of a few wide links); whether it fits."""
    units, s, remainder, fresh, several = room
    crossing = inside[g.head] & ~inside[g.tail]
    into = np.flatnonzero(crossing & fresh)
    up = into[np.argsort(-remainder[into], kind="stable")[:deficit]]
    u1[up] += 1
    fresh[up] = False
    return up.size >= deficit or several and _raise_further(u1, units, s, remainder, crossing,
                                                            deficit - up.size)


def raise_ingress(g: Logical, u1: np.ndarray, k1: int, remainder: np.ndarray,
                  fresh: np.ndarray) -> int:
    """The single-GPU cuts of the rounding, all GPUs in one pass (no max-flow): every GPU
    whose rounded-down ingress ``u1(δ⁻(v))`` is below the ``k1·(n-1)`` trees entering it
    gets one unit more on as many of its ``fresh`` in-links (``u1 + 1`` still fits ``s``
    times; largest remainders first) as it lacks, or on all it has; ``u1`` and ``fresh``
    change in place.  Returns the units raised.  Without it each of the rounding's
    rooted sweeps repairs one violated set, so a fabric of more GPUs than
    :data:`ROUNDING_ROUNDS` whose floors all fall short ran out of rounds."""
    need = _ingress_need(g, u1, k1)
    cand = np.flatnonzero(fresh & (need[g.head] > 0))
    cand = cand[np.lexsort((-remainder[cand], g.head[cand]))]      # by head, then remainder
    heads = g.head[cand]
    rank = np.arange(cand.size) - np.searchsorted(heads, heads)    # place among its head's
    up = cand[rank < need[heads]]
    u1[up] += 1
    fresh[up] = False
    return int(up.size)


def _ingress_need(g: Logical, u1: np.ndarray, k1: int) -> np.ndarray:
    """Per GPU, the units its ingress ``u1(δ⁻(v))`` lacks for the ``k1·(n-1)`` trees
    entering it (negative: spare)."""
    return k1 * (g.n - 1) - np.bincount(g.head, weights=u1, minlength=g.n).astype(np.int64)


def _short_gpus(g: Logical, u1: np.ndarray, k1: int) -> list[np.ndarray]:
    """Each GPU whose ingress ``u1(δ⁻(v))`` is still below ``k1·(n-1)`` as a one-node
    set, in rank order (one pass, no max-flow): :func:`raise_ingress` adds at most one
    unit per link, so a GPU of few fresh in-links stays short, and a rooted sweep found it
    only behind the sets that hold it (half-uplinks 2x8x8: one sweep more, 0.2 s)."""
    need = _ingress_need(g, u1, k1)
    return [np.arange(g.n) == v for v in np.flatnonzero(need > 0).tolist()]


def _raise_further(u1: np.ndarray, units: np.ndarray, s: int, remainder: np.ndarray,
                   crossing: np.ndarray, deficit: int) -> bool:
    """``deficit`` more units on the ``crossing`` links, one per link in turn (largest
    remainders first) while ``s·u1 <= units`` allows; whether they fit."""
    into = np.flatnonzero(crossing)
    into = into[np.argsort(-remainder[into], kind="stable")]
    room = units[into] // s - u1[into]
    if int(room.sum()) < deficit:
        return False
    add = np.zeros(into.size, np.int64)
    while deficit:
        live = np.flatnonzero(add < room)[:deficit]
        add[live] += 1
        deficit -= live.size
    u1[into] += add
    return True


def _loads(classes: list[TreeClass], m: int) -> np.ndarray:
    """Trees per logical link of a packing (one compiled pass over every class's parent
    links: per-class masks took 2 s on HPN 4x16x8's 89 k classes, a weighted
    ``np.bincount`` 0.2-0.7 s)."""
    loads = np.zeros(m, np.int64)
    _add_loads(np.stack([c.parent_arc for c in classes]),
               np.fromiter((c.mult for c in classes), np.int64, len(classes)), loads)
    return loads


@njit(cache=True)
def _add_loads(parents, mult, loads):
    """``loads[a] += mult[i]`` for every link ``a = parents[i, v] >= 0``."""
    for i in range(parents.shape[0]):
        for v in range(parents.shape[1]):
            if parents[i, v] >= 0:
                loads[parents[i, v]] += mult[i]
