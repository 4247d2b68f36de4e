"""In-flight schedule switch on real ranks: a collective run in pieces, with an agreed
switch point between pieces (docs/executor.md, "In-flight switch").

The simulated loop aborts a collective stuck on a dead link and reruns it on the new
version (``abort_stale``, paper §3.3 / §6.2).  A real executor cannot abort a posted
transfer safely (NCCL cannot cancel one; gloo can only time out), so instead the
collective is cut into ``pieces`` element ranges of every block (``[floor(i B / P),
floor((i + 1) B / P))``, some empty when ``B < P``); each piece is a
complete collective of its own (the schedule's program compiled for the piece size), so
pieces may run different schedule versions and the result is still exact.  Before
every ``check_every``-th piece boundary every rank contributes ``[v, -v]``, ``v`` the
newest version it has staged and does not know to be held
(:meth:`~executor_cuda.rescheduler.Rescheduler.swappable`, or the running version),
to ONE all-reduce (MAX) on a gloo group of its own; when the maximum equals the minimum
and is newer than the running version, every rank has that version staged and every
rank switches at this boundary: the rest of the collective and every later one run it.
Every rank runs the same number of pieces and checks whatever it knows, so a version
that reaches the ranks at different times delays the switch to a later boundary, never
a deadlock.  Cost: one 16-byte all-reduce per check (``(pieces - 1) // check_every``
per collective) and, with CUDA tensors, a stream synchronisation before it (so that the
boundary is a real point of progress, not a point the host reached ahead of the GPU),
plus one copy of each piece in and out of contiguous buffers.

A link that nearly dies (1 % of nominal) makes the collective in flight up to 100x
slower; telemetry read only when a collective ends would wait for it, and so would the
swap.  With ``on_piece`` the caller reads telemetry after every piece (the real-rank
loop does, :mod:`executor_cuda.scenario_rank`): the controller hears of the drop
after one or two pieces, and the new version takes over at a later piece boundary of
the same collective, so the stale collective costs at most a few pieces on the dead
link instead of holding the swap for its whole duration.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist

from mccl_opt.errors import InputError
from mccl_opt.lowering.program import slice_bounds
from mccl_opt.schedule import Schedule

__all__ = ["InFlightSwitch"]


class InFlightSwitch:
    """Runs a communicator's collectives in ``pieces`` and switches to a newer staged
    version between pieces when every rank has it (module docstring).  Creating one is
    collective over ``peers`` (it creates its gloo group)."""

    def __init__(self, peers: list[int], pieces: int, check_every: int = 1, timeout_s: float = 30.0) -> None:
        if pieces < 2:
            raise InputError(f"pieces must be >= 2 for an in-flight switch, got {pieces}")
        if check_every < 1:
            raise InputError(f"check_every must be >= 1, got {check_every}")
        self.pieces, self.check_every = pieces, check_every
        self.group = dist.new_group(ranks=list(peers), backend="gloo", timeout=timedelta(seconds=timeout_s))
        #: (seq, piece, version) of every in-flight switch on this rank
        self.switches: list[tuple[int, int, int]] = []
        self.checks = 0
        #: called after every non-empty piece with its schedule and piece size (elements per
        #: block): a caller that reports telemetry per piece sees a link that slowed mid-collective
        self.on_piece: Callable[[Schedule, int], None] | None = None

    def sizes(self, block: int) -> set[int]:
        """The distinct non-empty piece sizes of a block (what staging compiles)."""
        return {hi - lo for lo, hi in slice_bounds(block, self.pieces) if hi > lo}

    def run(self, comm: Any, collective: str, seq: int, schedule: Schedule, out: torch.Tensor,
            inp: torch.Tensor, block: int) -> None:
        """One collective of ``block`` elements per block, piece by piece
        (``comm.run_block`` runs one piece on a schedule)."""
        n = comm.world
        for j, (lo, hi) in enumerate(slice_bounds(block, self.pieces)):
            if j and j % self.check_every == 0:
                schedule = self._check(comm, collective, seq, j, schedule, out)
            if hi == lo:
                continue
            b = hi - lo
            if collective == "alltoall":
                pin = inp.view(n, block)[:, lo:hi].contiguous().view(-1)
            else:
                pin = inp.view(-1)[lo:hi]
            pout = torch.empty(n * b, dtype=out.dtype, device=out.device)
            schedule = comm.run_block(schedule, seq, pout, pin, b)     # a newer one if aborted (.abort)
            out.view(n, block)[:, lo:hi].copy_(pout.view(n, b))
            if self.on_piece is not None:
                self.on_piece(schedule, b)

    def _check(self, comm: Any, collective: str, seq: int, piece: int, schedule: Schedule,
               like: torch.Tensor) -> Schedule:
        """The agreement before ``piece`` (collective): the schedule the rest runs."""
        if like.is_cuda:
            torch.cuda.current_stream(like.device).synchronize()
        cand = comm.rescheduler.swappable(collective, schedule.version) if comm.rescheduler else None
        v = cand.version if cand is not None else schedule.version
        row = torch.tensor([v, -v], dtype=torch.int64)
        dist.all_reduce(row, op=dist.ReduceOp.MAX, group=self.group)
        self.checks += 1
        newest, oldest = int(row[0]), -int(row[1])
        if newest != oldest or newest <= schedule.version:   # cand is this version on every rank
            return schedule
        comm.switch_now(cand)
        self.switches.append((seq, piece, cand.version))
        return cand
