"""The long-running controller service (``mccl controller serve``).

A ZeroMQ ROUTER socket answers requests (:mod:`mccl_runtime.protocol`) from executors
(REQ or DEALER sockets); a PUB socket publishes every new schedule version under the
topic ``b"schedule"``.  Each telemetry batch is ingested and followed by one manager
decision (Algorithm 1, re-synthesis start); finished re-syntheses are collected on every
loop turn.  Binding is loopback-only unless ``allow_remote`` is set.  The state (the
topology, the telemetry channels behind ``M``, the schedules with their versions and
the counters) is saved atomically after every publish or registration, at most every
``persist_interval_s`` after telemetry, and on shutdown; a restarted service resumes
from it without re-synthesizing.  :meth:`ControllerService.stop` (the CLI wires
SIGTERM/SIGINT to it) ends the loop, saves the state and closes the sockets.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

from mccl_opt.errors import MCCLError, TopologyError
from mccl_opt.topology import Topology

from .manager import Event, Policy, ScheduleManager, Synthesizer
from .protocol import (REPLAY_WINDOW_S, REQUESTS, SCHEDULE_TOPIC, Message, ProtocolError,
                       ReplayGuard, decode, encode)
from .state import load_state, save_state
from .telemetry import MeasurementStore

__all__ = ["ControllerService", "is_loopback"]

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def is_loopback(endpoint: str) -> bool:
    """True for ``ipc://``/``inproc://`` endpoints and TCP on a loopback address."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    host = urlsplit(endpoint.replace("*", "0")).hostname if endpoint.startswith("tcp://") else None
    return host in LOOPBACK_HOSTS or (host or "").startswith("127.")


def _ephemeral(endpoint: str) -> str:
    """zmq spells an ephemeral TCP port ``*``; accept ``:0`` too."""
    return endpoint[:-2] + ":*" if endpoint.startswith("tcp://") and endpoint.endswith(":0") else endpoint


