"""Progress of long solves on stderr: phase, round, rate, bound, gap, elapsed seconds.

The synthesizers call :func:`update` at phase boundaries (ForestColl Phase 1, switch
removal, packing, paper §4.3; step-aware cutting-plane rounds, App. C) and once per
column-generation round (paper §4.2; the general AllGather method).  Nothing happens
unless a command line installed a :class:`Reporter` with :func:`start` or a caller
enabled DEBUG on the ``mccl.progress`` logger: :func:`update` is then a global lookup, a
level check and a return, no formatting.  A reporter draws one updating line when its
stream is a terminal; forced onto another stream (``mccl solve --progress``) it writes
one plain line per shown update instead.  Library callers (the controller, tests) never
install one; they get the same updates as log records with
``logging.getLogger("mccl.progress").setLevel(logging.DEBUG)`` and a handler.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

__all__ = ["Reporter", "start", "stop", "update", "active"]

_log = logging.getLogger("mccl.progress")

#: a terminal line is redrawn at most this often (s), except when the phase changes
TERMINAL_INTERVAL_S = 0.1
#: a forced non-terminal stream gets at most one line per this many seconds per phase
PLAIN_INTERVAL_S = 1.0


class Reporter:
    """Formats and writes progress updates to ``stream`` (terminal: one line redrawn in
    place; otherwise one line per shown update), prefixed with ``label``."""

    def __init__(self, stream: TextIO, label: str = "", terminal: bool | None = None) -> None:
        self.stream = stream
        self.label = label
        self.terminal = _is_terminal(stream) if terminal is None else terminal
        self.interval = TERMINAL_INTERVAL_S if self.terminal else PLAIN_INTERVAL_S
        self.t0 = time.perf_counter()
        self._last_phase: str | None = None
        self._last_draw = float("-inf")
        self._drawn = False

    def update(self, phase: str, round: int | None, rate: float | None,
               bound: float | None, unit: str | None) -> None:
        """Show an update: always when ``phase`` changed, else at most once per interval."""
        now = time.perf_counter()
        if phase == self._last_phase and now - self._last_draw < self.interval:
            return
        self._last_phase, self._last_draw = phase, now
        text = format_line(self.label, phase, round, rate, bound, unit, now - self.t0)
        try:
            if self.terminal:
                self.stream.write("\r\x1b[K" + text)
            else:
                self.stream.write(text + "\n")
            self.stream.flush()
        except (OSError, ValueError):       # a closed or broken stream: stop drawing
            self.terminal, self._last_phase, self._last_draw = False, phase, float("inf")
            return
        self._drawn = True

    def close(self) -> None:
        """Clear the terminal line (the result follows on stdout)."""
        if self.terminal and self._drawn:
            try:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
            except (OSError, ValueError):
                pass


def format_line(label: str, phase: str, round: int | None, rate: float | None,
                bound: float | None, unit: str | None, elapsed: float) -> str:
    """``label: phase  round R  rate X  bound Y  gap G%  T s`` with the parts that are
    known; the gap is ``1 - rate/bound``; rates and bounds are shown only with a
    ``unit`` (scaled masters report a gap only)."""
    parts = [f"{label}: {phase}" if label else phase]
    if round is not None:
        parts.append(f"round {round}")
    if unit is not None and rate is not None:
        parts.append(f"rate {rate:.4g} {unit}")
    finite_bound = bound is not None and 0 < bound < float("inf")
    if unit is not None and finite_bound:
        parts.append(f"bound {bound:.4g} {unit}")
    if rate is not None and finite_bound:
        parts.append(f"gap {max(0.0, 1.0 - rate / bound):.3%}")
    parts.append(f"{elapsed:.1f} s")
    return "  ".join(parts)


def _is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


_active: Reporter | None = None


def start(force: bool | None = None, label: str = "", stream: TextIO | None = None
          ) -> Reporter | None:
    """Install a reporter on ``stream`` (stderr by default) when ``force`` is true, or
    when ``force`` is ``None`` and the stream is a terminal; ``force=False``: none.
    Returns the installed reporter (``None`` when progress stays off)."""
    global _active
    stream = sys.stderr if stream is None else stream
    stop()
    if force is False or (force is None and not _is_terminal(stream)):
        return None
    _active = Reporter(stream, label)
    return _active


def stop() -> None:
    """Remove the installed reporter, clearing its terminal line."""
    global _active
    reporter, _active = _active, None
    if reporter is not None:
        reporter.close()


def active() -> bool:
    """Whether a reporter is installed."""
    return _active is not None


def update(phase: str, round: int | None = None, rate: float | None = None,
           bound: float | None = None, unit: str | None = None) -> None:
    """Report progress; a no-op (no formatting) when no reporter is installed."""
    reporter = _active
    if reporter is not None:
        reporter.update(phase, round, rate, bound, unit)
    if _log.isEnabledFor(logging.DEBUG):
        _log.debug("%s round=%s rate=%s bound=%s %s", phase, round, rate, bound, unit or "")
