"""Series reduction of pass-through switches before a communicator's synthesis
(docs/training.md "Relays at 2048 GPUs").

With host relays (``relay="host"``) a data-parallel rail group of ``m`` members on an HPN
fabric of ``8 m`` GPUs has ``7 m`` forwarding-only GPUs, each joined to exactly two nodes:
its host's NVSwitch and its rail's ToR.  Such a *pass-through* switch ``r`` with
neighbours ``A`` and ``B`` only can carry nothing but ``A -> r -> B`` and ``B -> r -> A``
(a path ``A -> r -> A`` is not simple), so it is the link ``A -> B`` of capacity
``min(c(A, r), c(r, B))`` (and ``B -> A`` likewise) for every flow, every tree and every
path: the optimum of either collective is the same on the reduced fabric, and a schedule
of it runs on the original one with each reduced hop replaced by its two links.  The
reduction is repeated (a chain of pass-through switches becomes one link) and skips a
switch whose reduced link would run parallel to an existing one (the constructor merges
parallel links, which would change the link order this module maps loads through).

What it saves: ForestColl's switch removal (paper §4.3, Phase 2) splits every switch; the
1024-GPU relay group (128 members, 896 relays) has 1096 switches before and 200 after.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..topology import Link, Topology

__all__ = ["SeriesReduced", "series_reduced"]


@dataclass(frozen=True)
class SeriesReduced:
    """A fabric with its pass-through switches contracted: ``topology`` and, for each of
    its links, the original links it stands for (``parts[j]``, one or several)."""

    topology: Topology
    parts: tuple[tuple[int, ...], ...]
    original_links: int

    def expand(self, loads: np.ndarray) -> np.ndarray:
        """Per-link values of the reduced fabric (share loads) onto the original links:
        a contracted link's load is carried by each of the links it stands for."""
        out = np.zeros(self.original_links, dtype=float)
        for j, links in enumerate(self.parts):
            out[list(links)] += loads[j]
        return out


def series_reduced(topo: Topology) -> SeriesReduced:
    """``topo`` with every pass-through switch (exactly two distinct neighbours, no
    parallel link created) contracted, repeatedly (module docstring)."""
    links: dict[tuple[str, str], tuple[float, float, tuple[int, ...]]] = {
        (l.src, l.dst): (l.capacity_gbps, l.latency_us, (i,)) for i, l in enumerate(topo.links)}
    switches = set(topo.switches)
    removed: set[str] = set()
    changed = True
    while changed:
        changed = False
        neighbours: dict[str, set[str]] = {s: set() for s in switches - removed}
        for a, b in links:
            if a in neighbours:
                neighbours[a].add(b)
            if b in neighbours:
                neighbours[b].add(a)
        for r in sorted(neighbours):
            near = neighbours[r]
            if len(near) != 2 or any(v in removed for v in near):
                continue
            a, b = sorted(near)
            if (a, b) in links or (b, a) in links:
                continue
            for u, v in ((a, b), (b, a)):
                into, out = links.get((u, r)), links.get((r, v))
                if into is not None and out is not None:
                    links[(u, v)] = (min(into[0], out[0]), into[1] + out[1], into[2] + out[2])
            for key in [(a, r), (r, a), (b, r), (r, b)]:
                links.pop(key, None)
            removed.add(r)
            changed = True
    if not removed:
        return SeriesReduced(topo, tuple((i,) for i in range(topo.num_links)), topo.num_links)
    nodes = [n for n in topo.nodes if n.id not in removed]
    kept = list(links.items())
    reduced = Topology(topo.name, nodes, [topo.links[parts[0]] if len(parts) == 1 else Link(a, b, cap, lat)
                                          for (a, b), (cap, lat, parts) in kept], topo.extra)
    return SeriesReduced(reduced, tuple(parts for _, (_, _, parts) in kept), topo.num_links)
