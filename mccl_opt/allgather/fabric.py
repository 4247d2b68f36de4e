"""Integer view of a :class:`~mccl_opt.Topology` for the AllGather phases.

Capacities are resolved to a quantum ``q`` Gbps (1 Mbps, or finer when some link is
below 1 Gbps) so every max-flow runs on exact integers; ``lp_rate_gbps`` is the exact
optimum of the quantized fabric (identical to the true optimum when capacities are
multiples of ``q``, as every shipped instance's are).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import TopologyError
from ..topology import Topology
from .throughput import Fabric

__all__ = ["quantum_for", "fabric_of"]

#: largest quantized capacity allowed, so that products stay inside int64
MAX_UNITS = 1 << 40


def quantum_for(capacity: np.ndarray) -> float:
    """The capacity quantum in Gbps: 1e-3, or a power of ten 1000x below the smallest link."""
    smallest = float(np.min(capacity))
    q = 1e-3 if smallest >= 1.0 else 10.0 ** (math.floor(math.log10(smallest)) - 3)
    if float(np.max(capacity)) / q > MAX_UNITS:
        raise TopologyError(
            f"link capacities span {smallest:g}..{float(np.max(capacity)):g} Gbps, too wide a "
            f"range for exact integer max-flow; raise the smallest capacity or drop that link")
    return q


def fabric_of(topo: Topology, capacity: np.ndarray | None = None) -> tuple[Fabric, float]:
    """The integer :class:`Fabric` of ``topo`` (optionally with other capacities) and its quantum."""
    arr = topo.arrays
    cap = np.asarray(arr.capacity if capacity is None else capacity, float)
    q = quantum_for(cap)
    cap_q = np.rint(cap / q).astype(np.int64)
    return Fabric.build(topo.num_nodes, arr.tail, arr.head, cap_q, arr.gpu_nodes), q
