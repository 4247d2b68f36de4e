"""Hostile input, fourth pass (issue 27): the remainders of the third pass and cases of
our own beyond them, each failing on the code of 2026-12-06 before its fix
(docs/runtime.md, "Hostile-input audit, fourth pass").  Every case ends in one typed
error (an error reply, exit status 2 with one ``error:`` line), never in a traceback, a
hang or a silent acceptance."""

from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

import numpy as np
import pytest

import mccl_runtime.client as client_mod
from mccl_opt.errors import TopologyError
from mccl_opt.topology import Topology
from mccl_runtime.columns import ColumnBatch
from mccl_runtime.protocol import ProtocolError, decode, encode, new_id
from mccl_runtime.telemetry import MeasurementStore
from tests.test_hostile_replay import _hold, _pub_sub
from tests.test_runtime_manager import TOPO
from tests.test_runtime_service import KEY
from tests.test_hostile_third import _cli

ALPHA = 0.5
ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ protocol messages
def _raw(body_text: str, head: str = '"v":3,"type":"telemetry"') -> bytes:
    return ("{" + head + ',"body":' + body_text + "}").encode()


@pytest.mark.parametrize("raw, words", [
    (_raw('{"samples":[]}', '"v":3,"type":"ping","type":"telemetry"'), "'type' appears twice"),
    (_raw('{"samples":[{"kind":"link","kind":"pair"}]}'), "'kind' appears twice"),
    (_raw('{"samples":[],"note":"a:b","samples":[]}'), "'samples' appears twice"),   # a ':' in a string too
    ('{"v":3,"type":"ping","body":{}}'.encode("utf-16"), "not JSON"),                 # json.loads takes UTF-16
    ('{"v":3,"type":"ping","body":{}}'.encode("utf-32"), "not JSON"),
    (b'{"v":3,"type":"ping","body":{"c":"\xed\xa0\x80"}}', "not JSON"),               # a surrogate in UTF-8
    (b'{"v":3,"type":"ping","body":{"c":"\xc0\xaf"}}', "not JSON"),                   # an overlong '/'
    (b"\xef\xbb\xbf" + b'{"v":3,"type":"ping","body":{}}', "not JSON"),               # a byte-order mark
])
def test_a_message_with_a_key_twice_or_not_utf8_is_refused(raw, words):
    """A JSON object with a key twice was read with the last value winning (the signature
    covers the parsed body, so what a sender meant and what the receiver applied could
    differ); UTF-16/32 messages and UTF-8 surrogates (``json.loads`` decodes bytes with
    ``surrogatepass``) were read too."""
    with pytest.raises(ProtocolError, match=words) as err:
        decode(raw)
    assert err.value.reason == "malformed_json"


def test_a_colon_in_a_string_is_no_repeated_key():
    """The repeated-key check counts ':' bytes against the keys parsed; a string holding
    ':' (an endpoint) takes the careful parse and is accepted."""
    msg = decode(encode("ok", {"pub": "tcp://127.0.0.1:5555", "epoch": "a:b:c"}))
    assert msg.body == {"pub": "tcp://127.0.0.1:5555", "epoch": "a:b:c"}
    assert decode(b'{"v":3,"type":"ok","body":{"a:b":"\\u003a"}}').body == {"a:b": ":"}     # an escaped ':'
    for body in (b'{"a":"\\u003a","a":1}', b'{"a":"\\u003a","a":"\\u003a"}'):    # the second one balances
        with pytest.raises(ProtocolError, match="'a' appears twice"):                 # the count: still refused
            decode(b'{"v":3,"type":"ok","body":' + body + b"}")


# ------------------------------------------------------------------ folded telemetry
def _folded(rows: list[tuple[int, float, float, int]]) -> ColumnBatch:
    """A folded batch of link rows ``(link, gbps, t, count)``."""
    links, gbps, ts, counts = zip(*rows)
    b = ColumnBatch.build(TOPO, [0] * len(rows), list(links), [0] * len(rows), list(gbps), list(ts))
    return ColumnBatch(b.kind, b.a, b.b, b.gbps, b.t, links=b.links, gpus=b.gpus,
                       count=np.array(counts, dtype=np.uint32), alpha=ALPHA)


def test_refused_folded_rows_count_once_whatever_their_count():
    """A key holder's refused rows (NaN, negative, from the future, too old, above
    nominal) added their ``count`` (up to 2^32-1 each) to
    the ``rejected`` counters: ``stats`` could be inflated at will.  Now a refused row
    counts once; an applied row still counts the samples it stands for."""
    store, now, big = MeasurementStore(TOPO, alpha=ALPHA), 1000.0, (1 << 32) - 1
    assert store.ingest_columns(_folded([(0, 10.0, now - 2.0, 5)]), now=now).accepted == 5
    report = store.ingest_columns(_folded([
        (1, float("nan"), now, big), (2, -1.0, now, big), (3, 10.0, now + 3600.0, big),
        (4, 10.0, now - 3600.0, big), (5, 1e9, now, big)]), now=now)
    assert report.accepted == 0
    assert report.rejected == {"nan": 1, "negative": 1, "future": 1, "too_old": 1, "above_nominal": 1}
    assert sum(store.rejected.values()) == 5


