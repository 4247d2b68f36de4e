"""A job under ``torchrun`` that runs MCCL's schedules from a controller (README, "Run the
executor under torchrun"; docs/executor.md).

``torchrun --nproc-per-node N -m executor_cuda.torchrun --controller tcp://HOST:PORT``
starts N ranks; torchrun sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``
and ``MASTER_PORT``, which ``init_process_group`` reads (NCCL with one GPU per rank when
CUDA is available, else gloo on CPU).  Rank 0 registers the collective with the
controller (``mccl controller serve``); every rank fetches the controller's schedule,
runs the collective ``--iters`` times on a :class:`~executor_cuda.Communicator`, checks
every result, pushes its passive telemetry to the controller and stages every version
the controller publishes (hot-swap, paper §3.3); at the end the ranks agree on the last
version to stage (:class:`~executor_cuda.follower.VersionFollower`, docs/executor.md).
Rank 0 prints one JSON line: ranks, backend, versions run, wrong results, median
seconds and algbw (nccl-tests convention).
Exit status: 0, 1 if a result was wrong, 2 on an error (printed as ``error: ...``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import sys
import threading
import time
from typing import Any, Callable, Iterator

from mccl_opt.errors import MCCLError

__all__ = ["main", "build_parser", "Terminated", "sigterm_names_the_collective"]


class Terminated(BaseException):
    """SIGTERM during the collectives: torchrun ends every rank once one has failed.  A
    ``BaseException``, so no ``except Exception`` on the way swallows it."""


@contextlib.contextmanager
def sigterm_names_the_collective(describe: Callable[[], str]) -> Iterator[None]:
    """While inside, SIGTERM raises :class:`Terminated` with ``describe()``: a survivor
    that torchrun stopped before gloo reported the dead peer used to end silently
    (``exitcode -15``), naming no collective (issue 27, ninth pass)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Terminated(describe())

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m executor_cuda.torchrun",
                                description="one rank of a job that runs MCCL schedules from a "
                                            "controller (start it with torchrun)")
    p.add_argument("--controller", required=True, help="the controller's request endpoint, tcp://HOST:PORT")
    p.add_argument("--key-file", help="the controller's shared key (HMAC-signed messages)")
    p.add_argument("--collective", choices=["allgather", "alltoall"], default="allgather")
    p.add_argument("--comm", default="world", help="communicator name at the controller (default %(default)s)")
    p.add_argument("--name", default="ag", help="collective name at the controller (default %(default)s)")
    p.add_argument("--members", help="the communicator's GPU ids in rank order, comma separated "
                                      "(default: every GPU of the controller's fabric)")
    p.add_argument("--numel", type=int, default=65536,
                   help="float32 elements per shard (AllGather) or per pair block (AllToAll)")
    p.add_argument("--iters", type=int, default=20, help="collectives to run (default %(default)s)")
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto",
                   help="auto: NCCL when CUDA is available, else gloo")
    p.add_argument("--no-telemetry", action="store_true", help="do not report measurements")
    p.add_argument("--telemetry", metavar="ENDPOINT",
                   help="where measurements go, e.g. a telemetry front end (`mccl controller frontend`, "
                        "docs/scale.md); schedules and subscriptions stay with --controller "
                        "(default: --controller)")
    p.add_argument("--wait-s", type=float, default=60.0,
                   help="seconds to wait for the controller's first schedule (default %(default)s)")
    return p


def _env() -> tuple[int, int, int]:
    """``(RANK, WORLD_SIZE, LOCAL_RANK)`` set by torchrun."""
    try:
        return (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]),
                int(os.environ.get("LOCAL_RANK", os.environ["RANK"])))
    except (KeyError, ValueError):
        raise MCCLError("RANK and WORLD_SIZE are not set: start this with torchrun, e.g. "
                        "torchrun --nproc-per-node 4 -m executor_cuda.torchrun --controller "
                        "tcp://127.0.0.1:5555") from None


def _first_schedule(client: Any, comm: str, name: str, wait_s: float) -> Any:
    """The controller's schedule, once rank 0 registered it and its first version exists."""
    from mccl_runtime.protocol import ProtocolError

    deadline = time.monotonic() + wait_s
    while True:
        try:
            _, sched = client.get_schedule(comm, name)
        except ProtocolError as exc:
            if exc.reason != "rejected":            # not registered (yet): ask again
                raise
            sched = None
        if sched is not None:
            return sched
        if time.monotonic() > deadline:
            raise MCCLError(f"the controller published no schedule for {comm}/{name} within "
                            f"{wait_s:g} s")
        time.sleep(0.05)


class _Pusher:
    """Telemetry flushes to the controller or a telemetry front end (``--telemetry``), from
    the telemetry thread (own socket)."""

    def __init__(self, endpoint: str, key: bytes | None) -> None:
        self.endpoint, self.key = endpoint, key
        self.client: Any = None
        self.sent = self.failed = 0

    def __call__(self, samples: list) -> None:
        from mccl_runtime.client import ControllerClient

        if self.client is None:
            self.client = ControllerClient(self.endpoint, self.key)
        try:
            self.client.push_telemetry([s.to_controller(time.time()) for s in samples])
            self.sent += len(samples)
        except MCCLError:                   # best effort: the job never waits for telemetry
            self.failed += len(samples)


