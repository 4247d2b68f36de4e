"""Anytime solves: a time limit that holds, and the best schedule found so far.

A synthesizer called with ``time_limit=S`` runs inside :func:`limited`, which makes an
:class:`Anytime` the *current* one for that call (a context variable: nested solves and
threads each see their own).  The solve offers every valid schedule it builds
(:func:`offer`: the first cheap one, then better ones), and its phases call :func:`check`
at their boundaries and inside their Python-level loops (:func:`check_room` before a
phase whose expected cost exceeds the time left: its result would come too late).
Once the limit has passed, :func:`check` raises :class:`TimeLimitReached`; :func:`limited` catches it and returns the
best schedule offered, so the caller gets a valid schedule at the limit (or, if none was
offered yet, a :class:`~mccl_opt.errors.SolveError` saying so).  Without a limit,
:func:`check` is one context-variable lookup and :func:`offer` does nothing.

:func:`stage` runs one optional attempt (a warm start) under a sub-budget: when the
sub-budget passes, the attempt is abandoned and the caller goes on with the next method,
which is how a warm start that does not pay is detected early (docs/allgather.md,
*Warm never slower than cold*); :func:`give_up` abandons it at once, where a step sized
to the sub-budget's time left (:func:`time_left`) finds that it cannot finish within it;
:func:`run_out` does the same for whichever limit is innermost, the solve's own included.
A compiled step sizes its work by :func:`time_left` scaled by :func:`cpu_share`, the share
of the wall-clock time this solve has had the CPU (a loaded machine runs it at a fraction
of the kernels' measured rates).
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Callable, Iterator, TypeVar

from .errors import SolveError
from .kernel_time import thread_kernel_cpu_seconds, thread_kernel_seconds

__all__ = ["Anytime", "TimeLimitReached", "limited", "check", "check_room", "late", "offer",
           "limit_left", "time_left", "lp_time_limit", "lp_room", "give_up", "run_out", "cpu_share", "share_since", "stage",
           "current"]

#: :func:`cpu_share` is 1 until the solve has run this long (too short to measure a share)
_SHARE_AFTER_S = 0.02
#: ... and never below this (a step is not sized to nothing by one stalled moment)
_SHARE_MIN = 0.1

#: CPU seconds an LP solver takes to set up and return, however short its own limit:
#: HiGHS stopped at 1 ms returned after 3-8 ms CPU at 1024 GPUs (the balanced
#: restriction's cutting-plane LP; docs/allgather.md, "The leftovers past the deadline")
LP_SETUP_S = 0.005

T = TypeVar("T")


class TimeLimitReached(Exception):
    """Raised by :func:`check` past the current limit; caught by :func:`limited` or
    :func:`stage`, never seen by a caller of a synthesizer."""

    def __init__(self, where: str, owner: "Anytime") -> None:
        super().__init__(f"time limit reached in {where}")
        self.where = where
        self.owner = owner


@dataclass
class Anytime:
    """One limited solve: its deadline (``time.perf_counter()`` seconds), the best
    schedule offered so far (by ``rate_gbps``) and where the limit was reached."""

    deadline: float
    parent: "Anytime | None" = None
    best: object | None = None
    stopped_in: str | None = None
    offers: int = 0
    kernels_from: float | None = None     # stage: numba compile/load time does not count
    cpu_deadline: float | None = None     # a CPU stage: :func:`_solving_cpu` seconds
    failure: str | None = None            # a SolveError that ended the solve before its limit
    grace: float = 0.0                    # :func:`check` raises this long past the deadline
    _rate: float = field(default=float("-inf"), repr=False)
    _began: tuple[float, float] = field(       # (wall, this thread's CPU) when it began
        default_factory=lambda: (time.perf_counter(), time.thread_time()), repr=False)

    @property
    def is_stage(self) -> bool:
        """A sub-budget of a solve (:func:`stage`), not a solve's own limit."""
        return self.kernels_from is not None

    def _now(self) -> float:
        now = time.perf_counter()
        if self.kernels_from is not None:
            now -= thread_kernel_seconds() - self.kernels_from
        return now

    def expired(self) -> bool:
        """Past the deadline by more than :attr:`grace` (:func:`late`), or past the CPU
        deadline."""
        if self.cpu_deadline is not None and self.cpu_deadline - _solving_cpu() <= 0.0:
            return True
        return self.deadline + self.grace - self._now() <= 0.0

    def remaining(self) -> float:
        left = self.deadline - self._now()
        if self.cpu_deadline is not None:
            left = min(left, self.cpu_deadline - _solving_cpu())
        return max(0.0, left)

    def offer(self, schedule: object, rate: float) -> None:
        self.offers += 1
        if rate > self._rate:
            self.best, self._rate = schedule, rate
        if self.parent is not None:
            self.parent.offer(schedule, rate)


_current: ContextVar[Anytime | None] = ContextVar("mccl_anytime", default=None)


