"""Swap holds for real executors (docs/runtime.md, "Swap holds on real executors").

The simulated loop asks :meth:`ScheduleManager.swap_hold` when a published version is
due at the ranks and keeps the old version while a link the new one relies on has
changed since its synthesis (paper §3.2: every rank must agree on the swap; a version
overtaken between publish and swap should not run).  A real executor swaps a version
in when its ranks' OOB exchange says so, some milliseconds after the publish; the
controller does not see that moment.  So after every publish the service watches the
version for ``window_s``: when :meth:`~ScheduleManager.swap_hold` names links, it
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


class SwapHolds:
    """Which published versions are held, and the hold/release messages to publish."""

    def __init__(self, window_s: float = HOLD_WINDOW_S) -> None:
        self.window_s = window_s
        self._watch: dict[tuple[str, str], _Watch] = {}
        self.sent = 0                      # hold and release messages decided

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
            links = manager.swap_hold(*key)
            if w.held_since is None:
                if links:
                    w.held_since, w.links = now, links
                    out.append((*key, w.version, links))
                elif now - w.published >= self.window_s:
                    del self._watch[key]
            elif not links or self._over(manager, key, links, w.held_since, now):
                del self._watch[key]
                out.append((*key, w.version, []))
        self.sent += len(out)
        return out

    def _over(self, manager: Any, key: tuple[str, str], links: list[list[str]], since: float,
              now: float) -> bool:
        """A hold (since ``since``) on ``links`` that have not cleared ends ``settle_max_s``
        after it began once the manager says a fresh reading settled it, and ``window_s``
        after it began in any case (module docstring)."""
        held_s = now - since
        return held_s >= self.window_s or (held_s >= manager.policy.settle_max_s and
                                           manager.hold_settled(*key, links, since, self.window_s))
