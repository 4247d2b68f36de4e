"""What the controller does with a synthesis job, in one place (paper §3.2's re-check
before publishing, with the rules issue 26 added; docs/runtime.md "One publish decision").

Pure functions of what is known: the finished job (:class:`Finished`), the active
version (:class:`Active`), the store's estimates (:class:`Estimate`) and the
:class:`~.manager.Policy`.  :class:`~.manager.ScheduleManager` gathers these facts,
calls :func:`publish_decision` and acts on its :class:`Decision`.  In order:

1. **Initial** job (no active version): ``PUBLISH``.
2. **Hold** (``HOLD``) while something the job relies on is still changing:

   * *pending*: a link of the collective's fabric with an unconfirmed change (level
     estimator) that the new schedule uses, or that the job saw more than ``restart_tol``
     below nominal, whose newest estimate is more than ``restart_tol`` from the job's
     input; for a *speculative* job (started on early estimates, ``Policy.speculate``) any
     pending link of its fabric; for at most ``settle_max_s`` after the hold began
     (a speculative job: ``early_hold_s`` when set, real ranks confirm a collective later);
   * *rising*: a link still moving after a rise (EWMA at alpha 1, :mod:`.rises`) that the
     job saw more than ``restart_tol`` above what the active version was built for (or,
     for a swing after a recovery, that far from it either way); never when the job saw
     a settled drop of more than ``restart_tol`` elsewhere; for at most ``moving_max_s``
     over the collective's jobs until one is decided; never when rule 4 already restarts
     the job (a ramp's next step read while a stall's recovery held it: 2.7 s on real ranks);
   * *unheard* (checked last, only when the job would otherwise publish, rule 6): a
     speculative job (level estimator) whose result came before any sample newer than it
     from a link it was started on, for at most ``fresh_s`` after it came: a flap that
     cleared during its synthesis is read in the measurement window in flight (HPN
     64-GPU AllToAll ``flap-slow``: the result came 0.8 ms after the clear and 48 µs
     before that window ended, and was published for nothing).
3. **Cleared** (``CLEARED``): the drift that started the job is gone under ``M``
   (:func:`drift_gone`), unless the job replaces a held version (then only the gain
   decides).
4. **Restart** (``RESTART``, event ``superseded``), at most ``max_restarts`` in a row:
   ``M`` moved more than ``restart_tol`` from the job's input on some link *and* the move
   costs the new schedule more than ``restart_tol`` of the rate it was built for (a move
   that costs it nothing publishes it; a speculative job restarts on any such move: its
   early picture was partial, e.g. one direction of a cable not alarmed yet, and the swap
   hold would keep its version from the ranks); or a link the job was held for (a rise)
   settled more than ``restart_tol`` from its input.
   With ``Policy.anytime_s``, a job whose synthesis took that long publishes instead when
   it beats the active version under ``M`` by ``restart_tol``, and restarts at once
   (``ANYTIME``).
5. **No gain** (``NO_GAIN``): the new schedule does not beat the active one under ``M`` by
   more than ``min_gain`` (``rate_loss`` for a job that replaces a version a swap hold held
   or a settled drop made unfit, :meth:`~.manager.ScheduleManager.supersede_held`: on real
   ranks such jobs chased telemetry noise with 1-3 % gains, a third version per event).
6. Otherwise ``PUBLISH``, or ``REUSE`` when the job took a remembered fabric's schedule
   (:func:`remembered`) instead of synthesizing.

Before a job starts, :func:`no_schedule_gains` (the single-vertex cut bound,
:mod:`.gain_bound`) ends a flagged collective ``no_gain`` with no job,
:func:`remembered` picks a known fabric's schedule to reuse, and (``Policy.speculate``)
:func:`speculation_covers` decides whether a job may start on early estimates.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import numpy as np

from .drift import ScheduleProfile, bottleneck_rate, detect

if TYPE_CHECKING:
    from .manager import Policy
    from .telemetry import MeasurementStore

__all__ = ["Verdict", "Decision", "Estimate", "Active", "Finished", "publish_decision", "outdated",
           "drift_gone", "gained", "changing_under", "moving_under", "remembered", "no_schedule_gains",
           "rate", "moved", "speculation_covers", "one_way_drops", "swap_holding", "held_against", "beats"]

_NONE = np.zeros(0, dtype=np.int64)


class Verdict(str, enum.Enum):
    """What to do with a job; all but ``HOLD`` end it."""

    PUBLISH = "publish"
    REUSE = "reuse"                 # publish a remembered fabric's schedule
    CLEARED = "cleared"             # abort: the drift is gone
    NO_GAIN = "no_gain"             # abort: not faster than the active version
    RESTART = "restart"             # superseded: synthesize again on the latest ``M``
    ANYTIME = "anytime"             # publish now, and synthesize again on the latest ``M``
    HOLD = "hold"                   # keep the result and decide again later


@dataclass(frozen=True)
class Decision:
    """A :class:`Verdict`, why, and what the manager records: ``held`` (links, pending then
    rising, of a ``HOLD``), ``rising`` (the moving links among them), the rates under ``M``
    of the active and new schedules (re-checked jobs only)."""

    verdict: Verdict
    reason: str
    held: np.ndarray = field(default_factory=lambda: _NONE)
    rising: np.ndarray = field(default_factory=lambda: _NONE)
    rate_before: float | None = None
    rate_after: float | None = None


@dataclass(frozen=True)
class Estimate:
    """The store's view now: confirmed ``M``, the newest estimate (``provisional``: pending
    changes at their post-change mean), pending links (level estimator), links still
    moving after a rise and the swings among them (EWMA at alpha 1), nominal capacities."""

    m: np.ndarray
    provisional: np.ndarray
    pending: np.ndarray
    moving: np.ndarray
    swings: np.ndarray
    nominal: np.ndarray

    @classmethod
    def of(cls, store: MeasurementStore) -> Estimate:
        moving = store.moving_links()
        return cls(store.measured(), store.provisional(), store.pending_links(), moving,
                   store.moving_links(swings=True) if moving.size else _NONE, store.topo.arrays.capacity)


@dataclass(frozen=True)
class Active:
    """The active version: its profile (share loads, cut), the capacities it was
    ``built_for``, the mask of the communicator's links (``mine``), whether the drift that
    started the job is gone under ``M`` (``cleared``: :func:`drift_gone`), and since when the
    collective's jobs are held for rises (``rising_since``)."""

    profile: ScheduleProfile
    built_for: np.ndarray | None
    mine: np.ndarray
    cleared: bool = False
    rising_since: float | None = None


