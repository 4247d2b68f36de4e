"""Abort a collective stuck on a (nearly) dead link and re-run it on the new version
(docs/executor.md, "Aborting a stale collective").

The simulated loop aborts a collective stuck on a dead link and reruns it on the new
version (``abort_stale``, paper §3.3 / §6.2).  On real ranks the swap round of the
:class:`~executor_cuda.rescheduler.Rescheduler` runs on its own thread while the
training thread waits inside a collective, and decides alike on every rank "version
``v`` from sequence number ``K + 1`` on", ``K`` the collective in flight.  With
:class:`StaleAbort` that decision also ends the collective ``K`` in flight:

* **Abort.** A rank waiting for an emulated link to deliver (:meth:`StaleAbort.hold`)
  wakes as soon as a switch after its collective is decided (``schedule_switch`` wakes
  it) and stops waiting: every later round of the attempt runs at once (every posted
  send still meets its receive, so nothing is left in flight and no transfer is
  cancelled half-way), and the attempt's telemetry is dropped.
* **Agreement.** After every attempt the ranks all-reduce (MAX) one int64 on a gloo
  group of their own: the version of the switch decided after this collective, as this
  rank knows it (0: none).  A rank that finished its rounds before it heard of the
  decision learns it here, so every rank re-runs, or none does.  A peer that never
  answers (stopped, dead) ends it after the group's ``timeout_s`` with a
  :class:`~executor_cuda.timeouts.CollectiveTimeoutError` naming the collective and
  this rank, not gloo's bare ``RuntimeError``; a peer that answers a version this rank has
  not staged is an :class:`~mccl_opt.errors.MCCLError` saying so.
* **Re-run.** Every rank runs the same collective (same sequence number, same buffers)
  again on that version, from its start: the output is rewritten whole, so it equals
  the reference whatever the aborted attempt wrote.  The version is staged on every
  rank (the swap round chose it as staged everywhere).  A newer decision during the
  re-run aborts that attempt too.

While it waits, a rank also reads its links in windows that close on time
(:attr:`StaleAbort.on_progress`): every ``progress_s`` it reports each message still in
flight for at least that long with the bytes its emulated link delivered so far (a link
delivers at its rate from the sender's round start) over the seconds since, which is
what a transport's progress counter shows.  A link at 1 % of nominal is thus read within
``progress_s`` of its first message, not when the stale collective ends (100x a healthy
one).  Healthy messages finish well within a window and are read, as before, once they
completed.

What this needs from a real transport: that transfers in flight can be given up.  The
emulated links here (:mod:`executor_cuda.faults`) only delay delivery, so giving up
costs nothing; on NCCL a posted transfer cannot be cancelled (``ncclCommAbort`` and a new
communicator, seconds), so :class:`StaleAbort` runs CPU tensors only.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from mccl_opt.errors import InputError, MCCLError
from mccl_opt.schedule import Schedule

from .timeouts import CollectiveTimeoutError, check_seconds

__all__ = ["Abort", "StaleAbort"]

#: one reading of a message still in flight: (sender rank, bytes, bytes delivered so far, seconds since sent)
Reading = tuple[int, int, float, float]


@dataclass(frozen=True)
class Abort:
    """One aborted attempt on this rank (times on ``time.time``)."""

    seq: int
    from_version: int
    to_version: int
    started: float            # the attempt's start
    rerun: float              # the re-run's start (after the agreement)


class StaleAbort:
    """Aborts a communicator's collective in flight once a switch after it is decided,
    and re-runs it on the new version (module docstring).  Creating one is collective
    over ``peers`` (it creates its gloo group)."""

    def __init__(self, peers: Sequence[int], timeout_s: float = 30.0, progress_s: float = 0.02) -> None:
        check_seconds("progress_s", progress_s)
        check_seconds("timeout_s", timeout_s)
        self.timeout_s = timeout_s
        self.group = dist.new_group(ranks=list(peers), backend="gloo", timeout=timedelta(seconds=timeout_s))
        #: every aborted attempt on this rank, in order
        self.aborts: list[Abort] = []
        self.checks = 0
        #: called while waiting with ``(program, round, readings)`` of the messages in flight
        #: for at least ``progress_s`` (module docstring)
        self.on_progress: Callable[[Any, int, list[Reading]], None] | None = None
        self.progress_s = progress_s
        self._wake = threading.Event()
        self._seq = 0
        self._version = 0
        self.aborting = False

    def wake(self) -> None:
        """A switch was decided (any thread): a waiting rank looks whether it ends its attempt."""
        self._wake.set()

    def run(self, comm: Any, schedule: Schedule, seq: int, out: torch.Tensor, inp: torch.Tensor,
            block: int) -> Schedule:
        """Run collective ``seq`` on ``schedule`` (``comm.run_program``), aborted and re-run
        on a newer version as decided; returns the schedule that completed it."""
        if out.is_cuda:
            raise InputError("abort=True gives up emulated transfers in flight on CPU (gloo) ranks; "
                             "NCCL cannot cancel a posted transfer: create the Communicator without abort")
        while True:
            started = time.time()
            self._seq, self._version, self.aborting = seq, schedule.version, False
            comm.run_program(schedule, seq, out, inp, block)
            nxt = self._agree(comm, seq, schedule)
            if nxt is None:
                return schedule
            self.aborts.append(Abort(seq, schedule.version, nxt.version, started, time.time()))
            if comm.telemetry is not None:
                comm.telemetry.discard(seq)
            comm.switch_now(nxt)
            comm.trace.append((seq, nxt.collective, nxt.version))
            schedule = nxt

    def _agree(self, comm: Any, seq: int, schedule: Schedule) -> Schedule | None:
        """The all-reduce after an attempt: the schedule every rank re-runs it on, if any."""
        nxt = comm.switch_after(seq, schedule.collective)
        row = torch.tensor([nxt.version if nxt is not None and nxt.version > schedule.version else 0])
        start = time.monotonic()
        try:
            dist.all_reduce(row, op=dist.ReduceOp.MAX, group=self.group)
        except RuntimeError as exc:          # gloo: a peer timed out, died or reset the connection
            reason = (str(exc).strip().splitlines() or ["no detail"])[0][:160]
            waited = time.monotonic() - start        # a closed connection fails at once, not at the timeout
            raise CollectiveTimeoutError(
                f"{schedule.collective} #{seq}: rank {comm.rank} got no abort agreement from its peers "
                f"{list(comm.peers)} after {waited:.1f} s (timeout {self.timeout_s:g} s: {reason}); a peer "
                "stopped, died or hangs: this communicator cannot be used again, restart the job") from None
        self.checks += 1
        v = int(row[0])
        if v <= schedule.version:
            return None
        if nxt is None or nxt.version != v:
            nxt = comm.staged_version(schedule.collective, v)
        if nxt is None:
            raise MCCLError(f"{schedule.collective} #{seq}: ranks agreed to re-run it on version {v}, "
                            f"which rank {comm.rank} has not staged; every rank must be given the same versions")
        return nxt

    def hold(self, comm: Any, deliver_s: float, sent: list[tuple[int, int, float, float]], prog: Any,
             rnd: int, collective: str) -> None:
        """Wait until ``deliver_s`` (``time.time``) for the emulated links of round ``rnd``;
        ``sent``: ``(sender rank, bytes, sender's round start, emulated delay)`` of each
        message received.  Returns at once once the attempt is aborted."""
        read_at = time.time() + self.progress_s
        while not self.aborting:
            self._wake.clear()
            now = time.time()
            if now >= deliver_s:
                return
            nxt = comm.switch_after(self._seq, collective)
            if nxt is not None and nxt.version > self._version:
                self.aborting = True
                return
            if now >= read_at:
                read_at = now + self.progress_s
                readings = [(src, nbytes, nbytes * (now - t) / delay, now - t) for src, nbytes, t, delay in sent
                            if delay > 0 and t + delay > now and now - t >= self.progress_s]
                if readings and self.on_progress is not None:
                    self.on_progress(prog, rnd, readings)
            self._wake.wait(max(0.0, min(deliver_s, read_at) - now))
