"""A canonical listing of a topology, so that AllGather synthesis does not depend on the
order a file lists its switches and links in.

The ForestColl phases break ties by node and link index (switch order of Phase 2, arcs
scanned by the packers), so the same fabric listed in another order could give other
trees and, where a phase is a heuristic (balancing an unbalanced switch), another rate.
:func:`canonical` lists the GPUs first in their given order (their ranks, DESIGN.md §3,
are part of the fabric), then the switches by id, and the links by (tail, head) in that
node order; a topology already in this order is returned as is.  Schedules name nodes by
id and keep the GPU order, so a schedule synthesized on the canonical listing is a
schedule of the original topology.
"""

from __future__ import annotations

import numpy as np

from ..topology import Topology

__all__ = ["canonical"]


def canonical(topo: Topology) -> Topology:
    """``topo`` listed canonically (module docstring); the same object if it already is."""
    arr = topo.arrays
    n_gpus = topo.num_gpus
    switch_ids = [nd.id for nd in topo.nodes[n_gpus:]]
    if not arr.is_switch[:n_gpus].any() and switch_ids == sorted(switch_ids):
        key = arr.tail * topo.num_nodes + arr.head
        if key.size < 2 or bool((key[1:] > key[:-1]).all()):
            return topo
    gpus = [nd for nd in topo.nodes if nd.is_gpu]
    switches = sorted((nd for nd in topo.nodes if not nd.is_gpu), key=lambda nd: nd.id)
    index = {nd.id: i for i, nd in enumerate(gpus + switches)}
    links = sorted(topo.links, key=lambda ln: (index[ln.src], index[ln.dst]))
    return Topology(topo.name, gpus + switches, links, topo.extra)
