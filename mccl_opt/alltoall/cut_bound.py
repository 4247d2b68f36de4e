"""A cheap certified upper bound on the AllToAll rate: node-set cuts (paper §4.2, App. D).

Every pair ``(s, d)`` with ``s`` in a node set ``X`` and ``d`` outside sends its whole
shard over the links leaving ``X``: with ``k`` GPUs in ``X`` out of ``N``, any schedule
has ``rate * k (N - k) <= cap_out(X)``, and the same for the links entering ``X``.  The
bound is the smallest of these over a few sets built in arrays, no max-flow and no LP:

* every GPU alone (its NICs and NVLinks);
* every switch with the GPUs cabled to it (a host's NVSwitch domain: its NICs);
* the pieces the fabric falls into without the switches that reach no GPU directly
  (segments below an aggregation layer: the oversubscription cut).

Column generation certifies a tighter bound once it has priced a round; a solve
stopped by its time limit before that (or with a weaker bound) reports this one, so
a limited result always carries a bound and a gap (:func:`cut_bound_gbps`).
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

from ..topology import Topology

__all__ = ["cut_bound_gbps", "tightest_cut", "set_cuts"]


def cut_bound_gbps(topo: Topology) -> float:
    """The smallest node-set cut bound (module doc) on ``topo``'s AllToAll rate, in Gbps
    per pair; ``inf`` with fewer than two GPUs."""
    return tightest_cut(topo)[0]


def tightest_cut(topo: Topology) -> tuple[float, np.ndarray]:
    """:func:`cut_bound_gbps` and the links of the cut that gives it (bool per link;
    none with fewer than two GPUs).  Priced at ``1 / cap`` of that cut, every pair the
    cut separates costs at least that much, so the Farley bound of these prices is at
    least the cut bound (column generation's certificate when its duals stall:
    :func:`.colgen.column_generation`)."""
    arr = topo.arrays
    n, g = topo.num_nodes, int(arr.gpu_nodes.size)
    links = np.zeros(int(arr.tail.size), bool)
    if g < 2:
        return float("inf"), links
    tail, head = np.asarray(arr.tail, np.int64), np.asarray(arr.head, np.int64)
    cap = np.asarray(arr.capacity, float)
    best, rows = float("inf"), None
    for pairs, leaving, entering in set_cuts(topo):
        for cut in (leaving, entering):
            per_set = (cut @ cap) / pairs
            x = int(np.argmin(per_set))
            if per_set[x] < best:
                best, rows = float(per_set[x]), cut.indices[cut.indptr[x]:cut.indptr[x + 1]]
    gpus = np.asarray(arr.gpu_nodes)
    for end in (tail, head):
        per_gpu = np.bincount(end, weights=cap, minlength=n)[gpus] / (g - 1)
        x = int(np.argmin(per_gpu))
        if per_gpu[x] < best:
            best, rows = float(per_gpu[x]), np.flatnonzero(end == gpus[x])
    links[rows] = True
    return best, links


def set_cuts(topo: Topology) -> list[tuple[np.ndarray, csr_matrix, csr_matrix]]:
    """The switch domains' and the pieces' cuts (module doc), one triple per family:
    the ordered GPU pairs ``k (N - k)`` each set separates, and which links leave and
    which enter each set (``sets x links``, 0/1); sets that separate no pair are left
    out.  (Every GPU alone is the bound's third family, computed apart.)"""
    arr = topo.arrays
    n, g = topo.num_nodes, int(arr.gpu_nodes.size)
    tail, head = np.asarray(arr.tail, np.int64), np.asarray(arr.head, np.int64)
    out = []
    for member in (_switch_domains(arr.is_switch, tail, head, n),
                   _pieces(arr.is_switch, tail, head, n)):          # sets x nodes, 0/1
        if member.shape[0] == 0:
            continue
        k = np.asarray(member[:, np.asarray(arr.gpu_nodes)].sum(axis=1)).ravel()
        pairs = k * (g - k)
        ok = np.flatnonzero(pairs > 0)
        if ok.size == 0:
            continue
        at_tail, at_head = member[ok][:, tail], member[ok][:, head]
        inside = at_tail.multiply(at_head)
        leaving, entering = csr_matrix(at_tail - inside), csr_matrix(at_head - inside)
        leaving.eliminate_zeros()
        entering.eliminate_zeros()
        out.append((pairs[ok], leaving, entering))
    return out


def _switch_domains(is_switch: np.ndarray, tail: np.ndarray, head: np.ndarray,
                    n: int) -> csr_matrix:
    """One row per switch cabled to a GPU: that switch and its GPUs."""
    gpu_to_switch = ~is_switch[tail] & is_switch[head]
    switches = np.unique(head[gpu_to_switch])
    row_of = np.full(n, -1, np.int64)
    row_of[switches] = np.arange(switches.size)
    rows = np.concatenate((row_of[switches], row_of[head[gpu_to_switch]]))
    cols = np.concatenate((switches, tail[gpu_to_switch]))
    m = csr_matrix((np.ones(rows.size), (rows, cols)), shape=(switches.size, n))
    m.data[:] = 1.0                           # parallel arcs summed: back to 0/1
    return m


def _pieces(is_switch: np.ndarray, tail: np.ndarray, head: np.ndarray, n: int) -> csr_matrix:
    """One row per connected piece of the fabric without its switches that no GPU is
    cabled to (both directions of a link count)."""
    touches_gpu = np.zeros(n, bool)
    touches_gpu[head[~is_switch[tail]]] = True
    touches_gpu[tail[~is_switch[head]]] = True
    keep = ~is_switch | touches_gpu
    arcs = keep[tail] & keep[head]
    graph = csr_matrix((np.ones(int(arcs.sum())), (tail[arcs], head[arcs])), shape=(n, n))
    count, label = connected_components(graph, directed=True, connection="weak")
    if count < 2:
        return csr_matrix((0, n))
    nodes = np.flatnonzero(keep)
    return csr_matrix((np.ones(nodes.size), (label[nodes], nodes)), shape=(count, n))