@dataclass(frozen=True)
class Finished:
    """A job: its input ``capacity``, its schedule's ``loads`` (``None`` while queued),
    restarts so far, whether it is the ``initial`` one, ``reused`` a remembered schedule,
    ``replaces_held`` a version whose swap was held, since when it is held, the links it
    was held for as rises (``moving``), whether it started ``speculative`` on early
    estimates of changes not confirmed yet, how long its synthesis took (``synth_s``),
    when its result was first seen (``done_t``) and, for a speculative job, the links it
    was started on that no sample newer than that has measured yet (``unheard``; ``None``
    past ``Policy.fresh_s`` or outside the level estimator)."""

    capacity: np.ndarray
    loads: np.ndarray | None = None
    restarts: int = 0
    initial: bool = False
    reused: bool = False
    replaces_held: bool = False
    held_since: float | None = None
    moving: np.ndarray | None = None
    speculative: bool = False
    synth_s: float = 0.0
    done_t: float | None = None
    unheard: np.ndarray | None = None


def publish_decision(job: Finished, active: Active | None, est: Estimate, now: float, policy: Policy) -> Decision:
    """The decision on a finished job (module docstring, rules 1-6); ``active`` is ``None``
    only for the initial job."""
    if job.initial:
        return Decision(Verdict.PUBLISH, "initial")
    tol = policy.restart_tol
    pending = _NONE
    bound = policy.early_hold_s if job.speculative and policy.early_hold_s is not None else policy.settle_max_s
    if job.held_since is None or now - job.held_since < bound:
        pending = changing_under(est, active.mine, job.capacity, job.loads, tol)
        if job.speculative and not pending.size:
            pending = est.pending[active.mine[est.pending]]
    m = est.m
    stale = outdated(job, active, m, policy)
    rising = _NONE
    if (active.rising_since is None or now - active.rising_since < policy.moving_max_s) \
            and stale is not Verdict.RESTART:
        rising = moving_under(est, active, job.capacity, tol)
    if pending.size or rising.size:
        return Decision(Verdict.HOLD, "pending" if pending.size else "rising",
                        held=np.concatenate([pending, rising]), rising=rising)
    before, after = rate(m, active.profile.loads), rate(m, job.loads)
    why = stale or _rose_past(job, m, policy)
    if why is Verdict.CLEARED and job.replaces_held:
        why = None                  # the held version was built on a transient: only the gain decides
    if stale is Verdict.RESTART and _anytime(job, policy) and after > before * (1.0 + policy.restart_tol):
        return Decision(Verdict.ANYTIME, "anytime", rate_before=before, rate_after=after)
    if why is not None:
        return Decision(why, why.value, rate_before=before, rate_after=after)
    if after <= before * (1.0 + (policy.rate_loss if job.replaces_held else policy.min_gain)):
        return Decision(Verdict.NO_GAIN, "no_gain", rate_before=before, rate_after=after)
    if job.unheard is not None and job.unheard.size:
        return Decision(Verdict.HOLD, "unheard", held=job.unheard)
    verdict = Verdict.REUSE if job.reused else Verdict.PUBLISH
    return Decision(verdict, "gain", rate_before=before, rate_after=after)


