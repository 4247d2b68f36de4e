"""Joint re-synthesis of communicators that share links (docs/training.md "Joint
re-synthesis"; beyond the paper, which synthesizes each communicator on its own).

Communicators that run at the same time and cross one link (a GPU's NIC carries its
expert-parallel AllToAll and its data-parallel AllGather; with host relays, every
data-parallel rail group may use every NIC of a host) each believe, synthesized on their
own, that they have the whole link; together they over-subscribe it.  Joint
re-synthesis gives each communicator a *share* of every link it shares and synthesizes
its MCCL schedules as if the link had only that share; the candidate whose iteration
time (real capacities, contention model) is smallest wins:

* **proportional rounds**: a communicator's share of link ``a`` is its part of the bits
  that all communicators of the same phase put on ``a`` under the previous round's
  schedules (round 1 starts from independent synthesis), at least :data:`FLOOR`, the
  largest over the phases it runs in, rounded to 1/:data:`QUANTUM` (so that symmetric
  communicators keep equal keys and share one synthesis); a link nobody else uses stays
  whole.  :data:`ROUNDS` rounds.
* **no relays** (with host relays only): every communicator keeps to its members, i.e.
  gets no share of the links it would only relay over.
* **degraded-link splits**: the links below their healthy capacity (or new, as Fail3's
  backup cables) are split between the *groups* that cross them in one phase: each
  group in turn gets a fraction of :data:`FRACTIONS`, the others share the rest equally.

Independent synthesis (every communicator sees whole links) is always a candidate, so
the joint result is never worse than it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..topology import Topology
from .comms import LoadCache
from .iteration import Capacities, FabricState, fabric_state, iteration_time, link_traffic
from .workload import Workload

__all__ = ["joint_resynthesis", "JointResult", "degraded_links", "contending_groups", "FRACTIONS",
           "ROUNDS", "FLOOR", "QUANTUM"]

FRACTIONS = (0.02, 0.25, 0.5, 0.75)
ROUNDS = 3
FLOOR = 0.02
QUANTUM = 32          # shares are rounded to 1/32: symmetric communicators keep equal keys


@dataclass(frozen=True)
class JointResult:
    """The best candidate (``best``: its name, ``seconds``: its iteration time), the
    independent synthesis' time, and every candidate's time by name."""

    seconds: float
    independent_s: float
    best: str
    candidates: dict[str, float]


def degraded_links(healthy: Topology, degraded: Topology) -> np.ndarray:
    """Mask over ``degraded``'s links: below their healthy capacity, or new (Fail3's backup)."""
    out = np.zeros(degraded.num_links, dtype=bool)
    for i, link in enumerate(degraded.links):
        out[i] = (not healthy.has_link(link.src, link.dst)
                  or link.capacity_gbps < healthy.link(link.src, link.dst).capacity_gbps - 1e-9)
    return out


def contending_groups(workload: Workload, state: FabricState, mask: np.ndarray) -> tuple[str, ...]:
    """Groups with a communicator crossing a masked link that run in the same phase as
    another such group (only they compete for the link)."""
    crossing = {g for g, comms in state.comms.items() if any(mask[c.sub.links].any() for c in comms)}
    out: set[str] = set()
    for phase in workload.phases:
        here = {op.group for op in phase.ops if op.kind != "compute"} & crossing
        if len(here) > 1:
            out |= here
    return tuple(sorted(out))


def _proportional(traffic: list[dict[tuple[str, int], np.ndarray]], state: FabricState) -> Capacities:
    cap = state.topo.arrays.capacity
    links = {(c.group, c.index): c.sub.links for comms in state.comms.values() for c in comms}
    share: dict[tuple[str, int], np.ndarray] = {}
    for phase in traffic:
        total = sum(phase.values(), np.zeros_like(cap))
        for key, bits in phase.items():
            mine = np.ones_like(cap)
            own = links[key]
            shared = total[own] - bits[own] > 1e-9 * total[own]
            part = np.round(bits[own] / np.where(shared, total[own], 1.0) * QUANTUM) / QUANTUM
            mine[own] = np.where(shared, np.maximum(part, FLOOR), 1.0)
            share[key] = np.maximum(share.get(key, mine), mine)
    return {key: cap * s for key, s in share.items() if (s < 1.0).any()}


def _group_splits(groups: tuple[str, ...]) -> list[dict[str, float]]:
    seen, out = set(), []
    for g in groups:
        for f in FRACTIONS:
            rest = (1.0 - f) / (len(groups) - 1)
            shares = {h: (f if h == g else rest) for h in groups}
            key = tuple(round(shares[h], 9) for h in groups)
            if key not in seen:
                seen.add(key)
                out.append(shares)
    return out


def joint_resynthesis(workload: Workload, state: FabricState, healthy: Topology,
                      cache: LoadCache) -> JointResult:
    """The candidates of the module docstring on ``state`` (``healthy``: the fabric
    before the failure, to find the degraded links; ``state.topo`` itself when healthy)."""
    cap = state.topo.arrays.capacity
    times = {"independent": iteration_time(workload, state, cache, "mccl").seconds}
    if state.relay != "members":
        members = fabric_state(state.topo, workload, "members")
        times["no relays"] = iteration_time(workload, members, cache, "mccl").seconds
    capacity: Capacities = {}
    for r in range(1, ROUNDS + 1):
        capacity = _proportional(link_traffic(workload, state, cache, "mccl", capacity), state)
        if not capacity:
            break
        times[f"proportional-{r}"] = iteration_time(workload, state, cache, "mccl", capacity).seconds
    mask = degraded_links(healthy, state.topo) if state.topo is not healthy else np.zeros(cap.size, bool)
    groups = contending_groups(workload, state, mask)
    if len(groups) > 1:
        for shares in _group_splits(groups):
            split = {(c.group, c.index): np.where(mask, cap * shares[c.group], cap)
                     for g in groups for c in state.comms[g]}
            name = "split " + ",".join(f"{g}={shares[g]:.2f}" for g in groups)
            times[name] = iteration_time(workload, state, cache, "mccl", split).seconds
    best = min(times, key=lambda k: (times[k], k != "independent"))
    return JointResult(float(times[best]), float(times["independent"]), best,
                       {k: float(v) for k, v in times.items()})
