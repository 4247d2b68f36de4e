"""The controller service over real ZeroMQ sockets on loopback (threads and a subprocess)."""

from __future__ import annotations

import contextlib
import json
import threading
import time

import pytest
import zmq

from mccl_opt.errors import MCCLError
from mccl_runtime.client import ControllerClient
from mccl_runtime.manager import Policy
from mccl_runtime.protocol import ProtocolError, decode, encode
from mccl_runtime.service import ControllerService, is_loopback
from tests.test_runtime_manager import TOPO, PruningSynth

KEY = b"0123456789abcdef-test-key"


class Server:
    def __init__(self, synth=None, **kw):
        self.synth = synth or PruningSynth()
        kw.setdefault("policy", Policy(gamma=0.1, min_dwell_s=0.0))
        self.svc = ControllerService(TOPO, "tcp://127.0.0.1:0", synthesize=self.synth, alpha=1.0, **kw)
        self.thread = threading.Thread(target=self.svc.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        assert self.svc.ready.wait(5.0)
        return self.svc

    def __exit__(self, *exc):
        self.svc.stop()
        self.thread.join(5.0)
        assert not self.thread.is_alive()


def settled(svc: ControllerService, timeout_s: float = 10.0) -> bool:
    """Every synthesis job of ``svc`` (a :class:`Server`'s) done and its version published.
    A finished job is published by the service loop's next turn, and the final state
    write on :meth:`ControllerService.stop` runs no turn: a test that stops the service
    right after ``manager.wait_idle`` saved no schedule when its thread got no turn (a
    loaded machine)."""
    deadline = time.monotonic() + timeout_s
    if not svc.manager.wait_idle(timeout_s):
        return False
    while any(c.version == 0 for c in svc.manager.collectives()):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _degraded(t):
    return [{"kind": "link", "src": a, "dst": b, "gbps": 50.0, "t": t}
            for a, b in (("s0h0g0", "s0tor0"), ("s0tor0", "s0h0g0"))]


def test_round_trip_register_subscribe_degrade_and_malformed():
    with Server() as svc, ControllerClient(svc.endpoint, timeout_s=5.0) as cli:
        assert cli.ping()["topology"] == TOPO.name
        sub = cli.subscribe()
        assert sub.wait_connected(5.0)                    # no update is published before this
        assert cli.register("world", "ag", "allgather") == ["ag"]
        upd = sub.recv(5.0)
        assert upd is not None and upd[:3] == ("world", "ag", 1)
        rep = cli.push_telemetry(_degraded(time.time()) + [{"kind": "link", "src": "x", "dst": "y",
                                                             "gbps": 1.0, "t": 0.0}])
        assert rep == {"accepted": 2, "rejected": {"unknown_link": 1}}
        upd = sub.recv(5.0)
        assert upd is not None and upd[2] == 2
        version, sched = cli.get_schedule("world", "ag")
        assert version == 2 and sched.to_dict()["chunks"] == upd[3].to_dict()["chunks"]
        # malformed input is answered with an error and counted
        raw = zmq.Context.instance().socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(svc.endpoint)
        raw.send_multipart([b"", b"{not json"])
        assert raw.poll(5000)
        reply = decode(raw.recv_multipart()[-1])
        assert reply.type == "error" and reply.body["reason"] == "malformed_json"
        raw.close(0)
        with pytest.raises(ProtocolError) as err:
            cli.request("get_schedule", {"comm": "world"})
        assert err.value.reason == "bad_body"
        stats = cli.stats()
        assert stats["protocol_errors"] == {"malformed_json": 1, "bad_body": 1}
        assert stats["manager"]["published"] == 2 and stats["telemetry"]["rejected"]["unknown_link"] == 1
        # leaving the block closes the client together with its open subscription (no hang)


def test_signed_service_rejects_strangers():
    with Server(key=KEY) as svc:
        with ControllerClient(svc.endpoint, timeout_s=5.0) as stranger:
            with pytest.raises(ProtocolError) as err:
                stranger.push_telemetry(_degraded(time.time()))
            assert err.value.reason == "unsigned"
        with ControllerClient(svc.endpoint, key=b"wrong-key-wrong-key", timeout_s=5.0) as forger:
            with pytest.raises(ProtocolError) as err:
                forger.push_telemetry(_degraded(time.time()))
            assert err.value.reason == "bad_signature"
        assert svc.store.accepted == 0
        with ControllerClient(svc.endpoint, key=KEY, timeout_s=5.0) as friend:
            assert friend.push_telemetry(_degraded(time.time()))["accepted"] == 2
            assert friend.stats()["protocol_errors"] == {"unsigned": 1, "bad_signature": 1}


@contextlib.contextmanager
def _publisher_and_subscriber():
    """A bare publisher and a signed :class:`Subscription` connected to it; returns once
    the publisher holds the subscription (an XPUB hands it to the application), so
    nothing sent afterwards is dropped."""
    from mccl_runtime.client import Subscription

    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub = Subscription(ctx, f"tcp://127.0.0.1:{port}", KEY)
    assert pub.poll(5000) and pub.recv()[:1] == b"\x01"    # the subscribe message arrived
    try:
        yield pub, sub
    finally:
        sub.close()
        pub.close(0)


def test_subscription_reports_no_connection_without_a_publisher():
    from mccl_runtime.client import Subscription

    import socket

    with socket.socket() as probe:                        # closed at once (a zmq socket closes
        probe.bind(("127.0.0.1", 0))                      # in its I/O thread, later: a SUB could
        port = probe.getsockname()[1]                     # still connect to it)
    sub = Subscription(zmq.Context.instance(), f"tcp://127.0.0.1:{port}", KEY)
    try:
        assert sub.wait_connected(0.2) is False
    finally:
        sub.close()


def test_subscriber_drops_forged_schedules():
    with _publisher_and_subscriber() as (pub, sub):
        pub.send_multipart([b"schedule", encode("schedule", {"comm": "w", "name": "x", "version": 9,
                                                             "schedule": {}}, b"forged-key-forged")])
        assert sub.recv(0.5) is None and sub.rejected == 1


def test_signed_service_rejects_replayed_and_stale_requests(monkeypatch):
    """A captured signed request sent again is refused (same nonce, and its ``seq`` is
    not above the client's mark), and so is one whose send time lies outside the replay
    window; both are counted, neither is applied."""
    import mccl_runtime.protocol as protocol
    from mccl_runtime.protocol import new_id

    with Server(key=KEY) as svc:
        raw = zmq.Context.instance().socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(svc.endpoint)
        client = new_id()
        captured = encode("telemetry", {"samples": _degraded(time.time())}, KEY,
                          epoch=svc.epoch, client=client, seq=1)
        reasons = []
        for payload in (captured, captured):
            raw.send_multipart([b"", payload])
            assert raw.poll(5000)
            reply = decode(raw.recv_multipart()[-1], KEY)
            reasons.append(reply.body.get("reason", reply.type))
        monkeypatch.setattr(protocol.time, "time", lambda: time.monotonic() - 1e6)
        old = encode("telemetry", {"samples": _degraded(time.time())}, KEY, epoch=svc.epoch, client=client, seq=2)
        monkeypatch.undo()
        raw.send_multipart([b"", old])
        assert raw.poll(5000)
        reasons.append(decode(raw.recv_multipart()[-1], KEY).body["reason"])
        raw.close(0)
        assert reasons == ["ok", "replayed", "stale"]
        assert svc.store.accepted == 2 and svc.protocol_errors == {"replayed": 1, "stale": 1}


def test_subscriber_drops_a_replayed_schedule():
    from mccl_opt.allgather import solve_allgather

    msg = encode("schedule", {"comm": "w", "name": "x", "version": 3,
                              "schedule": solve_allgather(TOPO).to_dict()}, KEY, epoch="e" * 32, seq=1)
    with _publisher_and_subscriber() as (pub, sub):
        pub.send_multipart([b"schedule", msg])
        assert sub.recv(2.0)[2] == 3
        pub.send_multipart([b"schedule", msg])
        assert sub.recv(0.5) is None and sub.rejected == 1


def test_replay_guard_forgets_only_what_the_time_check_refuses():
    from mccl_runtime.protocol import ReplayGuard

    now = [1000.0]
    guard = ReplayGuard(window_s=10.0, clock=lambda: now[0])
    guard.check(995.0, "a" * 32)
    with pytest.raises(ProtocolError, match="before"):
        guard.check(995.0, "a" * 32)
    now[0] = 1006.0                          # "a" expires (995 < 996) only when stale too
    guard.check(1005.0, "b" * 32)
    assert "a" * 32 not in guard._seen
    with pytest.raises(ProtocolError) as err:
        guard.check(995.0, "a" * 32)
    assert err.value.reason == "stale"
    for ts, nonce in ((float("nan"), "c" * 32), (1005.0, "short"), (True, "d" * 32)):
        with pytest.raises(ProtocolError) as err:
            guard.check(ts, nonce)
        assert err.value.reason == "bad_envelope"


def test_restart_resumes_from_state_without_resynthesis(tmp_path):
    state = tmp_path / "controller.json"
    with Server(state_path=state) as svc, ControllerClient(svc.endpoint) as cli:
        cli.register("world", "ag", "allgather")
        deadline = time.time() + 5
        while cli.get_schedule("world", "ag")[0] < 1 and time.time() < deadline:
            time.sleep(0.02)
        cli.push_telemetry(_degraded(time.time()))
        while cli.get_schedule("world", "ag")[0] < 2 and time.time() < deadline:
            time.sleep(0.02)
        before = cli.get_schedule("world", "ag")
    assert before[0] == 2 and state.exists()
    fresh = PruningSynth()
    with Server(synth=fresh, state_path=state) as svc, ControllerClient(svc.endpoint) as cli:
        assert cli.ping()["resumed"] is True
        after = cli.get_schedule("world", "ag")
        assert after[0] == 2 and after[1].to_dict() == before[1].to_dict()
        # the resumed AllGather trees carry their warm state again (a failure reroutes them)
        assert svc.manager.get("world", "ag").schedule.warm_state.trees.forest is not None
        assert cli.push_telemetry(_degraded(time.time()))["accepted"] == 2   # same M: no drift
        time.sleep(0.1)
        assert cli.stats()["manager"]["published"] == 2
    assert fresh.calls == []


def test_loopback_only_by_default():
    assert is_loopback("tcp://127.0.0.1:5555") and is_loopback("ipc:///tmp/x")
    assert not is_loopback("tcp://0.0.0.0:5555") and not is_loopback("tcp://*:5555")
    with pytest.raises(MCCLError, match="loopback"):
        ControllerService(TOPO, "tcp://0.0.0.0:5555", synthesize=PruningSynth())


def test_client_times_out_instead_of_hanging():
    ctx = zmq.Context.instance()
    dead = ctx.socket(zmq.ROUTER)               # bound but never answers
    dead.setsockopt(zmq.LINGER, 0)
    port = dead.bind_to_random_port("tcp://127.0.0.1")
    with ControllerClient(f"tcp://127.0.0.1:{port}", timeout_s=0.3) as cli:
        with pytest.raises(ProtocolError) as err:
            cli.ping()
        assert err.value.reason == "timeout"
    dead.close(0)


def test_cli_serve_subprocess_graceful_sigterm(tmp_path):
    from tests.procs import start_controller, stop

    topo_file, state = tmp_path / "t.json", tmp_path / "state.json"
    TOPO.save(topo_file)
    proc = start_controller(topo_file, state)
    try:
        line = proc.stdout.readline()
        assert line.startswith("controller on tcp://127.0.0.1:"), line + proc.stderr.read()
        endpoint = line.split()[2]
        with ControllerClient(endpoint, timeout_s=5.0) as cli:
            assert cli.ping()["resumed"] is False
            assert cli.push_telemetry(_degraded(time.time()))["accepted"] == 2
        assert stop(proc, 10) == 0
    finally:
        if proc.poll() is None:
            stop(proc, 1)
    assert state.exists()
    assert '"accepted":2' in state.read_text()


def test_level_estimator_synthesizes_for_the_confirmed_new_level():
    """``estimator="level"``: one low sample is not trusted (no new version); a run of
    them confirms the change, and the version published is synthesized for the new
    level itself (the EWMA would still remember the healthy link)."""
    with Server(estimator="level") as svc, ControllerClient(svc.endpoint, timeout_s=5.0) as cli:
        sub = cli.subscribe()
        assert sub.wait_connected(5.0)
        assert cli.register("world", "ag", "allgather") == ["ag"]
        assert sub.recv(5.0)[2] == 1
        t0 = time.time() - 1.0
        assert cli.push_telemetry(_degraded(t0))["accepted"] == 2
        assert cli.stats()["manager"]["published"] == 1        # one sample: not confirmed
        for i in range(1, 16):
            cli.push_telemetry(_degraded(t0 + 0.004 * i))
        upd = sub.recv(10.0)
        assert upd is not None and upd[2] == 2
        a = TOPO.link_index("s0h0g0", "s0tor0")
        assert svc.store.measured()[a] == pytest.approx(50.0, rel=0.02)


def test_a_version_is_published_even_if_the_decision_that_collected_it_fails():
    """A decision (manager.step) that raises after collecting a finished job: the version
    it applied is still published in that turn (bench_shards once saw `list` at version 2
    with no publication; publication follows the versions, not the turn's events)."""
    svc = ControllerService(TOPO, "tcp://127.0.0.1:0", synthesize=PruningSynth(), alpha=1.0,
                            policy=Policy(gamma=0.1, min_dwell_s=0.0))

    class Pub:
        sent: list = []

        def send_multipart(self, frames):
            msg = json.loads(frames[1])
            if msg["type"] == "schedule":           # not the swap holds the degradation causes
                self.sent.append(msg["body"]["version"])

    pub = Pub()
    svc.register("world", "ag", "allgather", now=time.time())
    coll = svc.manager.get("world", "ag")
    coll.job.future.result(10.0)
    svc._turn(pub)
    assert pub.sent == [1]
    svc.store.ingest(_degraded(time.time()))
    svc._decide = True
    svc._turn(pub)                                  # the decision starts a job
    coll.job.future.result(10.0)

    def broken(now):
        raise RuntimeError("a bug after the job was collected")

    svc.manager._check = broken
    svc._decide = True
    svc._turn(pub)                                  # collects v2, then raises
    assert svc.internal_errors == 1 and coll.version == 2
    assert pub.sent == [1, 2]
    svc._turn(pub)
    assert pub.sent == [1, 2]                       # once
    svc.manager.close()