def outdated(job: Finished, active: Active, m: np.ndarray, policy: Policy) -> Verdict | None:
    """``CLEARED`` (rule 3, before anything else) or ``RESTART`` (rule 4's first part) for a
    job under ``m``, queued (``job.loads`` is ``None``: any move past ``restart_tol``
    restarts it) or finished; ``None`` when it is up to date."""
    if active.cleared:
        return Verdict.CLEARED
    if moved(m[active.mine], job.capacity[active.mine]) > policy.restart_tol \
            and job.restarts < policy.max_restarts and (
                job.loads is None or job.speculative
                or rate(m, job.loads) < (1.0 - policy.restart_tol) * rate(job.capacity, job.loads)):
        return Verdict.RESTART
    return None


def _anytime(job: Finished, policy: Policy) -> bool:
    """Rule 4b (``Policy.anytime_s``): a finished job that the latest ``M`` outdates but whose
    synthesis took at least ``anytime_s`` is published when it beats the active version under
    ``M`` by ``restart_tol`` (then restarted at once; a smaller gain is not worth a version):
    a restart would take about as long again, and on real ranks under load (AllToAll:
    0.6-1.1 s wall) that is most of a ramp's step, which then ran on the version before to
    its end (docs/runtime.md, "Anytime publication")."""
    return policy.anytime_s is not None and job.synth_s >= policy.anytime_s and not job.speculative


def _rose_past(job: Finished, m: np.ndarray, policy: Policy) -> Verdict | None:
    """``RESTART`` when a link the job was held for (a rise still moving) settled more than
    ``restart_tol`` from the job's input: it was built on a partial reading, whatever its
    rate on the settled one (a recovery only raises it)."""
    if job.moving is None or job.restarts >= policy.max_restarts:
        return None
    cap = job.capacity[job.moving]
    return Verdict.RESTART if np.any(np.abs(m[job.moving] - cap) > policy.restart_tol * cap) else None


def drift_gone(m: np.ndarray, profile: ScheduleProfile, built_for: np.ndarray | None, mine: np.ndarray,
               better_known: bool, policy: Policy) -> bool:
    """The drift that started a job is gone under ``m`` (rule 3): Algorithm 1's deviation is
    back within ``clear_ratio * Gamma`` (hysteresis), no link gained capacity, ``m`` matches
    no remembered fabric whose schedule beats the active one (``better_known``, "Partial
    recoveries"), and the active rate under ``m`` is within ``rate_loss`` of
    its rate on the capacities it was built for.  The last test matters when a cut's links
    degrade one sample apart: a job started on the partial picture saw the deviation vanish
    once the rest was read (a uniformly scaled cut), and was aborted with the rate at 0.22
    of what it was built for (docs/runtime.md, "Capacity lost: a job is not cleared while
    the rate stays lost")."""
    report = detect(m, profile, policy.gamma)
    if report.max_delta > policy.clear_ratio * policy.gamma or gained(m, built_for, mine, policy.gamma) \
            or better_known:
        return False
    if built_for is None:
        return True
    return not rate(m, profile.loads) < (1.0 - policy.rate_loss) * rate(built_for, profile.loads)


