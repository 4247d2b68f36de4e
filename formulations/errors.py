"""The root of every MCCL error, defined in the bottom layer.

:class:`MCCLError` lives here, not in :mod:`mccl_opt.errors`, because the layer rule
(docs/architecture.md) lets every package import ``formulations`` but lets
``formulations`` import nothing above it: defining the root at the bottom is the only
way for the model builders' :class:`FormulationError` to be an ``MCCLError`` too.
:mod:`mccl_opt.errors` re-exports the same class object, so ``except
mccl_opt.MCCLError`` catches errors of every layer, this one included.
"""

from __future__ import annotations

__all__ = ["MCCLError", "FormulationError"]


class MCCLError(Exception):
    """Base class of every error raised by MCCL (re-exported as ``mccl_opt.MCCLError``)."""


class FormulationError(MCCLError, ValueError):
    """A model whose arrays are inconsistent (shapes, NaN, crossed bounds)."""
