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
import re
import signal
import sys
import threading
import time
import zlib
from argparse import Namespace
from typing import Any, Callable

from mccl_opt.errors import MCCLError

from .endpoints import is_loopback, shard_endpoint
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
            return _checked_peers(reply.get("shards"), reply.get("shard"), first.endpoint)
        if time.monotonic() >= deadline:
            raise ProtocolError("not_ready", f"{first.endpoint} is shard {str(reply.get('shard'))[:20]} of a sharded "
                                f"controller that did not list its shards within {timeout_s} s; is the "
                                "controller still starting? wait for its 'controller on' line and retry")
        time.sleep(0.05)


#: characters of one shard endpoint a ``ping`` may list
MAX_ENDPOINT_CHARS = 256
#: a wildcard bind's address, as ZeroMQ reports it: this machine too
_ANY = {"0.0.0.0", "[::]", "*"}
_ENDPOINT = re.compile(r"(tcp://([!-~]+):[0-9]{1,5}|ipc://[!-~]+)", re.ASCII)


def _checked_peers(peers: Any, shard: Any, endpoint: str) -> Any:
    """``peers`` as a ``ping`` gave them: None or what one launcher binds
    (:func:`launch`; a key-less controller's reply is not authenticated, and a broken or
    hostile one listing 100,000 endpoints would have the client open as many sockets):
    1 to :data:`MAX_SHARDS` distinct ``tcp://HOST:PORT`` or ``ipc://PATH`` endpoints of
    at most :data:`MAX_ENDPOINT_CHARS` printable ASCII characters, every TCP one on the
    same host (one machine runs every shard), on a loopback (or wildcard) host when
    ``endpoint`` (the shard asked) is one, with ``shard`` the index of a listed endpoint, ``endpoint``'s
    own when it is listed."""
    if peers is None:
        return None

    def bad(why: str) -> ProtocolError:
        return ProtocolError("bad_reply", f"the controller at {endpoint[:80]} lists its shards as "
                             f"{str(peers)[:80]}: {why}")

    if not (isinstance(peers, list) and 1 <= len(peers) <= MAX_SHARDS and all(isinstance(e, str) for e in peers)):
        raise bad(f"not a list of 1 to {MAX_SHARDS} endpoints")
    if any(len(e) > MAX_ENDPOINT_CHARS or not _ENDPOINT.fullmatch(e) for e in peers):
        raise bad(f"not tcp://HOST:PORT or ipc://PATH endpoints of at most {MAX_ENDPOINT_CHARS} printable characters")
    if len(set(peers)) != len(peers):
        raise bad("an endpoint listed twice")
    hosts = {m.group(2) for m in map(_ENDPOINT.fullmatch, peers) if m and m.group(2) is not None}
    if len(hosts) > 1 or (hosts and is_loopback(endpoint) and not (all(map(is_loopback, peers)) or hosts <= _ANY)):
        raise bad("shards on several hosts, or off the loopback host asked (one machine runs every shard)")
    if isinstance(shard, bool) or not isinstance(shard, int) or not 0 <= shard < len(peers) \
            or (endpoint in peers and peers.index(endpoint) != shard):
        raise bad(f"its own shard number {str(shard)[:20]} is not the place of {endpoint[:80]} in the list")
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
