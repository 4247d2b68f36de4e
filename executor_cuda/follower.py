"""Follow the controller's published versions of one collective on an executor rank, and
stop following at a version every rank agrees on (docs/executor.md, "Hot-swap" and
"Stopping: the agreed last version"; docs/runtime.md, "Protocol and service").

The rescheduler picks one switch point ``K`` for a version only when every rank is
given the same sequence of versions (paper §5: the ranks agree on the collective where
the new schedule starts).  A listener that each rank simply stops on its own breaks
this at the end of a job: a version published at that moment reaches some ranks and
not others, and its swap round waits ``oob_timeout`` for the missing ranks or aborts.
:class:`VersionFollower` stages versions as they arrive and, in :meth:`finish`, first
agrees on the newest version any rank staged (one all-reduce, MAX) and stages exactly
up to it on every rank before it stops.  :func:`agree_first` does the same at the
start: every rank begins on the same version of the schedule.

Swap holds (docs/executor.md, "Swap holds from the controller") arrive on the same
subscription (:class:`~mccl_runtime.client.HoldUpdate`) and are passed on in order:
a hold to :meth:`Communicator.hold_version` at once, a release to
:meth:`Communicator.release_version` (it may run one more swap round, so releases are
counted, and :meth:`finish` agrees on their number as it does on the last version).
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable, Protocol

from mccl_opt.errors import MCCLError
from mccl_opt.schedule import Schedule

__all__ = ["VersionFollower", "VersionTimeoutError", "agree_first"]

#: ``(comm, name, version, schedule)``, as :meth:`mccl_runtime.client.Subscription.recv` returns
Update = tuple[str, str, int, Schedule]


class _Hold(Protocol):
    """A :class:`mccl_runtime.client.HoldUpdate` (``links`` empty: a release)."""

    comm: str
    name: str
    version: int
    links: tuple[tuple[str, str], ...]


class VersionTimeoutError(MCCLError):
    """The version the ranks agreed to stop at did not reach this rank in time."""


class _Subscription(Protocol):
    def recv(self, timeout_s: float) -> Update | _Hold | None: ...


class VersionFollower:
    """Stages every newer published version of ``comm_name``/``name`` on ``comm``.

    ``comm`` is an :class:`~executor_cuda.communicator.Communicator` (anything with
    ``stage(schedule)`` and ``active``), ``subscription`` a connected
    :class:`~mccl_runtime.client.Subscription` (call its ``wait_connected`` first, or
    versions published before the connection are missed).  ``comm_name=None`` accepts
    every communicator name.  A listener thread receives updates; a version is staged
    only if it is newer than every version seen before (the initial schedule's
    included), so duplicates and stale updates are dropped and versions are staged in
    increasing order.  ``on_version(version, schedule)`` is called once per staged
    version, just before it is staged.  :attr:`staged` lists the staged versions.
    """

    def __init__(self, comm: Any, subscription: _Subscription, comm_name: str | None, name: str,
                 collective: str, on_version: Callable[[int, Schedule], None] | None = None,
                 poll_s: float = 0.1) -> None:
        self.comm, self.sub = comm, subscription
        self.comm_name, self.name = comm_name, name
        self.on_version = on_version
        self.poll_s = poll_s
        self.collective = collective
        self.last = int(comm.active[collective].version)       # newest version staged (or initial)
        self._initial = self.last
        self.limit: float = math.inf                           # stage nothing newer than this
        self.releases = 0                                      # releases passed to comm
        self.release_limit: float = math.inf                   # pass no more releases than this
        self.staged: list[int] = []
        self.error: BaseException | None = None
        self._seen = self.last                                 # newest version received
        self._pending: list[Update | _Hold] = []               # received, beyond a limit
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="mccl-version-follower", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ receiving
    def _listen(self) -> None:
        recv = getattr(self.sub, "recv_any", self.sub.recv)
        while not self._stop.is_set():
            upd = recv(self.poll_s)
            if upd is None:
                continue
            try:
                self.offer(upd)
            except Exception as exc:  # noqa: BLE001 - re-raised by finish() on this rank
                with self._cond:
                    self.error = exc
                    self._cond.notify_all()
                return

    def offer(self, upd: Update | _Hold) -> None:
        """Take one received update (the listener thread calls this for every update)."""
        if not isinstance(upd, tuple):
            self._offer_hold(upd)
            return
        comm_name, name, version, schedule = upd
        if not self._mine(comm_name, name):
            return
        with self._cond:
            if version <= self._seen:                  # a duplicate, or older than one seen
                return
            self._seen = version
            self._pending.append(upd)                  # increasing, since version > _seen
            self._admit()

    def _mine(self, comm_name: str, name: str) -> bool:
        return name == self.name and (self.comm_name is None or comm_name == self.comm_name)

    def _offer_hold(self, upd: _Hold) -> None:
        """A swap hold or release of a version newer than the initial one (every rank
        subscribed before it was published, so every rank gets the same ones)."""
        if not self._mine(upd.comm, upd.name) or upd.version <= self._initial:
            return
        with self._cond:
            self._pending.append(upd)
            self._admit()

    def _admit(self) -> None:
        """Pass on the pending updates in order: versions up to :attr:`limit`, releases
        up to :attr:`release_limit` (holding the condition's lock)."""
        while self._pending:
            upd = self._pending[0]
            if isinstance(upd, tuple):
                _, _, version, schedule = upd
                if version > self.limit:
                    break
                if self.on_version is not None:
                    self.on_version(version, schedule)
                self.comm.stage(schedule)
                self.last = version
                self.staged.append(version)
            elif upd.links:
                self.comm.hold_version(self.collective, upd.version)
            elif self.releases < self.release_limit:
                self.comm.release_version(self.collective, upd.version)
                self.releases += 1
            else:
                break
            self._pending.pop(0)
        self._cond.notify_all()

    # ------------------------------------------------------------------ stopping
    def hold(self) -> int:
        """Stage nothing newer than what is staged now and pass on no more releases
        (updates arriving meanwhile wait); returns that newest staged version, this
        rank's input to the agreement (with :attr:`releases`)."""
        with self._cond:
            self.limit = self.last
            self.release_limit = self.releases
            return self.last

    def release(self, agreed: int, timeout_s: float, releases: int | None = None) -> None:
        """Stage exactly the versions up to ``agreed`` and pass on exactly ``releases``
        swap releases (default: those passed on already), waiting up to ``timeout_s``
        for those not received yet, then stop listening.  Raises
        :class:`VersionTimeoutError` when ``agreed`` did not arrive, or the error that
        stopped the listener (e.g. a :class:`~mccl_opt.errors.ScheduleError` from staging)."""
        try:
            with self._cond:
                self.limit = agreed
                self.release_limit = self.releases if releases is None else releases
                self._admit()
                self._cond.wait_for(lambda: (self.last >= agreed and self.releases >= self.release_limit)
                                    or self.error is not None, timeout_s)
        finally:
            self.close()
        if self.error is not None:
            raise self.error
        if self.releases < self.release_limit:
            raise VersionTimeoutError(
                f"the ranks agreed on {self.release_limit:g} swap releases of {self.comm_name or '*'}/"
                f"{self.name}, but this rank received {self.releases} within {timeout_s:g} s")
        if self.last < agreed:
            raise VersionTimeoutError(
                f"the ranks agreed to stage {self.comm_name or '*'}/{self.name} up to version "
                f"{agreed}, but this rank received only up to version {self._seen} within "
                f"{timeout_s:g} s: the controller's update did not reach it (subscribe and "
                f"wait_connected before the first version is fetched, or raise timeout_s)")

    def finish(self, group: Any = None, timeout_s: float = 20.0) -> int:
        """Collective over ``group`` (default: the world group): agree on the newest
        version any rank staged (all-reduce MAX), stage exactly up to it, stop.
        Returns the agreed version; every rank has then staged the same versions."""
        agreed, releases = _max_over_ranks([self.hold(), self.releases], group)
        self.release(agreed, timeout_s, releases)
        return agreed

    def close(self) -> None:
        """Stop the listener thread (at most ``poll_s`` later); staged versions stay staged."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()


def agree_first(fetch: Callable[[], Schedule], group: Any = None, attempts: int = 10) -> Schedule:
    """Collective over ``group``: the first schedule, the same version on every rank.

    Each rank fetches the controller's current version (``fetch``, e.g. from
    ``ControllerClient.get_schedule``); a version published while the ranks fetch would
    start them on different schedules.  The ranks all-reduce (MAX) ``[version,
    -version]``; until the newest and oldest agree, ranks behind fetch again.  Subscribe
    before calling this, so that no later version is missed (docs/executor.md,
    "Stopping: the agreed last version").  Raises :class:`VersionTimeoutError` after
    ``attempts`` rounds without agreement.
    """
    sched = fetch()
    for _ in range(attempts):
        newest, oldest = _max_over_ranks([sched.version, -sched.version], group)
        if newest == -oldest:
            return sched
        if sched.version < newest:
            sched = fetch()
    raise VersionTimeoutError(f"the ranks fetched different first schedule versions {attempts} "
                              f"times in a row (this rank: {sched.version}); the controller "
                              f"publishes faster than the ranks start: retry, or raise attempts")


def _max_over_ranks(values: list[int], group: Any) -> list[int]:
    """Element-wise MAX of ``values`` over the ranks of ``group`` (on the GPU for NCCL)."""
    import torch
    import torch.distributed as dist

    device = (torch.device("cuda", torch.cuda.current_device())
              if dist.get_backend(group) == "nccl" else torch.device("cpu"))
    row = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(row, op=dist.ReduceOp.MAX, group=group)
    return [int(v) for v in row.tolist()]