def current() -> Anytime | None:
    """The innermost limit of this context, ``None`` without one."""
    return _current.get()


def check(where: str) -> None:
    """Raise :class:`TimeLimitReached` if this context's limit (or an enclosing one) has
    passed; ``where`` names the phase for the report."""
    limit, expired = _current.get(), None
    while limit is not None:             # the outermost expired limit owns the stop
        if limit.expired():
            expired = limit
        limit = limit.parent
    if expired is not None:
        expired.stopped_in = where
        raise TimeLimitReached(where, expired)


@contextmanager
def late(seconds: float) -> Iterator[None]:
    """Inside, :func:`check` lets the solve's own limit run ``seconds`` past its deadline
    (a stage's sub-budget gets no such grace): for a step whose result is the solve's
    first good schedule, started only where its expected cost fits the time left
    (:func:`check_room`), so that a machine slower than expected makes it finish a
    little late, within the limit's tolerance, rather than throw it away at the limit
    (AllGather's first schedule's images, docs/allgather.md).  :func:`limit_left` and
    :func:`time_left` are unchanged.  A no-op without a limit."""
    limit = _current.get()
    while limit is not None and limit.is_stage:
        limit = limit.parent
    if limit is None:
        yield
        return
    before, limit.grace = limit.grace, max(limit.grace, seconds)
    try:
        yield
    finally:
        limit.grace = before


def check_room(where: str, need_s: float) -> None:
    """:func:`check`, and stop as well when the solve's own limit has less than
    ``need_s`` seconds left: a phase expected to take longer than what is left would
    only run past the limit (its result comes too late to be returned), so the best
    schedule offered so far is returned now.  ``need_s`` is the phase's expected cost,
    measured on earlier phases of the same solve."""
    check(where)
    left = limit_left()
    if left is not None and left < need_s:
        limit = _current.get()
        while limit is not None and limit.is_stage:      # the solve's own limit owns it
            limit = limit.parent
        if limit is not None:
            limit.stopped_in = f"{where} (needs ~{need_s:.2g} s, {left:.2g} s left)"
            raise TimeLimitReached(limit.stopped_in, limit)


def offer(schedule: object) -> None:
    """Offer a valid schedule as a result should the limit pass (kept if it is the best
    offered so far); a no-op without a limit."""
    limit = _current.get()
    if limit is not None:
        limit.offer(schedule, float(getattr(schedule, "rate_gbps")))


def limit_left() -> float | None:
    """Seconds left before the outermost limit, the solve's own (``None`` without one):
    an iterative method that can stop with a valid result stops there by itself."""
    limit, outer = _current.get(), None
    while limit is not None:
        if not limit.is_stage:
            outer = limit
        limit = limit.parent
    return None if outer is None else outer.remaining()


def time_left() -> float | None:
    """Seconds left before the innermost limit, a :func:`stage`'s sub-budget included
    (``None`` without one): a compiled kernel that cannot call :func:`check` sizes its
    work cap from it, so a warm stage stays within its allowance inside one call."""
    limit = _current.get()
    return None if limit is None else limit.remaining()


def lp_time_limit() -> float | None:
    """:func:`time_left` as an LP solver's own time limit (HiGHS' ``time_limit``; at
    least 1 ms, solvers refuse 0): an LP solve is one call no :func:`check` reaches, so
    the solver stops itself, and the caller :func:`run_out` s when it reports the limit."""
    left = time_left()
    return None if left is None else max(left, 1e-3)


def lp_room() -> bool:
    """Whether an LP solve started now can return within the innermost limit: ``False``
    when its time left, at this solve's CPU share, is under :data:`LP_SETUP_S` (the
    solver would return past the limit however short its own limit, so the caller acts
    as if it had stopped there, without starting it).  ``True`` without a limit."""
    left = time_left()
    return left is None or left * cpu_share() >= LP_SETUP_S


def cpu_share() -> float:
    """The share of wall-clock time this thread has been on the CPU since the solve's own
    limit began (1 without a limit; before :data:`_SHARE_AFTER_S` the load average's
    estimate, :func:`_load_share`; at least :data:`_SHARE_MIN`): a compiled step sized by rates measured on an idle core does
    ``time_left() * cpu_share()`` seconds of them on a shared one."""
    limit, outer = _current.get(), None
    while limit is not None:
        if not limit.is_stage:
            outer = limit
        limit = limit.parent
    return 1.0 if outer is None else share_since(outer._began)


def share_since(began: tuple[float, float]) -> float:
    """The share of wall-clock time this thread has been on the CPU since ``began``
    (``(time.perf_counter(), time.thread_time())`` readings; before
    :data:`_SHARE_AFTER_S` the load average's estimate, :func:`_load_share`; at least
    :data:`_SHARE_MIN`)."""
    wall = time.perf_counter() - began[0]
    if wall < _SHARE_AFTER_S:
        return _load_share()
    return min(1.0, max(_SHARE_MIN, (time.thread_time() - began[1]) / wall))


