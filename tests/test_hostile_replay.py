"""Hostile input, replay: captured signed messages sent again after a restart, after a
fresh start and within one start; samples too old or repeated; malformed nonces,
client ids and sequence numbers.  Every case must be refused and counted, never
applied (docs/runtime.md, "Threat model")."""

from __future__ import annotations

import threading
import time

import pytest
import zmq

from mccl_runtime.client import ControllerClient, Subscription
from mccl_runtime.manager import Policy
from mccl_runtime.protocol import (MAX_SEQ, Message, ProtocolError, ReplayGuard, SequenceGuard, decode,
                                   encode, new_id)
from mccl_runtime.service import ControllerService
from mccl_runtime.telemetry import MeasurementStore, RejectedSample
from tests.test_runtime_manager import TOPO, PruningSynth
from tests.test_runtime_service import KEY, _degraded


class Keyed:
    """A keyed controller on ``bind`` (an ``ipc://`` path keeps its endpoint across
    restarts), in a thread, with a state file."""

    def __init__(self, bind: str, state) -> None:
        self.svc = ControllerService(TOPO, bind, synthesize=PruningSynth(), alpha=1.0, key=KEY,
                                     policy=Policy(gamma=0.1, min_dwell_s=0.0), state_path=state)
        self.thread = threading.Thread(target=self.svc.serve_forever, daemon=True)

    def __enter__(self) -> ControllerService:
        self.thread.start()
        assert self.svc.ready.wait(5.0)
        return self.svc

    def __exit__(self, *exc) -> None:
        self.svc.stop()
        self.thread.join(10.0)
        assert not self.thread.is_alive()


