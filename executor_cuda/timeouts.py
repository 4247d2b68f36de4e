"""Range checks of the executor's timeouts (issue 27, seventh pass).

A timeout becomes a ``datetime.timedelta`` handed to gloo (a process group's) or a wait
(a swap round's): NaN and infinity ended in a ``ValueError``/``OverflowError`` traceback
from ``timedelta``, a negative value in gloo's ``enforce fail`` ``RuntimeError``, 1e300 in
an ``OverflowError`` (gloo counts milliseconds in a C int), and 0 made every round time
out at once.  :func:`check_seconds` refuses each with an :class:`InputError` naming the
argument.  :class:`CollectiveTimeoutError` (re-exported by
:mod:`executor_cuda.communicator`) is what a missed deadline raises, a collective's own
or the abort agreement's (:mod:`executor_cuda.abort`).
"""

from __future__ import annotations

import math

from mccl_opt.errors import InputError, MCCLError

__all__ = ["MAX_TIMEOUT_S", "CollectiveTimeoutError", "check_seconds"]

#: the longest timeout taken (a day; gloo's milliseconds fit a C int up to ~24 days)
MAX_TIMEOUT_S = 86400.0


class CollectiveTimeoutError(MCCLError):
    """A collective missed its deadline: a peer stopped, died or hangs."""


def check_seconds(name: str, value: object, none_ok: bool = False) -> None:
    """``value`` is a number of seconds in (0, :data:`MAX_TIMEOUT_S`] (or None where
    ``none_ok``: no deadline); else :class:`InputError`."""
    if value is None and none_ok:
        return
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and 0 < value <= MAX_TIMEOUT_S
    if not ok:
        hint = " (or None: no deadline)" if none_ok else ""
        raise InputError(f"{name} must be > 0 seconds and at most {MAX_TIMEOUT_S:g} (a finite number){hint}, "
                         f"got {value!r}")
