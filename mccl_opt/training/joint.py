"""Joint re-synthesis of communicators that cross the same degraded link
(docs/training.md "Joint re-synthesis"; beyond the paper, which re-synthesizes each
communicator on its own).

When several communicators run at the same time and cross one degraded link (a GPU's
NIC carries its expert-parallel AllToAll and its data-parallel AllGather), each one
synthesized on its own believes it has the whole link and routes onto it as much as that
capacity allows; together they over-subscribe it.  Here the degraded links' capacity is
split between the *groups* whose communicators cross them and run in the same phase:
each group's MCCL schedules are synthesized as if the degraded links had only its share,
and the split whose iteration time (with the real capacities, in the contention model)
is smallest wins.  Candidates: every group in turn gets a fraction ``f`` of
:data:`FRACTIONS` and the others share ``1 - f`` equally.  Independent synthesis (every
group sees the whole link) is always among the candidates, so the joint result is never
worse than it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..topology import Topology
from .comms import LoadCache
from .iteration import FabricState, iteration_time
from .workload import Workload

__all__ = ["joint_resynthesis", "JointResult", "degraded_links", "contending_groups", "FRACTIONS"]

FRACTIONS = (0.02, 0.25, 0.5, 0.75)


@dataclass(frozen=True)
class JointResult:
    """The best split found: ``shares`` (group -> fraction of the degraded links),
    its iteration time, the independent one, and every candidate's time."""

    seconds: float
    independent_s: float
    shares: dict[str, float]
    groups: tuple[str, ...]
    candidates: tuple[tuple[dict[str, float], float], ...]


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


def _candidates(groups: tuple[str, ...]) -> list[dict[str, float]]:
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
                      cache: LoadCache) -> JointResult | None:
    """Split the degraded links between contending groups (module docstring); ``None``
    when fewer than two groups compete for a degraded link."""
    mask = degraded_links(healthy, state.topo)
    groups = contending_groups(workload, state, mask)
    independent = iteration_time(workload, state, cache, "mccl").seconds
    if len(groups) < 2:
        return None
    cap = state.topo.arrays.capacity
    best, best_shares, tried = independent, {g: 1.0 for g in groups}, []
    for shares in _candidates(groups):
        capacity = {g: np.where(mask, cap * s, cap) for g, s in shares.items()}
        seconds = iteration_time(workload, state, cache, "mccl", capacity).seconds
        tried.append((shares, float(seconds)))
        if seconds < best * (1 - 1e-9):
            best, best_shares = seconds, shares
    return JointResult(float(best), float(independent), best_shares, groups, tuple(tried))
