"""Drift detection: paper Algorithm 1 (§3.2), as pure functions on arrays.

For a schedule ``s`` with ``n_a`` chunks crossing link ``a`` and bottleneck cut ``K_s``
(each cut link with its ``base_slack``), under measured capacities ``M``:

1. ``x_min = min over a with n_a > 0 of M_a / n_a`` (the per-chunk bottleneck rate);
2. for ``a`` in ``K_s``: ``slack_a = (M_a - n_a x_min) / M_a`` and
   ``delta_a = |slack_a - base_slack_a|``;
3. flag ``s`` when ``max_a delta_a > Gamma``.

The deviation is taken in absolute value, as the paper's word "deviation" reads.  Since
``x_min <= M_a / n_a``, ``slack_a >= 0``; a cut link can fall below its base slack by
at most ``base_slack_a`` (the rounding slack), so the absolute and the signed reading
differ only when a rounding slack exceeds ``Gamma``.  A uniformly scaled cut keeps every
slack, and a failure outside the cut that does not become the bottleneck leaves
``x_min`` alone: neither flags (paper §6.1).  ``n_a`` covers every used link, not only
the cut, because a link outside the cut may become the new bottleneck.

``n_a`` is taken as ``max_chunks * L_a`` (``L_a`` the share load) without rounding:
exact when shares are multiples of ``1/max_chunks``, and since slack is invariant to
scaling every ``n_a`` by one constant, still exact for coarser AllGather tree shares.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from mccl_opt.errors import ScheduleError
from mccl_opt.schedule import Schedule, bottleneck_links, schedule_rate, share_loads
from mccl_opt.topology import Topology

__all__ = ["ScheduleProfile", "DriftReport", "ProfileStack", "bottleneck_rate", "cut_slack", "detect",
           "profile_schedule"]


@dataclass(frozen=True)
class ScheduleProfile:
    """What Algorithm 1 needs from a schedule: ``n`` per link, the cut's link indices and
    their base slacks, and the share loads (for rates under ``M``)."""

    n: np.ndarray
    cut: np.ndarray
    base_slack: np.ndarray
    loads: np.ndarray


@dataclass(frozen=True)
class DriftReport:
    """Algorithm 1's outcome for one schedule."""

    x_min: float
    slack: np.ndarray
    delta: np.ndarray
    max_delta: float
    worst: int
    flagged: bool

    def to_dict(self, topo: Topology, cut: np.ndarray) -> dict:
        worst = topo.links[int(cut[self.worst])] if self.worst >= 0 else None
        return {"x_min": self.x_min, "max_delta": self.max_delta, "flagged": self.flagged,
                "worst_link": [worst.src, worst.dst] if worst else None}


def bottleneck_rate(m: np.ndarray, n: np.ndarray, floor: float = 0.0) -> float:
    """Phase 1: ``x_min = min_{a: n_a > floor} M_a / n_a`` (``inf`` when nothing is used)."""
    used = n > floor
    if not used.any():
        return float("inf")
    return float(np.min(m[used] / n[used]))


def cut_slack(m: np.ndarray, n: np.ndarray, cut: np.ndarray, x_min: float) -> np.ndarray:
    """Phase 2 (first half): ``(M_a - n_a x_min) / M_a`` for every cut link."""
    mc = m[cut]
    return (mc - n[cut] * x_min) / mc


def detect(m: np.ndarray, profile: ScheduleProfile, gamma: float) -> DriftReport:
    """Algorithm 1 for one schedule under measured capacities ``m`` (link order)."""
    x_min = bottleneck_rate(m, profile.n)
    if profile.cut.size == 0 or not np.isfinite(x_min):
        empty = np.zeros(0)
        return DriftReport(x_min, empty, empty, 0.0, -1, False)
    slack = cut_slack(m, profile.n, profile.cut, x_min)
    delta = np.abs(slack - profile.base_slack)
    worst = int(np.argmax(delta))
    max_delta = float(delta[worst])
    return DriftReport(x_min, slack, delta, max_delta, worst, max_delta > gamma)


