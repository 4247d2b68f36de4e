"""LP/MIP backend adapters, chosen by name.

``get_backend("highs")`` (default, always installed), ``"gurobi"`` (pip ``gurobipy``)
and ``"scip"`` (pip ``pyscipopt``).  Availability is checked with
``importlib.util.find_spec`` without importing the solver; the solver module itself is
imported only when an adapter is created.
"""

from __future__ import annotations

import importlib

from ..errors import SolverNotAvailableError
from .base import Backend, Basis, LPSolution, SolveStatus

__all__ = ["Backend", "Basis", "LPSolution", "SolveStatus", "get_backend", "available_backends",
           "BACKENDS", "backend_class", "installed_class"]

#: name -> "module:Class" of the adapter (imported lazily).
BACKENDS: dict[str, str] = {
    "highs": "mccl_opt.backends.highs:HighsBackend",
    "gurobi": "mccl_opt.backends.gurobi:GurobiBackend",
    "scip": "mccl_opt.backends.scip:ScipBackend",
}


def backend_class(name: str) -> type[Backend]:
    """The adapter class for ``name`` (imports the adapter module, not the solver)."""
    try:
        target = BACKENDS[name.lower()]
    except (KeyError, AttributeError):
        raise SolverNotAvailableError(
            f"unknown backend {name!r}; choose one of {sorted(BACKENDS)}") from None
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)


def available_backends() -> list[str]:
    """Names of the backends whose solver package is installed."""
    return [name for name in BACKENDS if backend_class(name).is_available()]


def installed_class(name: str) -> type[Backend]:
    """The adapter class for ``name`` when its solver is installed (checked with
    ``find_spec``, nothing imported); raises :class:`SolverNotAvailableError` naming the
    pip package otherwise, or the known names for an unknown one."""
    cls = backend_class(name)
    if not cls.is_available():
        raise SolverNotAvailableError(
            f"backend {name!r} needs the Python package {cls.pip_package!r}: "
            f"pip install {cls.pip_package}  (or: pip install 'mccl[{name}]')")
    return cls


def get_backend(name: str = "highs", **options) -> Backend:
    """A fresh adapter instance (:func:`installed_class` says why there is none)."""
    return installed_class(name)(**options)
