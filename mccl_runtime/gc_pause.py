"""Garbage collection paused while the simulated loop's synthesis runs (docs/runtime.md):
a collection pass inside a timed job would be charged to synthesis."""

from __future__ import annotations

import gc
import threading

from mccl_opt.schedule import Schedule
from mccl_opt.topology import Topology

from .synthesizer import Synthesizer

__all__ = ["GcPause", "paused"]


class GcPause:
    """Cyclic garbage collection off while any ``with`` block of this object runs (the
    synthesis worker thread and the loop's thread may nest), back to its former state
    after the last one (:mod:`.loop`'s docstring, "Timing model")."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._was_enabled = False

    def __enter__(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._depth += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._was_enabled:
                gc.enable()


def paused(synthesize: Synthesizer, pause: GcPause) -> Synthesizer:
    """``synthesize`` run with garbage collection paused (:class:`GcPause`)."""

    def synthesize_paused(kind: str, topo: Topology, warm: Schedule | None, time_limit_s: float | None) -> Schedule:
        with pause:
            return synthesize(kind, topo, warm, time_limit_s)

    return synthesize_paused
