"""Initial columns: one path per pair that makes the restricted master meaningful.

Each pair without a column gets its shortest path under the prices ``1/cap_a`` (the
time a bit spends crossing the link), within the step bound, ties towards fewer steps
-- a capacity-aware variant of the paper's shortest-hop start.  Raises
:class:`TopologyError` when the step bound leaves a pair unconnected.
"""

from __future__ import annotations

import numpy as np

from ..errors import TopologyError
from .pricing import PricedColumns, price_paths
from .problem import Problem

__all__ = ["initial_columns", "min_steps_per_pair"]


def initial_columns(prob: Problem, max_steps: int, missing: np.ndarray) -> PricedColumns:
    """Paths for the pairs where ``missing[p]`` is true (pair order)."""
    want = prob.pair_matrix(missing.astype(float), 0.0) > 0
    threshold = np.full((prob.num_gpus, prob.num_gpus), np.inf)
    priced = price_paths(prob.graph, 1.0 / prob.capacity, threshold, max_steps, want)
    unreachable = missing & ~np.isfinite(prob.pair_values(priced.shortest))
    if unreachable.any():
        p = int(np.flatnonzero(unreachable)[0])
        gpus = prob.topo.gpus
        raise TopologyError(
            f"GPU {gpus[prob.pair_src[p]]!r} cannot reach GPU {gpus[prob.pair_dst[p]]!r} within "
            f"max_steps={max_steps} steps ({int(unreachable.sum())} pair(s) affected); raise "
            f"max_steps or use max_steps='min'")
    return priced


def min_steps_per_pair(prob: Problem) -> np.ndarray:
    """Fewest steps any path of each pair needs (zero prices: ties go to fewer steps)."""
    threshold = np.full((prob.num_gpus, prob.num_gpus), np.inf)
    priced = price_paths(prob.graph, np.zeros(prob.num_links), threshold, prob.topo.num_nodes - 1)
    seg = np.repeat(np.arange(priced.count), np.diff(priced.start))
    steps = np.bincount(seg, weights=prob.is_step_arc[priced.arcs].astype(float),
                        minlength=priced.count)
    out = np.zeros(prob.num_pairs, dtype=np.int64)
    out[prob.pair_index(priced.src, priced.dst)] = steps.astype(np.int64)
    return out
