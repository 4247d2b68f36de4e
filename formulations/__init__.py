"""Solver-neutral models (the bottom layer; numpy and scipy only): the sparse
:class:`LinearProgram` container, the builders of the compact arc-flow model (paper
App. G), the AllToAll restricted master (§4.2) and the switch-removal models (App. C),
and MPS/LP file export.  See docs/modelling.md and docs/benchmarks.md ("Model export")."""

from __future__ import annotations

from .compact import build_chunked_milp, build_compact_lp
from .export import read_mps, write_lp, write_mps
from .lp import FormulationError, LinearProgram
from .master import build_master_lp, path_columns

__all__ = ["LinearProgram", "FormulationError", "build_compact_lp", "build_chunked_milp",
           "build_master_lp", "path_columns", "write_mps", "write_lp", "read_mps"]