def _send(endpoint: str, payloads: list[bytes]) -> list[str]:
    """Each payload on a raw socket; the reply's type, or its error reason."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    out = []
    try:
        for p in payloads:
            sock.send_multipart([b"", p])
            assert sock.poll(5000), "no reply within 5 s"
            msg = decode(sock.recv_multipart()[-1], KEY)
            out.append(msg.body["reason"] if msg.type == "error" else msg.type)
    finally:
        sock.close(0)
    return out


def _wait_version(svc: ControllerService, comm: str, name: str, version: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while svc.manager.get(comm, name).version < version:
        assert time.monotonic() < deadline, f"version {version} never came"
        time.sleep(0.02)


def _healthy(t: float) -> list[dict]:
    return [{**s, "gbps": 400.0} for s in _degraded(t)]


def test_a_degrade_batch_captured_before_a_restart_is_refused_after_it(tmp_path):
    """The issue's attack: degrade, recover, restart, replay the degrade batch.  After
    the restart the replay names the old epoch: refused, nothing applied, no version."""
    ep, state = f"ipc://{tmp_path}/ctl", tmp_path / "state.json"
    with Keyed(ep, state) as svc, ControllerClient(ep, key=KEY, timeout_s=5.0) as cli:
        cli.register("w", "ag", "allgather")
        _wait_version(svc, "w", "ag", 1)
        client, old_epoch = new_id(), svc.epoch
        degrade = encode("telemetry", {"samples": _degraded(time.time())}, KEY,
                         epoch=svc.epoch, client=client, seq=1)
        register = encode("register", {"comm": "x", "name": "ag2", "kind": "allgather"}, KEY,
                          epoch=svc.epoch, client=client, seq=2)
        assert _send(ep, [degrade]) == ["ok"]
        _wait_version(svc, "w", "ag", 2)
        time.sleep(0.01)
        assert cli.push_telemetry(_healthy(time.time()))["accepted"] == 2
        time.sleep(0.3)
        svc.manager.wait_idle(10.0)
    with Keyed(ep, state) as svc:
        version = svc.manager.get("w", "ag").version
        assert svc.epoch != old_epoch and version >= 2
        measured, accepted = svc.store.measured().copy(), svc.store.accepted
        assert _send(ep, [degrade, register]) == ["wrong_epoch", "wrong_epoch"]
        time.sleep(0.2)                          # a decision turn would have run
        assert svc.store.accepted == accepted and (svc.store.measured() == measured).all()
        assert svc.manager.get("w", "ag").version == version and svc.manager.get("w", "ag").job is None
        assert [c.comm for c in svc.manager.collectives()] == ["w"]
        assert svc.protocol_errors["wrong_epoch"] == 2
    # a fresh start (the state deleted, as the state error message suggests) is a new epoch too
    with Keyed(ep, tmp_path / "fresh.json") as svc:
        assert _send(ep, [register, degrade]) == ["wrong_epoch", "wrong_epoch"]
        assert svc.manager.collectives() == [] and svc.store.accepted == 0


def test_a_client_follows_the_controller_across_a_restart(tmp_path):
    """The project's client learns the new epoch from the refusal and signs again; the
    request is applied once."""
    ep, state = f"ipc://{tmp_path}/ctl", tmp_path / "state.json"
    with ControllerClient(ep, key=KEY, timeout_s=5.0) as cli:
        with Keyed(ep, state):
            cli.register("w", "ag", "allgather")
            first = cli.session.epoch
        with Keyed(ep, state) as svc:
            assert cli.push_telemetry(_degraded(time.time()))["accepted"] == 2
            assert cli.session.epoch == svc.epoch != first
            assert svc.store.accepted == 2 and svc.protocol_errors == {"wrong_epoch": 1}


def test_within_one_epoch_a_reused_seq_is_refused_even_with_a_fresh_nonce(tmp_path):
    ep = f"ipc://{tmp_path}/ctl"
    with Keyed(ep, None) as svc:
        client = new_id()
        msgs = [encode("telemetry", {"samples": _degraded(time.time() + i * 1e-3)}, KEY,
                       epoch=svc.epoch, client=client, seq=seq) for i, seq in enumerate((5, 5, 4, 6))]
        assert _send(ep, msgs) == ["ok", "replayed", "replayed", "ok"]
        assert svc.store.accepted == 4


@pytest.mark.parametrize("fields", [
    {"client": "zz" * 16, "seq": 1}, {"client": "A" * 32, "seq": 1}, {"client": "é" * 32, "seq": 1},
    {"client": "a" * 31, "seq": 1}, {"client": None, "seq": 1}, {"seq": 0}, {"seq": -1}, {"seq": True},
    {"seq": 1.5}, {"seq": MAX_SEQ + 1}, {"seq": "1"}, {"seq": None}])
def test_malformed_client_ids_and_sequence_numbers_are_refused(tmp_path, fields):
    ep = f"ipc://{tmp_path}/ctl"
    with Keyed(ep, None) as svc:
        msg = encode("telemetry", {"samples": _degraded(time.time())}, KEY,
                     **{"epoch": svc.epoch, "client": new_id(), **fields})
        assert _send(ep, [msg]) == ["bad_envelope"]
        assert svc.store.accepted == 0


@pytest.mark.parametrize("nonce", ["zz" * 16, "é" * 32, "A" * 32, "a" * 31, "a" * 33, "a" * 32 + "\n",
                                   " " + "a" * 31, 12345678901234567890123456789012, None])
def test_only_32_lower_case_hex_digits_make_a_nonce(nonce):
    with pytest.raises(ProtocolError) as err:
        ReplayGuard().check(time.time(), nonce)
    assert err.value.reason == "bad_envelope"


def test_read_only_requests_need_no_epoch_but_mutating_ones_do(tmp_path):
    ep = f"ipc://{tmp_path}/ctl"
    with Keyed(ep, None) as svc:
        assert _send(ep, [encode("ping", {}, KEY), encode("list", {}, KEY),
                          encode("telemetry", {"samples": []}, KEY, client=new_id(), seq=1),
                          encode("telemetry", {"samples": []}, KEY, epoch="0" * 32, client=new_id(), seq=1)]) \
            == ["ok", "ok", "wrong_epoch", "wrong_epoch"]


def test_the_sequence_guard_forgets_only_clients_whose_replays_are_stale():
    guard = SequenceGuard("e" * 32, window_s=10.0, max_clients=2)
    msg = lambda client, seq, ts: Message("telemetry", {}, ts, "e" * 32, client, seq)  # noqa: E731
    guard.check(msg("a" * 32, 1, 100.0))
    guard.check(msg("b" * 32, 1, 105.0))
    with pytest.raises(ProtocolError) as err:            # both active within the window
        guard.check(msg("c" * 32, 1, 106.0))
    assert err.value.reason == "busy"
    guard.check(msg("c" * 32, 1, 111.0))                 # "a" left the window: forgotten
    with pytest.raises(ProtocolError) as err:
        guard.check(msg("b" * 32, 1, 112.0))
    assert err.value.reason == "replayed"


def test_samples_too_old_or_repeated_are_not_applied():
    store = MeasurementStore(TOPO, alpha=0.5)
    now = 1e9
    link = {"kind": "link", "src": "s0h0g0", "dst": "s0tor0"}
    old = [{**link, "gbps": 50.0, "t": t} for t in (0, 0.0, -1e300, now - 61.0)]
    rep = store.ingest(old, now)
    assert rep.to_dict() == {"accepted": 0, "rejected": {"too_old": 4}}
    assert store.measured()[TOPO.link_index("s0h0g0", "s0tor0")] == 400.0
    batch = [{**link, "gbps": 100.0, "t": now - 1.0}]
    assert store.ingest(batch, now).accepted == 1
    value = store.measured().copy()
    assert store.ingest(batch, now).to_dict() == {"accepted": 0, "rejected": {"stale": 1}}
    assert store.ingest(batch * 3 + [{**link, "gbps": 100.0, "t": now}] * 2, now).accepted == 1
    assert store.measured()[TOPO.link_index("s0h0g0", "s0tor0")] < value[TOPO.link_index("s0h0g0", "s0tor0")]
    with pytest.raises(RejectedSample) as err:           # strict ingest words it
        store.ingest_strict(old[:1], now)
    assert err.value.reason == "too_old"


def test_a_subscriber_drops_an_older_publication_of_the_same_epoch():
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub = Subscription(ctx, f"tcp://127.0.0.1:{port}", KEY)
    try:
        assert pub.poll(5000) and pub.recv()[:1] == b"\x01"
        from mccl_opt.allgather import solve_allgather

        body = {"comm": "w", "name": "x", "version": 2, "schedule": solve_allgather(TOPO).to_dict()}
        epoch = new_id()
        for seq in (2, 1, 2, 3):
            pub.send_multipart([b"schedule", encode("schedule", body, KEY, epoch=epoch, seq=seq)])
        pub.send_multipart([b"schedule", encode("schedule", body, KEY, epoch=new_id(), seq=1)])
        got = [sub.recv(2.0) for _ in range(3)]
        assert all(g is not None for g in got) and sub.recv(0.3) is None and sub.rejected == 2
    finally:
        sub.close()
        pub.close(0)


def test_a_subscriber_that_missed_a_restart_refuses_a_publication_of_another_start(tmp_path):
    """Issue 27: a publication signed in an earlier start (captured, replayed within the
    60 s window) reaches a subscriber that did not see the restart; the subscriber asks
    the controller which epoch is current and refuses it, while a genuine publication of
    the restarted controller's epoch is accepted, and its older ``seq`` is refused."""
    from mccl_opt.allgather import solve_allgather

    ep = f"ipc://{tmp_path}/ctl"
    state = tmp_path / "state.json"
    with Keyed(ep, state) as svc:
        before = svc.epoch
    with Keyed(ep, state) as svc:                       # the restart the subscriber missed
        now = svc.epoch
        assert now != before
        ctx = zmq.Context.instance()
        pub = ctx.socket(zmq.XPUB)
        pub.setsockopt(zmq.LINGER, 0)
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        sub = Subscription(ctx, f"tcp://127.0.0.1:{port}", KEY, epoch=before, controller=ep, timeout_s=5.0)
        try:
            assert pub.poll(5000) and pub.recv()[:1] == b"\x01"
            body = {"comm": "w", "name": "x", "version": 2, "schedule": solve_allgather(TOPO).to_dict()}
            send = (lambda epoch, seq: pub.send_multipart(   # noqa: E731
                [b"schedule", encode("schedule", body, KEY, epoch=epoch, seq=seq)]))
            send(new_id(), 7)                            # an epoch of some earlier start: refused
            assert sub.recv(1.0) is None and sub.rejected == 1
            send(now, 3)                                 # the controller's epoch now: accepted
            assert sub.recv(2.0) is not None
            send(now, 2)                                 # older within that epoch: refused
            send(before, 9)                              # the epoch it knew, now over: refused
            assert sub.recv(1.0) is None and sub.rejected == 3
        finally:
            sub.close()
            pub.close(0)


