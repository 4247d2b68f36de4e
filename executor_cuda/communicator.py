"""Run synthesized schedules on torch.distributed ranks (paper §3.3, the fast path).

:class:`Communicator` executes the per-rank program compiled by
:mod:`mccl_opt.lowering.program` with point-to-point operations
(``batch_isend_irecv``): NCCL with CUDA tensors, gloo with CPU tensors, one code path.
Rank ``r`` of the process group is GPU ``schedule.gpus[r]``.

Each round posts every receive and send of this rank, then waits for all of them;
a relay's forward of round ``t`` only reads data received in an earlier round, and
both ends of a message list the same segments in the same order, so the program
cannot deadlock and needs no tags.  Every collective gets a sequence number; a
schedule switch decided by the :class:`~executor_cuda.rescheduler.Rescheduler` takes
effect at the first sequence number after the agreed ``K`` (paper §6.2.2).

A communicator must be driven by one thread (like an NCCL communicator); ``stage``
may be called from any thread.

Every collective has a deadline: ``timeout_s`` beyond its expected time (``8 x block
bytes / rate`` of its schedule, times :data:`TIMEOUT_SLOWDOWN` for links running slower
than the schedule assumed).  A rank still waiting for a peer at the deadline (a stopped,
dead or hung peer) raises :class:`CollectiveTimeoutError`, so every live rank fails
within a few deadlines instead of the process group's timeout (30 min by default).  A
communicator that raised it must not be used again (like an aborted NCCL communicator).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from datetime import timedelta
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable, Iterator, Sequence

import torch
import torch.distributed as dist

from mccl_opt.errors import InputError, MCCLError, ScheduleError
from mccl_opt.piece_rule import PieceRule
from mccl_opt.schedule import Schedule

from .buffers import check_pair, gather_target, pack, scatter, view
from .faults import FaultInjector, hold_until
from mccl_opt.lowering.program import COLLECTIVES_EXEC, GlobalProgram, ProgramCache, direct_schedule
from .telemetry import Telemetry, cuda_event
from .timeouts import CollectiveTimeoutError, check_seconds

__all__ = ["Communicator", "CollectiveTimeoutError", "TIMEOUT_SLOWDOWN"]

STAMP_TAG = 1      # telemetry timestamps travel beside the data (gloo matches on tags)
#: how much slower than its schedule's rate a collective may run before the timeout
#: (a gray failure in the paper cuts a link to 1/8)
TIMEOUT_SLOWDOWN = 10.0


class Communicator:
    """AllGather / AllToAll over a process group with hot-swappable MCCL schedules.

    ``schedule`` is one :class:`Schedule` or several (at most one per collective); a
    collective without a schedule runs the direct fallback
    (:func:`~mccl_opt.lowering.program.direct_schedule`).  ``pipeline`` slices every chunk
    for pipelining through relays (an int: that many slices each; a
    :class:`~mccl_opt.piece_rule.PieceRule`: as many as the simulator's rule gives the
    chunk's bytes).  ``telemetry`` records per-peer transfer samples,
    ``faults`` emulates slow links.  ``hot_swap=True`` creates the gloo side group and
    the background :class:`~executor_cuda.rescheduler.Rescheduler` (collective: every
    rank must construct its communicator in the same order).  ``pieces >= 2`` runs every
    collective in that many pieces and lets a newer staged version take over between
    pieces, checked every ``check_every`` pieces
    (:class:`~executor_cuda.pieces.InFlightSwitch`; needs ``hot_swap``).  ``abort=True``
    ends a collective waiting on emulated links once a switch after it is decided and
    re-runs it on the new version (:class:`~executor_cuda.abort.StaleAbort`; needs
    ``hot_swap``, CPU tensors).
    """

    def __init__(self, process_group: dist.ProcessGroup | None = None,
                 schedule: Schedule | Sequence[Schedule] | None = None, *,
                 pipeline: int | PieceRule = 1, telemetry: Telemetry | None = None,
                 faults: FaultInjector | None = None, hot_swap: bool = True,
                 name: str = "mccl", stage_timeout: float = 5.0,
                 oob_timeout: float = 10.0, timeout_s: float | None = 10.0,
                 pieces: int = 1, check_every: int = 1, abort: bool = False) -> None:
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised; call "
                               "dist.init_process_group(...) before creating a Communicator")
        self.group = process_group if process_group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.world = dist.get_world_size(self.group)
        #: global rank of every group rank (rank order)
        self.peers = [dist.get_global_rank(self.group, r) if process_group is not None else r
                      for r in range(self.world)]
        if not isinstance(pipeline, PieceRule) and pipeline < 1:
            raise InputError(f"pipeline must be >= 1 or a PieceRule, got {pipeline}")
        if pieces < 1 or check_every < 1:
            raise InputError(f"pieces and check_every must be >= 1, got {pieces} and {check_every}")
        if (pieces > 1 or abort) and not hot_swap:
            raise InputError("pieces > 1 and abort switch versions in flight: each needs hot_swap=True")
        for label, secs in (("timeout_s", timeout_s), ("oob_timeout", oob_timeout), ("stage_timeout", stage_timeout)):
            check_seconds(label, secs, none_ok=label == "timeout_s")     # finite, > 0, at most a day
        #: seconds a collective may take beyond its expected time (None: no deadline)
        self.timeout_s = timeout_s
        self._deadline: tuple | None = None          # (deadline, budget, collective, seq, version)
        self.pipeline = pipeline
        self.telemetry = telemetry
        self.faults = faults
        self.name = name
        self.cache = ProgramCache()
        self._waiters: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self._seq = 0
        self._pending: list[tuple[int, Schedule]] = []
        #: block sizes each collective's programs ran with last (what staging compiles)
        self.recent_sizes: dict[str, set[int]] = {}
        #: (seq, collective, schedule version) of the last 4096 collectives issued here
        self.trace: deque[tuple[int, str, int]] = deque(maxlen=4096)
        schedules = [] if schedule is None else ([schedule] if isinstance(schedule, Schedule)
                                                  else list(schedule))
        gpus = schedules[0].gpus if schedules else tuple(f"rank{r}" for r in range(self.world))
        self.active: dict[str, Schedule] = {c: direct_schedule(c, gpus) for c in COLLECTIVES_EXEC}
        for s in schedules:
            self.check_schedule(s)
            self.active[s.collective] = s
        self.rescheduler = None
        if hot_swap:
            from .rescheduler import Rescheduler

            self.rescheduler = Rescheduler(self, stage_timeout=stage_timeout,
                                           oob_timeout=oob_timeout)
        self.inflight = None
        if pieces > 1:
            from .pieces import InFlightSwitch

            self.inflight = InFlightSwitch(self.peers, pieces, check_every, timeout_s=oob_timeout)
        self.aborter = None
        if abort:
            from .abort import StaleAbort

            self.aborter = StaleAbort(self.peers, timeout_s=oob_timeout)

    # ------------------------------------------------------------------ public API
    def all_gather_into_tensor(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        """``out[r*n:(r+1)*n] = inp`` of rank ``r`` (``n = inp.numel()``), like torch's."""
        check_pair(out, inp)
        if out.numel() != self.world * inp.numel():
            raise InputError(f"all_gather_into_tensor: output has {out.numel()} elements, "
                             f"expected world_size * input = {self.world * inp.numel()}")
        self._collective("allgather", out, inp, inp.numel())

    def all_to_all_single(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        """Block ``d`` of ``inp`` goes to rank ``d``; block ``s`` of ``out`` comes from ``s``."""
        check_pair(out, inp)
        if inp.numel() != out.numel() or inp.numel() % self.world:
            raise InputError(f"all_to_all_single: input ({inp.numel()}) and output "
                             f"({out.numel()}) must have the same size, divisible by the "
                             f"world size {self.world}")
        self._collective("alltoall", out, inp, inp.numel() // self.world)

    def stage(self, schedule: Schedule) -> None:
        """Hand a new schedule version to the background rescheduler (any thread).

        Every rank of the communicator must be given the same sequence of versions.
        """
        if self.rescheduler is None:
            raise RuntimeError("this Communicator was created with hot_swap=False")
        self.check_schedule(schedule)
        self.rescheduler.submit(schedule)

    def hold_version(self, collective: str, version: int) -> None:
        """The controller holds ``version`` of ``collective``: no rank swaps it in while
        any rank knows of the hold (docs/executor.md, "Swap holds"; any thread)."""
        if self.rescheduler is None:
            raise RuntimeError("this Communicator was created with hot_swap=False")
        self.rescheduler.hold(collective, version)

    def release_version(self, collective: str, version: int) -> None:
        """The controller released ``version``: it may be swapped in (any thread; every
        rank must be given the same releases, in order with the versions)."""
        if self.rescheduler is None:
            raise RuntimeError("this Communicator was created with hot_swap=False")
        self.rescheduler.release(collective, version)

    @property
    def seq(self) -> int:
        """Sequence number of the last issued collective."""
        return self._seq

    def check_schedule(self, schedule: Schedule) -> None:
        """Raise :class:`ScheduleError` if ``schedule`` cannot run on this group."""
        if schedule.collective not in COLLECTIVES_EXEC:
            raise ScheduleError(f"cannot execute a {schedule.collective!r} schedule")
        if len(schedule.gpus) != self.world:
            raise ScheduleError(f"schedule {schedule.collective} v{schedule.version} has "
                                f"{len(schedule.gpus)} GPUs but the process group has "
                                f"{self.world} ranks; synthesize it for this job's GPUs")

    def close(self) -> None:
        """Stop the rescheduler thread and flush telemetry."""
        if self.rescheduler is not None:
            self.rescheduler.close()
            self.rescheduler = None
        if self.telemetry is not None:
            self.telemetry.close()
        if self._waiters is not None:
            self._waiters.shutdown()
            self._waiters = None

    # ------------------------------------------------------------------ swap hooks
    # (the :class:`~executor_cuda.rescheduler.SwapTarget` protocol: ``name``, ``rank``,
    # ``world``, ``peers``, ``active``, ``prepare``, ``paused``, ``schedule_switch``)
    def prepare(self, schedule: Schedule) -> None:
        """Compile ``schedule`` for the block size its collective ran with last (fills
        the program cache, so the first collective after a swap does not compile)."""
        for block in sorted(self.recent_sizes.get(schedule.collective, ())):
            self.cache.get(schedule, block, self.pipeline)

    @contextmanager
    def paused(self) -> Iterator[int]:
        """Pause issuing collectives; yields the last issued sequence number."""
        with self._lock:
            yield self._seq

    def schedule_switch(self, schedule: Schedule, k: int) -> None:
        """Use ``schedule`` from sequence number ``k + 1`` on (call while :meth:`paused`)."""
        if k < self._seq:
            raise RuntimeError(f"switch point K={k} is before the last issued collective "
                               f"{self._seq}; the OOB exchange must run while paused")
        self._pending.append((k, schedule))
        if self.aborter is not None:
            self.aborter.wake()

    def switch_after(self, seq: int, collective: str) -> Schedule | None:
        """The newest schedule of ``collective`` decided to run from ``seq + 1`` on (any thread)."""
        with self._lock:
            found = [s for k, s in self._pending if k == seq and s.collective == collective]
        return max(found, key=lambda s: s.version, default=None)

    def staged_version(self, collective: str, version: int) -> Schedule | None:
        """``version`` of ``collective`` if this rank has it staged."""
        return None if self.rescheduler is None else self.rescheduler.staged.get((collective, version))

    def switch_now(self, schedule: Schedule) -> None:
        """Run ``schedule`` from now on (the in-flight switch, agreed by every rank)."""
        with self._lock:
            if schedule.version > self.active[schedule.collective].version:
                self.active[schedule.collective] = schedule

    # ------------------------------------------------------------------ execution
    def _issue(self, collective: str) -> tuple[int, Schedule]:
        with self._lock:
            self._seq += 1
            keep = []
            for k, sched in self._pending:
                if self._seq > k:
                    if sched.version > self.active[sched.collective].version:
                        self.active[sched.collective] = sched
                else:
                    keep.append((k, sched))
            self._pending = keep
            sched = self.active[collective]
            self.trace.append((self._seq, collective, sched.version))
            return self._seq, sched

    def _collective(self, collective: str, out: torch.Tensor, inp: torch.Tensor,
                    block: int) -> None:
        seq, schedule = self._issue(collective)
        if self.inflight is None:
            self.recent_sizes[collective] = {block}
            self.run_block(schedule, seq, out.view(-1), inp.view(-1), block)
        else:
            self.recent_sizes[collective] = self.inflight.sizes(block)
            self.inflight.run(self, collective, seq, schedule, out, inp, block)

    def run_block(self, schedule: Schedule, seq: int, out: torch.Tensor, inp: torch.Tensor,
                  block: int) -> Schedule:
        """Run ``schedule``'s program for ``block`` elements per block (aborted and re-run
        on a newer version with ``abort``); returns the schedule that completed it."""
        if self.aborter is None:
            self.run_program(schedule, seq, out, inp, block)
            return schedule
        return self.aborter.run(self, schedule, seq, out, inp, block)

    def run_program(self, schedule: Schedule, seq: int, out: torch.Tensor, inp: torch.Tensor,
                    block: int) -> None:
        """Run ``schedule``'s program for ``block`` elements per block, with its deadline."""
        prog = self.cache.get(schedule, block, self.pipeline)
        expected = 8.0 * block * out.element_size() / (schedule.rate_gbps * 1e9) \
            if schedule.rate_gbps > 0 else 0.0
        budget = None if self.timeout_s is None else self.timeout_s + TIMEOUT_SLOWDOWN * expected
        self._deadline = None if budget is None else (time.monotonic() + budget, budget, schedule.collective,
                                                      seq, schedule.version)
        self._run(prog, schedule.gpus, out, inp, seq)

    def _run(self, prog: GlobalProgram, gpus: Sequence[str], out: torch.Tensor,
             inp: torch.Tensor, seq: int) -> None:
        me = prog.ranks[self.rank]
        stage = (torch.empty(me.stage_numel, dtype=out.dtype, device=out.device)
                 if me.stage_numel else out[:0])
        bufs = (inp, out, stage)
        for s, d in me.copies:
            view(bufs, d).copy_(view(bufs, s))
        cuda = out.is_cuda
        held = self.faults is not None and not cuda     # CPU: links emulated at the receiver (faults)
        delay_of = self.faults.message_delay_s if self.faults else (lambda *_: 0.0)
        stamped = (self.telemetry is not None or held) and not cuda
        for rnd, (sends, recvs) in enumerate(me.rounds):
            if not sends and not recvs:
                continue
            ops, unpack, delayed, recv_meta = [], [], [], []
            t0 = time.time_ns()
            start = cuda_event(cuda)
            for m in recvs:
                tensor = gather_target(bufs, m.dst_segs, unpack)
                ops.append(dist.P2POp(dist.irecv, tensor, self.peers[m.src], self.group))
                nbytes = tensor.numel() * tensor.element_size()
                recv_meta.append((m.src, nbytes, delay_of(prog, rnd, m, nbytes) if held else 0.0))
            stamps_in = torch.zeros(len(recvs), dtype=torch.int64)
            if stamped:     # each sender tells when it was ready to send (its round start)
                stamp_out = torch.tensor([t0], dtype=torch.int64)
                ops += [dist.P2POp(dist.irecv, stamps_in[i:i + 1], self.peers[m.src],
                                   self.group, tag=STAMP_TAG) for i, m in enumerate(recvs)]
                ops += [dist.P2POp(dist.isend, stamp_out, self.peers[m.dst], self.group,
                                   tag=STAMP_TAG) for m in sends]
            sent_s = 0.0                 # the emulated time of this rank's slowest send
            for m in sends:
                tensor = pack(bufs, m.src_segs)
                delay = delay_of(prog, rnd, m, tensor.numel() * tensor.element_size())
                sent_s = max(sent_s, delay)
                if delay > 0 and not held:          # GPUs: the sender holds the send back
                    delayed.append((delay, m.dst, tensor))
                else:
                    ops.append(dist.P2POp(dist.isend, tensor, self.peers[m.dst], self.group))
            works = dist.batch_isend_irecv(ops) if ops else []
            recv_works, other = works[:len(recvs)], works[len(recvs):]
            timed = self._start_timing(recv_works) if stamped else None
            for delay, dst, tensor in sorted(delayed, key=lambda x: (x[0], x[1])):
                hold_until((t0 + delay * 1e9) / 1e9, time.time)
                other.append(dist.isend(tensor, self.peers[dst], self.group))
            # each wait names the peer it waits for (sends and stamp sends: the round's peers)
            known = len(recvs) if stamped else 0           # ``other`` starts with the stamp receives
            waits = [] if timed is not None else [(w, [m.src]) for w, m in zip(recv_works, recvs)]
            waits += [(w, [m.src]) for w, m in zip(other[:known], recvs)]
            waits += [(w, [m.src for m in recvs] + [m.dst for m in sends]) for w in other[known:]]
            for w, who in waits:
                self._wait(lambda t, w=w: _wait_work(w, t), who)
            for fut, m in zip(timed or (), recvs):
                self._wait(lambda t, f=fut: f.result(timeout=t), [m.src])
            if held:        # the round ends once the emulated links delivered what it sent and received
                sent = [(src, nb, s / 1e9, d) for s, (src, nb, d) in zip(stamps_in.tolist(), recv_meta)]
                deliver = max([t0 / 1e9 + sent_s] + [t + d for _, _, t, d in sent])
                if self.aborter is None:
                    hold_until(deliver, time.time)
                else:
                    self.aborter.hold(self, deliver, sent, prog, rnd, prog.collective)
            if self.aborter is None or not self.aborter.aborting:      # an aborted attempt reports nothing
                if self.telemetry is not None:
                    self.telemetry.record_round(recv_meta, gpus, self.rank, seq, t0, start, timed, stamps_in)
            for target, segs in unpack:
                scatter(bufs, segs, target)

    def _wait(self, done: Callable[[float | None], object], peers: list[int]) -> None:
        """``done(timeout_s)`` within the collective's deadline; a miss raises
        :class:`CollectiveTimeoutError` naming the peers of the round."""
        if self._deadline is None:
            done(None)
            return
        deadline, budget, collective, seq, version = self._deadline
        try:
            done(max(deadline - time.monotonic(), 1e-3))
            return
        except Exception:               # gloo and NCCL raise RuntimeError subclasses on a timeout
            if time.monotonic() < deadline - 1e-3:
                raise
        raise CollectiveTimeoutError(
            f"{collective} #{seq} (schedule v{version}) on rank {self.rank}: no progress with rank(s) "
            f"{sorted(set(peers))} within {budget:.3g} s; a peer is stopped, dead or hung.  This "
            "communicator cannot be used again: restart the job (Communicator(timeout_s=...) sets "
            "the margin above the expected time)")

    def _start_timing(self, works: list) -> list:
        """Wait on each gloo receive in its own pool thread, so that each completion time
        is its own (gloo p2p works only complete inside ``wait()``)."""
        if self._waiters is None:
            self._waiters = ThreadPoolExecutor(max_workers=max(1, self.world - 1),
                                               thread_name_prefix="mccl-recv-timer")
        left = None if self._deadline is None else max(self._deadline[0] - time.monotonic(), 1e-3)
        return [self._waiters.submit(_timed_wait, w, left) for w in works]


def _wait_work(work, timeout_s: float | None) -> None:
    if timeout_s is None:
        work.wait()
    else:
        work.wait(timeout=timedelta(seconds=timeout_s))


def _timed_wait(work, timeout_s: float | None) -> int:
    _wait_work(work, timeout_s)
    return time.time_ns()
