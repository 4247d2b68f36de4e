"""The solver-facing LP models of a topology, for export as MPS/LP (docs/modelling.md).

``build_model(topo, model)`` returns a :class:`formulations.lp.LinearProgram` and a
:class:`ModelInfo` (what the optimum means, so a third-party solver's objective can be
compared with the manifest):

* ``"compact"``: the AllToAll arc-flow LP of paper App. G.3, ``max z`` (Gbps per pair).
  ``commodities="source"`` (default, ``N·|A|`` flow columns) or ``"pair"`` (the App. G
  model as written, ``N(N-1)·|A|``); both have the same optimum ``z*``.
* ``"master"``: the path-column restricted master of paper §4.2 over the columns that
  column generation ends with (``solve_alltoall(max_chunks=None)``), in the ``t = 1/z``
  form of :mod:`formulations.master`; optimum ``1/z*`` (s/Gbit).
* ``"switch-removal"``: the step-aware switch-removal LP of paper App. C (even form of
  :mod:`formulations.switch_removal`) on the AllGather pipeline's balanced fabric for a
  chunk budget of 10 (``k`` trees per root, link units in tree bandwidths), with every
  rooted cut row its cutting-plane loop separated
  (:func:`mccl_opt.allgather.forestcoll.step_aware.switch_removal_lp`).  ``max`` of a
  dimensionless water-filling utility of the logical GPU-pair capacities: not a
  function of ``z*``; the optimum the loop converged to is ``ModelInfo.optimum``.
  Fabrics with no switch between GPUs (rings, meshes) have no such model
  (:class:`MCCLError`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from formulations.lp import LinearProgram

from .errors import MCCLError, SolveError
from .topology import Topology

__all__ = ["MODELS", "ModelInfo", "build_model", "master_columns"]

MODELS = ("compact", "master", "switch-removal")


@dataclass(frozen=True)
class ModelInfo:
    """What an exported model's objective is: ``objective = f(AllToAll rate z*)`` for
    ``"rate_gbps"`` (z) and ``"inverse_rate"`` (1/z); ``"utility"`` (switch-removal) is
    no function of ``z*`` and comes with the ``optimum`` found while building."""

    model: str
    sense: str
    objective: str          # "rate_gbps" (z), "inverse_rate" (1/z) or "utility"
    num_cols: int
    num_rows: int
    nnz: int
    optimum: float | None = None

    def optimum_from_rate(self, rate_gbps: float) -> float:
        """The model's optimal objective given the instance's optimal AllToAll rate."""
        if self.objective == "rate_gbps":
            return rate_gbps
        if self.objective == "inverse_rate":
            return 1.0 / rate_gbps
        raise MCCLError(f"the {self.model} optimum does not follow from the AllToAll rate; "
                        "use ModelInfo.optimum")


def master_columns(topo: Topology, backend: str = "highs") -> tuple[np.ndarray, ...]:
    """(pair, start, arcs) of the path columns column generation ends with on ``topo``.

    Pairs are ``s·(N-1) + d - (d > s)`` over GPU ranks, as in :mod:`formulations.master`.
    """
    from .alltoall import solve_alltoall

    lp = solve_alltoall(topo, backend=backend, max_chunks=None).warm_state.lp
    return (np.asarray(lp.pair, dtype=np.int64), np.asarray(lp.start, dtype=np.int64),
            np.asarray(lp.arcs, dtype=np.int64))


def _switch_removal(topo: Topology, backend: str) -> tuple[LinearProgram, float]:
    """The converged step-aware switch-removal LP and its optimum (App. C)."""
    from .allgather.forestcoll.step_aware import switch_removal_lp

    try:
        return switch_removal_lp(topo, backend=backend)
    except SolveError as exc:
        raise MCCLError(f"model 'switch-removal' cannot be exported for {topo.name}: {exc}") from None


def build_model(topo: Topology, model: str, *, commodities: str = "source",
                backend: str = "highs") -> tuple[LinearProgram, ModelInfo]:
    """The LP of ``model`` (one of :data:`MODELS`) on ``topo``, named after the topology;
    the compact LP's and the master's rows and columns are named after its nodes and
    links (:mod:`formulations.names`)."""
    from formulations.names import FabricLabels

    ar = topo.arrays
    optimum = None
    labels = FabricLabels.of([n.id for n in topo.nodes], ar.tail, ar.head, ar.gpu_nodes)
    if model == "compact":
        from formulations.compact import build_compact_lp

        lp = build_compact_lp(topo.num_nodes, ar.tail, ar.head, ar.capacity, ar.is_switch,
                              ar.gpu_nodes, commodities=commodities, labels=labels)
    elif model == "master":
        from formulations.master import build_master_lp

        pair, start, arcs = master_columns(topo, backend)
        lp = build_master_lp(topo.num_gpus * (topo.num_gpus - 1), ar.capacity, pair, start, arcs,
                             labels=labels)
    elif model == "switch-removal":
        lp, optimum = _switch_removal(topo, backend)
    else:
        raise MCCLError(f"unknown model {model!r}; choose one of {', '.join(MODELS)}")
    lp.name = f"{topo.name}-{model}"
    objective = ("utility" if model == "switch-removal"
                 else "rate_gbps" if lp.sense == "max" else "inverse_rate")
    return lp, ModelInfo(model, lp.sense, objective, lp.num_cols, lp.num_rows, int(lp.A.nnz),
                         optimum)