def test_a_subscription_from_a_client_knows_the_epoch_it_started_in(tmp_path):
    ep = f"ipc://{tmp_path}/ctl"
    with Keyed(ep, None) as svc:
        with ControllerClient(ep, KEY, timeout_s=5.0) as client:
            sub = client.subscribe()
            assert sub._last[0] == svc.epoch
            sub.close()


def _pub_sub(key=KEY, **sub_kw):
    """An XPUB standing in for the controller's publisher, and a subscription to it."""
    ctx = zmq.Context.instance()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.LINGER, 0)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    sub = Subscription(ctx, f"tcp://127.0.0.1:{port}", key, **sub_kw)
    assert pub.poll(5000) and pub.recv()[:1] == b"\x01"
    return pub, sub


def _hold(version=2, held=(("s0h0g0", "s0tor0"),), **body):
    return {"comm": "w", "name": "x", "version": version, "held": [list(h) for h in held], **body}


def test_a_replayed_forged_or_malformed_hold_is_refused():
    """Issue 27: swap holds travel on the schedule topic with the same signature, nonce,
    epoch and ``seq`` rules as versions; a hold sent again (same bytes, or re-signed with
    an old ``seq``), signed with another key, or with a version or link list no
    controller sends, never reaches the executor."""
    pub, sub = _pub_sub()
    try:
        epoch = new_id()
        first = encode("hold", _hold(), KEY, epoch=epoch, seq=4)
        bad = [first,                                                         # the same bytes again
               encode("hold", _hold(), KEY, epoch=epoch, seq=4),              # a fresh nonce, same seq
               encode("hold", _hold(held=()), KEY, epoch=epoch, seq=3),       # an older release
               encode("hold", _hold(), b"x" * 32, epoch=epoch, seq=9),        # another key
               encode("hold", _hold(version="7"), KEY, epoch=epoch, seq=10),
               encode("hold", _hold(version=True), KEY, epoch=epoch, seq=11),
               encode("hold", _hold(version=-1), KEY, epoch=epoch, seq=12),
               encode("hold", _hold(version=2.5), KEY, epoch=epoch, seq=13),
               encode("hold", {**_hold(), "held": [["a"]]}, KEY, epoch=epoch, seq=14),
               encode("hold", _hold(comm={"a": 1}), KEY, epoch=epoch, seq=15),
               encode("hold", _hold(), KEY, epoch=epoch, seq=None),
               encode("hold", _hold(), None)]                                  # unsigned
        pub.send_multipart([b"schedule", first])
        got = sub.recv_any(2.0)
        assert got is not None and got.version == 2 and got.held
        for msg in bad:
            pub.send_multipart([b"schedule", msg])
        assert sub.recv_any(1.0) is None and sub.rejected == len(bad)
        pub.send_multipart([b"schedule", encode("hold", _hold(held=()), KEY, epoch=epoch, seq=20)])
        got = sub.recv_any(2.0)
        assert got is not None and not got.held                               # the genuine release
    finally:
        sub.close()
        pub.close(0)


