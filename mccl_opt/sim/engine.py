"""The event loop of the fluid fabric simulator (docs/sim.md).

State is numpy arrays over streams (see :mod:`.model`).  Between two events every
transmitting stream has a constant max-min fair rate (:mod:`.fairshare`); the next
event is the earliest of: a piece finishing transmission, a piece arriving at a relay
GPU (transmission end plus the segment's latency), a capacity change.  Events closer
than a relative 1e-9 are processed together, which keeps symmetric schedules cheap.
"""

from __future__ import annotations

import time as _time
from typing import Iterable, Mapping

import numpy as np

from ..schedule import Schedule, schedule_rate, share_loads
from ..topology import Topology
from .fairshare import fill
from .model import SimulationError, Streams, compile_streams, parse_timeline
from .result import SimResult

__all__ = ["simulate"]

_BATCH_TOL = 1e-9

Timeline = Iterable[tuple[float, Mapping[tuple[str, str], float]]]


def simulate(topo: Topology, schedule: Schedule, message_bytes: float, *,
             slice_bytes: float | None = None, pieces: int | None = None,
             capacity_timeline: Timeline | None = None) -> SimResult:
    """Run ``schedule`` on ``topo`` moving ``message_bytes`` per block.

    ``message_bytes`` is B bytes per ordered GPU pair (AllToAll) or the shard bytes per
    GPU (AllGather), DESIGN.md §2.  Chunks are cut into pieces of at most
    ``slice_bytes`` (default 512 KiB) or into exactly ``pieces`` pieces (``pieces=1``:
    whole-chunk store-and-forward, the fast mode for large fabrics).
    ``capacity_timeline`` is ``[(t_seconds, {(src, dst): gbps}), ...]``.
    Raises :class:`mccl_opt.ScheduleError` if the schedule does not match ``topo`` and
    :class:`SimulationError` for bad sizes, slicing or timeline.
    """
    wall = _time.perf_counter()
    streams = compile_streams(topo, schedule, message_bytes, slice_bytes=slice_bytes, pieces=pieces)
    changes = parse_timeline(topo, capacity_timeline)
    times, loads, completion, events = _run(streams, topo.arrays.capacity.copy(), changes)
    rate = schedule_rate(topo, share_loads(topo, schedule.chunks))
    return SimResult(
        collective=schedule.collective, num_gpus=topo.num_gpus, message_bytes=float(message_bytes),
        completion_s=completion, fluid_rate_gbps=rate,
        link_names=tuple((l.src, l.dst) for l in topo.links), times=times, link_gbps=loads,
        num_streams=streams.num_streams, num_events=events, wall_s=_time.perf_counter() - wall)


class _Recorder:
    """Piecewise-constant per-link throughput, merging equal consecutive rows."""

    def __init__(self, n_links: int) -> None:
        self.starts: list[float] = []
        self.rows: list[np.ndarray] = []
        self.zero = np.zeros(n_links)

    def add(self, t: float, load: np.ndarray) -> None:
        if self.rows and float(np.abs(self.rows[-1] - load).max()) <= 1e-9 * (1.0 + float(load.max())):
            return
        self.starts.append(t)
        self.rows.append(load)

    def finish(self, t_end: float) -> tuple[np.ndarray, np.ndarray]:
        if not self.rows:
            return np.array([0.0, t_end]), self.zero[None, :].copy()
        return np.array(self.starts + [t_end]), np.vstack(self.rows)


def _run(st: Streams, cap: np.ndarray, changes) -> tuple[np.ndarray, np.ndarray, float, int]:
    n = st.num_streams
    done = np.zeros(n, dtype=np.int64)
    active = np.zeros(n, dtype=bool)
    rem = np.zeros(n)
    off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(st.npieces, out=off[1:])
    fin = np.full(int(off[-1]), np.nan)
    bytes_per_s = 1e9 / 8.0
    open_idx = np.arange(n)
    indptr = st.inc.indptr.astype(np.int64)
    indices = st.inc.indices.astype(np.int64)
    rec = _Recorder(cap.size)
    t, ci, events = 0.0, 0, 0
    while open_idx.size:
        while ci < len(changes) and changes[ci].time_s <= t * (1 + _BATCH_TOL):
            cap[changes[ci].links] = changes[ci].gbps
            ci += 1
        next_change = changes[ci].time_s if ci < len(changes) else np.inf
        next_arrival = _start_ready(st, open_idx, done, active, rem, fin, off, t)
        act = open_idx[active[open_idx]]
        if act.size == 0:
            t_next = min(next_arrival, next_change)
            if not np.isfinite(t_next):  # pragma: no cover - compile_streams forbids cycles
                raise SimulationError("simulation deadlocked: no piece can move")
            rec.add(t, rec.zero)
            t = t_next
            continue
        rates, load = fill(indptr, indices, act, st.mult, cap)
        dt_fin = rem[act] / (rates * bytes_per_s)
        dt = min(float(dt_fin.min()), next_arrival - t, next_change - t)
        rec.add(t, load)
        rem[act] -= rates * bytes_per_s * dt
        finished = act[dt_fin <= dt * (1 + _BATCH_TOL)]
        t += dt
        events += 1
        fin[off[finished] + done[finished]] = t
        done[finished] += 1
        active[finished] = False
        rem[finished] = 0.0
        if (done[finished] == st.npieces[finished]).any():
            open_idx = open_idx[done[open_idx] < st.npieces[open_idx]]
    arrivals = fin[off[1:] - 1] + st.latency_s
    completion = float(arrivals.max())
    if completion > t:
        rec.add(t, rec.zero)
    times, loads = rec.finish(completion)
    return times, loads, completion, events


def _start_ready(st: Streams, open_idx: np.ndarray, done: np.ndarray, active: np.ndarray,
                 rem: np.ndarray, fin: np.ndarray, off: np.ndarray, t: float) -> float:
    """Start every idle stream whose next piece is at its tail GPU; return the time the
    next piece arrives somewhere (``inf`` if none is in flight)."""
    idle = open_idx[~active[open_idx]]
    if idle.size == 0:
        return np.inf
    par = st.parent[idle]
    j = done[idle]
    arrive = np.zeros(idle.size)
    child = par >= 0
    p = par[child]
    jc = j[child]
    sent = done[p] > jc
    at = np.full(p.size, np.inf)
    at[sent] = fin[off[p[sent]] + jc[sent]] + st.latency_s[p[sent]]
    arrive[child] = at
    ready = arrive <= t * (1 + _BATCH_TOL) + 1e-15
    start = idle[ready]
    active[start] = True
    rem[start] = st.piece_bytes[start]
    later = arrive[~ready]
    return float(later.min()) if later.size else np.inf
