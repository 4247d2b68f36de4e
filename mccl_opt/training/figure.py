"""The Figure 14 sweep: iteration time healthy / degraded with static (NCCL) schedules /
degraded with MCCL's re-synthesized schedules (/ jointly re-synthesized), per model, GPU
count and fabric state (paper §6.3, docs/training.md "The figure").

The core does not build fabrics or failures (``instances`` sits above it): the caller
passes ``fabric(gpus) -> Topology`` and ``failures`` (name -> function of the healthy
fabric).  One :class:`.comms.LoadCache` serves the whole sweep, so a sub-fabric seen at
several sizes or states is synthesized once; its synthesis time is reported apart.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Sequence

from ..topology import Topology
from .comms import LoadCache
from .iteration import FabricState, fabric_state, iteration_time
from .joint import joint_resynthesis
from .workload import Workload

__all__ = ["train_rows", "timed_sweep", "ROW_FIELDS", "HEALTHY"]

HEALTHY = "healthy"
ROW_FIELDS = ("model", "gpus", "state", "topology", "iteration_s_healthy", "iteration_s_healthy_mccl",
              "iteration_s_static", "iteration_s_mccl", "speedup", "iteration_s_joint", "joint_gain",
              "joint_best", "compute_s", "collective_share_healthy", "collective_share_static")


def train_rows(model: str, workload_for: Callable[[int], Workload], gpus: Sequence[int],
               fabric: Callable[[int], Topology], failures: Mapping[str, Callable[[Topology], Topology]],
               *, joint: bool = False, relay: str = "members", cache: LoadCache | None = None,
               progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """One row per GPU count and state (``healthy`` and each of ``failures``) with the
    fields of :data:`ROW_FIELDS`; ``speedup = iteration_s_static / iteration_s_mccl``;
    ``iteration_s_joint`` (:func:`.joint.joint_resynthesis`) on every row when ``joint``."""
    cache = cache or LoadCache()
    say = progress or (lambda msg: None)
    rows = []
    for n in gpus:
        workload = workload_for(n)
        healthy_topo = fabric(n)
        say(f"{model} on {n} GPUs: healthy")
        healthy = fabric_state(healthy_topo, workload, relay)
        base = iteration_time(workload, healthy, cache, "nccl")
        mine = iteration_time(workload, healthy, cache, "mccl")
        common = {"model": model, "gpus": n, "iteration_s_healthy": base.seconds,
                  "iteration_s_healthy_mccl": mine.seconds, "compute_s": base.compute_s,
                  "collective_share_healthy": base.collective_share}
        row = {**common, "state": HEALTHY, "topology": healthy_topo.name,
               "iteration_s_static": base.seconds, "iteration_s_mccl": mine.seconds,
               "speedup": base.seconds / mine.seconds, "collective_share_static": base.collective_share}
        rows.append(_joint(row, joint, workload, healthy, healthy_topo, cache, say))
        for name, fail in failures.items():
            say(f"{model} on {n} GPUs: {name}")
            state = fabric_state(fail(healthy_topo), workload, relay)
            static = iteration_time(workload, state, cache, "nccl")
            mccl = iteration_time(workload, state, cache, "mccl")
            row = {**common, "state": name, "topology": state.topo.name,
                   "iteration_s_static": static.seconds, "iteration_s_mccl": mccl.seconds,
                   "speedup": static.seconds / mccl.seconds, "collective_share_static": static.collective_share}
            rows.append(_joint(row, joint, workload, state, healthy_topo, cache, say))
    return rows


def _joint(row: dict[str, Any], joint: bool, workload: Workload, state: FabricState, healthy: Topology,
           cache: LoadCache, say: Callable[[str], None]) -> dict[str, Any]:
    """``row`` with the joint re-synthesis fields (``None`` unless ``joint``)."""
    row.update(iteration_s_joint=None, joint_gain=None, joint_best=None)
    if joint:
        say(f"{row['model']} on {row['gpus']} GPUs: {row['state']}, joint re-synthesis")
        res = joint_resynthesis(workload, state, healthy, cache)
        row.update(iteration_s_joint=res.seconds, joint_gain=1.0 - res.seconds / res.independent_s,
                   joint_best=res.best)
    return row


def timed_sweep(models: Mapping[str, Callable[[int], Workload]], gpus: Sequence[int],
                fabric: Callable[[int], Topology], failures: Mapping[str, Callable[[Topology], Topology]],
                *, joint: bool = False, relay: str = "members", backend: str = "highs",
                reduce_scatter: str = "ring",
                progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """:func:`train_rows` for every model with one cache: ``{rows, synthesis}`` where
    ``synthesis`` reports the MCCL synthesis time apart (seconds, syntheses, reuses) and
    the whole wall time."""
    cache = LoadCache(backend=backend, reduce_scatter=reduce_scatter)
    start = time.perf_counter()
    rows = [r for model, make in models.items()
            for r in train_rows(model, make, gpus, fabric, failures, joint=joint, relay=relay, cache=cache,
                                progress=progress)]
    return {"rows": rows, "synthesis": {"synthesis_s": cache.synth_s, "syntheses": cache.syntheses,
                                        "reused": cache.reused, "baseline_s": cache.baseline_s,
                                        "wall_s": time.perf_counter() - start}}