def _check(out: Any, collective: str, rank: int, world: int, i: int) -> bool:
    """Whether ``out`` holds what iteration ``i`` sent (see :func:`_fill`)."""
    import torch

    src = torch.arange(world, dtype=torch.float32, device=out.device)
    want = src * 1000.0 + (i % 997 if collective == "allgather" else rank * 10.0 + i % 7)
    return bool(torch.equal(out.view(world, -1), want.unsqueeze(1).expand(world, out.numel() // world)))


def _fill(inp: Any, collective: str, rank: int, world: int, i: int) -> None:
    import torch

    if collective == "allgather":
        inp.fill_(rank * 1000.0 + i % 997)
    else:
        dst = torch.arange(world, dtype=torch.float32, device=inp.device)
        inp.view(world, -1).copy_((rank * 1000.0 + dst * 10.0 + i % 7).unsqueeze(1)
                                  .expand(world, inp.numel() // world))


def run(args: argparse.Namespace, rank: int, world: int, local_rank: int) -> dict[str, Any]:
    """One rank: init, fetch, run and check, report; returns the job's summary."""
    import torch
    import torch.distributed as dist

    from mccl_runtime.client import ControllerClient
    from mccl_runtime.protocol import load_key

    from .communicator import Communicator
    from .follower import VersionFollower, agree_first
    from .telemetry import Telemetry

    backend = args.backend if args.backend != "auto" else (
        "nccl" if torch.cuda.is_available() else "gloo")
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend)                     # env:// from torchrun
    key = load_key(args.key_file) if args.key_file else None
    client = ControllerClient(args.controller, key, timeout_s=10.0)
    if rank == 0 and not any(c["comm"] == args.comm and c["name"] == args.name for c in client.list()):
        client.register(args.comm, args.name, args.collective, gpus=args.members.split(",") if args.members else None)
    sub = client.subscribe()                             # before the first fetch: no version missed
    sub.wait_connected(5.0)
    sched = agree_first(lambda: _first_schedule(client, args.comm, args.name, args.wait_s))
    if sched.collective != args.collective or sched.num_gpus != world:
        raise MCCLError(f"the controller's {args.comm}/{args.name} is a {sched.num_gpus}-GPU "
                        f"{sched.collective} schedule; this job runs {world} ranks of "
                        f"{args.collective} (serve a topology with {world} GPUs, or pass --members "
                        f"with {world} GPU ids)")
    pusher = None if args.no_telemetry else _Pusher(args.telemetry or args.controller, key)
    tel = Telemetry(on_flush=pusher) if pusher else None
    comm = Communicator(None, sched, telemetry=tel)
    follower = VersionFollower(comm, sub, args.comm, args.name, args.collective)   # hot-swap
    n = args.numel
    inp = torch.empty(n if args.collective == "allgather" else world * n, device=device)
    out = torch.empty(world * n, device=device)
    run_one = comm.all_gather_into_tensor if args.collective == "allgather" else comm.all_to_all_single
    seconds, wrong = [], 0
    step = "iteration 0"

    def stopped() -> str:
        return (f"rank {rank}: the {args.collective} collective {args.comm}/{args.name} was stopped at "
                f"{step} (SIGTERM: torchrun ends the job once a rank fails; its summary names the "
                "rank that failed first)")

    with sigterm_names_the_collective(stopped):
        try:
            for i in range(args.iters):
                step = f"iteration {i}"
                _fill(inp, args.collective, rank, world, i)
                t = time.perf_counter()
                run_one(out, inp)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                seconds.append(time.perf_counter() - t)
                wrong += not _check(out, args.collective, rank, world, i)
            step = "the final version agreement"
            follower.finish(timeout_s=args.wait_s)           # every rank stages the same versions
            versions = sorted({v for _, c, v in comm.trace if c == args.collective})
            totals = torch.tensor([wrong], dtype=torch.int64, device=device)
            step = "the final error count"
            dist.all_reduce(totals)
        except RuntimeError as exc:                          # gloo/NCCL: a peer left or stopped
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            raise MCCLError(f"rank {rank}: the {args.collective} collective {args.comm}/{args.name} failed at "
                            f"{step}: {first}; a peer rank died or stopped (torchrun names the rank that "
                            "exited)") from None
    comm.close()                                         # flushes the last telemetry
    if pusher is not None and pusher.client is not None:
        pusher.client.close()
    sub.close()
    client.close()
    dist.destroy_process_group()
    median = statistics.median(seconds)
    return {"ranks": world, "backend": backend, "collective": args.collective,
            "comm": args.comm, "name": args.name, "iters": args.iters, "bytes": n * 4,
            "versions": versions, "wrong": int(totals.item()), "median_s": median,
            "algbw_gbytes_per_s": world * n * 4 / median / 1e9,
            "telemetry_sent": pusher.sent if pusher else 0}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.numel < 1 or args.iters < 1:
            raise MCCLError("--numel and --iters must be positive")
        rank, world, local_rank = _env()
        summary = run(args, rank, world, local_rank)
    except (MCCLError, Terminated) as exc:
        sys.stderr.write(f"error: {exc}\n")      # one write: ranks share the launcher's stderr
        sys.stderr.flush()
        return 2
    if rank == 0:
        print(json.dumps(summary), flush=True)
    return 1 if summary["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
