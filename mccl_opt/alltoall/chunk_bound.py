"""A certified upper bound on the rate of any schedule of ``K`` whole chunks per pair:
the node-set cuts of :mod:`.cut_bound`, counted in chunks (paper §4.2, rounding).

Every pair ``(s, d)`` with ``s`` in a node set ``X`` (``k`` of the ``N`` GPUs) and ``d``
outside sends ``K`` chunks, each on one path that leaves ``X`` at least once, so the
links ``a`` leaving ``X`` carry ``n_a`` chunks with ``sum_a n_a >= K k (N - k)``.  A
schedule's rate is ``z = min_a cap_a K / n_a`` (docs/alltoall.md, *Rounding*), so
``n_a <= floor(cap_a K / z)``: ``z`` is at most the largest ``z_X`` with
``sum_a floor(cap_a K / z_X) >= K k (N - k)`` (and the same for the links entering
``X``).  Unlike the fractional bound, this one sees that whole chunks cannot fill a link
whose LP load is fractional: HPN 1x8x8 with GPU0's NIC at 1 % has the LP rate 6.2589
(the host cut, ``2804 / 448``), but ``floor(4000 / z)`` chunks on each of the other
seven NICs and ``floor(40 / z)`` on GPU0's reach the 4,480 the host sends only at
``z <= 4000 / 640 = 6.25``, the rate its rounding already has.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix

from ..topology import Topology
from .cut_bound import set_cuts

__all__ = ["chunk_bound_gbps"]


def chunk_bound_gbps(topo: Topology, k: int) -> float:
    """The smallest whole-chunk cut bound (module doc) on the rate of ``topo``'s
    AllToAll schedules of ``k`` chunks per pair, in Gbps per pair (``inf`` with fewer
    than two GPUs)."""
    arr = topo.arrays
    g = int(arr.gpu_nodes.size)
    if g < 2:
        return float("inf")
    cap = np.asarray(arr.capacity, float)
    best = float("inf")
    for pairs, leaving, entering in [*set_cuts(topo), _gpu_cuts(topo)]:
        for cut in (leaving, entering):
            # z_X is at least sum(units) / (demand + links): there every link's count
            # falls short of units / z by less than one chunk (_whole_chunk_rate)
            lower = k * (cut @ cap) / (k * pairs + np.diff(cut.indptr))
            for x in np.argsort(lower, kind="stable"):
                if lower[x] >= best:
                    break
                links = cut.indices[cut.indptr[x]:cut.indptr[x + 1]]
                best = min(best, _whole_chunk_rate(cap[links] * k, k * int(pairs[x])))
    return best


def _gpu_cuts(topo: Topology) -> tuple[np.ndarray, csr_matrix, csr_matrix]:
    """Every GPU alone as a :func:`.cut_bound.set_cuts` family: ``N - 1`` pairs, its
    outgoing and its incoming links."""
    arr = topo.arrays
    g, m = int(arr.gpu_nodes.size), int(arr.tail.size)
    rank = np.asarray(arr.rank_of)

    def links_at(end: np.ndarray) -> csr_matrix:
        at_gpu = np.flatnonzero(rank[end] >= 0)
        return csr_matrix((np.ones(at_gpu.size), (rank[end[at_gpu]], at_gpu)), shape=(g, m))

    return (np.full(g, g - 1), links_at(np.asarray(arr.tail, np.int64)),
            links_at(np.asarray(arr.head, np.int64)))


def _whole_chunk_rate(units: np.ndarray, demand: int) -> float:
    """The largest ``z`` with ``sum floor(units / z) >= demand`` (``units``: each link's
    ``cap_a K``).  From the fractional ``z = sum units / demand`` down, each step moves
    to the next ``z`` at which some link fits one more chunk; the shortfall at the start
    is below the number of links, so that many steps end it.  A count within 1e-9 of
    the next integer is taken as reached: the bound can only come out higher (valid)."""
    if demand <= 0:
        return float("inf")
    z = float(units.sum()) / demand
    for _ in range(units.size + 1):
        if not z > 0:
            return 0.0
        n = np.floor(units / z + 1e-9)
        if n.sum() >= demand:
            return z
        z = float((units / (n + 1)).max())
    return z