def gained(m: np.ndarray, built_for: np.ndarray | None, mine: np.ndarray, gamma: float) -> bool:
    """Some link of ``mine`` is measured above ``(1 + Gamma)`` x the capacity the active
    version was built for (Algorithm 1 cannot see a recovered link in no cut)."""
    return built_for is not None and bool(np.any(m[mine] > (1.0 + gamma) * built_for[mine]))


def changing_under(est: Estimate, mine: np.ndarray, capacity: np.ndarray, loads: np.ndarray,
                   tol: float, every_link: bool = False) -> np.ndarray:
    """The pending links (every link with ``every_link``) of ``mine`` that a schedule with
    ``loads``, synthesized for ``capacity``, relies on (it uses them, or they were more than
    ``tol`` below nominal) whose newest estimate is more than ``tol`` from ``capacity``."""
    cand = np.flatnonzero(mine) if every_link else est.pending[mine[est.pending]]
    if cand.size == 0:
        return _NONE
    cap = capacity[cand]
    relied = (loads[cand] > 1e-12) | (cap < (1.0 - tol) * est.nominal[cand])
    return cand[relied & (np.abs(est.provisional[cand] - cap) > tol * cap)]


def swap_holding(est: Estimate, mine: np.ndarray, capacity: np.ndarray, loads: np.ndarray,
                 tol: float, rate_loss: float) -> np.ndarray:
    """The links of ``mine`` whose change makes a published version (``loads``, built for
    ``capacity``) unfit to swap in now (:meth:`~.manager.ScheduleManager.swap_hold`): of
    :func:`changing_under` with ``every_link``, every *rise* (a clear during synthesis
    never runs the failure's schedule), and a *drop* only when it costs the version's
    rate: it carries load and ``provisional / load`` is below ``(1 - rate_loss)`` x the
    rate on ``capacity`` (the capacity-lost test of :func:`drift_gone`).  A stalled
    NVSwitch link read at 0.65 of nominal does not hold a version bottlenecked on a
    50 Gbps NIC (docs/runtime.md, "Swap holds only for drops that cost the rate")."""
    cand = changing_under(est, mine, capacity, loads, tol, every_link=True)
    if cand.size == 0:
        return cand
    prov, load = est.provisional[cand], loads[cand]
    rose = prov > capacity[cand]
    floor = (1.0 - rate_loss) * rate(capacity, loads)
    costs = (load > 1e-12) & (prov < floor * load)
    return cand[rose | costs]


def held_against(unfit: np.ndarray, provisional: np.ndarray, loads: np.ndarray, before: np.ndarray,
                 min_gain: float) -> np.ndarray:
    """Of ``unfit`` (:func:`swap_holding`), what holds a version on real executors, whose
    ranks run the version before (share loads ``before``) meanwhile; a hold there lasts
    until a fresh reading and a superseding job, seconds under load.  Nothing holds while
    the published version (``loads``), under the newest estimate, beats it by more than
    ``min_gain``: holding would keep the ranks on the slower version, and the change (a
    stall on a link the new version relies on, a stall it was built on that reverted, a
    ramp's next step) gets its own version either way; a failure's schedule after a clear
    is slower than the healthy one before it, so it is still held (docs/runtime.md,
    "Holds only for a version slower than the one it replaces")."""
    if unfit.size and beats(provisional, loads, before, min_gain):
        return _NONE
    return unfit


def beats(m: np.ndarray, loads: np.ndarray, other: np.ndarray, min_gain: float) -> bool:
    """A schedule with ``loads`` is faster under ``m`` than one with ``other`` by more than
    ``min_gain`` (:func:`rate`)."""
    return rate(m, loads) > (1.0 + min_gain) * rate(m, other)