class ProfileStack:
    """Algorithm 1 for many schedules at once (one controller decision, docs/runtime.md).

    The profiles' ``n`` are stacked as a sparse row per schedule (used links only) and
    their cuts as one flat array, so step 1 is one gather, divide and per-row minimum
    and steps 2-3 one gather and per-row maximum over every schedule.  The arithmetic is
    :func:`detect`'s, operation for operation, so the flags are the same.  ``capacity``
    (one row per profile, the capacities each schedule was synthesized for, ``inf`` on
    links it may not use) gives the capacity-gained test: a link measured above
    ``(1 + gamma)`` times it.  Only a row's links below ``inf`` are kept (a sub-fabric's),
    and collectives with equal rows share one, so the test reads each distinct row's own
    links once instead of every link per collective.  Equal profiles (one schedule
    registered under several communicators) likewise share one row of Algorithm 1.
    With ``rate_loss``, a schedule whose bottleneck rate under ``M`` is more than
    ``rate_loss`` below its rate on ``capacity`` (capacity lost, measured against the
    fabric it was built for) is flagged at the lower deviation ``lost_gamma``: a change
    that costs throughput and moves the cut's slacks is acted on before it reaches
    ``gamma`` (a ramp's first small step).  A loss that moves no slack at all (a cut of
    one link: a bottleneck link that drops keeps slack 0 however far it falls; or every
    cut link dropping together) is flagged once the rate has fallen by more than
    ``gamma`` itself, Algorithm 1's own threshold as a relative change, so a reading
    that Algorithm 1 would not act on (a stalled one on real ranks) does not flag through
    this test either.  Whether another schedule does better is the synthesizer's
    question; when none does, the manager records ``no_gain`` and re-bases the schedule
    on that fabric, so the same loss does not flag again.  ``built_for`` (per profile,
    default ``capacity``) is the fabric the schedule was synthesized for, which a re-base
    leaves alone: the ``gamma`` test reads the rate against it, so a ramp's later steps
    add up, and also requires a loss of more than ``rate_loss`` since the re-base, so a
    loss no schedule can undo flags once (docs/runtime.md, "Ramps after no gain").
    """

    def __init__(self, profiles: Sequence[ScheduleProfile], capacity: Sequence[np.ndarray], gamma: float,
                 rate_loss: float | None = None, lost_gamma: float | None = None,
                 built_for: Sequence[np.ndarray] | None = None) -> None:
        self.profiles = tuple(profiles)
        self.gamma = gamma
        self.lost_gamma = gamma if lost_gamma is None else lost_gamma
        built = np.array([bottleneck_rate(np.asarray(c, dtype=float), p.n) for p, c in zip(self.profiles, capacity)])
        self.lost_below = None if rate_loss is None else (1.0 - rate_loss) * built
        origin = built if built_for is None else np.array(
            [bottleneck_rate(np.asarray(c, dtype=float), p.n) for p, c in zip(self.profiles, built_for)])
        self.gone_below = np.minimum((1.0 - gamma) * origin, self.lost_below) \
            if rate_loss is not None and rate_loss < 1.0 else np.zeros_like(built)
        self.row_of, distinct = _distinct_profiles(self.profiles)
        self.rows = len(distinct)
        used = [np.flatnonzero(p.n > 0) for p in distinct]
        self.link = np.concatenate(used + [np.zeros(0, dtype=np.int64)])
        self.n = np.concatenate([p.n[u] for p, u in zip(distinct, used)] + [np.zeros(0)])
        sizes = np.array([len(u) for u in used], dtype=np.int64)
        self.used_rows = np.flatnonzero(sizes)
        self.used_start = (np.cumsum(sizes) - sizes)[self.used_rows]
        cuts = [p.cut for p in distinct]
        self.cut = np.concatenate(cuts + [np.zeros(0, dtype=np.int64)])
        self.cut_n = np.concatenate([p.n[p.cut] for p in distinct] + [np.zeros(0)])
        self.base = np.concatenate([p.base_slack for p in distinct] + [np.zeros(0)])
        cut_sizes = np.array([len(c) for c in cuts], dtype=np.int64)
        self.cut_row = np.repeat(np.arange(self.rows), cut_sizes)
        self.gain_of, self.gain_link, self.gain_threshold, self.gain_start = _gain_rows(capacity, gamma)

    def flags(self, m: np.ndarray) -> np.ndarray:
        """Per schedule: flagged by Algorithm 1 (``max delta > gamma``), by a lost rate
        with ``max delta > lost_gamma`` or a rate more than ``gamma`` below its built-for
        one (with ``rate_loss``), or by a gained link."""
        x_min = np.full(self.rows, np.inf)
        if len(self.link):
            x_min[self.used_rows] = np.minimum.reduceat(m[self.link] / self.n, self.used_start)
        max_delta = np.zeros(self.rows)
        live = np.isfinite(x_min)[self.cut_row]
        if live.any():
            cut, row = self.cut[live], self.cut_row[live]
            mc = m[cut]
            delta = np.abs((mc - self.cut_n[live] * x_min[row]) / mc - self.base[live])
            starts = np.flatnonzero(np.r_[True, row[1:] != row[:-1]])
            max_delta[row[starts]] = np.maximum.reduceat(delta, starts)
        max_delta = max_delta[self.row_of]
        flagged = max_delta > self.gamma
        if self.lost_below is not None:
            rate = x_min[self.row_of]
            flagged |= ((rate < self.lost_below) & (max_delta > self.lost_gamma)) | (rate < self.gone_below)
        if len(self.gain_link):
            over = np.logical_or.reduceat(m[self.gain_link] > self.gain_threshold, self.gain_start)
            flagged |= np.append(over, False)[self.gain_of]
        return flagged


