"""The AllToAll instance as arrays: ordered GPU pairs, link capacities, pricing graph.

Pairs are numbered source-major: pair ``p`` of ``(s, d)`` (ranks, ``s != d``) is
``s·(N-1) + d - [d > s]``.  Built once per topology object and cached while it lives.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np

from ..topology import Topology
from .pricing import PricingGraph

__all__ = ["Problem", "problem_for"]


class _PairRanks:
    """The source and destination rank of every pair (source-major), built on first
    use: 64 MB at 2,048 GPUs that a routed schedule (:mod:`.direct`) never reads."""

    def __init__(self, num_gpus: int) -> None:
        self.num_gpus = num_gpus
        self._ranks: tuple[np.ndarray, np.ndarray] | None = None

    def ranks(self) -> tuple[np.ndarray, np.ndarray]:
        if self._ranks is None:
            n = self.num_gpus
            src = np.repeat(np.arange(n, dtype=np.int64), n - 1)    # no mask
            dst = np.tile(np.arange(n - 1, dtype=np.int64), n)
            dst += dst >= src                                       # skip the diagonal
            self._ranks = (src, dst)
        return self._ranks


@dataclass(frozen=True)
class Problem:
    """Array view of an AllToAll instance on ``topo``."""

    topo: Topology
    graph: PricingGraph
    capacity: np.ndarray
    pairs: _PairRanks
    is_step_arc: np.ndarray     # arc advances one step (its head is a GPU)

    @property
    def pair_src(self) -> np.ndarray:
        """Rank of pair p's source."""
        return self.pairs.ranks()[0]

    @property
    def pair_dst(self) -> np.ndarray:
        """Rank of pair p's destination."""
        return self.pairs.ranks()[1]

    @property
    def num_gpus(self) -> int:
        return self.graph.num_gpus

    @property
    def num_pairs(self) -> int:
        return self.num_gpus * (self.num_gpus - 1)

    @property
    def num_links(self) -> int:
        return int(self.capacity.size)

    def pair_index(self, s: np.ndarray, d: np.ndarray) -> np.ndarray:
        """Pair index of ranks ``(s, d)`` (arrays, ``s != d``)."""
        s = np.asarray(s, dtype=np.int64)
        d = np.asarray(d, dtype=np.int64)
        return s * (self.num_gpus - 1) + d - (d > s)

    def pair_matrix(self, values: np.ndarray, diagonal: float) -> np.ndarray:
        """An ``N x N`` matrix with ``values[p]`` at ``(src, dst)`` and ``diagonal`` on it."""
        n = self.num_gpus
        out = np.empty((n, n), dtype=float)
        _off_diagonal(out)[:] = np.reshape(values, (n - 1, n))
        np.fill_diagonal(out, diagonal)
        return out

    def pair_values(self, matrix: np.ndarray) -> np.ndarray:
        """``matrix[src, dst]`` of every pair, in pair order (an ``N x N`` matrix)."""
        return _off_diagonal(np.ascontiguousarray(matrix)).reshape(-1)


def _off_diagonal(matrix: np.ndarray) -> np.ndarray:
    """A view of the off-diagonal entries of a C-contiguous ``N x N`` matrix as ``N-1``
    rows of ``N``, in row-major order -- the source-major pair order -- without an index
    array: entry ``(s, d)`` is at ``s·N + d``, and the diagonal entries ``k·(N+1)`` are
    exactly the last column of the flat array past its first entry, cut in rows of N+1."""
    n = matrix.shape[0]
    return matrix.reshape(-1)[1:].reshape(n - 1, n + 1)[:, :n] if n > 1 else matrix[:0, :0]


#: Per live topology (by identity), its problem's arrays.  Keyed by ``id`` with a
#: finalizer, as :mod:`mccl_opt.paths` does: a Topology hashes all of its links (18 ms
#: at 1024 GPUs), and a cached Problem holding its topology would keep it alive.
_CACHE: dict[int, tuple] = {}


def problem_for(topo: Topology) -> Problem:
    """The :class:`Problem` of ``topo`` (its arrays built once per topology object)."""
    cached = _CACHE.get(id(topo))
    if cached is None:
        ar = topo.arrays
        graph = PricingGraph.from_arrays(topo.num_nodes, ar.tail, ar.head, ar.is_switch,
                                         ar.gpu_nodes)
        cached = _CACHE[id(topo)] = (graph, np.asarray(ar.capacity, dtype=float),
                                     _PairRanks(graph.num_gpus),
                                     ~np.asarray(ar.is_switch)[ar.head])
        weakref.finalize(topo, _CACHE.pop, id(topo), None)
    return Problem(topo, *cached)
