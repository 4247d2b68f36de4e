"""The long-running controller service (``mccl controller serve``).

A ZeroMQ ROUTER socket answers requests (:mod:`mccl_runtime.protocol`) from executors
(REQ or DEALER sockets); a PUB socket publishes every new schedule version under the
topic ``b"schedule"``.  One loop turn answers the queued requests, small ones first
(:mod:`.inbox`), large ones for up to :data:`TURN_BUDGET_S`, then makes one manager
decision (Algorithm 1, re-synthesis start) if telemetry arrived, collects finished
re-syntheses and publishes them.

Guarantees (docs/runtime.md, "Limits and guarantees"):

* **A message never stops the service.**  Every exception a request raises becomes an
  ``error`` reply (reason ``internal`` for unexpected ones), a counted rejection and a
  log line; failures of the loop's own work (a synthesizer bug) are logged and counted.
* **Persist before publish.**  A new version is written to the state file before it
  goes out on PUB or is served by ``get_schedule``, so a version seen by anyone survives
  a crash and is never reused for other chunks; a registration is written before it is
  acknowledged, and undone (error reply ``not_persisted``) if the write fails.  A
  failing disk puts the service in read-only mode (:mod:`.durability`), logged once.
* **Bounded work.**  Requests above ``max_request_bytes`` are dropped by the socket
  (``ZMQ_MAXMSGSIZE``); a telemetry request carries at most ``MAX_BATCH_SAMPLES``
  samples; at most ``MAX_BACKLOG`` large requests wait (more are refused ``busy``), and
  a small one waits only for the large one in progress; at most ``max_collectives``
  collectives are registered; telemetry alone rewrites the state at most every
  ``persist_interval_s``.

Binding is loopback-only unless ``allow_remote`` is set, which needs a key.
:meth:`ControllerService.stop` (the CLI wires SIGTERM/SIGINT to it) ends the loop, saves
the state and closes the sockets.

Longer than ~400 lines on purpose: the loop, the request handlers and the
persist-before-publish order share one socket, one state file and one turn; split, each
part would reach into the others' fields.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from mccl_opt.errors import MCCLError
from mccl_opt.topology import Topology

from .columns import ColumnBatch
from .decision_log import log_events
from .durability import DurableState
from .endpoints import ephemeral, is_loopback
from .manager import Event, Policy, ScheduleManager
from .synthesizer import Synthesizer
from .pool import SynthesisPool
from .quota import MAX_REGISTRATIONS_PER_MIN, RegistrationBudget
from .gate import MAX_ERROR_CHARS, RequestGate, telemetry_samples
from .protocol import (MAX_REQUEST_BYTES, REPLAY_WINDOW_S, SCHEDULE_TOPIC, Message,
                       ProtocolError, brief, encode)
from .inbox import Inbox
from .shards import shard_of
from .state import StateWriter, check_state_folder, load_state, remove_temporaries
from .state_check import MAX_COLLECTIVES, MAX_NAME_CHARS, name_problem
from .swap_holds import HOLD_WINDOW_S, SwapHolds
from .telemetry import MeasurementStore

__all__ = ["ControllerService", "is_loopback", "MAX_COLLECTIVES", "MAX_CLIENT_COLLECTIVES", "MAX_NAME_CHARS"]

log = logging.getLogger("mccl.controller")

#: of them, registered by one signed client (its ``client`` id; an AllReduce counts two): a
#: runaway client cannot take every slot (docs/runtime.md, "Threat model")
MAX_CLIENT_COLLECTIVES = 64
#: requests received per drain, and seconds of large requests per loop turn, before the
#: loop decides, publishes and persists
TURN_MESSAGES = 64
TURN_BUDGET_S = 0.02
#: publications queued per subscriber before libzmq drops the newest for that subscriber
#: only (its default, 1000, let a subscriber that never reads hold 1000 schedules in the
#: controller's memory; not ``ZMQ_CONFLATE``, which would keep one collective's version of
#: many and does not take multipart messages): docs/runtime.md, "Limits and guarantees"
PUB_HWM = 64


def open_sockets(ctx: Any, max_request_bytes: int) -> tuple[Any, Any]:
    """The service's ROUTER (requests, each at most ``max_request_bytes``) and PUB
    (publications, at most :data:`PUB_HWM` queued per subscriber) sockets, unbound."""
    import zmq

    router, pub = ctx.socket(zmq.ROUTER), ctx.socket(zmq.PUB)
    for s in (router, pub):
        s.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.MAXMSGSIZE, max_request_bytes)
    pub.setsockopt(zmq.SNDHWM, PUB_HWM)
    return router, pub


class ControllerService:
    """The controller: a :class:`ScheduleManager` behind ZeroMQ sockets."""

    def __init__(self, topo: Topology, bind: str = "tcp://127.0.0.1:5555", *,
                 pub_bind: str | None = None, key: bytes | None = None,
                 state_path: str | Path | None = None, synthesize: Synthesizer | None = None,
                 alpha: float = 0.012, estimator: str = "ewma", policy: Policy = Policy(),
                 allow_remote: bool = False, persist_interval_s: float = 1.0, clock: Callable[[], float] = time.time,
                 replay_window_s: float = REPLAY_WINDOW_S, max_collectives: int = MAX_COLLECTIVES,
                 max_client_collectives: int = MAX_CLIENT_COLLECTIVES, max_request_bytes: int = MAX_REQUEST_BYTES, pool: SynthesisPool | None = None,
                 hold_window_s: float = HOLD_WINDOW_S,
                 max_registrations_per_min: int = MAX_REGISTRATIONS_PER_MIN) -> None:
        if pub_bind is None:
            pub_bind = bind.rsplit(":", 1)[0] + ":*" if bind.startswith("tcp://") else bind + "-pub"
        if allow_remote and not key:
            raise MCCLError("--allow-remote needs a --key-file: without a key anyone who can reach the "
                            "port could inject telemetry and read schedules")
        for ep in (bind, pub_bind):
            if not allow_remote and not is_loopback(ep):
                raise MCCLError(f"refusing to bind {brief(ep, 80)}: not a loopback address; pass "
                                "--allow-remote (and a --key-file) to expose the controller to the network")
        self.bind_req, self.bind_pub = ephemeral(bind), ephemeral(pub_bind)
        self.key = key
        self.gate = RequestGate(key, replay_window_s, max_request_bytes, log)   # checks every request
        self.epoch = self.gate.epoch
        self._pub_seq = 0
        self.clock = clock
        self.state_path = Path(state_path) if state_path else None
        self.folder = check_state_folder(self.state_path) if self.state_path else None   # held open
        if self.folder is not None:
            self.folder.lock()                     # one controller per state file
        self.writer = StateWriter(self.state_path, topo, self.folder) if self.state_path else None
        self.durable = DurableState(self.writer)
        self.final_write_ok: bool | None = None    # after serve_forever: the last write's outcome
        self.persist_interval_s = persist_interval_s
        self.max_collectives, self.max_client_collectives = max_collectives, max_client_collectives
        self._owners: dict[tuple[str, str], str] = {}     # collective -> the client that registered it
        self.budget = RegistrationBudget(max_registrations_per_min)   # all register requests together
        self.max_request_bytes = max_request_bytes
        self.store = MeasurementStore(topo, alpha=alpha, estimator=estimator, clock=clock)
        self.store.watch_early = policy.speculate       # executors' early estimates (EWMA)
        self.manager = ScheduleManager(self.store, synthesize, policy, pool=pool)   # pool: jobs in processes
        self.holds = SwapHolds(hold_window_s)      # swap holds sent to executors (.swap_holds)
        self.protocol_errors: Counter[str] = self.gate.protocol_errors
        self.requests: Counter[str] = self.gate.requests
        self.internal_errors = 0
        self.endpoint: str | None = None
        self.pub_endpoint: str | None = None
        self.ready = threading.Event()
        self.resumed = False
        self._stop = threading.Event()
        self._dirty_since: float | None = None     # telemetry not yet written
        self._must_persist = False                 # a registration not yet written
        self._unsaved: list[tuple[str, list[str]]] = []    # (comm, names) registered, not yet written
        self._decide = False                       # telemetry arrived since the last decision
        self._sent: dict[tuple[str, str], int] = {}    # collective -> the last version published
        self.shard: tuple[int, int] | None = None   # (index, count) in a sharded controller
        self.shard_endpoints: list[str] | None = None
        self._resume()

    # ------------------------------------------------------------------ state
    def _resume(self) -> None:
        if self.state_path is None:
            return
        try:
            for tmp in remove_temporaries(self.state_path, self.folder):
                log.warning("removed %s, left by a write that did not finish", tmp)
        except OSError as exc:                     # a read-only disk: the first write will say so
            log.warning("cannot remove a temporary file next to %s: %s", self.state_path, exc.strerror)
        state = load_state(self.state_path, self.store.topo, now=self.clock(),
                           max_ratio=self.store.max_ratio,
                           future_tolerance_s=self.store.future_tolerance_s, max_collectives=self.max_collectives,
                           folder=self.folder)
        if state is None:
            return
        self.store.restore(state["telemetry"])
        self.manager.restore(state["manager"])
        self.writer.adopt(self.manager, state)
        self.protocol_errors.update(state["protocol_errors"])
        self.durable.adopt(self.manager)
        self._sent = {c.key: c.version for c in self.manager.collectives()}   # published before the restart
        self.resumed = True
        log.info("resumed from %s: %s", self.state_path, ", ".join(
            f"{c.comm}/{c.name} v{c.version}" for c in self.manager.collectives()) or "no collectives")

    def persist(self) -> bool:
        """Write the state file (if any) now (:class:`.state.StateWriter`); ``False`` if
        the write failed (the service is then read-only, :mod:`.durability`)."""
        if not self.durable.save(self.store, self.manager, self.protocol_errors):
            return False
        self._dirty_since = None
        self._must_persist = False
        return True

    # ------------------------------------------------------------------ loop
    def stop(self) -> None:
        """Ask the loop to finish (safe from signal handlers and other threads)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was asked."""
        return self._stop.is_set()

    def serve_forever(self, poll_ms: int = 20) -> None:
        """Run until :meth:`stop`; always tries a last state write (``final_write_ok``
        says whether it worked) and closes the sockets."""
        import zmq

        if not self.key:
            log.warning("serving WITHOUT a key: any local process can inject telemetry and "
                        "register collectives; pass --key-file to sign and check every message")
        ctx = zmq.Context()
        router, pub = open_sockets(ctx, self.max_request_bytes)
        try:
            for sock, ep in ((router, self.bind_req), (pub, self.bind_pub)):
                try:
                    sock.bind(ep)
                except zmq.ZMQError as exc:
                    raise MCCLError(f"cannot bind {ep}: {exc}; is another controller running there? "
                                    "pick another --bind/--pub-bind (port 0 picks a free one)") from None
            self.endpoint = router.getsockopt(zmq.LAST_ENDPOINT).decode()
            self.pub_endpoint = pub.getsockopt(zmq.LAST_ENDPOINT).decode()
            self.ready.set()
            inbox = Inbox(router, zmq)
            while not self._stop.is_set():
                router.poll(0 if inbox.backlog else poll_ms)
                held = self._serve_requests(inbox, router)
                self._turn(pub)
                self._answer_held(router, held)
        finally:
            self.ready.set()
            self.manager.close()
            self.final_write_ok = self._guarded("final state write", self.persist) is True
            if self.folder is not None:
                self.folder.unlock()
            router.close(0)
            pub.close(0)
            ctx.term()

    def _serve_requests(self, inbox: Inbox, router: Any) -> list[tuple[list[bytes], bool]]:
        """Answer one turn's requests, small ones first (:class:`.inbox.Inbox`), large
        ones for up to ``TURN_BUDGET_S`` (at least one); returns the replies held back
        until the state is written (a registration's and those after it), each with
        whether it acknowledges a registration."""
        held: list[tuple[list[bytes], bool]] = []

        def answer(frames: list[bytes]) -> None:
            registered = len(self._unsaved)
            reply = self._handle(frames)
            if reply is not None and self._must_persist:
                held.append((reply, len(self._unsaved) > registered))
            elif reply is not None:
                router.send_multipart(reply)

        def refuse(frames: list[bytes]) -> None:
            self.protocol_errors["busy"] += 1
            router.send_multipart(frames[:-1] + [self._encode("error", {
                "reason": "busy", "message": "the controller is saturated with large requests; retry"})])

        deadline = time.perf_counter() + TURN_BUDGET_S
        inbox.drain(answer, refuse, TURN_MESSAGES)
        while (frames := inbox.pop()) is not None:
            answer(frames)
            inbox.drain(answer, refuse, TURN_MESSAGES)
            if time.perf_counter() > deadline:
                break
        return held

    def _turn(self, pub: Any) -> None:
        """The loop's own work: one decision, collect jobs, publish, persist."""
        now = self.clock()
        events: list[Event] = []
        if self._decide:
            self._decide = False
            events = self._guarded("decision", lambda: self.manager.step(now)) or []
        else:
            events = self._guarded("collecting re-syntheses", lambda: self.manager.poll(now)) or []
        log_events(log, events, self.manager)
        self._publish(pub)
        self._guarded("swap holds", lambda: self._send_holds(pub, now))
        if self._dirty_since is not None:             # the wall clock stepped back: no write for that long
            self._dirty_since = min(self._dirty_since, self.clock())
        if self._must_persist or (self._dirty_since is not None and self.durable.due()
                                  and self.clock() - self._dirty_since >= self.persist_interval_s):
            self.persist()

    def _answer_held(self, router: Any, held: list[tuple[list[bytes], bool]]) -> None:
        """Send the replies held for this turn's write.  If the write failed, the turn's
        registrations are undone and their replies become ``not_persisted`` errors: no
        ``ok`` for a registration a restart would not know."""
        failed = self._must_persist
        if failed:
            for comm, names in self._unsaved:
                self.manager.unregister(comm, names)
            for comm, names in self._unsaved:
                for n in names:
                    self._sent.pop((comm, n), None)
            self._must_persist = False
        self._unsaved = []
        for frames, acknowledges in held:
            if failed and acknowledges:
                self.protocol_errors["not_persisted"] += 1
                frames = frames[:-1] + [self._encode("error", {"reason": "not_persisted", "message": (
                    f"the registration was undone: the state file cannot be written "
                    f"({self.durable.failure}); the controller is read-only until its disk works")[:MAX_ERROR_CHARS]})]
            router.send_multipart(frames)

    def _guarded(self, what: str, work: Callable[[], Any]) -> Any:
        """Run the loop's own work; an exception is logged and counted, not fatal
        (the result is then ``False``)."""
        try:
            return work()
        except Exception:
            self.internal_errors += 1
            log.exception("controller: %s failed; the service keeps running", what)
            return False

    def _handle(self, frames: list[bytes]) -> list[bytes] | None:
        """One request to its reply frames (:meth:`.gate.RequestGate.answer`); never raises."""
        return self.gate.answer(frames, self._dispatch)

    def _encode(self, type_: str, body: dict[str, Any]) -> bytes:
        """A reply, signed with this start's epoch (a client learns the epoch from it)."""
        return self.gate.encode(type_, body)

    def _dispatch(self, msg: Message, columns: tuple[bytes, ...] = ()) -> tuple[str, dict[str, Any]]:
        b, now = msg.body, self.clock()
        if msg.type == "telemetry_columns":
            batch = ColumnBatch.from_frames(b, columns, self.store.topo)
            return "ok", self._ingested(len(batch), self.store.ingest_columns(batch, now).to_dict(), now)
        if msg.type == "ping":
            return "ok", {"topology": self.store.topo.name, "pub": self.pub_endpoint, "resumed": self.resumed,
                          "epoch": self.epoch, "pub_seq": self._pub_seq,
                          "links": self.store.topo.num_links, "gpus": self.store.topo.num_gpus,
                          "alpha": self.store.alpha, "estimator": self.store.estimator, "read_only": self.durable.failure,
                          "shard": None if self.shard is None else self.shard[0], "shards": self.shard_endpoints}
        if msg.type == "telemetry":
            samples = telemetry_samples(b)
            return "ok", self._ingested(len(samples), self.store.ingest(samples, now).to_dict(), now)
        if msg.type == "register":
            names = self.register(_field(b, "comm"), _field(b, "name"), _field(b, "kind"), now,
                                  self._members(b.get("gpus")), client=msg.client, budget=self.budget)
            return "ok", {"registered": names}
        if msg.type == "get_schedule":
            coll = self.manager.get(_field(b, "comm"), _field(b, "name"))
            version, schedule = self.durable.served(coll)      # the version on disk
            return "schedule", {"comm": coll.comm, "name": coll.name, "version": version,
                                "schedule": schedule.to_dict() if schedule else None,
                                "held": self.holds.held(coll.comm, coll.name, version)}
        if msg.type == "list":
            return "ok", {"collectives": [{"comm": c.comm, "name": c.name, "kind": c.kind,
                                           "dynamic": c.dynamic, "version": self.durable.served(c)[0],
                                           "gpus": list(c.gpus) if c.gpus is not None else None}
                                          for c in self.manager.collectives()]}
        return "ok", {"telemetry": self.store.counters(), "manager": dict(self.manager.counters),
                      "protocol_errors": dict(self.protocol_errors), "requests": dict(self.requests),
                      "internal_errors": self.internal_errors, "read_only": self.durable.failure,
                      "swap_holds": self.holds.sent,
                      "failed_writes": self.durable.failed_writes, "cpu_s": time.process_time()}

    def _ingested(self, n: int, body: dict[str, Any], now: float) -> dict[str, Any]:
        """After a telemetry batch: decide at the end of the turn, write the state soon."""
        log.debug("telemetry: %d samples: %s", n, body)
        self._decide, self._dirty_since = True, self._dirty_since if self._dirty_since is not None else now
        return body

    def _members(self, gpus: Any) -> list[str] | None:
        """A register request's ``gpus``: absent, or a list of at most as many GPU ids as
        the fabric has (the manager checks the ids themselves)."""
        if gpus is None:
            return None
        if not isinstance(gpus, list) or not all(isinstance(g, str) and len(g) <= MAX_NAME_CHARS for g in gpus):
            raise ProtocolError("bad_body", f"'gpus' must be a list of GPU ids (strings of at most "
                                            f"{MAX_NAME_CHARS} characters)")
        if len(gpus) > self.store.topo.num_gpus:
            raise ProtocolError("bad_body", f"'gpus' lists {len(gpus)} ids; the fabric has "
                                            f"{self.store.topo.num_gpus} GPUs")
        return gpus

    def register(self, comm: str, name: str, kind: str, now: float, gpus: list[str] | None = None, *,
                 client: str | None = None, budget: RegistrationBudget | None = None) -> list[str]:
        """Register all of a collective or nothing (an AllReduce is two entries), within
        the cap, ``client``'s quota (a signed request's sender; collectives restored
        from the state count for no client) and ``budget`` (a protocol request's: new
        collectives a minute, all senders together, :mod:`.quota`); written at the end
        of the loop turn (a request's reply waits for it).  ``gpus``: the communicator's
        members (:meth:`ScheduleManager.register`)."""
        for label, v in (("comm", comm), ("name", name)):
            if name_problem(v):
                raise ProtocolError("bad_body", f"{label} {name_problem(v)}")
        if self.shard is not None and shard_of(comm, self.shard[1]) != self.shard[0]:
            right = shard_of(comm, self.shard[1])
            where = self.shard_endpoints[right] if self.shard_endpoints else f"shard {right}"
            raise ProtocolError("wrong_shard", f"communicator {brief(comm)} is served by {where}")
        names = [f"{name}/reducescatter", f"{name}/allgather"] if kind == "allreduce" else [name]
        taken = [n for n in names if any(c.key == (comm, n) for c in self.manager.collectives())]
        if taken:
            raise MCCLError(f"collective {brief(comm)}/{brief(taken[0])} is already registered")
        if len(self.manager.collectives()) + len(names) > self.max_collectives:
            raise MCCLError(f"this controller already serves {len(self.manager.collectives())} collectives "
                            f"(at most {self.max_collectives})")
        if client is not None:
            mine = sum(self._owners.get(c.key) == client for c in self.manager.collectives())
            if mine + len(names) > self.max_client_collectives:
                raise MCCLError(f"this client already registered {mine} collectives (at most "
                                f"{self.max_client_collectives} per client, of {self.max_collectives}; an AllReduce "
                                "counts two): register fewer, or run another controller")
        if budget is not None and (wait := budget.wait_s(len(names))) == math.inf:
            raise MCCLError(f"registering {kind} {brief(comm)}/{brief(name)} takes {len(names)} collective slots, "
                            f"more than the {budget.per_min} a minute the controller takes: a retry never "
                            "succeeds; start it with a larger max_registrations_per_min")
        if budget is not None and wait > 0:
            raise MCCLError(f"the controller takes at most {budget.per_min} new collectives a minute from all "
                            f"clients together (a bound no client id widens); retry in {min(wait, 60.0):.1f} s")
        colls = self.manager.register(comm, name, kind, now=now, gpus=gpus)
        if budget is not None:
            budget.take(len(colls))
        self._owners.update((c.key, client) for c in colls if client is not None)
        members = "" if colls[0].gpus is None else f" over {len(colls[0].gpus)} GPUs"
        log.info("registered %s/%s (%s%s); synthesizing the first schedule", comm, name, kind, members)
        self._must_persist = True
        self._unsaved.append((comm, [c.name for c in colls]))
        return [c.name for c in colls]

    def _publish(self, pub: Any) -> None:
        """Write the state, then send the new versions (never the other way round: a
        version someone saw must survive a crash).  If the write fails, the versions
        wait (not served either) and both are retried (read-only mode: every
        ``WRITE_RETRY_S``).  What is new is every collective whose version is above the
        last one published, not the turn's events: a version the manager applied is
        published even if the work that reported it failed afterwards (a decision that
        raised after collecting a finished job), so ``list`` never shows a version the
        publisher has not sent."""
        fresh = [c for c in self.manager.collectives() if c.version > self._sent.get(c.key, 0)]
        if not fresh or not self.durable.due() or not self.persist():
            return
        for coll in fresh:
            version, schedule = self.durable.served(coll)       # its latest version, the one written
            body = {"comm": coll.comm, "name": coll.name, "version": version, "schedule": schedule.to_dict()}
            self._pub_seq += 1
            pub.send_multipart([SCHEDULE_TOPIC, encode("schedule", body, self.key, epoch=self.epoch,
                                                       seq=self._pub_seq)])
            self._sent[coll.key] = version
            self.holds.published(coll.comm, coll.name, version, self.clock())

    def _send_holds(self, pub: Any, now: float) -> None:
        """Publish the swap holds and releases of this turn (:mod:`.swap_holds`)."""
        turn = self.holds.turn(self.manager, now)
        log_events(log, self.holds.take_events(), self.manager)
        for comm, name, version, links in turn:
            log.info("%s/%s v%d: %s", comm, name, version,
                     f"swap held ({', '.join('->'.join(x) for x in links)} changed since its synthesis)"
                     if links else "swap hold released")
            self._pub_seq += 1
            pub.send_multipart([SCHEDULE_TOPIC, encode("hold", {"comm": comm, "name": name, "version": version,
                                                                "held": links}, self.key, epoch=self.epoch,
                                                       seq=self._pub_seq)])


def _field(body: dict[str, Any], name: str) -> str:
    v = body.get(name)
    if not isinstance(v, str) or not v:
        raise ProtocolError("bad_body", f"request body needs a non-empty string {name!r}")
    return v