def test_a_hold_from_before_a_restart_is_refused_after_it(tmp_path):
    """A hold captured in the controller's previous start and replayed to a subscriber
    that missed the restart: refused (the controller names another epoch), and a genuine
    hold of the new start is taken."""
    ep, state = f"ipc://{tmp_path}/ctl", tmp_path / "state.json"
    with Keyed(ep, state) as svc:
        before = svc.epoch
    with Keyed(ep, state) as svc:
        pub, sub = _pub_sub(epoch=before, controller=ep, timeout_s=5.0)
        try:
            pub.send_multipart([b"schedule", encode("hold", _hold(), KEY, epoch=before, seq=99)])
            pub.send_multipart([b"schedule", encode("hold", _hold(), KEY, epoch=new_id(), seq=99)])
            assert sub.recv_any(1.5) is None and sub.rejected == 2
            pub.send_multipart([b"schedule", encode("hold", _hold(), KEY, epoch=svc.epoch, seq=1)])
            assert sub.recv_any(2.0) is not None
        finally:
            sub.close()
            pub.close(0)


def _send_frames(endpoint: str, messages: list[list[bytes]]) -> list[str]:
    """Each multipart message on a raw socket; the reply's type, or its error reason."""
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    out = []
    try:
        for frames in messages:
            sock.send_multipart([b"", *frames])
            assert sock.poll(5000), "no reply within 5 s"
            msg = decode(sock.recv_multipart()[-1], KEY)
            out.append(msg.body["reason"] if msg.type == "error" else msg.type)
    finally:
        sock.close(0)
    return out


