"""The controller's state writes, honest about failure (docs/runtime.md, "Failing disks").

:class:`DurableState` wraps the :class:`~.state.StateWriter` of the service:

* :meth:`DurableState.save` returns whether the state is on disk; it never raises.  A
  failed write puts the controller in *read-only mode* (``failure`` says why): the first
  failure is logged once (an ``OSError`` without a traceback), further failures are only
  counted, and the first write that succeeds again is logged once;
* in read-only mode a write is tried at most every ``retry_s`` (:meth:`due`), except
  for a registration, which tries at once (its reply waits for the answer);
* :meth:`served` is what a client may see of a collective: the version and schedule of
  the last successful write, so a version that is not on disk is neither served nor
  published (it could be lost in a crash and its number reused for other chunks).
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable

from .state import StateWriter

__all__ = ["DurableState", "WRITE_RETRY_S"]

log = logging.getLogger("mccl.controller")

#: seconds between write attempts in read-only mode
WRITE_RETRY_S = 1.0


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror or exc}{where}"
    return f"{type(exc).__name__}: {str(exc)[:200]}"


class DurableState:
    """Saves and tracks what is on disk (module docstring); ``writer`` ``None``: no
    state file, every version is served at once."""

    def __init__(self, writer: StateWriter | None, retry_s: float = WRITE_RETRY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.writer, self.retry_s, self.clock = writer, float(retry_s), clock
        self.failure: str | None = None          # why writes fail (read-only mode), or None
        self.failed_writes = 0
        self._last_try = -math.inf
        self._served: dict[tuple[str, str], tuple[int, Any]] = {}

    @property
    def read_only(self) -> bool:
        return self.failure is not None

    def due(self) -> bool:
        """Whether a write may be tried now (always, unless read-only and tried within
        ``retry_s``)."""
        return self.failure is None or self.clock() - self._last_try >= self.retry_s

    def save(self, store: Any, manager: Any, protocol_errors: dict[str, int]) -> bool:
        """Write the state now; ``True`` if it is on disk (or there is no state file)."""
        if self.writer is None:
            return True
        self._last_try = self.clock()
        try:
            self.writer.write(store, manager, protocol_errors)
        except Exception as exc:
            self.failed_writes += 1
            if self.failure is None:
                self.failure = _why(exc)
                log.error("cannot write the state file %s: %s; READ-ONLY mode: registrations are refused "
                          "and new schedule versions are held (not served, not published) until a write "
                          "succeeds; retrying every %g s", self.writer.path, self.failure, self.retry_s,
                          exc_info=not isinstance(exc, OSError))
            return False
        if self.failure is not None:
            log.warning("the state file %s is written again (after %d failed writes); leaving read-only mode",
                        self.writer.path, self.failed_writes)
            self.failure = None
        self.adopt(manager)
        return True

    def adopt(self, manager: Any) -> None:
        """Every collective's current version is on disk (after a write or a resume)."""
        self._served = {c.key: (c.version, c.schedule) for c in manager.collectives()}

    def served(self, coll: Any) -> tuple[int, Any]:
        """``(version, schedule)`` of ``coll`` a client may see: the last one on disk."""
        if self.writer is None:
            return coll.version, coll.schedule
        return self._served.get(coll.key, (0, None))
