"""A per-solve time-out for the fuzz scripts: ``with time_out(s): solve()`` raises
:class:`SolveTimeout` once ``s`` seconds have passed (noticed when a compiled kernel
returns to Python, so a solve stuck inside one overruns by that kernel's time; numba
wraps it in a ``SystemError`` (one per nested kernel call) when it is raised inside a
kernel call, which is unwrapped here)."""

from __future__ import annotations

import signal
from contextlib import contextmanager
from typing import Any, Iterator

__all__ = ["SolveTimeout", "time_out"]


class SolveTimeout(Exception):
    """A solve ran past its time-out."""


def _raise(signum: int, frame: Any) -> None:
    raise SolveTimeout


@contextmanager
def time_out(seconds: float) -> Iterator[None]:
    previous = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except SystemError as e:                       # raised while a compiled kernel ran
        cause = e.__cause__
        while isinstance(cause, SystemError):      # a kernel called from another one
            cause = cause.__cause__
        if isinstance(cause, SolveTimeout):
            raise SolveTimeout from e
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
