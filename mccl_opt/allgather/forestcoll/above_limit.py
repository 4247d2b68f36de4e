"""Phases 2+3 above the tree limit (paper §4.3; docs/allgather_history.md "Above the tree limit").

At ``max_chunks=None`` ForestColl's exact ``k0`` trees per root can run into the millions
when capacities are odd floats (HPN 2x4x8 after a two-way degradation: 216 053).  The
plain repair packer grows ``k·n`` unit trees and the exact packer runs a max-flow per tree
edge, so above :data:`~..budget.EXACT_TREES_LIMIT` only the scaled packing
(:mod:`.packing.scaled`: copies of ~32-tree packings plus residual ones) is worth trying.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from mccl_opt import anytime, progress
from mccl_opt.errors import SolveError
from .packing.scaled import scaled_only
from .pack_steps import Packed, Packing, SplitKind, spread_logical
from .removal.guarded_spread import guarded_spread
from .removal.splitting import SplitGraph, sink_ranks

__all__ = ["pack_scaled"]


def pack_scaled(split: SplitGraph, rank_of: np.ndarray, k: int, stats: dict[str, Any]) -> Packed:
    """Phases 2+3 for more than :data:`~..budget.EXACT_TREES_LIMIT` trees per root (an
    exact ``k0`` of odd float capacities at ``max_chunks=None``): the spread split (guarded
    when it breaks the rooted cut condition) and the scaled packing only
    (:func:`.packing.scaled.scaled_only`).  Every other packer of :func:`pack` grows
    ``k·n`` unit trees or runs a max-flow per tree edge (:func:`.pack_steps.pack`); raises
    :class:`SolveError` when the scaled packing does not complete (the method chain's
    next method solves the fabric)."""
    progress.update("AllGather phase 2: switch removal")
    t = time.perf_counter()
    lg, kind = spread_logical(split, rank_of), SplitKind.SPREAD
    if not lg.admits(k, order=sink_ranks(split, rank_of)):
        anytime.check("Phase 2: before the guarded spread split")
        guarded = guarded_spread(split, rank_of, lg)
        if guarded is None:
            raise SolveError(f"no split of the fabric admits {k} trees per root")
        lg, kind = guarded, SplitKind.GUARDED
    stats["phase2_s"] = time.perf_counter() - t
    progress.update("AllGather phase 3: tree packing (scaled)")
    anytime.check_room("Phase 3: before the scaled packing", stats["phase2_s"])
    t = time.perf_counter()
    classes = scaled_only(lg.num_gpus, lg.tail, lg.head, lg.units, k, stats)
    stats["phase3_s"] = time.perf_counter() - t
    if classes is None:
        raise SolveError(f"the scaled packing of {k} trees per root did not complete")
    packed = Packed(lg, classes, k, kind, Packing.REPAIR)
    packed.record(stats)
    return packed
