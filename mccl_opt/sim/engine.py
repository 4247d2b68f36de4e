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

from ..link_rate import LOAD_NOISE, rate_of_loads
from ..schedule import Schedule
from ..topology import Topology
from .fairshare import fill
from .model import SimulationError, Streams, compile_streams, parse_timeline
from .result import SimResult

__all__ = ["simulate"]

_BATCH_TOL = 1e-9

Timeline = Iterable[tuple[float, Mapping[tuple[str, str], float]]]


def simulate(topo: Topology, schedule: Schedule, message_bytes: float, *,
             slice_bytes: float | None = None, pieces: int | None = None, fluid: bool = False,
             capacity_timeline: Timeline | None = None) -> SimResult:
    """Run ``schedule`` on ``topo`` moving ``message_bytes`` per block.

    ``message_bytes`` is B bytes per ordered GPU pair (AllToAll) or the shard bytes per
    GPU (AllGather), README "Units and definitions".  Chunks are cut into pieces as
    :mod:`mccl_opt.piece_rule` says (what the executor does: at most 512 KiB, 16 per relay hop
    down to 64 KiB pieces), of ``slice_bytes``, or into exactly ``pieces`` pieces
    (``pieces=1``: whole-chunk store-and-forward).  ``fluid=True`` is the fast mode for large fabrics:
    infinitely fine pieces, each chunk one flow over all its links at once.
    ``capacity_timeline`` is ``[(t_seconds, {(src, dst): gbps}), ...]``.
    Raises :class:`mccl_opt.ScheduleError` if the schedule does not match ``topo`` and
    :class:`SimulationError` for bad sizes, slicing or timeline.
    """
    wall = _time.perf_counter()
    streams = compile_streams(topo, schedule, message_bytes, slice_bytes=slice_bytes, pieces=pieces,
                              fluid=fluid)
    changes = parse_timeline(topo, capacity_timeline)
    times, loads, completion, events = _run(streams, topo.arrays.capacity.copy(), changes)
    rate = _fluid_rate(streams, topo.arrays.capacity, float(message_bytes))
    return SimResult(
        collective=schedule.collective, num_gpus=topo.num_gpus, message_bytes=float(message_bytes),
        completion_s=completion, fluid_rate_gbps=rate,
        link_names=tuple((l.src, l.dst) for l in topo.links), times=times, link_gbps=loads,
        num_streams=streams.num_streams, num_events=events, wall_s=_time.perf_counter() - wall)


def _fluid_rate(st: Streams, cap: np.ndarray, message_bytes: float) -> float:
    """``min_a cap_a / L_a`` with share loads ``L_a`` from the streams (= ``schedule_rate``)."""
    share = st.mult * st.npieces * st.piece_bytes / message_bytes
    return rate_of_loads(cap, st.inc.T @ share, noise=LOAD_NOISE)


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
    """The event loop; per event it touches only the transmitting streams and the
    streams whose next piece may just have become available."""
    n = st.num_streams
    done = np.zeros(n, dtype=np.int64)
    active = np.zeros(n, dtype=bool)
    rem = np.zeros(n)
    off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(st.npieces, out=off[1:])
    fin = np.full(int(off[-1]), np.nan)
    indptr = st.inc.indptr.astype(np.int64)
    indices = st.inc.indices.astype(np.int64)
    child_ptr, child_idx = _children(st.parent)
    bytes_per_s = 1e9 / 8.0
    rec = _Recorder(cap.size)
    act = np.zeros(0, dtype=np.int64)
    pend = np.zeros(0, dtype=np.int64)
    cand = np.flatnonzero(st.parent < 0)
    left = n
    t, ci, events = 0.0, 0, 0
    while left:
        while ci < len(changes) and changes[ci].time_s <= t * (1 + _BATCH_TOL):
            cap[changes[ci].links] = changes[ci].gbps
            ci += 1
        next_change = changes[ci].time_s if ci < len(changes) else np.inf
        started, pend, next_arrival = _start_ready(st, np.union1d(cand, pend), done, active, fin, off, t)
        rem[started] = st.piece_bytes[started]
        act = np.concatenate([act, started])
        if act.size == 0:
            t_next = min(next_arrival, next_change)
            if not np.isfinite(t_next):  # pragma: no cover - compile_streams forbids cycles
                raise SimulationError("simulation deadlocked: no piece can move")
            rec.add(t, rec.zero)
            t, cand = t_next, np.zeros(0, dtype=np.int64)
            continue
        rates, load = fill(indptr, indices, act, st.mult, st.growth, cap)
        dt_fin = rem[act] / (rates * bytes_per_s)
        dt = min(float(dt_fin.min()), next_arrival - t, next_change - t)
        rec.add(t, load)
        rem[act] -= rates * bytes_per_s * dt
        over = dt_fin <= dt * (1 + _BATCH_TOL)
        finished, act = act[over], act[~over]
        t += dt
        events += 1
        fin[off[finished] + done[finished]] = t
        done[finished] += 1
        active[finished] = False
        rem[finished] = 0.0
        more = done[finished] < st.npieces[finished]
        left -= int(finished.size - more.sum())
        cand = np.concatenate([finished[more], _gather(child_ptr, child_idx, finished)])
    arrivals = fin[off[1:] - 1] + st.latency_s
    completion = float(arrivals.max())
    if completion > t:
        rec.add(t, rec.zero)
    times, loads = rec.finish(completion)
    return times, loads, completion, events


def _children(parent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR of each stream's child streams."""
    has = np.flatnonzero(parent >= 0)
    order = has[np.argsort(parent[has], kind="stable")]
    ptr = np.zeros(parent.size + 1, dtype=np.int64)
    np.cumsum(np.bincount(parent[has], minlength=parent.size), out=ptr[1:])
    return ptr, order


def _gather(ptr: np.ndarray, idx: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Concatenation of ``idx[ptr[r]:ptr[r+1]]`` over ``rows``."""
    counts = ptr[rows + 1] - ptr[rows]
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    starts = np.repeat(ptr[rows] - np.cumsum(counts) + counts, counts)
    return idx[starts + np.arange(total)]


def _start_ready(st: Streams, cand: np.ndarray, done: np.ndarray, active: np.ndarray,
                 fin: np.ndarray, off: np.ndarray, t: float) -> tuple[np.ndarray, np.ndarray, float]:
    """Among candidate streams, start those whose next piece is at their tail GPU.

    Returns ``(started, pending, next_arrival)``: ``pending`` are idle streams whose
    next piece is on its way (it arrives at ``next_arrival`` at the earliest).
    """
    cand = cand[~active[cand] & (done[cand] < st.npieces[cand])]
    par = st.parent[cand]
    j = done[cand]
    arrive = np.zeros(cand.size)
    child = par >= 0
    p = par[child]
    jc = j[child]
    sent = done[p] > jc
    at = np.full(p.size, np.inf)
    at[sent] = fin[off[p[sent]] + jc[sent]] + st.latency_s[p[sent]]
    arrive[child] = at
    ready = arrive <= t * (1 + _BATCH_TOL) + 1e-15
    started = cand[ready]
    active[started] = True
    waiting = ~ready & np.isfinite(arrive)
    pending = cand[waiting]
    next_arrival = float(arrive[waiting].min()) if pending.size else np.inf
    return started, pending, next_arrival
