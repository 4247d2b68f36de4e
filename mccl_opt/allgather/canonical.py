"""A canonical listing of a topology, so that AllGather synthesis does not depend on the
order a file lists its switches and links in.

The ForestColl phases break ties by node and link index (switch order of Phase 2, arcs
scanned by the packers), so the same fabric listed in another order could give other
trees and, where a phase is a heuristic (balancing an unbalanced switch), another rate.
:func:`canonical` lists the GPUs first in their given order (their ranks, docs/modelling.md,
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
    nodes, n_gpus, arr = topo.nodes, topo.num_gpus, topo.arrays
    ids = [nd.id for nd in nodes]
    switches = np.flatnonzero(arr.is_switch)
    by_id = switches[np.argsort([ids[i] for i in switches.tolist()], kind="stable")]
    if not arr.is_switch[:n_gpus].any() and (by_id == np.arange(n_gpus, len(nodes))).all():
        order = np.arange(len(nodes))
    else:
        order = np.concatenate([np.flatnonzero(~arr.is_switch), by_id])
    position = np.empty(len(nodes), np.int64)
    position[order] = np.arange(len(nodes))
    key = position[arr.tail] * len(nodes) + position[arr.head]
    if (order == np.arange(len(nodes))).all() and (key.size < 2 or bool((key[1:] > key[:-1]).all())):
        return topo
    return topo.relisted(order.tolist(), np.argsort(key, kind="stable").tolist())
