"""One log line per controller decision (``mccl controller serve -v``; docs/runtime.md).

The manager reports every decision as an :class:`~.manager.Event` (paper §3.1-3.2:
Algorithm 1 flags a collective, a warm re-synthesis starts, and its result is published,
aborted on re-check, superseded by a newer estimate, abandoned at the time bound or
failed).  :func:`log_events` writes each on the ``mccl.controller`` logger: what
drifted, the rate of the current and the new schedule on the measured fabric, the
synthesis seconds and the published version.  Lines are formatted only when the level
is enabled.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

import numpy as np

from .manager import Action, Event, ScheduleManager

__all__ = ["describe", "changed_links", "log_events", "LEVELS"]

#: ``--log-level`` words and their levels
LEVELS = {"warning": logging.WARNING, "info": logging.INFO, "debug": logging.DEBUG}

#: events that mean a re-synthesis did not help: logged as warnings
_WARN = (Action.TIMEOUT, Action.FAILED)
#: changed links named per line (the rest are counted)
MAX_LINKS = 3


def _rate(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else "?"


def changed_links(manager: ScheduleManager, event: Event, gamma: float) -> list[str]:
    """``src->dst OLD -> NEW Gbps`` for the links measured more than ``gamma``
    (relative) away from the capacities the collective's schedule was built for."""
    coll = manager.get(event.comm, event.name)
    if coll.synth_capacity is None:
        return []
    m, old = manager.store.measured(), coll.synth_capacity
    moved = np.flatnonzero(np.abs(m - old) > gamma * old)
    links = manager.topo.links
    out = [f"{links[a].src}->{links[a].dst} {old[a]:.4g} -> {m[a]:.4g} Gbps"
           for a in moved[:MAX_LINKS].tolist()]
    if moved.size > MAX_LINKS:
        out.append(f"{moved.size - MAX_LINKS} more links")
    return out


def describe(event: Event, gamma: float | None = None, changed: list[str] | None = None) -> str:
    """The log line of one decision (``gamma``: Algorithm 1's threshold; ``changed``:
    the links whose measured capacity moved, :func:`changed_links`)."""
    d, who = event.detail, f"{event.comm}/{event.name}"
    if event.action is Action.RESYNTHESIS:
        if not d:
            return f"{who}: synthesizing the first schedule"
        what = ", ".join(changed) if changed else "capacities changed"
        worst = d.get("worst_link")
        if d.get("flagged") and worst:
            threshold = f" > Gamma {gamma:g}" if gamma is not None else ""
            why = (f"Algorithm 1: max delta {d.get('max_delta', 0.0):.3g}{threshold} on cut link "
                   f"{worst[0]}->{worst[1]}, bottleneck rate {_rate(d.get('x_min'))} Gbps")
        elif d.get("capacity") == "lost":
            why = (f"its rate fell below the schedule's synthesis capacities, max delta "
                   f"{d.get('max_delta', 0.0):.3g}")
        elif d.get("capacity") == "known":
            why = "the capacities match a known fabric whose schedule does better"
        else:
            why = "a link gained capacity above the schedule's"
        if d.get("unfit_version"):
            why += "; a settled drop costs the swapped-in version its rate"
        if d.get("speculative"):
            why += "; speculative: on changes still being confirmed"
        return f"{who} v{event.version}: {what} ({why}); re-synthesis started"
    rates = (f"rate {_rate(d['rate_before'])} -> {_rate(d['rate_after'])} Gbps on the measured "
             f"fabric" if "rate_after" in d else "")
    synth = f"synthesis {d['synth_s']:.3g} s" if isinstance(d.get("synth_s"), (int, float)) else ""
    if event.action is Action.PUBLISHED:
        how = "a known fabric's schedule reused" if d.get("known_fabric") else synth
        anytime = "anytime: the estimate moved during synthesis, restarting on it" if d.get("anytime") else ""
        parts = ", ".join(p for p in (rates or "first schedule", how, anytime) if p)
        return f"{who}: published v{event.version} ({parts})"
    if event.action is Action.ABORTED and "bound" in d:
        return (f"{who}: no re-synthesis (rate {_rate(d.get('rate_before'))} Gbps is at the single-vertex "
                f"bound {_rate(d['bound'])} Gbps: no schedule can gain); keeping v{event.version}")
    if event.action is Action.ABORTED:
        reason = {"cleared": "the drift cleared", "no_gain": "no gain"}.get(d.get("reason"), d.get("reason"))
        parts = ", ".join(p for p in (rates, synth) if p)
        return f"{who}: re-synthesis aborted ({reason}; {parts}); keeping v{event.version}"
    if event.action is Action.HELD:
        links = ", ".join(f"{a}->{b}" for a, b in d.get("pending", []))
        return (f"{who}: re-synthesis done ({synth}), held while {links} is still being confirmed; "
                f"keeping v{event.version}")
    if event.action is Action.SUPERSEDED:
        return (f"{who}: re-synthesis superseded (capacities moved {d.get('moved', 0.0):.3g} since "
                f"it started; {synth}); restarting on the latest estimate")
    if event.action is Action.TIMEOUT:
        return (f"{who}: re-synthesis abandoned after the {d.get('time_limit_s')} s time bound; "
                f"keeping v{event.version}")
    if event.action is Action.FAILED:
        return f"{who}: re-synthesis failed ({d.get('error')}); keeping v{event.version}"
    return f"{who}: {event.action} v{event.version} {d}"


def log_events(log: logging.Logger, events: Iterable[Event], manager: ScheduleManager) -> None:
    """Log every event of ``manager``: failures and timeouts as warnings, the rest at info."""
    gamma = manager.policy.gamma
    for event in events:
        level = logging.WARNING if event.action in _WARN else logging.INFO
        if log.isEnabledFor(level):
            changed = changed_links(manager, event, gamma) if event.action is Action.RESYNTHESIS else None
            log.log(level, "%s", describe(event, gamma, changed))
