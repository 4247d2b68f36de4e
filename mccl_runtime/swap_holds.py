"""Swap holds for real executors (docs/runtime.md, "Swap holds on real executors").

The simulated loop asks :meth:`ScheduleManager.swap_hold` when a published version is
due at the ranks and keeps the old version while a link the new one relies on has
changed since its synthesis (paper §3.2: every rank must agree on the swap; a version
overtaken between publish and swap should not run).  A real executor swaps a version
in when its ranks' OOB exchange says so, some milliseconds after the publish; the
controller does not see that moment.  So after every publish the service watches the
version for ``window_s``: when :meth:`~ScheduleManager.swap_holds` names held links, it
publishes a ``hold`` (the executors keep the old version,
:meth:`executor_cuda.rescheduler.Rescheduler.hold`); when the links clear, or the hold
has settled (below), it publishes the release (``held: []``).  A newer version ends the watch of the older one (it is never
released: the newer version replaces it at the ranks).

A hold ends early only on a fresh reading: ``settle_max_s`` (50 ms, the simulated loop's
bound, where a link is sampled every millisecond) is shorter than one real-rank
collective (60 ms and more on gloo ranks), so a hold released at ``settle_max_s`` was
released on the estimate that made it, before any rank had measured the held links
again.  The release now also waits until every channel on the held links that was
sampled in the ``window_s`` before the hold has been sampled since, and, when the fresh
reading shows the links back where the version before was built for (the held version
was made for a transient), until a newer version replaces it
(:meth:`~mccl_runtime.manager.ScheduleManager.hold_settled`); at most ``window_s`` in
any case: the bound scales with how often those links are measured, not with the
simulated loop's clock.

A hold that settles on a real change (the fresh reading confirms the links moved) is not
released: the held version was built on a partial picture, and releasing it ran it for
the whole dwell time (``Policy.min_dwell_s``, 1 s) before the next version could be
flagged.  The manager starts a job on the latest ``M`` at once
(:meth:`~mccl_runtime.manager.ScheduleManager.supersede_held`) and the hold stays while
that job runs: its version replaces the held one, and when it ends without one
(``no_gain``, ``cleared``) the held version is released, as it is ``window_s`` after the
hold began in any case.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["SwapHolds", "HOLD_WINDOW_S"]

#: seconds after a publish during which a change can still hold the version's swap
HOLD_WINDOW_S = 1.0


@dataclass
class _Watch:
    version: int
    published: float
    held_since: float | None = None
    links: list[list[str]] | None = None
    superseded: bool = False           # settled on a real change: a job replaces the version
    unfit_since: float | None = None   # a drop costs it its rate, but it beats the version before


class SwapHolds:
    """Which published versions are held, and the hold/release messages to publish."""

    def __init__(self, window_s: float = HOLD_WINDOW_S) -> None:
        self.window_s = window_s
        self._watch: dict[tuple[str, str], _Watch] = {}
        self.sent = 0                      # hold and release messages decided
        self.events: list[Any] = []        # manager events of jobs started here (:meth:`take_events`)

    def published(self, comm: str, name: str, version: int, now: float) -> None:
        """A version went out: watch it (and stop watching the older one)."""
        self._watch[(comm, name)] = _Watch(version, now)

    def held(self, comm: str, name: str, version: int) -> list[list[str]]:
        """The links that hold ``version`` now (``[]``: swappable)."""
        w = self._watch.get((comm, name))
        return list(w.links or []) if w is not None and w.version == version and w.held_since is not None else []

    def turn(self, manager: Any, now: float) -> list[tuple[str, str, int, list[list[str]]]]:
        """``(comm, name, version, held links)`` to publish this turn (``[]`` links:
        a release); a watch ends with its release or after ``window_s`` unheld."""
        out = []
        for key, w in list(self._watch.items()):
            w.published = min(w.published, now)            # a wall clock stepped back: no hold for that long
            w.held_since = None if w.held_since is None else min(w.held_since, now)
            links, unfit = manager.swap_holds(*key)
            if w.held_since is None:
                if links:
                    w.held_since, w.links = now, links
                    out.append((*key, w.version, links))
                elif not w.superseded and self._replace_unfit(manager, key, unfit, w, now):
                    continue
                elif now - w.published >= self.window_s:
                    del self._watch[key]
            elif not links or self._over(manager, key, links, w, now):
                del self._watch[key]
                out.append((*key, w.version, []))
        self.sent += len(out)
        return out

    def take_events(self) -> list[Any]:
        """The manager events of the jobs :meth:`turn` started, once."""
        events, self.events = self.events, []
        return events

    def _replace_unfit(self, manager: Any, key: tuple[str, str], unfit: list[list[str]], w: _Watch,
                       now: float) -> bool:
        """Whether an unheld version is being watched for a drop (``unfit``) that costs it
        its rate but not enough to hold it (it still beats the version before, so the ranks
        swap it in: ``swap_holds`` gives no held links, and ``unfit`` ones).
        Once a fresh reading settles that drop (:meth:`_over`'s test), a job replaces the
        version at once, as for a held one, without waiting for the dwell time or for the
        drop to flag Algorithm 1 (a ramp's step costs 20-40 % of the rate, under ``Gamma``
        on real ranks)."""
        if not unfit:
            w.unfit_since = None
            return False
        w.unfit_since = now if w.unfit_since is None else min(w.unfit_since, now)
        if now - w.unfit_since >= manager.policy.settle_max_s \
                and manager.hold_settled(*key, unfit, w.unfit_since, self.window_s):
            w.superseded = True
            event = manager.supersede_held(*key, now, held=False)
            if event is not None:
                self.events.append(event)
        return True

    def _over(self, manager: Any, key: tuple[str, str], links: list[list[str]], w: _Watch,
              now: float) -> bool:
        """Whether a hold on ``links`` that have not cleared ends now: ``window_s`` after it
        began in any case; else, once the manager says a fresh reading settled it (no
        sooner than ``settle_max_s``), a job replaces the held version and the hold ends
        only if that job ends without a newer version (module docstring)."""
        held_s = now - w.held_since
        if held_s >= self.window_s:
            return True
        if not w.superseded:
            if held_s < manager.policy.settle_max_s or not manager.hold_settled(*key, links, w.held_since,
                                                                                self.window_s):
                return False
            w.superseded = True
            event = manager.supersede_held(*key, now)
            if event is not None:
                self.events.append(event)
        return not manager.superseding(*key, w.version)
