"""Passive telemetry: per-transfer bytes and duration per peer (paper §3.3, §5).

The executor records one sample per received message: ``(src rank, dst rank, bytes,
seconds)``.  On CPU the duration comes from ``time.monotonic_ns`` (from posting the
round to the moment the receive completed); on CUDA from a pair of CUDA events around
the round, read later by the flusher thread once the end event has completed, so the
collective never synchronises the device for telemetry.

Samples go to a bounded buffer.  :meth:`Telemetry.record` never blocks: when the
buffer is full the sample is dropped and counted (:attr:`Telemetry.dropped`).  A
background thread flushes the buffer every ``flush_interval`` seconds, aggregates
the samples per overlay link (GPU pair, ids from the schedule's ``gpus``) into
:class:`LinkSample` records and hands them to ``on_flush`` (e.g. the runtime client
that forwards them to the controller).
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from mccl_opt.errors import TelemetryError

__all__ = ["LinkSample", "Telemetry", "aggregate", "cuda_event"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LinkSample:
    """Aggregated measurement of one overlay link ``src -> dst`` (GPU ids) over a flush."""

    src: str
    dst: str
    bytes: int
    seconds: float
    count: int
    first_seq: int
    last_seq: int

    @property
    def gbps(self) -> float:
        """Effective throughput in Gbps (10^9 bit/s), README "Units and definitions"."""
        return 8.0 * self.bytes / self.seconds / 1e9 if self.seconds > 0 else 0.0

    def to_controller(self, t: float) -> dict[str, Any]:
        """The controller's ``pair`` sample (mccl_runtime.telemetry wire format) at time ``t``."""
        return {"kind": "pair", "src": self.src, "dst": self.dst, "gbps": self.gbps, "t": t}

    def to_dict(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "bytes": self.bytes, "seconds": self.seconds,
                "gbps": self.gbps, "count": self.count, "first_seq": self.first_seq,
                "last_seq": self.last_seq}


# A raw sample: (src id, dst id, bytes, seconds or None, seq, cuda (start, end) or None)
_Raw = tuple


def aggregate(raw: Sequence[tuple[str, str, int, float, int]]) -> list[LinkSample]:
    """Sum bytes and seconds per ``(src, dst)``; output sorted by link for determinism."""
    acc: dict[tuple[str, str], list] = defaultdict(lambda: [0, 0.0, 0, None, None])
    for src, dst, nbytes, seconds, seq in raw:
        a = acc[(src, dst)]
        a[0] += nbytes
        a[1] += seconds
        a[2] += 1
        a[3] = seq if a[3] is None else min(a[3], seq)
        a[4] = seq if a[4] is None else max(a[4], seq)
    return [LinkSample(s, d, a[0], a[1], a[2], a[3], a[4]) for (s, d), a in sorted(acc.items())]


class Telemetry:
    """Bounded, non-blocking sample buffer with an asynchronous flusher thread.

    ``on_flush(samples)`` is called from the flusher thread with a list of
    :class:`LinkSample`; an exception in it is logged, never raised into the executor.
    ``flush_interval=None`` disables the thread (call :meth:`flush` yourself).
    """

    def __init__(self, capacity: int = 4096,
                 on_flush: Callable[[list[LinkSample]], None] | None = None,
                 flush_interval: float | None = 0.05) -> None:
        if capacity < 1:
            raise TelemetryError(f"telemetry capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self.on_flush = on_flush
        self.dropped = 0
        self.recorded = 0
        self.flushed: list[LinkSample] = []
        self._buf: list[_Raw] = []
        self._cuda_pending: list[_Raw] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if flush_interval is not None:
            self._interval = flush_interval
            self._thread = threading.Thread(target=self._loop, name="mccl-telemetry", daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ fast path
    def record(self, src: str, dst: str, nbytes: int, seconds: float, seq: int) -> bool:
        """Buffer one CPU-timed sample; returns False (and counts it) if the buffer is full."""
        return self._push((src, dst, int(nbytes), float(seconds), int(seq), None))

    def record_cuda(self, src: str, dst: str, nbytes: int, start: Any, end: Any, seq: int) -> bool:
        """Buffer a sample timed by CUDA events ``start``/``end`` (resolved when flushed)."""
        return self._push((src, dst, int(nbytes), None, int(seq), (start, end)))

    def record_round(self, meta: Sequence[tuple[int, int, float]], gpus: Sequence[str], rank: int, seq: int,
                     t0: int, start: Any, timed: list | None, stamps: Any) -> None:
        """One sample per message a rank received in a round (``meta``: sender rank, bytes,
        emulated seconds).  CPU (``timed``: futures of each receive's completion, ns): from
        the later of this rank's round start ``t0`` and the sender's (``stamps``) to the
        completion, at least the emulated time, so neither a late sender nor a late
        receiver is charged to the link (wall clock).  CUDA: the round's events."""
        me = gpus[rank]
        if timed is None:
            end = cuda_event(True)
            for src, nbytes, _ in meta:
                self.record_cuda(gpus[src], me, nbytes, start, end, seq)
            return
        for fut, (src, nbytes, delay), stamp in zip(timed, meta, stamps.tolist()):
            real = fut.result() - max(t0, stamp)          # the transfer once both ends were there
            self.record(gpus[src], me, nbytes, max(real, delay * 1e9, 1) / 1e9, seq)

    def discard(self, seq: int) -> int:
        """Drop the CPU samples of collective ``seq`` not yet drained (an aborted attempt,
        :mod:`executor_cuda.abort`); returns how many."""
        with self._lock:
            keep = [x for x in self._buf if x[4] != seq or x[5] is not None]
            dropped, self._buf = len(self._buf) - len(keep), keep
        return dropped

    def _push(self, item: _Raw) -> bool:
        with self._lock:
            if len(self._buf) + len(self._cuda_pending) >= self.capacity:
                self.dropped += 1
                return False
            self._buf.append(item)
            self.recorded += 1
            return True

    # ------------------------------------------------------------------ slow path
    def drain(self) -> list[LinkSample]:
        """Take every resolved sample out of the buffer and aggregate it per link.

        CUDA samples whose end event has not completed yet stay buffered.
        """
        with self._lock:
            items, self._buf = self._buf + self._cuda_pending, []
            self._cuda_pending = []
        ready, waiting = [], []
        for src, dst, nbytes, seconds, seq, events in items:
            if events is not None:
                start, end = events
                if not end.query():
                    waiting.append((src, dst, nbytes, seconds, seq, events))
                    continue
                seconds = start.elapsed_time(end) / 1e3
            ready.append((src, dst, nbytes, seconds, seq))
        if waiting:
            with self._lock:
                self._cuda_pending = waiting + self._cuda_pending
        return aggregate(ready)

    def flush(self) -> list[LinkSample]:
        """Drain now and deliver to ``on_flush`` (or keep in :attr:`flushed`)."""
        samples = self.drain()
        if samples:
            if self.on_flush is None:
                self.flushed.extend(samples)
            else:
                try:
                    self.on_flush(samples)
                except Exception:  # noqa: BLE001 - telemetry must never break training
                    log.exception("telemetry flush callback failed; %d samples lost", len(samples))
        return samples

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.flush()

    def close(self) -> None:
        """Stop the flusher and flush what is left."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.flush()


def cuda_event(cuda: bool) -> Any:
    """A recorded CUDA timing event on the current stream (``None`` on CPU)."""
    if not cuda:
        return None
    import torch

    ev = torch.cuda.Event(enable_timing=True)
    ev.record()
    return ev
