"""A controller sharded by communicator (docs/scale.md, "Sharding the controller").

Paper §3 has one controller; at 10,000+ GPUs its telemetry and synthesis outgrow one
process.  ``mccl controller serve --shards N`` starts ``N`` controller processes, each a
full :class:`~mccl_runtime.service.ControllerService` over the same fabric, each serving
the communicators :func:`shard_of` assigns to it (a stable hash of the name): each
decodes, folds and decides on its own telemetry in parallel, with its own state file
(``STATE.shardI``) and publisher.  A shard refuses to register another shard's
communicator (error ``wrong_shard``, naming the right endpoint), and every shard's
``ping`` lists all the shards' endpoints, so a client that knows one finds the rest
(:class:`~mccl_runtime.client.ShardedClient`).  The launcher prints its endpoints only
once every shard has confirmed it holds that list: a ``ping`` answered earlier (a
shard's ``shards`` still unknown) would make a client take one shard for the whole
controller and see part of its collectives (docs/runtime.md, "Sharded start-up").  Executors send a communicator's
telemetry to its shard; a link used by communicators of several shards is measured by
each from its own traffic, which is what each schedule sees.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
import zlib
from argparse import Namespace
from typing import Any, Callable

from mccl_opt.errors import MCCLError

from .endpoints import shard_endpoint
from .protocol import ProtocolError

__all__ = ["shard_of", "launch", "shard_args", "shard_endpoint", "shard_endpoints_of", "announce_shard"]

#: shards at most
MAX_SHARDS = 64
#: what a shard sends the launcher once it serves every shard's endpoint in ``ping``
READY = "ready"


def shard_of(comm: str, shards: int) -> int:
    """The shard serving communicator ``comm`` (CRC-32 of its name, modulo ``shards``)."""
    return zlib.crc32(comm.encode("utf-8", "surrogatepass")) % shards


def shard_endpoints_of(first: Any, timeout_s: float) -> Any:
    """The shards' endpoints that client ``first``'s controller serves in ``ping``
    (None: an unsharded controller).  A shard that does not know its peers yet
    (``shard`` set, ``shards`` not) is asked again until ``timeout_s``, then
    :class:`~mccl_runtime.protocol.ProtocolError` ``not_ready``: taking it for the
    whole controller would show part of the collectives."""
    deadline = time.monotonic() + timeout_s
    while True:
        reply = first.ping()
        if reply.get("shard") is None or reply.get("shards") is not None:
            return _checked_peers(reply.get("shards"), first.endpoint)
        if time.monotonic() >= deadline:
            raise ProtocolError("not_ready", f"{first.endpoint} is shard {reply.get('shard')} of a sharded "
                                f"controller that did not list its shards within {timeout_s} s; is the "
                                "controller still starting? wait for its 'controller on' line and retry")
        time.sleep(0.05)


def _checked_peers(peers: Any, endpoint: str) -> Any:
    """``peers`` as a ``ping`` gave them: None or a list of 1 to :data:`MAX_SHARDS`
    endpoint strings (a broken or hostile controller listing 100,000 would have the
    client open as many sockets)."""
    if peers is None:
        return None
    if not (isinstance(peers, list) and 1 <= len(peers) <= MAX_SHARDS and all(isinstance(e, str) for e in peers)):
        raise ProtocolError("bad_reply", f"the controller at {endpoint} lists its shards as {str(peers)[:80]}, "
                            f"not a list of 1 to {MAX_SHARDS} endpoints")
    return peers


def announce_shard(svc: Any, conn: Any) -> None:
    """In a shard: send its endpoint to the launcher once bound, take the list of every
    shard's endpoint (served by ``ping``), then confirm it holds the list (the launcher
    announces the controller only after every confirmation)."""
    svc.ready.wait()
    conn.send(svc.endpoint)
    endpoints = conn.recv()
    svc.shard_endpoints = endpoints
    conn.send(READY)


def shard_args(args: Namespace, index: int, shards: int) -> Namespace:
    """The ``serve`` arguments of shard ``index``: its endpoints and state file, and only
    the ``--collective``/``--members`` of its communicators."""
    mine = [spec for spec in args.collective if shard_of(spec.partition("/")[0], shards) == index]
    members = [spec for spec in args.members if shard_of(spec.partition("=")[0], shards) == index]
    return Namespace(**{**vars(args), "collective": mine, "members": members, "shards": 1, "frontends": 0,
                        "shard": (index, shards), "bind": shard_endpoint(args.bind, index),
                        "pub_bind": shard_endpoint(args.pub_bind, index),
                        "state": f"{args.state}.shard{index}" if args.state else None})


def _child(serve: Callable[[Namespace], int], args: Namespace, conn: Any) -> None:
    """A shard process: ignore the terminal's Ctrl-C (the launcher forwards a stop); a
    typed error ends it with status 2 and one line, as the CLI does."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    args.shard_conn = conn
    try:
        status = serve(args)
    except MCCLError as exc:               # as the CLI prints it: one line, no traceback
        print(f"error: shard {args.shard[0]}: {exc}", file=sys.stderr, flush=True)
        status = 2
    raise SystemExit(status)


def launch(serve: Callable[[Namespace], int], args: Namespace, shards: int) -> int:
    """Start ``shards`` processes running ``serve`` on per-shard arguments, print their
    endpoints, forward SIGTERM/SIGINT to them and wait; the worst exit status."""
    if not 2 <= shards <= MAX_SHARDS:
        raise MCCLError(f"--shards must be in [1, {MAX_SHARDS}], got {shards}")
    ctx = multiprocessing.get_context("spawn")
    procs, pipes = [], []
    for i in range(shards):
        mine, theirs = ctx.Pipe()
        p = ctx.Process(target=_child, args=(serve, shard_args(args, i, shards), theirs), name=f"mccl-shard{i}")
        p.start()
        procs.append(p)
        pipes.append(mine)
    stop = threading.Event()

    def forward(*_: Any) -> None:
        stop.set()
        for p in procs:
            if p.pid is not None and p.exitcode is None:
                os.kill(p.pid, signal.SIGTERM)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    endpoints = []
    for p, conn in zip(procs, pipes):
        endpoint = _receive(p, conn, stop)
        if endpoint is None:                                # it failed to start (its error is printed)
            forward()
            return _wait(procs)
        endpoints.append(endpoint)
    for conn in pipes:
        conn.send(endpoints)
    if not all(_receive(p, conn, stop) == READY for p, conn in zip(procs, pipes)):
        forward()                                           # one died before it knew its peers
        return _wait(procs)
    for i, ep in enumerate(endpoints):
        print(f"shard {i} on {ep}", flush=True)
    print(f"controller on {endpoints[0]} ({shards} shards)", flush=True)
    from .frontends import start_frontends, stop_frontends

    frontends = []
    try:
        frontends = start_frontends(args, endpoints[0]) if args.frontends else []
    except MCCLError as exc:               # one did not start: stop everything
        print(f"error: {exc}", file=sys.stderr, flush=True)
        forward()
    try:
        return _wait(procs)
    finally:
        stop_frontends(frontends)


def _receive(proc: Any, conn: Any, stop: threading.Event) -> str | None:
    """What a starting shard sends (its endpoint, then :data:`READY`), or None when it
    exits (or the launcher is stopped) first: a shard that dies during start-up closes
    its pipe."""
    while not conn.poll(0.2):
        if proc.exitcode is not None or stop.is_set():
            return None
    try:
        return conn.recv()
    except (EOFError, OSError):
        return None


def _wait(procs: list) -> int:
    for p in procs:
        p.join()
    return max(abs(p.exitcode or 0) for p in procs)
