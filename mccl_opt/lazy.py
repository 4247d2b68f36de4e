"""Package attributes imported on first access (PEP 562 module ``__getattr__``), so that
importing a package stays cheap: its heavy parts (zmq, torch, the synthesizers) load only
when a caller names them."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping

__all__ = ["lazy_getattr"]


def lazy_getattr(package: str, names: Mapping[str, str],
                 submodules: tuple[str, ...] = ()) -> Callable[[str], Any]:
    """A module ``__getattr__`` for ``package``: ``names`` maps an attribute to the module
    that defines it; ``submodules`` are subpackages reachable as attributes."""

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        if name in submodules:
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
