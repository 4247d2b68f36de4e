"""Seconds a block of code spent compiling or loading numba kernels.

A numba kernel is compiled on its first call with new argument types, or loaded from the
on-disk cache (docs/architecture.md, "Kernels: compiled once, loaded per process"); either
way numba holds its global compiler lock meanwhile and announces it on its event bus
(``numba.core.event``, event ``"numba:compiler_lock"``).  :func:`kernel_seconds` counts
that time for the calling thread, so a solve can report it apart (``stats["kernel_load_s"]``)
and keep it out of its ``seconds``: the first solve of a process must not look slower than
the next one because a kernel loaded inside it.

``on_compile`` is called once per block when numba really compiles (an empty cache: the
first process after an installation), e.g. to print a progress line; loads from the cache
do not call it.  Without one (a library caller), the first compilation of the process is
announced once on the ``mccl`` logger at WARNING level (:data:`COMPILE_NOTICE`), so a
library user waiting 3-40 s knows why; silence it with
``logging.getLogger("mccl").setLevel(logging.ERROR)``.  Cost: listeners called twice per kernel compile or load, nothing on
ordinary kernel calls.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

__all__ = ["KernelClock", "kernel_seconds", "thread_kernel_seconds", "thread_kernel_cpu_seconds",
           "TOTAL_KEYS", "charge_apart",
           "COMPILE_NOTICE"]

#: what the ``mccl`` logger says once per process before a library call compiles kernels
COMPILE_NOTICE = ("compiling MCCL's numba kernels on first use after installation: 20-40 s, once "
                  "(cached on disk; `mccl warmup` or mccl_runtime.warmup.load_kernels() does it ahead)")
_log = logging.getLogger("mccl")
_announced = False

#: a schedule's whole-solve timings (``solver`` and ``stats``); phase timings stay raw
TOTAL_KEYS = ("seconds", "total_s")

_per_thread = threading.local()
_registered = False
_register_lock = threading.Lock()


def _thread_total() -> float:
    return getattr(_per_thread, "total", 0.0)


def thread_kernel_seconds() -> float:
    """Kernel compile/load seconds this thread has spent so far (a running total; only
    counted while some :func:`kernel_seconds` block has registered the listener)."""
    return _thread_total()


def thread_kernel_cpu_seconds() -> float:
    """:func:`thread_kernel_seconds` in this thread's CPU seconds (``time.thread_time``):
    what to take out of a solve's CPU time (a warm allowance, ``cold_cpu_seconds``)."""
    return getattr(_per_thread, "cpu_total", 0.0)


def _register_listener() -> None:
    """Listen to numba's compiler-lock events once per process (numba imported here,
    lazily: callers reach this only when a synthesizer is running)."""
    global _registered
    with _register_lock:
        if _registered:
            return
        from numba.core import event

        class _LockTimer(event.Listener):
            def on_start(self, ev: event.Event) -> None:
                depth = getattr(_per_thread, "depth", 0)
                if depth == 0:
                    _per_thread.start = time.perf_counter()
                    _per_thread.cpu_start = time.thread_time()
                _per_thread.depth = depth + 1

            def on_end(self, ev: event.Event) -> None:
                depth = getattr(_per_thread, "depth", 0)
                if depth == 0:          # the lock was taken before this listener existed
                    return
                _per_thread.depth = depth = depth - 1
                if depth == 0:
                    _per_thread.total = _thread_total() + time.perf_counter() - _per_thread.start
                    _per_thread.cpu_total = thread_kernel_cpu_seconds() + time.thread_time() \
                        - _per_thread.cpu_start

        class _CompileNotice(event.Listener):
            def on_start(self, ev: event.Event) -> None:
                global _announced
                notify = getattr(_per_thread, "on_compile", None)
                if notify is not None:
                    _per_thread.on_compile = None
                    notify()
                elif not _announced:
                    _announced = True
                    _log.warning(COMPILE_NOTICE)

            def on_end(self, ev: event.Event) -> None:
                pass

        event.register("numba:compiler_lock", _LockTimer())
        event.register("numba:compile", _CompileNotice())
        _registered = True


class KernelClock:
    """Kernel compile/load seconds of one block, read after the block (:attr:`seconds`;
    :attr:`cpu_seconds`: the same in this thread's CPU seconds)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.cpu_seconds = 0.0


@contextmanager
def kernel_seconds(on_compile: Callable[[], None] | None = None) -> Iterator[KernelClock]:
    """Measure the numba compile/load time this thread spends inside the block; call
    ``on_compile`` before the block's first real compilation, if any."""
    _register_listener()
    clock = KernelClock()
    before, cpu_before = _thread_total(), thread_kernel_cpu_seconds()
    outer = getattr(_per_thread, "on_compile", None)
    _per_thread.on_compile = on_compile or outer
    try:
        yield clock
    finally:
        clock.seconds = _thread_total() - before
        clock.cpu_seconds = thread_kernel_cpu_seconds() - cpu_before
        _per_thread.on_compile = outer


def charge_apart(schedule: Any, clock: KernelClock) -> Any:
    """Take ``clock.seconds`` out of ``schedule``'s whole-solve timings (:data:`TOTAL_KEYS`
    in ``solver`` and ``stats``, and its report's ``seconds``) and record it as
    ``stats["kernel_load_s"]``."""
    for table in (schedule.solver, schedule.stats):
        for key in TOTAL_KEYS:
            if isinstance(table.get(key), float):
                table[key] = max(0.0, table[key] - clock.seconds)
    schedule.stats["kernel_load_s"] = clock.seconds
    report = getattr(schedule, "report", None)
    if report is not None:
        schedule.report = dataclasses.replace(report, seconds=max(0.0, report.seconds - clock.seconds))
    return schedule
