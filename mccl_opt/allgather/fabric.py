"""Integer view of a :class:`~mccl_opt.Topology` for the AllGather phases.

Capacities are resolved to a quantum ``q`` Gbps, a power of ten a million times below
the smallest link (10 kbps when the smallest is 50 Gbps), so every max-flow runs on
exact integers; ``lp_rate_gbps`` is the exact optimum of the quantized fabric
(identical to the true optimum when capacities are multiples of ``q``, as every shipped
instance's are, and within 5e-7 of it otherwise: measured capacities are arbitrary
floats, and a coarser quantum let a schedule's true rate exceed its ``lp_rate_gbps``
by more than the validator's tolerance, e.g. 1.5625 vs 1.562 Gbps at 1 Mbps).  A
schedule whose rate exceeds the quantized optimum proves the true optimum at least that
high, so the reported ``lp_rate_gbps`` is the larger of the two (never below ``rate``).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import TopologyError
from ..topology import Topology
from .forestcoll.throughput import Fabric

__all__ = ["quantum_for", "fabric_of", "switches_balanced"]

#: relative tolerance of the balance test (capacities summed in another order)
_BALANCE_TOL = 1e-12

#: largest quantized capacity allowed, so that products stay inside int64
MAX_UNITS = 1 << 40


def quantum_for(capacity: np.ndarray) -> float:
    """The capacity quantum in Gbps: a power of ten 10^6 times below the smallest link."""
    smallest = float(np.min(capacity))
    q = 10.0 ** (math.floor(math.log10(smallest)) - 6)
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


def switches_balanced(topo: Topology) -> bool:
    """Whether every switch's in-capacity equals its out-capacity."""
    arr = topo.arrays
    out = np.bincount(arr.tail, weights=arr.capacity, minlength=topo.num_nodes)
    into = np.bincount(arr.head, weights=arr.capacity, minlength=topo.num_nodes)
    sw = arr.is_switch
    return bool(np.all(np.abs(out[sw] - into[sw]) <= _BALANCE_TOL * np.maximum(out[sw], into[sw])))
