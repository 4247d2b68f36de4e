"""Solver-neutral models (the bottom layer; numpy and scipy only): the sparse
:class:`LinearProgram` container, the builders of the compact arc-flow model (paper
App. G), the AllToAll restricted master (§4.2) and the switch-removal models (App. C),
and MPS/LP file export.  See docs/modelling.md and docs/benchmarks.md ("Model export").

The names below load their module on first access (PEP 562), so a synthesizer that
needs only the master LP does not import the compact model or the file export."""

from __future__ import annotations

import importlib
from typing import Any

_HOME = {"LinearProgram": "lp", "FormulationError": "errors", "MCCLError": "errors",
         "build_compact_lp": "compact", "build_chunked_milp": "compact",
         "build_master_lp": "master", "path_columns": "master",
         "write_mps": "export", "write_lp": "export", "read_mps": "export"}

__all__ = list(_HOME)


def __getattr__(name: str) -> Any:
    if name in _HOME:
        return getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
