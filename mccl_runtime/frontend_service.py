"""``mccl controller frontend``: a telemetry front end in its own process (docs/scale.md,
"Telemetry front ends").

A ROUTER socket takes one pod's (or communicator group's) telemetry: the hosts use the
ordinary client (:class:`~mccl_runtime.client.ControllerClient`) against the front end's
endpoint, JSON or binary.  Every request passes the controller's own checks
(:class:`~mccl_runtime.gate.RequestGate`: signature over every frame, send-time window,
nonce, the front end's epoch and each host's ``seq``) and is folded
(:class:`~mccl_runtime.frontend.FrontEndFold`); the reply is the ingest report.  Every
``interval_s`` the front end sends the controller one signed ``telemetry_columns`` request
of folded rows, to every shard of a sharded controller (each shard folds what its
communicators' links carry, as when hosts send to every shard).  Requests other than
``ping``, ``telemetry`` and ``stats`` are refused (``unsupported``: ask the controller).

The front end is outside the decision process: if it dies, its hosts' requests time out
(:class:`~mccl_runtime.protocol.ProtocolError` ``timeout`` naming its endpoint) and the
controller goes on with the telemetry of the other front ends; if the controller does not
answer, the interval's rows are dropped (counted, logged: a lost request, as for a host
sending directly) and the next interval is sent.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

from mccl_opt.errors import MCCLError
from mccl_opt.topology import Topology

from .client import ShardedClient
from .columns import ColumnBatch
from .endpoints import ephemeral, is_loopback
from .frontend import FrontEndFold
from .gate import RequestGate, telemetry_samples
from .protocol import MAX_REQUEST_BYTES, Message, ProtocolError, brief

__all__ = ["FrontEndService"]

log = logging.getLogger("mccl.frontend")

#: seconds the front end waits for the controller's reply to one forwarded interval
UPSTREAM_TIMEOUT_S = 2.0
#: seconds a starting front end keeps asking a controller that has not answered yet (a
#: controller just started on a loaded machine can take longer than one interval's wait)
UPSTREAM_START_S = 10.0


class FrontEndService:
    """One telemetry front end (module docstring); ``upstream``: the controller's (or any
    shard's) request endpoint, whose ``alpha`` the fold uses, or a connected client of it
    (anything with ``clients[0].ping()``, ``endpoints``, ``push_columns`` and ``close``);
    ``reporter``: this front end's stable id, to forward pair channels as link maxima
    (:class:`~mccl_runtime.frontend.FrontEndFold`)."""

    def __init__(self, topo: Topology, upstream: str | ShardedClient, bind: str = "tcp://127.0.0.1:0", *,
                 key: bytes | None = None,
                 interval_s: float = 0.05, allow_remote: bool = False,
                 upstream_timeout_s: float = UPSTREAM_TIMEOUT_S, clock: Callable[[], float] = time.time,
                 reporter: int | None = None) -> None:
        if allow_remote and not key:
            raise MCCLError("--allow-remote needs a --key-file: without a key anyone who can reach the "
                            "port could inject telemetry")
        if not allow_remote and not is_loopback(bind):
            raise MCCLError(f"refusing to bind {brief(bind, 80)}: not a loopback address; pass "
                            "--allow-remote (and a --key-file) to take hosts' telemetry over the network")
        if not 0.001 <= interval_s <= 60.0:
            raise MCCLError(f"--interval must be in [0.001, 60] seconds, got {interval_s:g}")
        self.topo, self.bind, self.interval_s = topo, ephemeral(bind), float(interval_s)
        self.upstream = ShardedClient(upstream, key, timeout_s=upstream_timeout_s) \
            if isinstance(upstream, str) else upstream
        try:
            info = _first_ping(self.upstream, UPSTREAM_START_S)
            self._check_upstream(info)
        except Exception:
            self.upstream.close()
            raise
        # clock: "now" of the checks; reporter: forward pair channels as link maxima under this id
        self.fold = FrontEndFold(topo, float(info["alpha"]), reporter, clock=clock)
        self.gate = RequestGate(key, max_request_bytes=MAX_REQUEST_BYTES, log=log)
        self.forwarded = {"intervals": 0, "rows": 0, "samples": 0, "failures": 0}
        self.upstream_error: str | None = None
        self.endpoint: str | None = None
        self.ready = threading.Event()
        self._stop = threading.Event()

    def _check_upstream(self, info: dict[str, Any]) -> None:
        """The controller serves this fabric with the EWMA (a folded row is its EWMA)."""
        if (info.get("links"), info.get("gpus")) != (self.topo.num_links, self.topo.num_gpus):
            raise MCCLError(f"the controller serves {brief(info.get('topology'))} ({info.get('links')} links, "
                            f"{info.get('gpus')} GPUs); this front end was given {self.topo.name} "
                            f"({self.topo.num_links} links, {self.topo.num_gpus} GPUs): pass the same --topology")
        if info.get("estimator") != "ewma" or not isinstance(info.get("alpha"), float):
            raise MCCLError(f"the controller runs the {brief(info.get('estimator'))} estimator; a front end folds "
                            "EWMA statistics only (the change-point estimator needs every sample: send directly)")

    def stop(self) -> None:
        """Ask the loop to finish (safe from signal handlers and other threads)."""
        self._stop.set()

    def serve_forever(self, poll_ms: int = 5) -> None:
        """Take requests and forward one folded batch per interval until :meth:`stop`;
        the last interval is forwarded before the sockets close."""
        import zmq

        ctx = zmq.Context()
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.MAXMSGSIZE, MAX_REQUEST_BYTES)
        try:
            try:
                router.bind(self.bind)
            except zmq.ZMQError as exc:
                raise MCCLError(f"cannot bind {self.bind}: {exc}; pick another --bind (port 0 picks a free one)") \
                    from None
            self.endpoint = router.getsockopt(zmq.LAST_ENDPOINT).decode()
            self.ready.set()
            deadline = time.monotonic() + self.interval_s
            while not self._stop.is_set():
                if router.poll(max(0, min(poll_ms, int(1e3 * (deadline - time.monotonic()))))):
                    while True:
                        try:
                            frames = router.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        reply = self.gate.answer(frames, self._dispatch)
                        if reply is not None:
                            router.send_multipart(reply)
                        if time.monotonic() >= deadline:
                            break
                if time.monotonic() >= deadline:
                    self.forward()
                    deadline += self.interval_s
                    if deadline < time.monotonic():         # fell behind: no burst of catch-up forwards
                        deadline = time.monotonic() + self.interval_s
            self.forward()
        finally:
            self.ready.set()
            router.close(0)
            ctx.term()
            self.upstream.close()

    def forward(self) -> ColumnBatch:
        """Send the interval's folded batch to the controller (every shard); returns it."""
        batch = self.fold.interval()
        if not len(batch):
            return batch
        try:
            self.upstream.push_columns(batch)
        except MCCLError as exc:                   # the controller is down or refused: drop, count, go on
            self.forwarded["failures"] += 1
            if self.upstream_error is None:
                log.warning("front end: the controller did not take an interval (%s); dropping it", exc)
            self.upstream_error = str(exc)[:200]
            return batch
        self.upstream_error = None
        self.forwarded["intervals"] += 1
        self.forwarded["rows"] += len(batch)
        self.forwarded["samples"] += int(batch.count.sum())
        return batch

    def _dispatch(self, msg: Message, columns: tuple[bytes, ...]) -> tuple[str, dict[str, Any]]:
        b = msg.body
        if msg.type == "telemetry_columns":
            return "ok", self.fold.ingest_columns(ColumnBatch.from_frames(b, columns, self.topo)).to_dict()
        if msg.type == "telemetry":
            samples = telemetry_samples(b)
            return "ok", self.fold.ingest(samples).to_dict()
        if msg.type == "ping":
            return "ok", {"frontend": True, "topology": self.topo.name, "epoch": self.gate.epoch,
                          "links": self.topo.num_links, "gpus": self.topo.num_gpus, "interval_s": self.interval_s,
                          "upstream": self.upstream.endpoints, "upstream_error": self.upstream_error}
        if msg.type == "stats":
            return "ok", {"telemetry": self.fold.store.counters(), "forwarded": dict(self.forwarded),
                          "upstream_error": self.upstream_error, "protocol_errors": dict(self.gate.protocol_errors),
                          "requests": dict(self.gate.requests), "cpu_s": time.process_time()}
        raise ProtocolError("unsupported", f"a telemetry front end takes ping, telemetry and stats; send "
                                           f"{msg.type!r} to the controller at {self.upstream.endpoints[0]}")


def _first_ping(upstream: ShardedClient, within_s: float) -> dict[str, Any]:
    """The controller's ``ping``, asked again after each timeout for up to ``within_s``
    seconds; any other refusal, or no answer by then, raises."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return upstream.clients[0].ping()
        except ProtocolError as exc:
            if exc.reason != "timeout" or time.monotonic() >= deadline:
                raise