# ------------------------------------------------------------------ subscriber epochs
class _FakeController:
    """Stands in for ``ControllerClient`` in a subscription's epoch check: its ``ping``
    names ``epoch`` (what a restarted controller would answer) and is counted."""
    epoch = ""
    pings = 0

    def __init__(self, *a, **k) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def ping(self) -> dict:
        type(self).pings += 1
        return {"epoch": type(self).epoch}


def test_a_publication_of_the_previous_start_is_refused_right_after_a_restart(monkeypatch):
    """A subscriber trusted the controller's answer "my epoch is E" for a second: a
    publication of E captured before a restart and replayed within that second of the
    last check was taken (issue 27's remainder).  Now an answer covers only the
    publications read before its ``ping`` was sent, and one ``ping`` covers a burst."""
    monkeypatch.setattr(client_mod, "ControllerClient", _FakeController)
    old, new = new_id(), new_id()
    _FakeController.epoch, _FakeController.pings = old, 0
    pub, sub = _pub_sub(epoch=old, controller="ipc://unused")
    try:
        captured = encode("hold", _hold(version=3), KEY, epoch=old, seq=2)     # recorded, not delivered
        pub.send_multipart([b"schedule", encode("hold", _hold(), KEY, epoch=old, seq=1)])
        assert sub.recv_any(2.0) is not None and _FakeController.pings == 1
        _FakeController.epoch = new                                           # the controller restarts
        pub.send_multipart([b"schedule", captured])                           # replayed at once
        assert sub.recv_any(0.5) is None and sub.rejected == 1
        for seq in (1, 2, 3):                                                 # the new start's burst
            pub.send_multipart([b"schedule", encode("hold", _hold(version=3 + seq), KEY, epoch=new, seq=seq)])
        time.sleep(0.3)
        got = [sub.recv_any(1.0) for _ in range(3)]
        assert [g.version for g in got] == [4, 5, 6] and _FakeController.pings == 3
    finally:
        sub.close()
        pub.close(0)


def test_a_silent_controller_is_asked_again_only_after_a_pause(monkeypatch):
    """While the controller does not answer, publications are refused, and a flood of
    them costs one ``ping`` per :data:`~mccl_runtime.client.EPOCH_CHECK_S`, not one each."""
    class Down(_FakeController):
        def ping(self) -> dict:
            type(self).pings += 1
            raise ProtocolError("timeout", "no reply")

    monkeypatch.setattr(client_mod, "ControllerClient", Down)
    Down.pings = 0
    epoch = new_id()
    pub, sub = _pub_sub(epoch=epoch, controller="ipc://unused")
    try:
        t0 = time.monotonic()
        for seq in range(1, 21):
            pub.send_multipart([b"schedule", encode("hold", _hold(), KEY, epoch=epoch, seq=seq)])
            assert sub.recv_any(0.02) is None
        assert sub.rejected == 20
        assert Down.pings <= 1 + (time.monotonic() - t0) / client_mod.EPOCH_CHECK_S
    finally:
        sub.close()
        pub.close(0)


# ------------------------------------------------------------------ memory of a parse
def _write_many(path, unit: bytes, mib: int, compress: bool = False) -> None:
    n = (mib << 20) // len(unit)
    text = b"[" + unit * (n - 1) + unit.rstrip(b",") + b"]"
    path.write_bytes(gzip.compress(text, compresslevel=1) if compress else text)


@pytest.mark.parametrize("unit, mib, compress", [
    (b"{},", 40, False), (b"[],", 40, False),          # 50 bytes of memory per byte of text
    (b"{},", 40, True),                                # 40 MiB as a 60 kB gzip member
    (b'"ab",', 200, True),                             # 200 MiB of short strings, inflated in part
])
def test_a_json_file_too_costly_to_parse_is_refused_before_it_is_parsed(capsys, tmp_path, unit, mib, compress):
    """Issue 27's remainder: a JSON file was parsed whole, whatever it held: 64 MiB of
    ``[{},{},...]`` took 3.2 GB and 90-118 s to be refused as "not a topology".  Its
    parse cost is now estimated from byte counts first (``parse_cost``; a topology may
    cost 1 GiB), and a compressed one is refused while it inflates."""
    f = tmp_path / ("t.json.gz" if compress else "t.json")
    _write_many(f, unit, mib, compress)
    t0 = time.monotonic()
    rc, err = _cli(capsys, "topo", "show", str(f))
    assert rc == 2 and err.count("error:") == 1 and "to parse (at most 1024 MiB" in err, err
    assert time.monotonic() - t0 < 30.0               # refused before the parse (it took 90 s and more)