def _distinct_profiles(profiles: tuple[ScheduleProfile, ...]) -> tuple[np.ndarray, list[ScheduleProfile]]:
    """``(row_of, distinct)``: equal profiles (one schedule registered under several
    communicators on the same capacities) share a row of Algorithm 1."""
    index: dict[tuple[bytes, bytes, bytes], int] = {}
    row_of = np.empty(len(profiles), dtype=np.int64)
    distinct: list[ScheduleProfile] = []
    for r, p in enumerate(profiles):
        key = (np.asarray(p.n, dtype=float).tobytes(), np.asarray(p.cut, dtype=np.int64).tobytes(),
               np.asarray(p.base_slack, dtype=float).tobytes())
        row_of[r] = index.setdefault(key, len(distinct))
        if row_of[r] == len(distinct):
            distinct.append(p)
    return row_of, distinct


def _gain_rows(capacity: Sequence[np.ndarray], gamma: float) -> tuple[np.ndarray, ...]:
    """The capacity-gained thresholds ``(1 + gamma) * capacity`` of every row, kept sparse:
    ``(slot_of, link, threshold, start)``.  Row ``r`` reads the links of slot
    ``k = slot_of[r]``, ``link[start[k]:start[k + 1]]``, and equal rows share a slot.  A
    link at ``inf`` (or NaN) can never be exceeded and is left out; a row with no link
    left has no slot (``slot_of[r]`` is one past the last: an always-False entry)."""
    index: dict[bytes, int] = {}
    row_of = np.empty(len(capacity), dtype=np.int64)
    links: list[np.ndarray] = []
    values: list[np.ndarray] = []
    for r, cap in enumerate(capacity):
        thr = (1.0 + gamma) * np.asarray(cap, dtype=float)
        keep = np.flatnonzero(thr < np.inf)
        thr = thr[keep]
        row_of[r] = index.setdefault(keep.tobytes() + thr.tobytes(), len(index))
        if row_of[r] == len(links):
            links.append(keep)
            values.append(thr)
    sizes = np.array([len(k) for k in links], dtype=np.int64)
    slot = np.cumsum(sizes > 0) - 1
    slot[sizes == 0] = np.count_nonzero(sizes)
    start = (np.cumsum(sizes) - sizes)[sizes > 0]
    return (slot[row_of], np.concatenate(links + [np.zeros(0, dtype=np.int64)]),
            np.concatenate(values + [np.zeros(0)]), start)


def profile_schedule(topo: Topology, schedule: Schedule) -> ScheduleProfile:
    """Build the :class:`ScheduleProfile` of ``schedule`` on ``topo``.

    ``topo`` must carry the capacities the schedule was synthesized for: when the
    schedule lists no bottleneck cut, the cut and base slacks are recomputed from it
    (the links the rounded schedule saturates).
    """
    if tuple(schedule.gpus) != topo.gpus:
        raise ScheduleError(f"schedule GPUs do not match topology {topo.name!r}; "
                            "register the schedule with the topology it was synthesized for")
    loads = share_loads(topo, schedule.chunks)
    n = loads * float(schedule.max_chunks or 1)
    bottleneck = schedule.bottleneck or bottleneck_links(
        topo, loads, schedule_rate(topo, loads), schedule.max_chunks)
    cut = np.array([topo.link_index(b.src, b.dst) for b in bottleneck], dtype=np.int64)
    base = np.array([b.base_slack for b in bottleneck], dtype=float)
    for arr in (n, cut, base, loads):
        arr.setflags(write=False)
    return ScheduleProfile(n, cut, base, loads)