def moving_under(est: Estimate, active: Active, capacity: np.ndarray, tol: float) -> np.ndarray:
    """The links of the communicator still moving after a rise that ``capacity`` (a job's
    input) has more than ``tol`` above what the active version was built for, or, for a
    swing after a recovery, more than ``tol`` away from it (rule 2, *rising*).  Empty when
    the job saw a drop of more than ``tol`` on a link that is not moving (a ramp's step,
    confirmed by the executor): a rise elsewhere held such a step for 2.5 s."""
    if est.moving.size == 0 or active.built_for is None:
        return _NONE
    built = active.built_for
    dropped = np.flatnonzero(active.mine & (capacity < (1.0 - tol) * built))
    if np.setdiff1d(dropped, est.moving).size:
        return _NONE
    moving = est.moving[active.mine[est.moving]]
    was, seen = built[moving], capacity[moving]
    away = np.abs(seen - was) > tol * was
    return moving[away & ((seen > was) | np.isin(moving, est.swings))]


def remembered(m: np.ndarray, mine: np.ndarray, known: Sequence[tuple[np.ndarray, object]],
               active_built_for: np.ndarray | None, tol: float) -> int | None:
    """The index in ``known`` (remembered ``(capacities, schedule)``, newest first) of the
    first fabric other than the active version's that ``m`` matches within ``tol / 2`` on
    every link of ``mine``: its schedule is reused instead of synthesized."""
    for i, (cap, _) in enumerate(known):
        if cap is not active_built_for and near(m[mine], cap[mine], 0.5 * tol):
            return i
    return None


def speculation_covers(early: np.ndarray, pending: np.ndarray, mine: np.ndarray, rev: np.ndarray,
                       k: float) -> bool:
    """Whether a job may start on ``early`` (``M`` with every pending change at its early
    estimate, :meth:`~.telemetry.MeasurementStore.early`): some link of ``mine`` is
    pending, and every pending link of ``mine`` whose cable's other direction ``rev`` is in
    ``mine`` reads within ``k`` of that direction (pending too, or already at that level).
    A cable read in one direction only is a partial picture: a job started on it restarts
    once the other direction is confirmed, and the restart costs more than the
    confirmation saved (docs/runtime.md, "Speculative synthesis")."""
    mine_pending = pending[mine[pending]]
    if mine_pending.size == 0:
        return False
    other = rev[mine_pending]
    paired = other >= 0
    a, r = mine_pending[paired], other[paired]
    a, r = a[mine[r]], r[mine[r]]
    return bool(np.all(np.abs(early[a] - early[r]) <= k * np.maximum(early[a], early[r])))


def one_way_drops(m: np.ndarray, mine: np.ndarray, built_for: np.ndarray, loads: np.ndarray, rev: np.ndarray,
                  tol: float) -> bool:
    """Whether a link of ``mine`` reads more than ``tol`` below ``built_for`` while its
    cable's other direction ``rev``, in ``mine`` and loaded (``loads``), does not read within
    ``tol`` of it: a cable read dropped in one direction only (a one-way failure, or the
    other direction not reported yet; ``Policy.cable_wait_s``)."""
    dropped = np.flatnonzero(mine & (m < (1.0 - tol) * built_for))
    other = rev[dropped]
    a, r = dropped[other >= 0], other[other >= 0]
    keep = mine[r] & (loads[r] > 1e-12)
    a, r = a[keep], r[keep]
    return bool(np.any(np.abs(m[a] - m[r]) > tol * np.maximum(m[a], m[r])))


def no_schedule_gains(current: float, bound: float, min_gain: float) -> bool:
    """The active rate is within ``min_gain`` of an upper bound on every schedule's rate
    (:class:`~.gain_bound.VertexBound`): a job could only end ``no_gain``."""
    return bound <= current * (1.0 + min_gain)


def near(m: np.ndarray, capacity: np.ndarray, tol: float) -> bool:
    """``m`` is within ``tol`` (relative) of ``capacity`` on every link."""
    return bool(np.all(np.abs(m - capacity) <= tol * capacity))


def moved(m: np.ndarray, capacity: np.ndarray) -> float:
    """The largest relative change of ``m`` from ``capacity`` on any link."""
    return float(np.max(np.abs(m - capacity) / capacity))


def rate(m: np.ndarray, loads: np.ndarray) -> float:
    """A schedule's rate under ``m``: ``min_a m_a / L_a`` over the links it uses (share
    load above ``1e-12``, as :func:`mccl_opt.schedule.schedule_rate`)."""
    return bottleneck_rate(m, loads, floor=1e-12)
