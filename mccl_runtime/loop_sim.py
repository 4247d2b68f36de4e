"""The simulated side of the closed loop (:mod:`.loop`): one collective simulated across the
timeline's breakpoints it overlaps, and the measurement windows the ranks would report on its
saturated links (paper §5)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from mccl_opt.schedule import Schedule
from mccl_opt.topology import Topology

__all__ = ["link_windows", "simulate_span"]


def link_windows(res: Any, cap_rows: np.ndarray, window_bytes: float, max_windows: int,
                 window_s: float = math.inf) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Measurement windows of one simulated collective: ``(links, t_end, gbps)``, times
    relative to its start.  Only saturated stretches are measured (paper §5); a window
    closes after ``window_bytes`` (at most ``max_windows`` per link) or ``window_s``,
    whichever comes first."""
    dt = np.diff(res.times)
    sat = (res.link_gbps >= cap_rows * (1.0 - 1e-6)) & (res.link_gbps > 0) & (dt[:, None] > 0)
    out_l, out_t, out_y = [], [], []
    for a in np.flatnonzero(sat.any(axis=0)):
        cum = np.concatenate([[0.0], np.cumsum(res.link_gbps[:, a] * dt)])       # Gbit
        edges = np.flatnonzero(np.diff(np.concatenate([[0], sat[:, a].astype(np.int8), [0]])))
        starts, ends = res.times[edges[0::2]], res.times[edges[1::2]]
        nbytes = (np.interp(ends, res.times, cum) - np.interp(starts, res.times, cum)) * 1e9 / 8
        n = np.maximum(1, np.ceil(nbytes / window_bytes)).astype(int)
        if n.size >= max_windows:                  # more stretches than windows: the largest ones, once
            keep = np.argsort(-nbytes, kind="stable")[:max_windows]
            n = np.zeros_like(n)
            n[keep] = 1
        elif n.sum() > max_windows:
            n = np.maximum(1, np.floor(n * max_windows / n.sum())).astype(int)
        n = np.maximum(n, np.floor((ends - starts) / window_s)).astype(int)       # bounded in time
        starts, ends = starts[n > 0], ends[n > 0]
        n = n[n > 0]
        run = np.repeat(np.arange(n.size), n + 1)                 # window edges of every run at once
        pos = np.arange(run.size) - np.repeat(np.cumsum(n + 1) - (n + 1), n + 1)
        w = starts[run] + (ends - starts)[run] * pos / n[run]
        g = np.diff(np.interp(w, res.times, cum)) / np.maximum(np.diff(w), 1e-300)
        keep = pos[1:] > 0                                           # drop the gaps between runs
        out_l.append(np.full(int(n.sum()), a))
        out_t.append(w[1:][keep])
        out_y.append(g[keep])
    if not out_l:
        return np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0)
    return np.concatenate(out_l), np.concatenate(out_t), np.concatenate(out_y)


def simulate_span(topo: Topology, schedule: Schedule, message_bytes: float, timeline: list,
                  t_start: float, k: int, fluid: bool) -> tuple[Any, np.ndarray]:
    """Simulate one collective starting at ``t_start`` in timeline state ``k``, with every
    later breakpoint it overlaps; returns the result and the capacity per result row."""
    from mccl_opt.sim import simulate

    cap0 = timeline[k][1]
    base = topo.with_capacities(cap0)
    res = simulate(base, schedule, message_bytes, fluid=fluid)
    used = 0
    while True:
        later = [(tb - t_start, cap) for tb, cap, _ in timeline[k + 1:] if tb - t_start < res.completion_s]
        if len(later) == used:
            break
        used = len(later)
        prev, changes = cap0, []
        for dt, cap in later:
            diff = np.flatnonzero(cap != prev)
            if diff.size:
                changes.append((dt, {(topo.links[a].src, topo.links[a].dst): float(cap[a]) for a in diff}))
            prev = cap
        res = simulate(base, schedule, message_bytes, fluid=fluid, capacity_timeline=changes or None)
    if not used:
        return res, cap0[None, :]
    bounds = np.array([dt for dt, _ in later])
    caps = np.stack([cap0] + [cap for _, cap in later])
    return res, caps[np.searchsorted(bounds, res.times[:-1], side="right")]
