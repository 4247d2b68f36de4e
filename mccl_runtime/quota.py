"""A bound on registrations that no client id can widen (docs/runtime.md, "Threat model").

The per-client quota (``MAX_CLIENT_COLLECTIVES``) is keyed by the ``client`` id a signed
request carries, which its sender chooses: a key holder signing with fresh ids passes
it.  :class:`RegistrationBudget` is a token bucket over every registration request,
whoever sends it: at most ``per_min`` new collectives a minute (an AllReduce counts two),
in bursts of at most ``per_min``.  It bounds how fast the slots fill and how many first
syntheses can be started per minute, whatever the ids; the total stays capped by
``MAX_COLLECTIVES``.
"""

from __future__ import annotations

import math
import time
from numbers import Integral
from typing import Callable

from mccl_opt.errors import MCCLError

__all__ = ["RegistrationBudget", "MAX_REGISTRATIONS_PER_MIN"]

#: new collectives registered per minute, all clients together
MAX_REGISTRATIONS_PER_MIN = 64
#: the largest budget taken (a bound a float's precision still refills exactly)
MAX_BUDGET_PER_MIN = 1_000_000


class RegistrationBudget:
    """Tokens for new collectives: ``per_min`` at most, refilled at ``per_min`` a minute."""

    def __init__(self, per_min: int = MAX_REGISTRATIONS_PER_MIN,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if isinstance(per_min, bool) or not isinstance(per_min, Integral) or not 1 <= per_min <= MAX_BUDGET_PER_MIN:
            raise MCCLError(f"the registration budget must be a whole number of collectives a minute in "
                            f"[1, {MAX_BUDGET_PER_MIN}], got {str(per_min)[:40]!r}")   # NaN, inf: no traceback
        self.per_min, self.clock = int(per_min), clock
        self._tokens, self._at = float(self.per_min), clock()

    def _refill(self) -> float:
        now = self.clock()
        self._tokens = min(float(self.per_min), self._tokens + max(0.0, now - self._at) * self.per_min / 60.0)
        self._at = now
        return self._tokens

    def wait_s(self, n: int) -> float:
        """Seconds until ``n`` collectives may be registered (0: now; ``inf``: never,
        ``n`` is above the burst)."""
        if n > self.per_min:
            return math.inf
        missing = n - self._refill()
        return 0.0 if missing <= 0 else missing * 60.0 / self.per_min

    def take(self, n: int) -> None:
        """Spend ``n`` tokens (after :meth:`wait_s` said 0)."""
        self._refill()
        self._tokens -= n
