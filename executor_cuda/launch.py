"""Run a function on N forked CPU ranks (gloo) with a hard timeout: tests, benchmarks
and demos of the executor on one machine.

Each rank calls ``fn(rank, world, *args)`` after ``init_process_group("gloo")`` on a
FileStore in a fresh temporary directory; return values come back through a pipe.
A rank that fails, dies (killed) or hangs (stopped) is named in one :class:`RankFailure`;
on timeout every child is killed and the run fails, naming the ranks still running.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import re
import signal
import tempfile
import time
import traceback
from multiprocessing.connection import wait
from typing import Any, Callable

from mccl_opt.errors import MCCLError

__all__ = ["run_ranks", "RankFailure", "FAILURE_GRACE_S"]

#: seconds the other ranks get to report after one rank failed, before they are killed
FAILURE_GRACE_S = 5.0


def _lower_priority(nice: int) -> int:
    """Raise the calling process's nice value by ``nice`` (the threads it starts later
    inherit it); its new nice value.  A system that refuses it leaves it as is."""
    try:
        return os.nice(nice)
    except OSError:
        return os.getpriority(os.PRIO_PROCESS, 0)


def _child(fn: Callable, rank: int, world: int, path: str, args: tuple, conn, nice: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if nice:                        # before gloo starts its threads: they inherit it
        _lower_priority(nice)
    try:
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank,
                                world_size=world)
        # every rank's full mesh is up before any rank can finish and exit: a rank whose
        # fn needs no collective used to close its sockets while a slower rank was still
        # connecting ("Gloo connectFullMesh failed ... Connection closed by peer")
        dist.barrier()
        result = fn(rank, world, *args)
        conn.send(("ok", result))
    except BaseException:  # noqa: BLE001 - reported to the parent
        conn.send(("error", traceback.format_exc()))
    finally:
        conn.close()
        os._exit(0)      # skip interpreter teardown (daemon threads, gloo sockets)


class RankFailure(MCCLError, AssertionError):
    """Ranks failed: each one's traceback, or how it died (killed, stopped or hung).  An
    ``AssertionError`` too, for tests that expect one.  ``ranks`` holds ``(rank, line)``
    per failed rank, the likely cause first: how it died, or its exception's last line."""

    def __init__(self, text: str, ranks: list[tuple[int, str]] | None = None) -> None:
        super().__init__(text)
        self.ranks = ranks or []


def _last_line(trace: str) -> str:
    """The exception line that ends a traceback (``Type: message``), or its last line."""
    lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[\w.]+(Error|Exception|Interrupt|Exit)\b", ln):
            return ln
    return lines[-1] if lines else "(no message)"


def _stopped(pid: int | None) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, SIGTSTP, a debugger): state ``T``/``t``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rpartition(b")")[2].split()[0] in (b"T", b"t")
    except (OSError, IndexError):
        return False


def _death(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with status {exitcode}"


def run_ranks(fn: Callable, world: int, *args: Any, timeout: float = 60.0,
              grace_s: float = FAILURE_GRACE_S, stopped_s: float | None = None,
              nice: int = 0) -> list[Any]:
    """Run ``fn`` on ``world`` forked ranks; returns the per-rank results.

    Import torch in the parent first: forked children then start in milliseconds.
    Results are awaited from all ranks at once.  Raises :class:`RankFailure` naming every
    failed rank: its traceback, ``RankDied`` for one that ended without a result (killed),
    ``RankHung`` for one still running ``grace_s`` after the first failure (stopped, or
    blocked on a dead peer; it is killed).  With ``stopped_s``, a rank found stopped
    (SIGSTOP) for that long is a failure at once (``RankStopped``; it is killed, so its
    peers' sockets close and they report within the grace instead of after their own,
    longer, peer timeouts: issue 27, eighth pass).  ``TimeoutError`` (after killing the
    children) if no rank failed and they do not finish within ``timeout`` seconds.
    ``nice``: the ranks run that much below this process's priority (:func:`_lower_priority`).
    """
    ctx = mp.get_context("fork")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "store")
        procs, pipes = [], []
        for r in range(world):
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_child, args=(fn, r, world, path, args, child, nice), daemon=True)
            p.start()
            child.close()
            procs.append(p)
            pipes.append(parent)
        results: list[Any] = [None] * world
        causes: list[tuple[int, str, str]] = []     # ranks that died or hung: the likely cause, listed first
        errors: list[tuple[int, str, str]] = []
        deadline = time.monotonic() + timeout
        first_failure: float | None = None
        pending = {conn: r for r, conn in enumerate(pipes)}
        since: dict[int, float] = {}                # rank -> when it was first seen stopped
        try:
            while pending:
                until = deadline if first_failure is None else min(deadline, first_failure + grace_s)
                step = until - time.monotonic() if stopped_s is None else min(until - time.monotonic(), 0.5)
                ready = wait(list(pending), max(0.0, step))
                if stopped_s is not None:
                    first_failure = _reap_stopped(procs, pending, since, stopped_s, causes) or first_failure
                if not ready and time.monotonic() >= until:
                    break
                for conn in ready:
                    r = pending.pop(conn)
                    try:
                        status, value = conn.recv()
                    except EOFError:
                        procs[r].join(1.0)
                        status, value = "died", _death(procs[r].exitcode)
                    if status == "ok":
                        results[r] = value
                        continue
                    first_failure = first_failure or time.monotonic()
                    if status == "died":
                        causes.append((r, f"RankDied: {value} before returning a result", ""))
                    else:
                        errors.append((r, _last_line(value), value))
            if pending and first_failure is None:
                raise TimeoutError(f"ranks {sorted(pending.values())} still running after {timeout} s")
            causes += [(r, f"RankHung: still running {grace_s:g} s after the first failure "
                        f"(stopped, or waiting on a dead peer); killed", "") for r in sorted(pending.values())]
        finally:
            for p in procs:
                p.join(0.2 if pending else 1.0)
                if p.is_alive():
                    p.kill()
                    p.join()
        if causes or errors:
            failed = causes + errors
            raise RankFailure("\n".join(f"rank {r}:\n{text or line}" for r, line, text in failed),
                              [(r, line) for r, line, _ in failed])
        return results


def _reap_stopped(procs: list, pending: dict, since: dict[int, float], stopped_s: float,
                  causes: list[tuple[int, str, str]]) -> float | None:
    """Kill the pending ranks stopped for ``stopped_s`` seconds (:func:`run_ranks`),
    record them in ``causes``; the time of the first such failure, or None."""
    now, found = time.monotonic(), None
    for conn, r in list(pending.items()):
        if not _stopped(procs[r].pid):
            since.pop(r, None)
            continue
        if now - since.setdefault(r, now) >= stopped_s:
            procs[r].kill()
            del pending[conn]
            causes.append((r, f"RankStopped: stopped (SIGSTOP) for {now - since[r]:.0f} s, no progress; killed", ""))
            found = found or now
    return found