def test_a_column_batch_captured_before_a_restart_is_refused_after_it(tmp_path):
    """The binary path (``telemetry_columns``, a front end's forward included) under the
    JSON path's rules: a replay within the start (same nonce, or the same ``seq``
    re-signed), a tampered column, a batch of the previous start and one of a fresh
    start are all refused and nothing of them is applied."""
    from mccl_runtime.columns import ColumnBatch
    from mccl_runtime.frontend import FrontEndFold
    from mccl_runtime.protocol import encode_frames

    ep, state = f"ipc://{tmp_path}/ctl", tmp_path / "state.json"
    client = new_id()
    with Keyed(ep, state) as svc:
        raw = ColumnBatch.from_samples(TOPO, _degraded(time.time()))
        fold = FrontEndFold(TOPO, 1.0)
        fold.ingest(_degraded(time.time()))
        folded = fold.interval()
        msgs = [encode_frames("telemetry_columns", *b.to_frames(), KEY, epoch=svc.epoch, client=client, seq=s)
                for b, s in ((raw, 1), (folded, 2))]
        body, frames = raw.to_frames()
        again = encode_frames("telemetry_columns", body, frames, KEY, epoch=svc.epoch, client=client, seq=2)
        tampered = [*msgs[0][:2], *frames[:3], bytes(len(frames[3])), frames[4]]
        assert _send_frames(ep, [msgs[0], msgs[1], msgs[0], again, tampered]) == \
            ["ok", "ok", "replayed", "replayed", "bad_signature"]
        assert svc.store.accepted == 4
    for st in (state, tmp_path / "fresh.json"):
        with Keyed(ep, st) as svc:
            measured, accepted = svc.store.measured().copy(), svc.store.accepted
            assert _send_frames(ep, msgs) == ["wrong_epoch", "wrong_epoch"]
            assert svc.store.accepted == accepted and (svc.store.measured() == measured).all()


