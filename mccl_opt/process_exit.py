"""Interpreter exit without re-collecting numba's registries.

The first numba kernel a process loads (compiled or from the cache) fills numba's typing
and lowering registries: about 100 000 objects tracked by the garbage collector.  When the
interpreter exits, CPython clears its modules and runs full collections over everything
still alive; with those registries that is about 0.3 s of CPU, a third of a short
``mccl solve`` on 16 GPUs (docs/architecture.md, "Process start and exit").

:func:`install` (run by ``import mccl_opt``) registers an ``atexit`` hook that, once numba
is loaded, moves every live object to the permanent generation (:func:`gc.freeze`): the
exit then frees them by reference counting alone.  What is skipped is only the collection
of reference cycles still alive at exit, whose ``__del__`` Python does not promise to run
(language reference, ``object.__del__``): a file left open inside such a cycle is not
flushed.  ``MCCL_EXIT_GC=1`` in the environment keeps the full exit collection.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys

__all__ = ["install"]

_installed = False


def _freeze_if_numba_loaded() -> None:
    if "numba" in sys.modules and os.environ.get("MCCL_EXIT_GC", "") != "1":
        gc.freeze()


def install() -> None:
    """Register the exit hook once per process."""
    global _installed
    if not _installed:
        atexit.register(_freeze_if_numba_loaded)
        _installed = True
