"""Which collectives start a re-synthesis now: the flag side of the Schedule Manager
(paper §3.2; Algorithm 1 itself is :mod:`mccl_runtime.drift`).

:meth:`Flagger.check` runs Algorithm 1, the capacity-gained and capacity-lost tests
(:class:`~mccl_runtime.drift.ProfileStack`) and the known-fabric test on every dynamic
collective of the registry, then keeps the idle ones past their dwell (or with a new
confirmed level), and holds a flagged one's job for ``gather_s`` and ``cable_wait_s``
(:class:`~mccl_runtime.manager.ScheduleManager`'s docstring gives the rules).  While
changes are pending it evaluates them too, for speculative jobs (``Policy.speculate``): on
their early estimates alone while the level estimator holds decisions back
(:meth:`Flagger.unsettled`), and with the EWMA on the confirmed ``M`` and the executors'
early estimates, the confirmed flags taking precedence (:meth:`Flagger.check` says why
that is two passes).  Only a collective whose fabric holds a pending link can start a
speculative job (:meth:`Flagger._covers`), so with no such link the early pass does not
run Algorithm 1 (docs/runtime.md, "Speculative synthesis").
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Mapping

import numpy as np

from mccl_opt.schedule import Schedule

from .channels import reverse_links
from .drift import DriftReport, ProfileStack, ScheduleProfile, detect, profile_schedule
from .groups import Groups
from .publish_decision import beats, near, one_way_drops, remembered, speculation_covers
from .telemetry import MeasurementStore

if TYPE_CHECKING:
    from .manager import Collective, Policy

__all__ = ["Flagger"]

Flagged = list[tuple["Collective", DriftReport]]


class Flagger:
    """Algorithm 1 and the holds before a job starts, over a manager's registry
    (``registry``: its collectives by key, read only; module docstring)."""

    def __init__(self, store: MeasurementStore, groups: Groups, policy: Policy,
                 registry: Mapping[tuple[str, str], Collective]) -> None:
        self.store = store
        self.groups = groups
        self.policy = policy
        self.topo = store.topo
        self.registry = registry
        self._pending_since: float | None = None
        self._stack: ProfileStack | None = None
        # (comm, name) -> (M, profile, flag): the known-fabric test, once per confirmed M and profile
        self._known_seen: dict[tuple[str, str], tuple[np.ndarray, ScheduleProfile, bool]] = {}
        self._known_loads: dict[int, tuple[Schedule, np.ndarray]] = {}    # id(schedule) -> its loads
        self._rev: np.ndarray | None = None             # each link's reverse direction (speculation)

    def forget(self, key: tuple[str, str]) -> None:
        """A collective left the registry."""
        self._known_seen.pop(key, None)
        self._stack = None

    def check(self, colls: list[Collective], now: float) -> tuple[np.ndarray | None, Flagged]:
        """The flagged collectives of ``colls`` whose job may start now, with the ``M`` they
        were flagged on: the confirmed one, or while changes are pending and
        ``Policy.speculate`` is on, their early estimates (:meth:`MeasurementStore.early`;
        ``None`` when the flags are on confirmed ``M``)."""
        early = None
        if self.unsettled(now):
            early = self.store.early() if self.policy.speculate else None
            if early is None:
                return None, []
        elif self.policy.speculate and self.store.estimator == "ewma":
            early = self.store.early()      # drops the executors are still confirming (EWMA)
        profiled = [c for c in colls if c.dynamic and c.profile is not None]
        if not profiled:
            return early, []
        if early is None or self.store.estimator == "ewma":
            # Two estimates, two passes: the confirmed M's flags start their jobs as without
            # speculation (a speculation on a stall beside a confirmed drop cost a restart on
            # real ranks), so the early estimates, another M, are read only when it flags
            # nothing.  One pass over both as two rows was no faster (docs/runtime.md,
            # "Speculative synthesis"): what is shared is cached instead (the early M per
            # confirmed M, the confirmed M's known-fabric flags, the pending links).
            found = self._flagged(profiled, self.store.measured(), None, now)
            if early is None or found:
                return None, found
        return early, self._flagged(profiled, early, self.store.pending_links(), now)

    def _flagged(self, profiled: list[Collective], m: np.ndarray, pending: np.ndarray | None, now: float
                 ) -> Flagged:
        """The idle collectives past their dwell that Algorithm 1 flags under ``m``: the
        confirmed ``M`` or, with ``pending`` (the links of the changes still pending), early
        estimates, for the collectives they cover (:meth:`_covers`); those whose job may
        start now (:meth:`_gathered`), each with its Algorithm 1 report under ``m``.  With
        no pending link no collective is covered, and Algorithm 1 is not run."""
        if pending is None:
            flags = [f or self.known_flag(m, c) for c, f in zip(profiled, self._stack_of(profiled).flags(m).tolist())]
        elif pending.size:          # early estimates: their known-fabric test is not kept (one M is)
            flags = [f or self.better_known(m, c) is not None
                     for c, f in zip(profiled, self._stack_of(profiled).flags(m).tolist())]
        else:
            flags = [False] * len(profiled)
        for coll in profiled:       # a wall clock stepped back (NTP) kept every dwell on until it caught up
            coll.last_decision_t = min(coll.last_decision_t, now)
        flagged = [coll for coll, flag in zip(profiled, flags)
                   if flag and coll.job is None and coll.deferred is None
                   and (now - coll.last_decision_t >= self.policy.min_dwell_s or self._new_level(m, coll))
                   and (pending is None or self._covers(m, coll, pending))]
        chosen = {id(c) for c in flagged}
        for coll in profiled:
            if id(coll) not in chosen:
                coll.flagged_since = coll.one_way_since = None
        return [(coll, detect(m, coll.profile, self.policy.gamma)) for coll in flagged if self._gathered(coll, now)]

    def _covers(self, early: np.ndarray, coll: Collective, pending: np.ndarray) -> bool:
        """Whether ``coll`` may start a speculative job on ``early``
        (:func:`~.publish_decision.speculation_covers`: no cable of its fabric read in one
        direction only; within the level estimator's ``k``, or with the EWMA, where each
        direction is another rank's reading of a few noisy collectives, ``restart_tol``)."""
        if self._rev is None:
            self._rev = reverse_links(self.topo)
        k = self.store.level_params.k if self.store.estimator == "level" else self.policy.restart_tol
        return speculation_covers(early, pending, self.groups.mask(coll.gpus), self._rev, k)

    def _gathered(self, coll: Collective, now: float) -> bool:
        """Whether a flagged collective's job may start: at once with ``gather_s = 0``;
        else once every channel on its links that was sampled in the ``gather_s`` before
        the flag has been sampled again (:meth:`MeasurementStore.unheard_links`), at most
        ``gather_s`` after the flag.  Links that fail together but are read by different
        samples (pairs whose messages ran before and after the change) are then
        synthesized for together, not one version per partial picture.  With
        ``cable_wait_s``, also not while a cable it loads reads dropped in one direction only
        (:meth:`_one_way`)."""
        if self._one_way(coll, now):
            return False
        if self.policy.gather_s <= 0:
            return True
        if coll.flagged_since is None:
            coll.flagged_since = now
        since = coll.flagged_since
        unheard = self.store.unheard_links(since, self.policy.gather_s)
        if self.groups.mask(coll.gpus)[unheard].any() and now - since < self.policy.gather_s:
            return False
        coll.flagged_since = None
        return True

    def _one_way(self, coll: Collective, now: float) -> bool:
        """Whether ``coll``'s job waits for the other direction of a cable
        (``Policy.cable_wait_s``, :func:`~.publish_decision.one_way_drops`): some link of
        its fabric reads more than ``restart_tol`` below what the active version was built
        for while the cable's other direction, which the version loads, does not read
        within ``restart_tol`` of it; at most ``cable_wait_s`` from the first such check.
        On real ranks the two directions are two ranks' readings, reported a push or a
        collective apart, and a job started on one was superseded by the other at the
        cost of a whole synthesis (0.25-0.85 s of AllToAll under load)."""
        if self.policy.cable_wait_s <= 0 or coll.synth_capacity is None or coll.profile is None:
            return False
        if self._rev is None:
            self._rev = reverse_links(self.topo)
        if not one_way_drops(self.store.measured(), self.groups.mask(coll.gpus), coll.synth_capacity,
                             coll.profile.loads, self._rev, self.policy.restart_tol):
            coll.one_way_since = None
            return False
        if coll.one_way_since is None:
            coll.one_way_since = now
        if now - coll.one_way_since < self.policy.cable_wait_s:
            return True
        coll.one_way_since = None
        return False

    def _new_level(self, m: np.ndarray, coll: Collective) -> bool:
        """Level estimator only: a link ``coll``'s schedule relies on has a confirmed level
        more than ``restart_tol`` from the capacities it was synthesized for, i.e. a change
        confirmed after its synthesis started (a confirmed level is the estimate, it does
        not drift).  Such a change is not the thrashing the dwell time guards against: a
        change that arrives too late to hold the swap (the last ~2 ms before it, not yet
        alarmed) gets its version at once, not a dwell time later."""
        if self.store.estimator != "level" or coll.synth_capacity is None or coll.profile is None:
            return False
        links = self.groups.links(coll.gpus)
        cap, new = coll.synth_capacity[links], m[links]
        nominal = self.topo.arrays.capacity[links]
        relied = (coll.profile.loads[links] > 1e-12) | (cap < (1.0 - self.policy.restart_tol) * nominal)
        return bool(np.any(relied & (np.abs(new - cap) > self.policy.restart_tol * cap)))

    def _stack_of(self, colls: list[Collective]) -> ProfileStack:
        """The collectives' profiles stacked for Algorithm 1 (rebuilt when one changes)."""
        stack = self._stack
        if stack is None or len(stack.profiles) != len(colls) or any(
                p is not c.profile for p, c in zip(stack.profiles, colls)):
            stack = self._stack = ProfileStack([c.profile for c in colls], [self._gain_capacity(c) for c in colls],
                                               self.policy.gamma, self.policy.rate_loss,
                                               self.policy.clear_ratio * self.policy.gamma,
                                               [c.synth_capacity if c.built_for is None else c.built_for
                                                for c in colls])
        return stack

    def _gain_capacity(self, coll: Collective) -> np.ndarray:
        """``coll``'s synthesis capacities for the capacity-gained test: infinite outside
        its sub-fabric (a link it cannot use never flags it)."""
        if coll.gpus is None:
            return coll.synth_capacity
        links = self.groups.links(coll.gpus)
        cap = np.full(self.topo.num_links, math.inf)
        cap[links] = coll.synth_capacity[links]
        return cap

    def unsettled(self, now: float) -> bool:
        """Links with an unconfirmed change hold decisions back, for at most ``settle_max_s``
        (level estimator; with the EWMA a sample is the executor's confirmed reading and
        its ``early`` estimates only start speculative jobs, :meth:`check`)."""
        if self.store.estimator != "level" or self.store.pending_links().size == 0:
            self._pending_since = None
            return False
        if self._pending_since is None:
            self._pending_since = now
        return now - self._pending_since < self.policy.settle_max_s

    def better_known(self, m: np.ndarray, coll: Collective) -> tuple[np.ndarray, Schedule] | None:
        """A known fabric (:meth:`known`) that ``m`` matches while the active schedule's
        own capacities no longer do, whose schedule's rate under ``m`` beats the active
        one's by more than ``min_gain``: a partial recovery (a link read back at 363.6 of
        400, its version built for that, then read at 400: the rest is within ``Gamma``,
        so nothing else flags) returns to the schedule made for that fabric.  Requiring
        ``m`` to have left the active schedule's capacities keeps noise around one fabric
        from swapping between two schedules (docs/runtime.md, "Partial recoveries")."""
        if len(coll.known) < 2 or coll.synth_capacity is None or coll.profile is None:
            return None
        links = self.groups.links(coll.gpus)
        if near(m[links], coll.synth_capacity[links], 0.5 * self.policy.restart_tol):
            return None
        hit = self.known(coll, m)
        if hit is None:
            return None
        loads = self.loads_of(coll, hit[0], hit[1])
        return hit if beats(m, loads, coll.profile.loads, self.policy.min_gain) else None

    def known_flag(self, m: np.ndarray, coll: Collective) -> bool:
        """:meth:`better_known` as a flag, computed once per ``M`` and active profile."""
        seen = self._known_seen.get(coll.key)
        if seen is None or seen[0] is not m or seen[1] is not coll.profile:
            seen = self._known_seen[coll.key] = (m, coll.profile, self.better_known(m, coll) is not None)
        return seen[2]

    def loads_of(self, coll: Collective, capacity: np.ndarray, schedule: Schedule) -> np.ndarray:
        """A known schedule's share loads on the fabric's links (cached per schedule)."""
        hit = self._known_loads.get(id(schedule))
        if hit is None or hit[0] is not schedule:
            sub = self.groups.topology(coll.gpus, capacity)
            hit = (schedule, self.groups.lift(coll.gpus, profile_schedule(sub, schedule)).loads)
            if len(self._known_loads) > 4 * self.policy.known_fabrics * max(1, len(self.registry)):
                self._known_loads.clear()
            self._known_loads[id(schedule)] = hit
        return hit[1]

    def known(self, coll: Collective, m: np.ndarray) -> tuple[np.ndarray, Schedule] | None:
        """``(capacities, schedule)`` published for capacities within ``restart_tol / 2`` of
        ``m``, if any (other than the active one's)."""
        hit = remembered(m, self.groups.mask(coll.gpus), coll.known, coll.synth_capacity, self.policy.restart_tol)
        return None if hit is None else coll.known[hit]


