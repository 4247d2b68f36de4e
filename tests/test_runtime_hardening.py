"""The controller under hostile and broken input (loopback only, bounded in time):
crash payloads, persist-before-publish across a kill, limits, key hygiene.  The state
file's checks and incremental writes are in test_runtime_state.py."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zmq

from mccl_opt.errors import MCCLError
from mccl_runtime.client import ControllerClient
from mccl_runtime.protocol import (MAX_BATCH_SAMPLES, ProtocolError, ReplayGuard, decode, encode,
                                   load_key)
from mccl_runtime.service import ControllerService, is_loopback
from tests.test_runtime_manager import TOPO, PruningSynth
from tests.test_runtime_service import KEY, Server, _degraded

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------- helpers
class Proc:
    """``tests.controller_proc`` in a subprocess; ``endpoint`` once it is bound."""

    def __init__(self, *args: str) -> None:
        self.p = subprocess.Popen([sys.executable, "-m", "tests.controller_proc", *args], cwd=ROOT,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
        line = self.p.stdout.readline()
        assert line.startswith("controller on "), line + self.p.stderr.read()
        self.endpoint = line.split()[2]

    def stop(self) -> int:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            return self.p.wait(timeout=10)
        finally:
            if self.p.poll() is None:
                self.p.kill()
                self.p.wait(5)


def _raw(endpoint: str):
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def _send_raw(sock, payload: bytes, key: bytes | None = None, timeout_s: float = 5.0):
    sock.send_multipart([b"", payload])
    if not sock.poll(int(timeout_s * 1000)):
        return None
    return decode(sock.recv_multipart()[-1], key)


def _signed_envelope(body: dict, **override) -> bytes:
    env = json.loads(encode("ping", body, KEY))
    env.update(override)
    return json.dumps(env).encode()


# ---------------------------------------------------------------------- 1. never dies
def test_crash_payloads_are_answered_and_the_controller_keeps_serving(tmp_path):
    """The payloads that used to end the process (deep nesting before authentication, a
    non-ASCII signature, 401-digit numbers in a sample and in ``ts``) each get an error
    reply, and a signed ping right after each one is answered."""
    key_file = tmp_path / "key"
    key_file.write_bytes(KEY)
    key_file.chmod(0o600)
    huge = "1" * 401
    sample = '{"kind":"link","src":"s0h0g0","dst":"s0tor0","gbps":%s,"t":%s}'
    payloads = {
        "deep": b'{"v":3,"type":"ping","body":{"x":' + b"[" * 1000 + b"]" * 1000 + b"}}",
        "deep_900": b'{"v":3,"type":"ping","body":{"x":' + b"[" * 900 + b"]" * 900 + b"}}",
        "sig_non_ascii": _signed_envelope({}, sig="\u00e9" * 64),
        "sig_short": _signed_envelope({}, sig="ab"),
        "gbps_401_digits": ('{"v":2,"type":"telemetry","body":{"samples":[' + sample % (huge, "1.0")
                            + ']},"ts":1,"nonce":"' + "a" * 32 + '","sig":"' + "0" * 64 + '"}').encode(),
        "t_401_digits": ('{"v":2,"type":"telemetry","body":{"samples":[' + sample % ("1.0", huge)
                         + ']},"ts":1,"nonce":"' + "a" * 32 + '","sig":"' + "0" * 64 + '"}').encode(),
        "ts_401_digits": _signed_envelope({}, ts=10 ** 400),
        "not_utf8": b'{"v":2,"type":"\xff\xfe","body":{}}',
    }
    proc = Proc("--key-file", str(key_file))
    try:
        raw = _raw(proc.endpoint)
        with ControllerClient(proc.endpoint, key=KEY, timeout_s=5.0) as cli:
            for name, payload in payloads.items():
                reply = _send_raw(raw, payload, KEY)
                assert reply is not None and reply.type == "error", name
                assert reply.body["reason"] in ("malformed_json", "bad_signature", "bad_envelope"), name
                assert cli.ping()["topology"] == TOPO.name, f"no ping answer after {name}"
            errors = cli.stats()["protocol_errors"]
        raw.close(0)
        assert sum(errors.values()) == len(payloads)
        assert proc.p.poll() is None
    finally:
        assert proc.stop() == 0


def test_an_unexpected_exception_becomes_an_internal_error_reply(caplog):
    with Server() as svc, ControllerClient(svc.endpoint, timeout_s=5.0) as cli:
        def broken(*_a, **_k):
            raise TypeError("a bug in ingest")

        svc.store.ingest = broken
        with caplog.at_level(logging.ERROR, logger="mccl.controller"):
            with pytest.raises(ProtocolError) as err:
                cli.push_telemetry(_degraded(time.time()))
        assert err.value.reason == "internal" and "a bug in ingest" not in str(err.value)
        assert cli.ping()["topology"] == TOPO.name
        assert cli.stats()["protocol_errors"] == {"internal": 1}
    assert any("TypeError" in r.getMessage() and r.exc_info for r in caplog.records)


def test_a_synthesizer_bug_does_not_stop_the_service():
    class Broken(PruningSynth):
        def __call__(self, *a):
            raise ValueError("synthesizer bug")

    with Server(synth=Broken()) as svc, ControllerClient(svc.endpoint, timeout_s=5.0) as cli:
        cli.register("world", "ag", "allgather")
        deadline = time.time() + 5
        while svc.internal_errors + svc.manager.counters["failures"] == 0 and time.time() < deadline:
            time.sleep(0.02)
        assert svc.internal_errors + svc.manager.counters["failures"] == 1
        assert cli.ping()["topology"] == TOPO.name


def test_replay_guard_refuses_an_integer_time_beyond_float_range():
    with pytest.raises(ProtocolError) as err:
        ReplayGuard().check(10 ** 400, "a" * 32)
    assert err.value.reason == "bad_envelope"


def test_decode_refuses_deep_nesting_and_long_integers_without_other_exceptions():
    for raw in (b"[" * 100_000, b'{"v":3,"type":"ping","body":{"a":' + b"[" * 40 + b"]" * 40 + b"}}",
                b'{"v":3,"type":"ping","body":{"a":' + b"9" * 21 + b"}}"):
        with pytest.raises(ProtocolError) as err:
            decode(raw)
        assert err.value.reason == "malformed_json"
    assert decode(b'{"v":3,"type":"ping","body":{"a":' + b"9" * 20 + b"}}").body["a"] == int("9" * 20)


def test_error_replies_do_not_echo_the_input():
    with Server() as svc:
        raw = _raw(svc.endpoint)
        for payload in (json.dumps({"v": "A" * 100_000, "type": "ping", "body": {}}),
                        json.dumps({"v": 3, "type": "B" * 100_000, "body": {}})):
            reply = _send_raw(raw, payload.encode())
            assert reply.type == "error" and len(reply.body["message"]) < 400
            assert "A" * 100 not in reply.body["message"] and "B" * 100 not in reply.body["message"]
        raw.close(0)


# ---------------------------------------------------------------------- 2. persist, then publish
def _record(seen: dict[int, list], version: int, sched) -> None:
    seen.setdefault(version, []).append(json.dumps(sched.to_dict()["chunks"], sort_keys=True))


@pytest.mark.parametrize("crash", ["before_write", "after_write"])
def test_a_kill_between_persist_and_publish_never_reuses_a_version(tmp_path, crash):
    """The controller is killed when it writes (or has just written) version 2; after a
    restart from the state file and a different failure, every version anyone saw
    (subscription or get_schedule) maps to one set of chunks."""
    state = tmp_path / "state.json"
    seen: dict[int, list] = {}
    proc = Proc("--state", str(state), "--crash", crash)
    with ControllerClient(proc.endpoint, timeout_s=5.0) as cli:
        sub = cli.subscribe()
        assert sub.wait_connected(5.0)                    # no update is published before this
        cli.register("world", "ag", "allgather")
        upd = sub.recv(5.0)
        assert upd is not None and upd[2] == 1
        _record(seen, upd[2], upd[3])
        cli.push_telemetry(_degraded(time.time()))        # cable s0h0g0 <-> s0tor0: version 2
        assert proc.p.wait(timeout=10) == -signal.SIGKILL
        while (upd := sub.recv(0.5)) is not None:        # whatever left before the kill
            _record(seen, upd[2], upd[3])
    assert 2 not in seen, "version 2 was published before it was written"
    proc = Proc("--state", str(state))
    try:
        with ControllerClient(proc.endpoint, timeout_s=5.0) as cli:
            sub = cli.subscribe()
            assert sub.wait_connected(5.0)
            before = cli.get_schedule("world", "ag")
            assert before[0] == (2 if crash == "after_write" else 1)
            _record(seen, *before)
            t, nic = time.time(), TOPO.links[TOPO.link_index("s0h0g0", "s0tor0")].capacity_gbps
            cli.push_telemetry(            # the first cable recovers, another one degrades
                [{"kind": "link", "src": a, "dst": b, "gbps": nic, "t": t}
                 for a, b in (("s0h0g0", "s0tor0"), ("s0tor0", "s0h0g0"))]
                + [{"kind": "link", "src": a, "dst": b, "gbps": 50.0, "t": t}
                   for a, b in (("s0h1g1", "s0tor1"), ("s0tor1", "s0h1g1"))])
            upd = sub.recv(5.0)
            assert upd is not None and upd[2] == before[0] + 1
            _record(seen, upd[2], upd[3])
            _record(seen, *cli.get_schedule("world", "ag"))
    finally:
        assert proc.stop() == 0
    for version, chunks in seen.items():
        assert len(set(chunks)) == 1, f"version {version} went out with different chunks"


# ---------------------------------------------------------------------- 4. limits
def test_an_oversized_request_is_dropped_at_the_socket():
    with Server(max_request_bytes=64 << 10) as svc, ControllerClient(svc.endpoint, timeout_s=5.0) as cli:
        raw = _raw(svc.endpoint)
        big = encode("telemetry", {"samples": [{"pad": "x" * 1000}] * 200})
        assert len(big) > 64 << 10
        assert _send_raw(raw, big, timeout_s=0.5) is None           # connection dropped, no reply
        raw.close(0)
        assert cli.ping()["topology"] == TOPO.name


def test_telemetry_batches_are_bounded_and_the_client_splits_them():
    with Server(persist_interval_s=60.0) as svc, ControllerClient(svc.endpoint, timeout_s=10.0) as cli:
        t = time.time()
        one = {"kind": "link", "src": "s0h0g0", "dst": "s0h0nvs", "gbps": 100.0, "t": t}
        raw = _raw(svc.endpoint)
        reply = _send_raw(raw, encode("telemetry", {"samples": [one] * (MAX_BATCH_SAMPLES + 1)}))
        raw.close(0)
        assert reply.type == "error" and reply.body["reason"] == "too_large"
        n = 2 * MAX_BATCH_SAMPLES + 5               # distinct times: an equal-t repeat is stale
        assert cli.push_telemetry([{**one, "t": t - 1e-3 * (n - i)} for i in range(n)]) == \
            {"accepted": n, "rejected": {}}
        assert cli.stats()["requests"]["telemetry"] == 4          # 3 from the client, 1 refused


def test_registrations_are_capped_and_atomic():
    with Server(max_collectives=3) as svc, ControllerClient(svc.endpoint, timeout_s=5.0) as cli:
        assert cli.register("w", "y/allgather", "allgather") == ["y/allgather"]
        with pytest.raises(ProtocolError, match="already registered"):
            cli.register("w", "y", "allreduce")                  # y/allgather is taken
        assert [c["name"] for c in cli.list()] == ["y/allgather"]
        assert cli.register("w", "a", "allgather") == ["a"]
        with pytest.raises(ProtocolError, match="at most 3"):
            cli.register("w", "z", "allreduce")                  # needs two of the one slot left
        assert len(cli.list()) == 2
        for bad in ("", "x" * 129, "tab\there"):
            with pytest.raises(ProtocolError) as err:
                cli.register("w", bad, "allgather")
            assert err.value.reason == "bad_body"


# ---------------------------------------------------------------------- 7. security hygiene
def test_is_loopback_parses_the_address():
    for ep in ("tcp://127.0.0.1:5555", "tcp://127.1.2.3:1", "tcp://[::1]:5555", "tcp://localhost:1",
               "ipc:///tmp/x", "inproc://x"):
        assert is_loopback(ep), ep
    for ep in ("tcp://127.evil.example:5555", "tcp://127.0.0.1.evil:1", "tcp://0.0.0.0:5555",
               "tcp://*:5555", "tcp://10.0.0.1:1", "udp://127.0.0.1:1", "tcp://eth0:1"):
        assert not is_loopback(ep), ep


def test_remote_binding_needs_a_key_and_a_keyless_service_warns(caplog):
    with pytest.raises(MCCLError, match="needs a --key-file"):
        ControllerService(TOPO, "tcp://0.0.0.0:0", synthesize=PruningSynth(), allow_remote=True)
    with caplog.at_level(logging.WARNING, logger="mccl.controller"):
        with Server():
            pass
    assert any("WITHOUT a key" in r.getMessage() for r in caplog.records)


def test_a_key_file_readable_by_others_is_refused(tmp_path):
    key = tmp_path / "key"
    key.write_bytes(KEY)
    key.chmod(0o644)
    with pytest.raises(MCCLError, match="chmod 600"):
        load_key(key)
    key.chmod(0o600)
    assert load_key(key) == KEY


def test_a_port_in_use_is_a_clear_error():
    with Server() as svc:
        other = ControllerService(TOPO, svc.endpoint, synthesize=PruningSynth())
        with pytest.raises(MCCLError, match="cannot bind"):
            other.serve_forever()


def test_inbox_answers_small_requests_first_keeping_each_senders_order():
    from mccl_runtime.inbox import Inbox

    class Router:
        def __init__(self, queued):
            self.queued = list(queued)

        def recv_multipart(self, flags):
            if not self.queued:
                raise zmq.Again()
            return self.queued.pop(0)

    big, small = b"x" * 20_000, b"ping"
    router = Router([[b"A", b"", big], [b"B", b"", small], [b"A", b"", small], [b"C", b"", big],
                     [b"D", b"", big], [b"E", b"", small]])
    inbox = Inbox(router, zmq, max_backlog=3)
    answered, refused = [], []
    inbox.drain(lambda f: answered.append(f[0]), lambda f: refused.append(f[0]), limit=10)
    # B and E skip the queue; A's small request waits behind A's large one; D does not fit
    assert answered == [b"B", b"E"] and refused == [b"D"]
    order = []
    while (f := inbox.pop()) is not None:
        order.append((f[0], len(f[-1])))
    assert order == [(b"A", 20_000), (b"A", 4), (b"C", 20_000)]


def test_a_subscriber_drops_a_signed_publication_whose_schedule_is_malformed():
    from tests.test_runtime_service import _publisher_and_subscriber

    with _publisher_and_subscriber() as (pub, sub):
        pub.send_multipart([b"schedule", encode("schedule", {"comm": "w", "name": "x", "version": 2,
                                                             "schedule": {"format": "nope"}}, KEY)])
        assert sub.recv(0.5) is None and sub.rejected == 1
