"""Executor-side client of the controller service: push telemetry, fetch or subscribe
to schedule versions.  Every receive is bounded by a timeout (``zmq.Poller``) and by
size (``ZMQ_MAXMSGSIZE``), so a dead or misbehaving controller raises
:class:`~mccl_runtime.protocol.ProtocolError` instead of hanging; telemetry batches are
split into requests of at most :data:`~mccl_runtime.protocol.MAX_BATCH_SAMPLES`.

Longer than ~400 lines on purpose: the request client and the subscription share
the envelope, the replay guard and the bounded receive; apart they would duplicate them.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from itertools import islice
from typing import Any, Iterable

from mccl_opt.errors import MCCLError
from mccl_opt.schedule import Schedule

from .columns import MAX_COLUMN_SAMPLES, ColumnBatch
from .endpoints import connect
from .updates import HoldUpdate, ScheduleStatus, held_links, publication_key
from .protocol import (MAX_BATCH_SAMPLES, MAX_MESSAGE_BYTES, MUTATING, PUBLICATIONS, REPLIES, SCHEDULE_TOPIC, Message,
                       ProtocolError, ReplayGuard, Session, decode, encode, encode_frames)

__all__ = ["ControllerClient", "HoldUpdate", "ScheduleStatus", "ShardedClient", "Subscription",
           "ScheduleUpdate"]

ScheduleUpdate = tuple[str, str, int, Schedule]


#: pauses before asking a busy controller again
BUSY_RETRY_S = (0.05, 0.1, 0.2)
EPOCH_CHECK_S = 1.0  #: seconds before a subscription asks again a controller that did not answer
DRAIN_MAX = 256      #: publications a subscription reads at once (one epoch check covers them)


class ControllerClient:
    """Requests over a DEALER socket (one outstanding request at a time).  With a key
    every request carries this client's id, a growing ``seq`` and the controller epoch
    of the last reply (:class:`~mccl_runtime.protocol.Session`; a ping learns it before
    the first request that needs it); a request refused as ``wrong_epoch`` (the
    controller restarted) is signed again for the new epoch and sent once more (it was
    not applied)."""

    def __init__(self, endpoint: str, key: bytes | None = None, timeout_s: float = 5.0) -> None:
        import zmq

        self._zmq = zmq
        self.endpoint, self.key, self.timeout_s = endpoint, key, timeout_s
        self.replay = ReplayGuard() if key else None
        self.session = Session()
        self._ctx = zmq.Context()
        self._sock = self._connect()

    def _connect(self) -> Any:
        sock = self._ctx.socket(self._zmq.DEALER)
        sock.setsockopt(self._zmq.LINGER, 0)
        sock.setsockopt(self._zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        connect(sock, self.endpoint, "controller")
        return sock

    def request(self, type_: str, body: dict[str, Any] | None = None,
                frames: tuple[bytes, ...] = ()) -> tuple[str, dict[str, Any]]:
        """Send one request (``frames``: binary frames after its header,
        :func:`~mccl_runtime.protocol.encode_frames`) and return ``(reply_type, body)``; an
        ``error`` reply raises :class:`ProtocolError` with the controller's reason."""
        if self.key and type_ in MUTATING and self.session.epoch is None:
            self._exchange("ping", None)                    # learn the epoch first
        msg, new_epoch = self._exchange(type_, body, frames)
        if msg.type == "error" and msg.body.get("reason") == "wrong_epoch" and new_epoch:
            msg, _ = self._exchange(type_, body, frames)  # the controller restarted: sign for its epoch
        if msg.type == "error":
            raise ProtocolError(str(msg.body.get("reason")), f"controller: {msg.body.get('message')}")
        return msg.type, msg.body

    def _exchange(self, type_: str, body: dict[str, Any] | None,
                  frames: tuple[bytes, ...] = ()) -> tuple[Message, bool]:
        """One request and its checked reply; whether the reply named a new epoch."""
        fields = self.session.next() if self.key else {}
        if frames:
            self._sock.send_multipart([b"", *encode_frames(type_, body or {}, frames, self.key, **fields)],
                                      copy=False)
        else:
            self._sock.send_multipart([b"", encode(type_, body, self.key, **fields)])
        if not self._sock.poll(int(self.timeout_s * 1000)):
            self._sock.close(0)             # drop the late reply with the socket
            self._sock = self._connect()
            raise ProtocolError("timeout", f"no reply from the controller at {self.endpoint} within "
                                           f"{self.timeout_s} s; is `mccl controller serve` (or the "
                                           "telemetry front end, `mccl controller frontend`) running there?")
        msg = decode(self._sock.recv_multipart()[-1], self.key, REPLIES, self.replay)
        if fields.get("epoch") not in (None, msg.epoch) and msg.body.get("reason") != "wrong_epoch":
            self._sock.close(0)             # a stale reply may be followed by the real one: drop both
            self._sock = self._connect()
            raise ProtocolError("wrong_epoch", f"a reply from {self.endpoint} names another epoch than its "
                                               "request (a reply of an earlier start, replayed); not taken")
        return msg, bool(self.key) and self.session.heard(msg.epoch)

    def ping(self) -> dict[str, Any]:
        return self.request("ping")[1]

    def register(self, comm: str, name: str, kind: str, gpus: Iterable[str] | None = None) -> list[str]:
        """Register a collective of communicator ``comm``; ``gpus``: its members (GPU ids
        in rank order; default every GPU of the fabric, or the members ``comm`` was first
        registered with).  Returns the registered names."""
        body: dict[str, Any] = {"comm": comm, "name": name, "kind": kind}
        if isinstance(gpus, str):
            raise MCCLError(f"gpus must be a list of GPU ids, got one string {gpus[:40]!r}")
        if gpus is not None:
            body["gpus"] = list(gpus)
        return self.request("register", body)[1]["registered"]

    def push_telemetry(self, samples: Iterable[dict[str, Any]]) -> dict[str, Any]:
        """Send a batch (as requests of at most ``MAX_BATCH_SAMPLES`` samples); returns
        ``{"accepted": n, "rejected": {reason: count}}`` summed over the requests."""
        it, accepted, rejected = iter(samples), 0, Counter()
        while True:
            part = list(islice(it, MAX_BATCH_SAMPLES))
            body = self._telemetry(part)
            accepted += int(body.get("accepted", 0))
            rejected.update({str(k): int(v) for k, v in dict(body.get("rejected", {})).items()})
            if len(part) < MAX_BATCH_SAMPLES:
                break
        return {"accepted": accepted, "rejected": dict(rejected)}

    def push_columns(self, batch: ColumnBatch) -> dict[str, Any]:
        """Send a binary batch (:mod:`mccl_runtime.columns`; as requests of at most
        ``MAX_COLUMN_SAMPLES`` samples); the reply summed like :meth:`push_telemetry`'s."""
        accepted, rejected = 0, Counter()
        for lo in range(0, max(len(batch), 1), MAX_COLUMN_SAMPLES):
            part = batch if len(batch) <= MAX_COLUMN_SAMPLES else batch.rows(lo, lo + MAX_COLUMN_SAMPLES)
            body = self._retry_busy("telemetry_columns", *part.to_frames())
            accepted += int(body.get("accepted", 0))
            rejected.update({str(k): int(v) for k, v in dict(body.get("rejected", {})).items()})
        return {"accepted": accepted, "rejected": dict(rejected)}

    def _telemetry(self, part: list[dict[str, Any]]) -> dict[str, Any]:
        """One telemetry request (:meth:`_retry_busy`)."""
        return self._retry_busy("telemetry", {"samples": part})

    def _retry_busy(self, type_: str, body: dict[str, Any], frames: tuple[bytes, ...] = ()) -> dict[str, Any]:
        """One request; a ``busy`` controller (its backlog of large requests is full) is
        asked again after 50, 100, 200 ms before the error is raised."""
        for wait_s in BUSY_RETRY_S:
            try:
                return self.request(type_, body, frames)[1]
            except ProtocolError as exc:
                if exc.reason != "busy":
                    raise
            time.sleep(wait_s)
        return self.request(type_, body, frames)[1]

    def get_schedule(self, comm: str, name: str) -> tuple[int, Schedule | None]:
        """The active version and schedule (``(0, None)`` before the first synthesis)."""
        status = self.schedule_status(comm, name)
        return status.version, status.schedule

    def schedule_status(self, comm: str, name: str) -> ScheduleStatus:
        """:meth:`get_schedule` with the version's swap hold: an executor polling for
        versions swaps in a version only once ``held`` is empty."""
        body = self.request("get_schedule", {"comm": comm, "name": name})[1]
        sched = body.get("schedule")
        try:
            return ScheduleStatus(int(body["version"]), Schedule.from_dict(sched) if sched is not None else None,
                                  held_links(body.get("held", [])))
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError("bad_reply", f"malformed schedule reply from the controller: {exc}") from None

    def list(self) -> list[dict[str, Any]]:
        return self.request("list")[1]["collectives"]

    def stats(self) -> dict[str, Any]:
        return self.request("stats")[1]

    def subscribe(self) -> "Subscription":
        """Subscribe to new schedule versions (the publisher endpoint comes from ``ping``)."""
        info = self.ping()
        seq = info.get("pub_seq", 0)
        return Subscription(self._ctx, info["pub"], self.key, epoch=info.get("epoch"), controller=self.endpoint,
                            timeout_s=self.timeout_s, seq=seq if type(seq) is int else 0)

    def close(self) -> None:
        """Close the request socket and any subscriptions opened from this client."""
        self._ctx.destroy(linger=0)

    def __enter__(self) -> "ControllerClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Subscription:
    """A SUB socket on the controller's publisher; messages failing the signature or
    replay check (a repeated nonce, or with a key a ``seq`` not above the last one of
    the same controller epoch) are dropped and counted in ``rejected``.

    **Epochs** (with a key): the subscription starts in ``epoch`` (the controller's, from
    the ``ping`` that found the publisher) at its publish count ``seq`` (an earlier
    publication replayed to it is refused) and accepts a publication only of the epoch the
    controller at ``controller`` names as its own in a signed ``ping`` *sent after the
    publication was read*: epochs never come back, so it is no replay of an earlier start
    (issue 27).  One ``ping`` covers a burst read at once (:data:`DRAIN_MAX`); a silent
    controller is asked again after :data:`EPOCH_CHECK_S`, refusing meanwhile.  Without
    ``controller`` any epoch is accepted."""

    def __init__(self, ctx: Any, endpoint: str, key: bytes | None, epoch: Any = None,
                 controller: str | None = None, timeout_s: float = 5.0, seq: int = 0) -> None:
        import zmq

        self._sock = ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        self._sock.setsockopt(zmq.SUBSCRIBE, SCHEDULE_TOPIC)
        # watched from before the connect, so a handshake that completes at once is seen
        self._monitor = self._sock.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self._connected = False
        connect(self._sock, endpoint, "publisher")
        self.key = key
        self.replay = ReplayGuard() if key else None
        self.rejected = 0
        #: publications of the current epoch skipped over (signed ``seq`` gaps): the
        #: controller's PUB socket drops them for a subscriber 64 behind (``PUB_HWM``)
        self.missed = 0
        self._last: tuple[Any, int] = (epoch, seq)  # (epoch, seq) of the last accepted publication
        self._controller, self._timeout_s = controller, timeout_s
        self._checked: tuple[Any, float] = (None, -float("inf"))  # (its epoch or None, ping sent)
        self._pending: deque[tuple[bytes, float]] = deque()   # (publication, when read off the socket)

    def recv(self, timeout_s: float) -> ScheduleUpdate | None:
        """The next valid schedule update, or ``None`` after ``timeout_s`` (swap holds are
        skipped; :meth:`recv_any` returns them)."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            update = self.recv_any(left)
            if update is None or not isinstance(update, HoldUpdate):
                return update
        return None

    def recv_any(self, timeout_s: float) -> ScheduleUpdate | HoldUpdate | None:
        """The next valid publication (a new version, or a :class:`HoldUpdate`), or
        ``None`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self._pending or (left := deadline - time.monotonic()) > 0:
            if not self._pending and not self._drain(left):
                return None
            raw, received = self._pending.popleft()
            try:
                msg = decode(raw, self.key, PUBLICATIONS, self.replay)
                b = msg.body
                update: ScheduleUpdate | HoldUpdate
                comm, name, version = publication_key(b)
                if msg.type == "hold":
                    update = HoldUpdate(comm, name, version, held_links(b["held"]))
                else:
                    update = comm, name, version, Schedule.from_dict(b["schedule"])
                if self.key and not self._fresh(msg, received):
                    raise ProtocolError("replayed", "a publication older than one already received")
                return update
            except (MCCLError, KeyError, TypeError, ValueError):     # a bad schedule too
                self.rejected += 1
        return None

    def _drain(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s``, then queue all publications read, stamped with the time."""
        import zmq

        if not self._sock.poll(int(timeout_s * 1000) + 1):
            return False
        now = time.monotonic()
        for _ in range(DRAIN_MAX):
            try:
                self._pending.append((self._sock.recv_multipart(zmq.NOBLOCK)[-1], now))
            except zmq.Again:
                break
        return bool(self._pending)

    def _fresh(self, msg: Message, received: float) -> bool:
        """Whether a signed publication comes after the last one accepted (a new epoch
        starts a new count) and names the controller's epoch as of after it was
        ``received``; remembers it if so."""
        seq = msg.seq if isinstance(msg.seq, int) and not isinstance(msg.seq, bool) else None
        if seq is None or (msg.epoch == self._last[0] and seq <= self._last[1]):
            return False
        if not self._current(msg.epoch, received):
            return False
        if msg.epoch == self._last[0]:
            self.missed += seq - self._last[1] - 1
        self._last = (msg.epoch, seq)
        return True

    def _current(self, epoch: Any, received: float) -> bool:
        """Whether ``epoch`` was the controller's own after ``received`` (a signed
        ``ping`` sent since); ``False`` when it cannot be asked in time."""
        if self._controller is None:
            return True
        asked = self._checked[1]
        if asked < received and (self._checked[0] is not None or time.monotonic() - asked >= EPOCH_CHECK_S):
            now = time.monotonic()
            try:
                with ControllerClient(self._controller, self.key, self._timeout_s) as client:
                    self._checked = (client.ping().get("epoch"), now)
            except MCCLError:
                self._checked = (None, now)
        return self._checked[1] >= received and self._checked[0] is not None and epoch == self._checked[0]

    def wait_connected(self, timeout_s: float) -> bool:
        """Block until the connection to the publisher has finished its handshake (the
        subscription is sent with it), so updates published from then on arrive: a
        ZeroMQ subscriber that has not connected yet silently misses them ("slow
        joiner").  ``False`` after ``timeout_s`` without a connection."""
        import zmq
        from zmq.utils.monitor import recv_monitor_message

        deadline = time.monotonic() + timeout_s
        while (not self._connected and self._monitor is not None
               and (left := deadline - time.monotonic()) > 0):
            if not self._monitor.poll(int(left * 1000) + 1):
                break
            event = recv_monitor_message(self._monitor)["event"]
            self._connected = event == zmq.EVENT_HANDSHAKE_SUCCEEDED
        if self._connected:
            self._stop_monitor()
        return self._connected

    def _stop_monitor(self) -> None:
        if self._monitor is not None:
            self._sock.disable_monitor()
            self._monitor.close(0)
            self._monitor = None

    def close(self) -> None:
        self._stop_monitor()
        self._sock.close(0)


class ShardedClient:
    """A client of a sharded controller (:mod:`mccl_runtime.shards`): ``ping`` on any
    shard lists them all, and each communicator's requests go to the shard
    :func:`~mccl_runtime.shards.shard_of` names.  An unsharded controller is one shard."""

    def __init__(self, endpoint: str, key: bytes | None = None, timeout_s: float = 5.0) -> None:
        from .shards import shard_endpoints_of, shard_of

        self._shard_of = shard_of
        first = ControllerClient(endpoint, key, timeout_s)
        try:
            endpoints = shard_endpoints_of(first, timeout_s) or [endpoint]
        except Exception:
            first.close()
            raise
        self.endpoints = endpoints
        self.clients = [first if ep == endpoint else ControllerClient(ep, key, timeout_s) for ep in endpoints]
        if first not in self.clients:
            first.close()

    def for_comm(self, comm: str) -> ControllerClient:
        """The client of the shard serving ``comm``."""
        return self.clients[self._shard_of(comm, len(self.clients))]

    def register(self, comm: str, name: str, kind: str, gpus: Iterable[str] | None = None) -> list[str]:
        return self.for_comm(comm).register(comm, name, kind, gpus)

    def get_schedule(self, comm: str, name: str) -> tuple[int, Schedule | None]:
        return self.for_comm(comm).get_schedule(comm, name)

    def list(self) -> list[dict[str, Any]]:
        """Every shard's collectives."""
        return [c for cli in self.clients for c in cli.list()]

    def _targets(self, comms: Iterable[str] | None) -> list[ControllerClient]:
        if comms is None:
            return self.clients
        return list(dict.fromkeys(self.for_comm(c) for c in comms))

    def push_telemetry(self, samples: list[dict[str, Any]], comms: Iterable[str] | None = None) -> dict[str, Any]:
        """Send a batch to the shards of ``comms`` (default every shard); the replies summed."""
        return _sum([cli.push_telemetry(samples) for cli in self._targets(comms)])

    def push_columns(self, batch: ColumnBatch, comms: Iterable[str] | None = None) -> dict[str, Any]:
        """:meth:`ControllerClient.push_columns` to the shards of ``comms`` (default all)."""
        return _sum([cli.push_columns(batch) for cli in self._targets(comms)])

    def subscribe(self) -> list["Subscription"]:
        """One subscription per shard."""
        return [cli.subscribe() for cli in self.clients]

    def close(self) -> None:
        for cli in self.clients:
            cli.close()

    def __enter__(self) -> "ShardedClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _sum(replies: list[dict[str, Any]]) -> dict[str, Any]:
    rejected: Counter[str] = Counter()
    for r in replies:
        rejected.update(r.get("rejected", {}))
    return {"accepted": sum(int(r.get("accepted", 0)) for r in replies), "rejected": dict(rejected)}

