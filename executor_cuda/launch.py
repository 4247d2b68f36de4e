"""Run a function on N forked CPU ranks (gloo) with a hard timeout: tests, benchmarks
and demos of the executor on one machine.

Each rank calls ``fn(rank, world, *args)`` after ``init_process_group("gloo")`` on a
FileStore in a fresh temporary directory; return values come back through a pipe.
On timeout every child is killed and the test fails, naming the ranks still running.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import time
import traceback
from typing import Any, Callable

__all__ = ["run_ranks"]


def _child(fn: Callable, rank: int, world: int, path: str, args: tuple, conn) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
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


def run_ranks(fn: Callable, world: int, *args: Any, timeout: float = 60.0) -> list[Any]:
    """Run ``fn`` on ``world`` forked ranks; returns the per-rank results.

    Import torch in the parent first: forked children then start in milliseconds.
    Raises ``AssertionError`` with every failing rank's traceback, ``TimeoutError``
    (after killing the children) if they do not finish within ``timeout`` seconds.
    """
    ctx = mp.get_context("fork")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "store")
        procs, pipes = [], []
        for r in range(world):
            parent, child = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_child, args=(fn, r, world, path, args, child), daemon=True)
            p.start()
            child.close()
            procs.append(p)
            pipes.append(parent)
        results: list[Any] = [None] * world
        errors = []
        deadline = time.monotonic() + timeout
        try:
            for r, conn in enumerate(pipes):
                if not conn.poll(max(0.0, deadline - time.monotonic())):
                    raise TimeoutError(f"ranks {[i for i, p in enumerate(procs) if p.is_alive()]}"
                                       f" still running after {timeout} s")
                status, value = conn.recv()
                if status == "error":
                    errors.append(f"rank {r}:\n{value}")
                results[r] = value
        finally:
            for p in procs:
                p.join(1.0)
                if p.is_alive():
                    p.kill()
                    p.join()
        if errors:
            raise AssertionError("\n".join(errors))
        return results