class ControllerService:
    """The controller: a :class:`ScheduleManager` behind ZeroMQ sockets."""

    def __init__(self, topo: Topology, bind: str = "tcp://127.0.0.1:5555", *,
                 pub_bind: str | None = None, key: bytes | None = None,
                 state_path: str | Path | None = None, synthesize: Synthesizer | None = None,
                 alpha: float = 0.012, policy: Policy = Policy(), allow_remote: bool = False,
                 persist_interval_s: float = 1.0, clock: Callable[[], float] = time.time,
                 replay_window_s: float = REPLAY_WINDOW_S) -> None:
        if pub_bind is None:
            pub_bind = bind.rsplit(":", 1)[0] + ":*" if bind.startswith("tcp://") else bind + "-pub"
        for ep in (bind, pub_bind):
            if not allow_remote and not is_loopback(ep):
                raise MCCLError(f"refusing to bind {ep!r}: not a loopback address; pass --allow-remote "
                                "(and a --key-file) to expose the controller to the network")
        self.bind_req, self.bind_pub = _ephemeral(bind), _ephemeral(pub_bind)
        self.key = key
        self.replay = ReplayGuard(replay_window_s) if key else None
        self.clock = clock
        self.state_path = Path(state_path) if state_path else None
        self.persist_interval_s = persist_interval_s
        self.store = MeasurementStore(topo, alpha=alpha, clock=clock)
        self.manager = ScheduleManager(self.store, synthesize, policy)
        self.protocol_errors: Counter[str] = Counter()
        self.requests: Counter[str] = Counter()
        self.endpoint: str | None = None
        self.pub_endpoint: str | None = None
        self.ready = threading.Event()
        self.resumed = False
        self._stop = threading.Event()
        self._dirty_since: float | None = None
        self._resume()

    # ------------------------------------------------------------------ state
    def _resume(self) -> None:
        state = load_state(self.state_path) if self.state_path else None
        if state is None:
            return
        if Topology.from_dict(state.get("topology")) != self.store.topo:
            raise TopologyError(f"state file {self.state_path} was written for another topology; pass that "
                                "topology or delete the state file")
        self.store.restore(state.get("telemetry", {}))
        self.manager.restore(state.get("manager", {}))
        self.protocol_errors.update(state.get("protocol_errors", {}))
        self.resumed = True

    def state(self) -> dict[str, Any]:
        return {"topology": self.store.topo.to_dict(), "telemetry": self.store.to_dict(),
                "manager": self.manager.to_dict(), "protocol_errors": dict(self.protocol_errors)}

    def persist(self) -> None:
        if self.state_path:
            save_state(self.state_path, self.state())
        self._dirty_since = None

    # ------------------------------------------------------------------ loop
    def stop(self) -> None:
        """Ask the loop to finish (safe from signal handlers and other threads)."""
        self._stop.set()

    def serve_forever(self, poll_ms: int = 20) -> None:
        """Run until :meth:`stop`; always saves the state and closes the sockets."""
        import zmq

        ctx = zmq.Context()
        router = ctx.socket(zmq.ROUTER)
        pub = ctx.socket(zmq.PUB)
        for s in (router, pub):
            s.setsockopt(zmq.LINGER, 0)
        try:
            router.bind(self.bind_req)
            pub.bind(self.bind_pub)
            self.endpoint = router.getsockopt(zmq.LAST_ENDPOINT).decode()
            self.pub_endpoint = pub.getsockopt(zmq.LAST_ENDPOINT).decode()
            self.ready.set()
            poller = zmq.Poller()
            poller.register(router, zmq.POLLIN)
            while not self._stop.is_set():
                if poller.poll(poll_ms):
                    for _ in range(64):
                        try:
                            frames = router.recv_multipart(zmq.NOBLOCK)
                        except zmq.Again:
                            break
                        self._handle(router, pub, frames)
                self._publish(pub, self.manager.poll(self.clock()))
                if self._dirty_since is not None and self.clock() - self._dirty_since >= self.persist_interval_s:
                    self.persist()
        finally:
            self.ready.set()
            self.manager.close()
            self.persist()
            router.close(0)
            pub.close(0)
            ctx.term()

    def _handle(self, router: Any, pub: Any, frames: list[bytes]) -> None:
        envelope, payload = frames[:-1], frames[-1]
        if len(frames) < 2:
            self.protocol_errors["bad_frames"] += 1
            return
        try:
            msg = decode(payload, self.key, REQUESTS, self.replay)
            self.requests[msg.type] += 1
            reply_type, body = self._dispatch(msg, pub)
        except ProtocolError as exc:
            self.protocol_errors[exc.reason] += 1
            reply_type, body = "error", {"reason": exc.reason, "message": str(exc)}
        except MCCLError as exc:
            self.protocol_errors["rejected"] += 1
            reply_type, body = "error", {"reason": "rejected", "message": str(exc)}
        router.send_multipart(envelope + [encode(reply_type, body, self.key)])

    def _dispatch(self, msg: Message, pub: Any) -> tuple[str, dict[str, Any]]:
        b, now = msg.body, self.clock()
        if msg.type == "ping":
            return "ok", {"topology": self.store.topo.name, "pub": self.pub_endpoint, "resumed": self.resumed}
        if msg.type == "telemetry":
            samples = b.get("samples")
            if not isinstance(samples, list):
                raise ProtocolError("bad_body", "telemetry body needs 'samples': a list of samples")
            report = self.store.ingest(samples, now)
            self._publish(pub, self.manager.step(now))
            self._dirty_since = self._dirty_since if self._dirty_since is not None else now
            return "ok", report.to_dict()
        if msg.type == "register":
            comm, name, kind = (_field(b, k) for k in ("comm", "name", "kind"))
            colls = self.manager.register(comm, name, kind, now=now)
            self.persist()
            return "ok", {"registered": [c.name for c in colls]}
        if msg.type == "get_schedule":
            coll = self.manager.get(_field(b, "comm"), _field(b, "name"))
            return "schedule", {"comm": coll.comm, "name": coll.name, "version": coll.version,
                                "schedule": coll.schedule.to_dict() if coll.schedule else None}
        if msg.type == "list":
            return "ok", {"collectives": [{"comm": c.comm, "name": c.name, "kind": c.kind,
                                           "dynamic": c.dynamic, "version": c.version}
                                          for c in self.manager.collectives()]}
        return "ok", {"telemetry": self.store.counters(), "manager": dict(self.manager.counters),
                      "protocol_errors": dict(self.protocol_errors), "requests": dict(self.requests)}

    def _publish(self, pub: Any, events: list[Event]) -> None:
        published = [e for e in events if e.action == "published"]
        for e in published:
            coll = self.manager.get(e.comm, e.name)
            body = {"comm": coll.comm, "name": coll.name, "version": coll.version,
                    "schedule": coll.schedule.to_dict()}
            pub.send_multipart([SCHEDULE_TOPIC, encode("schedule", body, self.key)])
        if published:
            self.persist()


def _field(body: dict[str, Any], name: str) -> str:
    v = body.get(name)
    if not isinstance(v, str) or not v:
        raise ProtocolError("bad_body", f"request body needs a non-empty string {name!r}")
    return v
