"""Online rescheduler: stage new schedule versions and hot-swap them (paper §3.3, §6.2.2).

Each :meth:`Rescheduler.submit` starts one *swap round* on a background thread:

1. **Stage**: compile the new version for the sizes the communicator ran recently
   (filling its program cache) within ``stage_timeout``.  On gloo every peer
   connection exists from init; on NCCL the new peers' connections are created lazily
   by the first collective that uses them (nothing is sent from this thread, so no
   message can interleave with the training thread's).
2. **Arrival**: each rank writes ``arrive/<round>/<rank>`` to the store and waits up to
   ``oob_timeout`` for all ranks.  The outcome is made atomic with ``compare_set`` on
   ``gate/<round>``: the first rank to decide writes ``go`` (all arrived) or ``abort``
   (timeout); every rank follows the stored value, so ranks never disagree.
3. **OOB all-gather** (only on ``go``, so every rank is present and it cannot hang):
   with issuing paused, ranks exchange one fixed-size int64 row each with a single
   tensor collective on a gloo side group (no pickling; an all-to-all of the
   replicated row, one hop instead of gloo's all-gather ring):
   ``[round, collective, version, last issued seq, newest staged versions...]``
   (see :func:`encode_row`).  The newest version staged on *every*
   rank (the paper's minimum of the newest staged versions) is selected and
   ``K = max seq``: collectives up to ``K`` use the old schedule, later ones the new.
   Every rank decides from the same gathered rows, so all ranks agree.

If a rank did not stage the version (failure or ``stage_timeout``) the selected
version is the old one; if a rank does not arrive within ``oob_timeout`` the round is
aborted.  Either way every rank keeps the old schedule and the event is logged
(:attr:`Rescheduler.events`).  Swaps are per communicator.

**Swap holds** (docs/executor.md, "Swap holds from the controller"): the controller
may tell the ranks that a published version must not be swapped in yet (a link it
relies on changed since its synthesis; :meth:`hold`) and later that it may
(:meth:`release`).  Each advertised version carries this rank's knowledge of its hold
(``UNHELD``, ``HELD``, ``RELEASED``; the controller's state only moves forward, so the
furthest state any rank has seen is the controller's latest one the ranks know of): a
version is swappable only if its highest state over the rows is not ``HELD``.  A round
whose own version is common but held ends ``held`` on every rank (the same rows); the
release of that version then runs one more round for it, queued behind every version
the rank received before the release, so every rank runs the same sequence of rounds.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, ContextManager, Iterable, Mapping, Protocol

import torch
import torch.distributed as dist

from mccl_opt.schedule import Schedule

from mccl_opt.lowering.program import COLLECTIVES_EXEC

__all__ = ["Decision", "Rescheduler", "SwapEvent", "SwapTarget", "decide", "encode_row",
           "UNHELD", "HELD", "RELEASED"]

log = logging.getLogger(__name__)

#: staged versions newer than the active one that a rank advertises (newest first); an
#: older common version beyond these is ignored (the round then keeps the old schedule)
MAX_ADVERTISED = 8
_HEADER = 4                       # round, collective index, round's version, last seq
_SEQ = 3
_VERSIONS = _HEADER + MAX_ADVERTISED      # hold states first, then the versions
ROW_LEN = _HEADER + 2 * MAX_ADVERTISED
_NONE = -(2 ** 63)                # padding of unused version slots
#: a rank's knowledge of a version's swap hold (ordered: the controller's state only moves up)
UNHELD, HELD, RELEASED = 0, 1, 2


def encode_row(rnd: int, collective: str, version: int, last_seq: int,
               staged: Iterable[int], states: Mapping[int, int] | None = None) -> torch.Tensor:
    """This rank's OOB row: ``[round, collective index, round's version, last issued seq,
    hold state of each advertised version, newest staged versions (at most
    MAX_ADVERTISED, descending, padded)]``, int64.  ``states``: version -> ``UNHELD``,
    ``HELD`` or ``RELEASED`` as this rank knows it (default ``UNHELD``)."""
    newest = sorted(set(staged), reverse=True)[:MAX_ADVERTISED]
    row = torch.full((ROW_LEN,), _NONE, dtype=torch.int64)
    row[:_HEADER] = torch.tensor([rnd, COLLECTIVES_EXEC.index(collective), version, last_seq])
    row[_HEADER:_HEADER + len(newest)] = torch.tensor([(states or {}).get(v, UNHELD) for v in newest],
                                                      dtype=torch.int64)
    row[_VERSIONS:_VERSIONS + len(newest)] = torch.tensor(newest, dtype=torch.int64)
    return row


@dataclass(frozen=True)
class Decision:
    """Outcome of one OOB exchange, identical on every rank (computed from the same rows)."""

    best: int | None              # newest swappable version staged on every rank; None: keep old
    k: int                        # last sequence number that runs the old schedule
    missing: list[int]            # ranks that did not stage the round's version
    held: list[int] = field(default_factory=list)   # versions staged everywhere but held


def decide(rows: torch.Tensor, rnd: int, collective: str, version: int) -> Decision:
    """Choose the version and ``K`` from the gathered ``(world, ROW_LEN)`` rows (§6.2.2):
    the newest version every rank staged whose furthest hold state over the ranks is
    not ``HELD``, and ``K = max`` of the last issued seqs."""
    expect = torch.tensor([rnd, COLLECTIVES_EXEC.index(collective), version])
    bad = [r for r in range(rows.shape[0]) if not torch.equal(rows[r, :3], expect)]
    if bad:
        raise RuntimeError(f"ranks {bad} are in a different swap round than (round {rnd}, "
                           f"{collective} v{version}): {rows[:, :3].tolist()}; every rank "
                           "must be given the same sequence of versions")
    state: dict[int, int] = {}
    for r in rows.tolist():
        for st, v in zip(r[_HEADER:_VERSIONS], r[_VERSIONS:]):
            if v != _NONE:
                state[v] = max(state.get(v, UNHELD), st)
    sets = [set(r[_VERSIONS:].tolist()) - {_NONE} for r in rows]
    common = set.intersection(*sets)
    held = sorted(v for v in common if state[v] == HELD)
    free = common.difference(held)
    return Decision(best=max(free) if free else None, k=int(rows[:, _SEQ].max()),
                    missing=[r for r, vs in enumerate(sets) if version not in vs], held=held)


@dataclass
class SwapEvent:
    """What one swap round decided on this rank (times in seconds)."""

    round: int
    collective: str
    version: int
    outcome: str                  # "switch", "keep-old", "held", "abort"
    k: int | None = None
    from_version: int | None = None
    reason: str = ""
    stage_s: float = 0.0
    arrive_s: float = 0.0
    oob_s: float = 0.0            # issuing paused: lock held, exchange, decision
    total_s: float = 0.0
    ranks_missing: list[int] = field(default_factory=list)


class SwapTarget(Protocol):
    """What the rescheduler needs from the communicator whose schedules it swaps
    (:class:`~executor_cuda.communicator.Communicator` implements it)."""

    name: str                         # prefix of this communicator's store keys
    rank: int
    world: int
    peers: list[int]                  # global rank of every group rank
    active: dict[str, Schedule]       # the schedule each collective runs now

    def prepare(self, schedule: Schedule) -> None:
        """Compile ``schedule`` for the sizes run recently (staging)."""

    def paused(self) -> ContextManager[int]:
        """Hold issuing; yields the last issued sequence number."""

    def schedule_switch(self, schedule: Schedule, k: int) -> None:
        """Run ``schedule`` from sequence number ``k + 1`` on (while paused)."""


class Rescheduler:
    """Background hot-swap engine of one communicator (a :class:`SwapTarget`; see the
    module docstring).

    ``stage_hook(schedule)`` runs during staging (tests use it to make a rank never
    finish staging).  Creating one is collective (it creates the gloo side group).
    """

    def __init__(self, comm: SwapTarget, *, stage_timeout: float = 5.0,
                 oob_timeout: float = 10.0, store: Any = None,
                 stage_hook: Callable[[Schedule], None] | None = None) -> None:
        self.comm = comm
        self.stage_timeout = stage_timeout
        self.oob_timeout = oob_timeout
        self.stage_hook = stage_hook
        self.events: list[SwapEvent] = []
        self.staged: dict[tuple[str, int], Schedule] = {}
        base = store if store is not None else dist.distributed_c10d._get_default_store()
        self.store = dist.PrefixStore(f"mccl_exec/{comm.name}/", base)
        self.side_group = dist.new_group(ranks=list(comm.peers), backend="gloo",
                                         timeout=timedelta(seconds=oob_timeout))
        self._round = 0                       # swap rounds run (numbered on the rescheduler thread)
        self._items = 0                       # items queued (versions and releases)
        self._submit_lock = threading.Lock()
        self._done = threading.Condition()
        self._finished = 0
        #: this rank's knowledge of each (collective, version)'s swap hold
        self.holds: dict[tuple[str, int], int] = {}
        self._held_out: set[tuple[str, int]] = set()   # rounds that ended ``held``
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="mccl-rescheduler", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public
    def submit(self, schedule: Schedule) -> int:
        """Queue a swap round for ``schedule``; returns its queue position."""
        return self._put(("round", schedule))

    def hold(self, collective: str, version: int) -> None:
        """The controller holds ``version``: it is not swapped in (any thread)."""
        key = (collective, version)
        if self.holds.get(key, UNHELD) != RELEASED:
            self.holds[key] = HELD

    def release(self, collective: str, version: int) -> int:
        """The controller released ``version``: it may be swapped in; if its round ended
        ``held``, one more round for it runs (queued behind what was submitted before)."""
        self.holds[(collective, version)] = RELEASED
        return self._put(("release", (collective, version)))

    def swappable(self, collective: str, above: int) -> Schedule | None:
        """The newest staged version of ``collective`` newer than ``above`` that this
        rank does not know to be held (the in-flight check's input), or ``None``."""
        best = None
        for (coll, version), sched in list(self.staged.items()):
            if (coll == collective and version > above and self.holds.get((coll, version)) != HELD
                    and (best is None or version > best.version)):
                best = sched
        return best

    def _put(self, item: tuple[str, Any]) -> int:
        with self._submit_lock:
            self._items += 1
            self._queue.put(item)
            return self._items

    def wait(self, rounds: int | None = None, timeout: float | None = None) -> bool:
        """Block until the first ``rounds`` queued items (default: all) have finished."""
        target = self._items if rounds is None else rounds
        with self._done:
            return self._done.wait_for(lambda: self._finished >= target, timeout)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    # ------------------------------------------------------------------ rounds
    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            kind, what = item
            if kind == "release":
                sched = self._retry(what)
                if sched is None:
                    self._item_done()
                    continue
            else:
                sched = what
            self._round += 1
            try:
                ev = self._swap_round(self._round, sched)
            except Exception as exc:  # noqa: BLE001 - a failed swap must not kill training
                ev = SwapEvent(self._round, sched.collective, sched.version, "abort",
                               reason=f"swap round failed: {exc!r}")
            self.events.append(ev)
            level = logging.INFO if ev.outcome == "switch" else logging.WARNING
            log.log(level, "rank %d swap round %d (%s v%d): %s K=%s %s", self.comm.rank,
                    ev.round, ev.collective, ev.version, ev.outcome, ev.k, ev.reason)
            self._item_done()

    def _retry(self, key: tuple[str, int]) -> Schedule | None:
        """The schedule to run one more round for on a release: the version's round
        ended ``held`` (the same on every rank) and it is still staged."""
        if key not in self._held_out:
            return None
        self._held_out.discard(key)
        return self.staged.get(key)

    def _item_done(self) -> None:
        with self._done:
            self._finished += 1
            self._done.notify_all()

    def _stage(self, schedule: Schedule) -> None:
        if self.stage_hook is not None:
            self.stage_hook(schedule)
        self.comm.prepare(schedule)
        self.staged[(schedule.collective, schedule.version)] = schedule

    def _stage_with_timeout(self, schedule: Schedule) -> str:
        """Stage on a daemon thread; returns '' or why staging did not complete."""
        errors: list[BaseException] = []

        def run() -> None:
            try:
                self._stage(schedule)
            except BaseException as exc:  # noqa: BLE001 - reported in the swap event
                errors.append(exc)

        worker = threading.Thread(target=run, name="mccl-stage", daemon=True)
        worker.start()
        worker.join(self.stage_timeout)
        if worker.is_alive():
            return f"staging did not finish within {self.stage_timeout} s"
        return f"staging failed: {errors[0]!r}" if errors else ""

    def _swap_round(self, rnd: int, schedule: Schedule) -> SwapEvent:
        t0 = time.perf_counter()
        coll, version = schedule.collective, schedule.version
        ev = SwapEvent(rnd, coll, version, "keep-old")
        ev.reason = self._stage_with_timeout(schedule)
        t1 = time.perf_counter()
        ev.stage_s = t1 - t0

        n, me = self.comm.world, self.comm.rank
        self.store.set(f"arrive/{rnd}/{me}", "1")
        try:
            self.store.wait([f"arrive/{rnd}/{r}" for r in range(n)],
                            timedelta(seconds=self.oob_timeout))
            mine = "go"
        except Exception:  # noqa: BLE001 - store timeouts raise backend-specific errors
            mine = "abort"
        gate = self.store.compare_set(f"gate/{rnd}", "", mine).decode()
        t2 = time.perf_counter()
        ev.arrive_s = t2 - t1
        if gate != "go":
            ev.outcome = "abort"
            ev.reason = (f"not every rank reached swap round {rnd} within "
                         f"{self.oob_timeout} s; keeping the old schedule")
            ev.ranks_missing = [r for r in range(n) if not self.store.check([f"arrive/{rnd}/{r}"])]
            ev.total_s = t2 - t0
            return ev

        active = self.comm.active[coll]
        # the active version too: an in-flight switch (.pieces) may have taken a staged
        # version on some ranks before they build their row, not yet on others
        newer = [v for (c, v) in list(self.staged) if c == coll and v >= active.version]
        row = encode_row(rnd, coll, version, 0, newer,
                         {v: self.holds.get((coll, v), UNHELD) for v in newer})
        # ONE fixed-size collective, posted as an all-to-all of the replicated row: gloo's
        # all-gather is a ring (world - 1 dependent hops, 17-20 ms on 8 ranks here), its
        # all-to-all posts every send at once (one hop, 6-9 ms)
        send, rows = row.repeat(n, 1), torch.empty((n, ROW_LEN), dtype=torch.int64)
        with self.comm.paused() as last_seq:
            t3 = time.perf_counter()
            send[:, _SEQ] = last_seq
            dist.all_to_all_single(rows.view(-1), send.view(-1), group=self.side_group)
            dec = decide(rows, rnd, coll, version)
            ev.from_version, ev.k = active.version, dec.k
            if dec.best is not None:
                self.comm.schedule_switch(self.staged[(coll, dec.best)], dec.k)
                ev.outcome, ev.version = "switch", dec.best
            ev.oob_s = time.perf_counter() - t3
        if version in dec.held:                   # the same on every rank: its release runs a round
            self._held_out.add((coll, version))
        if dec.best is not None:
            for key in [key for key in self.staged if key[0] == coll and key[1] < dec.best]:
                del self.staged[key]
            self._held_out = {key for key in self._held_out if key[0] != coll or key[1] > dec.best}
        elif version in dec.held:
            ev.outcome = "held"
            ev.reason = f"the controller holds version {version}; it runs once released"
        else:
            ev.ranks_missing = dec.missing
            ev.reason = ev.reason or (f"version {version} is not staged on ranks "
                                      f"{dec.missing}; keeping the old schedule")
        ev.total_s = time.perf_counter() - t0
        return ev