def _load_share() -> float:
    """The CPU share a thread can expect from the load average (cores per runnable
    process, 1 on a free machine, at least :data:`_SHARE_MIN`): :func:`cpu_share` before
    the solve has run long enough to measure its own.  Before, it was 1 there, and the
    first schedule's optional shortest-path trees, sized by it at 512 GPUs, took 1.3 s
    wall of a 1 s limit at load 12 on 2 cores (docs/allgather_history.md, "Steps no check point
    reached")."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):          # no load average on this platform
        return 1.0
    return min(1.0, max(_SHARE_MIN, (os.cpu_count() or 1) / max(load, 1e-9)))


def run_out(where: str) -> None:
    """Stop the innermost limit now, whichever it is: a compiled step sized to its time
    left (:func:`time_left`) cannot finish within it, so its result would come too late.
    A :func:`stage` is abandoned (as :func:`give_up`); the solve's own limit returns the
    best schedule offered so far.  A no-op without a limit."""
    limit = _current.get()
    if limit is not None:
        limit.stopped_in = where
        raise TimeLimitReached(where, limit)


def give_up(where: str) -> None:
    """Abandon the innermost :func:`stage` now, as when its sub-budget passes: a step
    sized to the time left (:func:`time_left`) found that it cannot finish within it,
    so waiting for the clock would only spend the rest of the allowance.  A no-op
    outside a stage (nothing to abandon: the caller carries on)."""
    limit = _current.get()
    if limit is not None and limit.is_stage:
        limit.stopped_in = where
        raise TimeLimitReached(where, limit)


def _solving_cpu() -> float:
    """This thread's CPU seconds so far, numba kernel loads left out."""
    return time.thread_time() - thread_kernel_cpu_seconds()


@contextmanager
def _entered(seconds: float, count_kernels: bool = True, since: float | None = None,
             cpu: bool = False) -> Iterator[Anytime]:
    parent = _current.get()
    wall = seconds / _SHARE_MIN if cpu else seconds
    deadline = (time.perf_counter() if since is None else since) + wall
    cpu_deadline = _solving_cpu() + seconds if cpu else None
    if parent is not None:
        deadline = min(deadline, parent.deadline)
        if parent.cpu_deadline is not None:
            cpu_deadline = min(cpu_deadline if cpu_deadline is not None else float("inf"),
                               parent.cpu_deadline)
    limit = Anytime(deadline, parent, kernels_from=None if count_kernels
                    else thread_kernel_seconds(), cpu_deadline=cpu_deadline)
    token = _current.set(limit)
    try:
        yield limit
    finally:
        _current.reset(token)


def limited(seconds: float | None, solve: Callable[[], T], since: float | None = None
            ) -> tuple[T | None, Anytime | None]:
    """``solve()`` under a limit of ``seconds`` from ``since`` (a ``time.perf_counter()``
    reading: when the caller was called, so its own preparation counts; default now):
    ``(its result, None)`` when it finished,
    ``(best offered, the Anytime)`` when the limit passed first, or when ``solve`` raised
    :class:`SolveError` after a schedule was offered (``Anytime.failure`` says why).
    ``seconds=None``: no limit, ``(solve(), None)``.  Raises :class:`SolveError` if the
    limit passed (or the solve failed) before any schedule was offered."""
    if seconds is None:
        return solve(), None
    with _entered(seconds, since=since) as limit:
        try:
            return solve(), None
        except TimeLimitReached as stop:
            if stop.owner is not limit:
                raise
        except SolveError as e:       # numerical trouble: the best so far still stands (issue 27)
            if limit.best is None:
                raise
            limit.failure = limit.stopped_in = str(e)
    if limit.best is None:
        raise SolveError(f"time limit of {seconds:g} s reached in {limit.stopped_in} before any "
                         "schedule was found; raise the time limit")
    return limit.best, limit          # type: ignore[return-value]


def stage(seconds: float, attempt: Callable[[], T], cpu: bool = False
          ) -> tuple[T | None, bool]:
    """Run one optional ``attempt`` with a sub-budget of ``seconds`` of solving (numba
    kernels compiled or loaded meanwhile do not count: a first call in a process must
    not look slow), inside any enclosing limit: ``(result, False)`` when it finished,
    ``(None, True)`` when the sub-budget passed first.  ``cpu``: ``seconds`` of this
    thread's CPU time (``time.thread_time``; a warm allowance, docs/allgather.md, *Warm
    caps in CPU seconds*), and at most ``seconds / _SHARE_MIN`` wall seconds (a thread
    that waits instead of computing); :func:`time_left` is then the nearer of the two.
    The enclosing limit passing propagates (the caller's caller handles it)."""
    with _entered(seconds, count_kernels=False, cpu=cpu) as limit:
        try:
            return attempt(), False
        except TimeLimitReached as stop:
            if stop.owner is not limit:
                raise
    return None, True

