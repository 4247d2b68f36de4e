"""Fault injection: emulate a slow (gray-failed) link between chosen ranks on CPU.

gloo cannot throttle a TCP connection, so the executor emulates a link of
``gbps`` Gbps from rank ``src`` to rank ``dst`` by posting each send on it only after
``8 * bytes / (gbps * 1e9)`` seconds (delay proportional to bytes).  Sends to other
peers of the same round are posted first, so only the slow link is delayed and the
receiver's telemetry sees exactly that link degrade (paper §6.2.2's halved link).
The injector is thread-safe and can be changed while collectives run.
"""

from __future__ import annotations

import threading

__all__ = ["FaultInjector"]


class FaultInjector:
    """A mutable set of emulated slow links ``(src rank, dst rank) -> Gbps``."""

    def __init__(self) -> None:
        self._slow: dict[tuple[int, int], float] = {}
        self._lock = threading.Lock()

    def slow_link(self, src: int, dst: int, gbps: float, bidirectional: bool = True) -> None:
        """Make ``src -> dst`` (and ``dst -> src`` if ``bidirectional``) run at ``gbps``."""
        if not gbps > 0:
            raise ValueError(f"emulated link rate must be > 0 Gbps, got {gbps}")
        with self._lock:
            self._slow[(src, dst)] = float(gbps)
            if bidirectional:
                self._slow[(dst, src)] = float(gbps)

    def clear(self) -> None:
        """Heal every link."""
        with self._lock:
            self._slow.clear()

    def delay_s(self, src: int, dst: int, nbytes: int) -> float:
        """Seconds to hold back a ``nbytes`` send from ``src`` to ``dst`` (0 if healthy)."""
        with self._lock:
            gbps = self._slow.get((src, dst))
        return 0.0 if gbps is None else 8.0 * nbytes / (gbps * 1e9)

    @property
    def links(self) -> dict[tuple[int, int], float]:
        with self._lock:
            return dict(self._slow)