def test_the_parse_cost_bounds_what_a_parse_takes():
    """The estimate stays above what the parse allocates, for the hostile shapes and the
    project's own files (measured with ``tracemalloc`` here; the fifth pass bounds the
    peak, ``test_hostile_fifth``)."""
    import tracemalloc

    from mccl_opt.files import parse_cost

    for unit in (b"{},", b"[],", b'"ab",', b'{"a":1},', b"[1.5,2],", b"1e1,", b"-1.5,", b"123456,", b'"\\u00e9",'):
        raw = b"[" + unit * 20000 + b"0]"
        tracemalloc.start()
        obj = json.loads(raw.decode())
        took = tracemalloc.get_traced_memory()[0] + 2 * len(raw)      # plus the bytes and the str
        tracemalloc.stop()
        del obj
        assert took <= 1.5 * parse_cost(raw), (unit, took, parse_cost(raw))
    topo = (ROOT / "instances" / "data" / "hpn-1x2x4.json").read_bytes()
    assert parse_cost(topo) < 16 * len(topo)


def test_a_reply_too_costly_to_parse_is_refused():
    """A reply or publication may be 64 MiB (a schedule); 40 MiB of ``[{},...]`` would
    take 2 GB to parse: refused as ``too_large`` from the byte counts."""
    body = b"[" + b"{}," * ((40 << 20) // 3) + b"{}]"
    with pytest.raises(ProtocolError, match="to parse") as err:
        decode(b'{"v":3,"type":"ok","body":{"x":' + body + b"}}")
    assert err.value.reason == "too_large"


def test_a_colon_in_a_file_string_is_no_repeated_key(tmp_path):
    """Files take the same count of ':' against the keys parsed (a key twice is refused
    since the third pass); a node id holding ':' is read."""
    data = json.loads((ROOT / "instances" / "data" / "hpn-1x2x4.json").read_text())
    data["name"] = "a:b"
    f = tmp_path / "t.json"
    f.write_text(json.dumps(data))
    assert Topology.load(f).name == "a:b"
    f.write_text(json.dumps(data)[:-1] + ',"name":"c"}')
    with pytest.raises(TopologyError, match="'name' appears twice"):
        Topology.load(f)


# ------------------------------------------------------------------ node ids
@pytest.mark.parametrize("new_id, why", [
    ("s0h0g0\n", "a newline (a forged log line)"),
    ("s0h0\u202eg0", "a right-to-left override (shows another id)"),
    ("s0h0\u200bg0", "a zero-width space (two ids that look the same)"),
    ("s0h0ge\u0301", "NFD: e + combining accent, looks like the NFC 'é'"),
    ("\ud800", "a lone surrogate (cannot be written as UTF-8)"),
    ("g" * 257, "257 characters"),
])
def test_a_node_id_that_can_look_like_another_is_refused(capsys, tmp_path, new_id, why):
    """Node ids were any non-empty string: control, format and bidi characters, ids that
    normalise alike, lone surrogates (``print`` then raised ``UnicodeEncodeError``) and ids
    of megabytes (quoted whole in error messages)."""
    data = json.loads((ROOT / "instances" / "data" / "hpn-1x2x4.json").read_text())
    old = data["nodes"][0]["id"]
    data["nodes"][0]["id"] = new_id
    for link in data["links"]:
        link["src"], link["dst"] = (new_id if e == old else e for e in (link["src"], link["dst"]))
    f = tmp_path / "t.json"
    f.write_text(json.dumps(data))                      # ensure_ascii: a surrogate is written escaped
    rc, err = _cli(capsys, "topo", "show", str(f))
    assert rc == 2 and err.count("error:") == 1 and "printable characters in Unicode NFC form" in err, (why, err)
    assert len(err) < 600


# ------------------------------------------------------------------ the state file's owner
def _saved_state(tmp_path) -> Path:
    from tests.test_runtime_service import Server, settled

    state = tmp_path / "real" / "state.json"
    state.parent.mkdir()
    with Server(state_path=state) as svc:
        svc.register("w", "ag", "allgather", 0.0)
        assert settled(svc)
    return state


def test_a_state_that_another_user_could_have_planted_is_refused(tmp_path):
    """A state file or version folder that is a symlink (the next atomic write replaced
    the link and left the target stale), writable by group or others, or owned by
    another user (in a shared folder another user could plant a state, which the
    controller then served as its own) is refused with one message naming it."""
    import os

    from mccl_opt.errors import MCCLError
    from mccl_runtime.state import load_state, versions_dir

    state = _saved_state(tmp_path)
    assert load_state(state, TOPO) is not None
    link = tmp_path / "link.json"
    link.symlink_to(state)
    with pytest.raises(MCCLError, match="is a symlink"):
        load_state(link, TOPO)
    planted = tmp_path / "planted.json"                  # the same bytes, a version folder linked
    planted.write_bytes(state.read_bytes())
    planted.chmod(0o600)
    versions_dir(planted).symlink_to(versions_dir(state))
    with pytest.raises(MCCLError, match="folder .*is a symlink"):
        load_state(planted, TOPO)
    state.chmod(0o666)
    with pytest.raises(MCCLError, match="written by group or others"):
        load_state(state, TOPO)
    state.chmod(0o600)
    if os.geteuid() == 0:                                # only root can give a file away
        os.chown(state, 12345, 12345)
        with pytest.raises(MCCLError, match="belongs to user id 12345"):
            load_state(state, TOPO)
        os.chown(state, 0, 0)
    assert load_state(state, TOPO) is not None


@pytest.mark.parametrize("name", ["x\u202e\n\x1b[31mred", "\udc80bad", "x" * 300])
def test_a_topology_name_that_would_print_escapes_is_refused(capsys, tmp_path, name):
    """``topo show`` printed a topology's name as read: a terminal escape sequence, a
    newline and a bidi override reached the user's terminal, a lone surrogate was written
    out as an invalid UTF-8 byte, and a name of a megabyte was printed whole."""
    data = json.loads((ROOT / "instances" / "data" / "hpn-1x2x4.json").read_text())
    data["name"] = name
    f = tmp_path / "t.json"
    f.write_text(json.dumps(data))
    rc, err = _cli(capsys, "topo", "show", str(f))
    assert rc == 2 and err.count("error:") == 1 and "topology's name" in err, err
    assert "\x1b" not in err and len(err) < 600


def test_a_protocol_version_or_name_in_another_spelling_is_refused():
    """``"v": 3.0`` was taken for version 3; a communicator named ``"w"`` + a combining
    accent (NFD) was registered next to one that looks the same."""
    with pytest.raises(ProtocolError) as err:
        decode(b'{"v":3.0,"type":"ping","body":{}}')
    assert err.value.reason == "unsupported_version"
    from tests.test_runtime_service import Server

    with Server() as svc:
        with pytest.raises(ProtocolError, match="NFC") as err:
            svc.register("w\u0301", "ag", "allgather", 0.0)
        assert err.value.reason == "bad_body"
        assert svc.register("\u1e83", "ag", "allgather", 0.0) == ["ag"]          # the NFC spelling


def test_a_version_folder_swapped_for_a_symlink_is_not_written_into(tmp_path):
    """A version folder replaced by a symlink while the controller runs (another user's
    folder in a shared ``/tmp``): the next write fails (read-only mode, one log line)
    instead of putting version files where the link points."""
    import shutil

    from mccl_runtime.state import versions_dir
    from tests.test_runtime_service import Server, settled

    state = tmp_path / "state.json"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with Server(state_path=state) as svc:
        svc.register("w", "ag", "allgather", 0.0)
        assert settled(svc)
    # the loop has stopped: its writer, driven here, is the only one writing
    assert svc.durable.save(svc.store, svc.manager, svc.protocol_errors)
    shutil.rmtree(versions_dir(state))
    versions_dir(state).symlink_to(elsewhere)
    svc.writer._files.clear()                    # as after a restart: every version file is written again
    assert not svc.durable.save(svc.store, svc.manager, svc.protocol_errors)
    assert "is a symlink" in svc.durable.failure
    assert not list(elsewhere.iterdir())


def test_a_schedule_naming_a_huge_chunk_budget_is_refused(capsys, tmp_path):
    """A schedule file with ``max_chunks`` 10^29 was read: ``export teccl-flows`` then ran
    until killed (its share denominator is searched up to the budget) and ``check``
    accepted it.  Now every reader, and the solve API, takes at most 2^20."""
    import mccl_opt as mo
    from mccl_opt.errors import InputError

    topo = Topology.load(ROOT / "instances" / "data" / "hpn-1x2x4.json")
    sched = mo.solve_allgather(topo, max_chunks=4)
    data = sched.to_dict()
    data["max_chunks"] = 10 ** 29
    f = tmp_path / "s.json"
    f.write_text(json.dumps(data))
    t0 = time.monotonic()
    rc, err = _cli(capsys, "export", "teccl-flows", "--topology", str(ROOT / "instances" / "data" / "hpn-1x2x4.json"),
                   "-o", str(tmp_path / "f.json"), str(f))
    assert rc == 2 and err.count("error:") == 1 and "'max_chunks' must be a positive integer (at most 1048576" in err, err
    assert time.monotonic() - t0 < 30.0
    with pytest.raises(InputError, match="1048576"):
        mo.solve_allgather(topo, max_chunks=(1 << 20) + 1)