def test_a_message_for_one_front_end_is_refused_by_its_restart_and_by_the_controller():
    """Telemetry signed for a front end (its epoch) and captured: replayed to the front
    end after a restart, or straight to the controller, is refused; nothing of it is
    folded or forwarded."""
    from mccl_runtime.columns import ColumnBatch
    from mccl_runtime.protocol import encode_frames
    from tests.test_runtime_frontend import FrontEnd, _fail2
    from tests.test_runtime_service import Server

    with Server(key=KEY) as svc:
        with FrontEnd(svc.endpoint, key=KEY) as fe:
            fields = {"epoch": fe.gate.epoch, "client": new_id(), "seq": 1}
            now = time.time()
            body, frames = ColumnBatch.from_samples(TOPO, _fail2(now + 1e-3, "s0h0g1", "s0tor1")).to_frames()
            captured = [[encode("telemetry", {"samples": _fail2(now)}, KEY, **fields)],
                        encode_frames("telemetry_columns", body, frames, KEY, **{**fields, "seq": 2})]
            assert _send_frames(fe.endpoint, captured) == ["ok", "ok"]
            assert fe.fold.store.accepted == 4
            first = fe.gate.epoch
        with FrontEnd(svc.endpoint, key=KEY) as fe:      # the restarted front end: a new epoch
            assert fe.gate.epoch != first
            assert _send_frames(fe.endpoint, captured) == ["wrong_epoch", "wrong_epoch"]
            assert fe.fold.store.accepted == 0
        accepted = svc.store.accepted                    # the first front end's forwards: 4 samples
        assert accepted == 4
        assert _send_frames(svc.endpoint, captured) == ["wrong_epoch", "wrong_epoch"]
        assert svc.store.accepted == accepted


def test_binary_samples_too_old_from_the_future_or_repeated_are_not_applied():
    """The binary path's ``t`` column under the JSON path's rules: 0, -1e300, a minute
    old: ``too_old``; +1e300: ``future``; NaN and inf: ``nan``; a repeat of the last
    applied time on a channel: ``stale`` (never folded twice)."""
    from mccl_runtime.columns import ColumnBatch

    now = 1e9
    store = MeasurementStore(TOPO, alpha=0.5, clock=lambda: now)
    a = TOPO.link_index("s0h0g0", "s0tor0")
    ts = [0.0, -1e300, now - 61.0, 1e300, float("nan"), float("inf")]
    batch = ColumnBatch.build(TOPO, [0] * len(ts), [a] * len(ts), [0] * len(ts), [50.0] * len(ts), ts)
    assert store.ingest_columns(batch, now).to_dict() == \
        {"accepted": 0, "rejected": {"too_old": 3, "future": 1, "nan": 2}}
    assert store.measured()[a] == TOPO.arrays.capacity[a]
    one = ColumnBatch.build(TOPO, [0], [a], [0], [100.0], [now - 1.0])
    assert store.ingest_columns(one, now).accepted == 1
    value = store.measured()[a]
    assert store.ingest_columns(one, now).to_dict() == {"accepted": 0, "rejected": {"stale": 1}}
    assert store.measured()[a] == value


