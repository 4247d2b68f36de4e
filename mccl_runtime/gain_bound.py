"""A cheap upper bound on any schedule's rate, to skip a synthesis that cannot gain
(docs/runtime.md, "No synthesis when no schedule can gain").

In share units (a collective's rate is ``min_a M_a / L_a``, :func:`mccl_opt.schedule.schedule_rate`),
every schedule of ``n`` members loads each member's incoming links with at least ``n - 1``
(it receives every other member's shard, or its piece from each other member), and its
outgoing links with at least 1 (AllGather: its shard leaves once) or ``n - 1`` (AllToAll:
a piece for each other member).  A single-vertex cut (paper §4, the cut bound) then bounds
the rate of every schedule by ``min_v min(in_v / (n - 1), out_v / w)`` with ``in_v`` /
``out_v`` the member's link capacities into / out of it on its (sub-)fabric (switches
that reach only one node, a member's own NVSwitch in a rail's group, taken out first).  When the
current schedule's rate under ``M`` is already within ``min_gain`` of that bound, the
re-check before publishing could only end the job ``no_gain``, so it is decided at once.
"""

from __future__ import annotations

import math

import numpy as np

from mccl_opt.topology import Topology

__all__ = ["VertexBound"]


class VertexBound:
    """The single-vertex cut bound of one (sub-)fabric: ``links`` are the fabric links of
    the communicator (every link: ``slice(None)``), ``gpus`` its members."""

    def __init__(self, topo: Topology, links: np.ndarray | slice, gpus: tuple[str, ...]) -> None:
        idx = _useful(topo, np.arange(topo.num_links)[links], set(gpus))
        member = {g: i for i, g in enumerate(gpus)}
        src = np.array([member.get(topo.links[a].src, -1) for a in idx.tolist()], dtype=np.int64)
        dst = np.array([member.get(topo.links[a].dst, -1) for a in idx.tolist()], dtype=np.int64)
        self.n = len(gpus)
        self.out_link, self.out_of = idx[src >= 0], src[src >= 0]
        self.in_link, self.in_of = idx[dst >= 0], dst[dst >= 0]

    def rate(self, m: np.ndarray, kind: str) -> float:
        """The bound on ``kind``'s rate under capacities ``m`` (``inf`` for one member)."""
        if self.n < 2:
            return math.inf
        into = np.bincount(self.in_of, weights=m[self.in_link], minlength=self.n)
        out = np.bincount(self.out_of, weights=m[self.out_link], minlength=self.n)
        sent = 1.0 if kind == "allgather" else float(self.n - 1)
        return float(min(into.min() / (self.n - 1), out.min() / sent))


def _useful(topo: Topology, idx: np.ndarray, members: set[str]) -> np.ndarray:
    """The links of ``idx`` left once switches with at most one neighbour are removed (again
    and again): a switch that reaches one node only (a member's NVSwitch in a rail's
    sub-fabric) carries nothing between members, so the cut around a member and such
    switches crosses only the remaining links."""
    ends = [(topo.links[a].src, topo.links[a].dst) for a in idx.tolist()]
    near: dict[str, set[str]] = {}
    for u, v in ends:
        near.setdefault(u, set()).add(v)
        near.setdefault(v, set()).add(u)
    gone: set[str] = set()
    todo = [x for x, nb in near.items() if x not in members and len(nb) <= 1]
    while todo:
        x = todo.pop()
        if x in gone:
            continue
        gone.add(x)
        for y in near[x]:
            near[y].discard(x)
            if y not in members and y not in gone and len(near[y]) <= 1:
                todo.append(y)
    return idx[np.array([u not in gone and v not in gone for u, v in ends], dtype=bool)] if ends else idx
