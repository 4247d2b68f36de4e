"""The controller's request queue: small requests first, large ones in a bounded backlog.

The service is one thread, so a request waits for whatever is being handled before it.
Receiving is cheap and handling is not (a full telemetry batch costs milliseconds), so
:class:`Inbox` takes everything queued at the socket and answers a *small* request
(at most :data:`SMALL_BYTES`: a ping, a registration, a schedule fetch) at once, unless
its sender still has a large request waiting (each sender's requests keep their order).
Large requests wait in a backlog of at most :data:`MAX_BACKLOG`; beyond it they are
refused as ``busy`` (the sender may retry), so memory stays bounded under a flood and a
ping waits for at most the one large request in progress.
"""

from __future__ import annotations

from collections import Counter, deque
from typing import Any, Callable

__all__ = ["Inbox", "SMALL_BYTES", "MAX_BACKLOG"]

#: requests up to this size are answered before queued large ones
SMALL_BYTES = 16 << 10
#: large requests received but not yet handled
MAX_BACKLOG = 16

Frames = list[bytes]


class Inbox:
    """Small-first scheduling over a ROUTER socket (module docstring)."""

    def __init__(self, router: Any, zmq: Any, max_backlog: int = MAX_BACKLOG,
                 small_bytes: int = SMALL_BYTES) -> None:
        self.router, self._again, self._noblock = router, zmq.Again, zmq.NOBLOCK
        self.max_backlog, self.small_bytes = max_backlog, small_bytes
        self.backlog: deque[Frames] = deque()
        self._waiting: Counter[bytes] = Counter()     # sender identity -> large requests queued

    def drain(self, answer: Callable[[Frames], None], refuse: Callable[[Frames], None],
              limit: int) -> None:
        """Receive up to ``limit`` queued requests: answer the small ones of senders with
        nothing waiting, queue the others, refuse what does not fit."""
        for _ in range(limit):
            try:
                frames = self.router.recv_multipart(self._noblock)
            except self._again:
                return
            sender = frames[0] if len(frames) > 1 else b""
            if len(frames) < 2 or (sum(map(len, frames[1:])) <= self.small_bytes and not self._waiting[sender]):
                answer(frames)
            elif len(self.backlog) < self.max_backlog:
                self.backlog.append(frames)
                self._waiting[sender] += 1
            else:
                refuse(frames)

    def pop(self) -> Frames | None:
        """The oldest queued request, or ``None``."""
        if not self.backlog:
            return None
        frames = self.backlog.popleft()
        self._waiting[frames[0]] -= 1
        if not self._waiting[frames[0]]:
            del self._waiting[frames[0]]
        return frames