def _poll_version(cli: ControllerClient, version: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while cli.get_schedule("w", "ag")[0] < version:
        assert time.monotonic() < deadline, f"version {version} never came"
        time.sleep(0.05)


def test_a_long_lived_client_and_subscriber_cross_a_controller_process_restart(tmp_path):
    """Every message, not only the first of a connection: one client and one subscription
    live across a kill -9 and restart of the controller process (same endpoints).  After
    it, a read-only request and a publication signed for the first start are refused; the
    client and the subscriber follow the new start.  A subscription starts at the publish
    count of its ``ping``: a publication sent before it, replayed to it, is refused."""
    import os
    import signal

    from tests.test_runtime_hardening import Proc
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY)
    os.chmod(key_file, 0o600)
    ep, state = f"ipc://{tmp_path}/ctl", tmp_path / "state.json"
    args = ("--bind", ep, "--state", str(state), "--key-file", str(key_file))
    ctx = zmq.Context.instance()
    stand_in = ctx.socket(zmq.XPUB)                     # replays reach the subscription through it
    stand_in.setsockopt(zmq.LINGER, 0)
    port = stand_in.bind_to_random_port("tcp://127.0.0.1")
    first = Proc(*args)
    try:
        with ControllerClient(ep, key=KEY, timeout_s=5.0) as cli:
            cli.register("w", "ag", "allgather")
            info = cli.ping()
            spy = ctx.socket(zmq.SUB)                   # the attacker's capture of the publications
            spy.setsockopt(zmq.LINGER, 0)
            spy.setsockopt(zmq.SUBSCRIBE, b"")
            spy.connect(info["pub"])
            time.sleep(0.3)
            cli.push_telemetry(_degraded(time.time()))
            _poll_version(cli, 2)
            while True:                                 # a swap hold may be published first
                assert spy.poll(10000)
                captured = spy.recv_multipart()
                old = decode(captured[-1], KEY)
                if old.type != "hold":
                    break
            spy.close(0)
            assert old.type == "schedule" and old.epoch == info["epoch"] and old.seq >= 1
            sub = cli.subscribe()                       # after the capture: starts past its seq
            sub._sock.connect(f"tcp://127.0.0.1:{port}")
            assert stand_in.poll(5000) and stand_in.recv()[:1] == b"\x01"
            assert sub.wait_connected(5.0)
            stand_in.send_multipart(captured)
            assert sub.recv(1.0) is None and sub.rejected == 1
            read = encode("get_schedule", {"comm": "w", "name": "ag"}, KEY, epoch=info["epoch"],
                          client=new_id(), seq=1)
            assert _send(ep, [read]) == ["schedule"]
            first.p.send_signal(signal.SIGKILL)
            first.p.wait(10)
            second = Proc(*args)
            try:
                assert cli.get_schedule("w", "ag")[0] >= 2         # the same client, a new epoch
                assert cli.session.epoch != info["epoch"] == old.epoch
                assert _send(ep, [read]) == ["wrong_epoch"]         # read-only, earlier start
                stand_in.send_multipart(captured)                   # a publication of that start
                assert sub.recv(1.0) is None and sub.rejected == 2
                cli.register("w", "ag2", "allgather")              # published in the new start
                update = sub.recv(20.0)
                assert update is not None and update[:3] == ("w", "ag2", 1)
                assert sub._last[0] == cli.session.epoch
                assert cli.stats()["protocol_errors"].get("wrong_epoch", 0) >= 2
            finally:
                assert second.stop() == 0
            sub.close()
    finally:
        first.stop()
        stand_in.close(0)


def test_a_reply_of_another_epoch_than_its_request_is_not_taken():
    """A stand-in controller answers a client's ``ping`` in epoch A, then a request signed
    for A with a reply signed in epoch B (a reply of another start, replayed): refused,
    not taken as the answer; a ``wrong_epoch`` refusal naming B is the one reply that may."""
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    a, b = new_id(), new_id()

    def answer(epoch: str, type_: str = "ok", body: dict | None = None) -> None:
        assert router.poll(5000)
        ident, *_ = router.recv_multipart()
        router.send_multipart([ident, b"", encode(type_, body or {"epoch": epoch}, KEY, epoch=epoch)])

    with ControllerClient(f"tcp://127.0.0.1:{port}", KEY, timeout_s=5.0) as cli:
        done: list = []
        t = threading.Thread(target=lambda: done.extend([answer(a), answer(b)]))
        t.start()
        cli.ping()
        with pytest.raises(ProtocolError, match="another epoch") as err:
            cli.stats()
        t.join(5)
        assert err.value.reason == "wrong_epoch" and cli.session.epoch == a
    router.close(0)
