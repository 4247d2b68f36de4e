"""Concurrent collectives of many communicators sharing links: a fluid model
(paper §6.3; docs/training.md "Contention").

A *flow* is one communicator's collective: consecutive stages (an AllReduce is a
ReduceScatter then an AllGather), each a vector of bits per parent link.  A stage moves
in lockstep at the rate its schedule allows (the schedule's own rate model: alone on the
fabric it takes ``max_a bits_a / cap_a``).  Flows running at the same time share links
max-min fairly in *progress* (fraction of the stage per second): every unfrozen flow
advances at the same pace until a link saturates; the flows crossing it freeze there;
repeat (progressive filling).  This is the fluid simulator's sharing
(:mod:`mccl_opt.sim`, flows weighted by their size) with a whole collective as the flow.
Rates are recomputed whenever a stage, a collective or a compute op ends.

:func:`run_streams` runs streams side by side (a phase's critical path and its
background collectives); each stream is a list of items run in order: a compute
duration in seconds, or a collective op (the flows of every instance of its group,
done when the last one is).  Latency is not modelled (bandwidth terms only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

import numpy as np
import scipy.sparse as sp

__all__ = ["Flow", "progress_rates", "run_streams", "alone_seconds"]

_TOL = 1e-12
Stage = tuple[np.ndarray, np.ndarray]          # (parent link indices, bits on each)


@dataclass(frozen=True)
class Flow:
    """One communicator's collective: its stages (link indices, bits)."""

    stages: tuple[Stage, ...]


Item = Union[float, Sequence[Flow]]


def alone_seconds(flow: Flow, capacity_bps: np.ndarray) -> float:
    """The flow's duration with the fabric to itself."""
    return float(sum(np.max(bits / capacity_bps[idx], initial=0.0) for idx, bits in flow.stages))


def progress_rates(stages: Sequence[Stage], capacity_bps: np.ndarray) -> np.ndarray:
    """Max-min fair progress rate (stages per second) of each stage running at once."""
    n = len(stages)
    if n == 0:
        return np.zeros(0)
    indptr = np.cumsum([0] + [len(i) for i, _ in stages])
    m = sp.csr_matrix((np.concatenate([b for _, b in stages]).astype(float),
                       np.concatenate([i for i, _ in stages]).astype(np.int64), indptr),
                      shape=(n, capacity_bps.size))
    mt = m.T.tocsr()
    rate = np.zeros(n)
    free = np.array([np.any(b > 0) for _, b in stages])
    rate[~free] = np.inf
    residual = np.asarray(capacity_bps, dtype=float).copy()
    while free.any():
        demand = mt @ free.astype(float)
        used = demand > _TOL * residual.max()
        slack = residual[used] / demand[used]
        step = float(slack.min())
        rate[free] += step
        residual -= step * demand
        saturated = used & (residual <= 1e-9 * capacity_bps)
        saturated[np.flatnonzero(used)[int(np.argmin(slack))]] = True
        free &= ~((m @ saturated.astype(float)) > 0)
    return rate


class _Collective:
    """The running state of one collective op: each flow's stage and what is left of it."""

    def __init__(self, flows: Sequence[Flow]) -> None:
        self.flows = [f for f in flows if f.stages]
        self.stage = [0] * len(self.flows)
        self.left = [1.0] * len(self.flows)

    def running(self) -> list[int]:
        return [k for k, f in enumerate(self.flows) if self.stage[k] < len(f.stages)]

    def advance(self, k: int, rate: float, dt: float) -> None:
        self.left[k] -= rate * dt
        if self.left[k] <= 1e-9:
            self.stage[k] += 1
            self.left[k] = 1.0


def run_streams(streams: Sequence[Sequence[Item]], capacity_bps: np.ndarray) -> float:
    """Seconds until every stream has run all its items (module docstring)."""
    cap = np.asarray(capacity_bps, dtype=float)
    pos = [0] * len(streams)
    state: list[float | _Collective | None] = [None] * len(streams)
    now = 0.0
    while True:
        for s, items in enumerate(streams):          # load the next item of idle streams
            while state[s] is None and pos[s] < len(items):
                item = items[pos[s]]
                state[s] = float(item) if isinstance(item, (int, float)) else _Collective(item)
                if isinstance(state[s], _Collective) and not state[s].running():
                    state[s] = None
                    pos[s] += 1
        if all(st is None for st in state):
            return now
        active = [(s, k) for s, st in enumerate(state) if isinstance(st, _Collective) for k in st.running()]
        stages = [state[s].flows[k].stages[state[s].stage[k]] for s, k in active]
        rates = progress_rates(stages, cap)
        dt = min([st for st in state if isinstance(st, float)]
                 + [state[s].left[k] / r for (s, k), r in zip(active, rates) if r > 0], default=0.0)
        for (s, k), r in zip(active, rates):
            state[s].advance(k, r if np.isfinite(r) else np.inf, dt if np.isfinite(r) else 1.0)
        for s, st in enumerate(state):
            if isinstance(st, float):
                state[s] = st - dt if st - dt > 1e-15 else None
            elif isinstance(st, _Collective) and not st.running():
                state[s] = None
            if st is not None and state[s] is None:
                pos[s] += 1
        now += dt
