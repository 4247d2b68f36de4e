"""Link classes, their nominal capacities and the degraded links of a fabric
(docs/modelling.md, "Degraded links"; the gray failures of paper §2.2 and §6.1).

Nothing here reads names or generator metadata, so a hand-written or measured fabric is
classified like a generated one:

* a node's **tier** is its hop distance to the nearest GPU (GPUs 0, switches attached to
  a GPU 1, their uplink switches 2, ...; links counted in either direction);
* a link joins two tiers; its **class** is the ports of the higher-tier end (the *hub*)
  facing the lower tier: ``gpu@S`` for the GPU links of switch ``S``, ``tier1@S`` for
  the links of ``S`` to tier-1 switches, and so on.  Both directions of a cable are in
  one class.  Links between two GPUs form one class ``gpu-gpu``; a link between two
  switches of the same tier is a class of its own (``cable:A|B``, its two directions);
* a class's **nominal** capacity is the capacity most of its links run at, within the
  tolerance :data:`DEGRADED_BELOW` (ties: the larger), so a class that mixes speeds by
  design (double NVLinks next to single ones) keeps its common speed as nominal;
* a link's **nominal** is the larger of its class's nominal and its reverse link's
  capacity (the two directions of a cable run at one speed when healthy, so a cable
  slower one way is caught even in a class of mixed speeds);
* a link is **degraded** when its capacity is below ``DEGRADED_BELOW`` x its nominal;
  it is degraded **in one direction** when the reverse link exists and is not degraded.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from .errors import MCCLError

if TYPE_CHECKING:
    from .topology import Topology

__all__ = ["DEGRADED_BELOW", "DegradedLink", "node_tiers", "link_classes", "nominal_capacities",
           "degraded_links"]

#: a link below this fraction of its class's nominal capacity is degraded (the same
#: 0.95 the executor uses to call a measured pair below nominal, docs/executor.md)
DEGRADED_BELOW = 0.95


@dataclass(frozen=True)
class DegradedLink:
    """A link below its class's nominal capacity; ``reverse_gbps`` is the capacity of the
    reverse link (``None`` when there is none), ``one_direction`` whether the reverse is
    not degraded."""

    src: str
    dst: str
    capacity_gbps: float
    nominal_gbps: float
    link_class: str
    reverse_gbps: float | None
    one_direction: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def node_tiers(topo: "Topology") -> np.ndarray:
    """Hop distance of every node to its nearest GPU, links taken in either direction
    (a node no GPU reaches gets ``num_nodes``)."""
    arr = topo.arrays
    n = topo.num_nodes
    neighbours: list[list[int]] = [[] for _ in range(n)]
    for u, v in zip(arr.tail.tolist(), arr.head.tolist()):
        neighbours[u].append(v)
        neighbours[v].append(u)
    tier = np.full(n, n, dtype=np.int64)
    tier[arr.gpu_nodes] = 0
    queue = deque(arr.gpu_nodes.tolist())
    while queue:
        u = queue.popleft()
        for v in neighbours[u]:
            if tier[v] > tier[u] + 1:
                tier[v] = tier[u] + 1
                queue.append(v)
    return tier


def link_classes(topo: "Topology") -> list[str]:
    """The class label of every link, in link order (module docstring)."""
    arr = topo.arrays
    tier = node_tiers(topo)
    ids = [n.id for n in topo.nodes]
    out = []
    for u, v in zip(arr.tail.tolist(), arr.head.tolist()):
        tu, tv = int(tier[u]), int(tier[v])
        if tu == tv:
            a, b = sorted((ids[u], ids[v]))
            out.append("gpu-gpu" if tu == 0 else f"cable:{a}|{b}")
        else:
            hub, low = (v, tu) if tv > tu else (u, tv)
            out.append(f"{'gpu' if low == 0 else f'tier{low}'}@{ids[hub]}")
    return out


def _nominal(capacities: np.ndarray, below: float) -> float:
    """The capacity with the most links within ``[c·below, c/below]`` (ties: the larger)."""
    caps = np.sort(capacities)
    values = np.unique(caps)
    support = (np.searchsorted(caps, values / below, side="right")
               - np.searchsorted(caps, values * below, side="left"))
    return float(values[np.flatnonzero(support == support.max())[-1]])


def _class_nominals(labels: list[str], cap: np.ndarray, below: float) -> dict[str, float]:
    members: dict[str, list[int]] = {}
    for a, label in enumerate(labels):
        members.setdefault(label, []).append(a)
    return {label: _nominal(cap[idx], below) for label, idx in members.items()}


def _check_below(below: float) -> None:
    if not 0 < below <= 1:
        raise MCCLError(f"the degradation threshold must be in (0, 1], got {below!r}")


def nominal_capacities(topo: "Topology", below: float = DEGRADED_BELOW,
                       labels: list[str] | None = None) -> dict[str, float]:
    """The nominal capacity (Gbps) of every link class of ``topo`` (``labels``:
    :func:`link_classes` of ``topo`` when the caller has them already)."""
    _check_below(below)
    return _class_nominals(link_classes(topo) if labels is None else labels,
                           topo.arrays.capacity, below)


def degraded_links(topo: "Topology", below: float = DEGRADED_BELOW,
                   labels: list[str] | None = None) -> list[DegradedLink]:
    """The links below ``below`` x their nominal capacity — the larger of their class's
    and their reverse link's — in link order (``labels``: :func:`link_classes` of
    ``topo`` when the caller has them already)."""
    _check_below(below)
    labels = link_classes(topo) if labels is None else labels
    cap = topo.arrays.capacity
    by_class = _class_nominals(labels, cap, below)
    reverse = [topo.link_index(l.dst, l.src) if topo.has_link(l.dst, l.src) else None
               for l in topo.links]
    nominal = [max(by_class[label], 0.0 if rev is None else float(cap[rev]))
               for label, rev in zip(labels, reverse)]
    low = {a for a in range(topo.num_links) if cap[a] < below * nominal[a]}
    out = []
    for a in sorted(low):
        link, rev = topo.links[a], reverse[a]
        out.append(DegradedLink(link.src, link.dst, float(cap[a]), nominal[a], labels[a],
                                None if rev is None else float(cap[rev]),
                                rev is not None and rev not in low))
    return out
