"""The controller's state file: every bad field refused by name, incremental version
files written once and checked by digest, persistence rate, leftovers of interrupted
writes, and the CLI's one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

zmq = pytest.importorskip("zmq")

from mccl_opt.errors import MCCLError
from mccl_runtime.client import ControllerClient
from mccl_runtime.service import ControllerService
from tests.test_runtime_manager import TOPO, PruningSynth
from tests.test_runtime_service import Server, _degraded

ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------- 3. the state file is checked
def _good_state(tmp_path: Path) -> dict:
    """A real state with its schedules inline: a registered AllGather and AllReduce,
    given while a cable is degraded."""
    from mccl_runtime.state import _inline_versions
    from mccl_runtime.state_folder import StateFolder
    from tests.test_runtime_manager import bfs_allgather

    path = tmp_path / "good.json"
    svc = ControllerService(TOPO, "tcp://127.0.0.1:0", synthesize=PruningSynth(), alpha=1.0,
                            state_path=path)
    svc.manager.register("world", "ag", "allgather", bfs_allgather(TOPO))
    svc.store.ingest(_degraded(time.time() - 1.0))
    svc.manager.register("world", "ar", "allreduce", bfs_allgather(TOPO))
    svc.persist()
    svc.manager.close()
    state = json.loads(path.read_text())
    with StateFolder(path).versions() as vfd:
        _inline_versions(state, path, vfd)     # schedules inline, as format 1 keeps them
    return state


def _set(d, path, value):
    *head, last = path
    for k in head:
        d = d[k]
    if value is KeyError:
        del d[last]
    else:
        d[last] = value


AG = ("manager", "collectives", 0)


@pytest.mark.parametrize("path, value, field", [
    (AG + ("synth_capacity",), KeyError, "collectives[0].synth_capacity is missing"),
    (AG + ("version",), "abc", "collectives[0].version"),
    (AG + ("version",), -5, "collectives[0].version"),
    (AG + ("kind",), "broadcast", "collectives[0].kind"),
    (AG + ("synth_capacity", 0), int("9" * 401), "integer literal has 401 digits"),
    (AG + ("synth_capacity", 3), 1e300, "synth_capacity[3]"),
    (AG + ("last_decision_t",), 1e300, "collectives[0].last_decision_t"),
    (AG + ("schedule", "chunks", 0, 1), 0.5, "collectives[0].schedule"),       # [src, share, tree]
    (AG + ("schedule", "version"), 7, "collectives[0].schedule"),
    (("telemetry", "direct", 0, "value"), float("nan"), "telemetry.direct[0].value"),
    (("telemetry", "direct", 0, "value"), 1e9, "telemetry.direct[0].value"),
    (("telemetry", "direct", 0, "t"), 1e300, "telemetry.direct[0].t"),
    (("telemetry", "direct", 0, "src"), "nowhere", "telemetry.direct[0]"),
    (("telemetry", "accepted"), -1, "telemetry.accepted"),
    (("protocol_errors",), {"x": "many"}, "protocol_errors.x"),
    (("manager", "collectives"), {}, "manager.collectives must be a list"),
])
def test_a_bad_state_file_is_refused_naming_the_field(tmp_path, path, value, field):
    state = _good_state(tmp_path)
    _set(state, path, value)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(state))
    with pytest.raises(MCCLError) as err:
        ControllerService(TOPO, "tcp://127.0.0.1:0", synthesize=PruningSynth(), state_path=bad)
    assert type(err.value) is MCCLError and field in str(err.value) and "bad.json" in str(err.value)


def test_the_good_state_file_resumes(tmp_path):
    path = tmp_path / "s.json"
    path.write_text(json.dumps(_good_state(tmp_path)))
    svc = ControllerService(TOPO, "tcp://127.0.0.1:0", synthesize=PruningSynth(), state_path=path)
    assert svc.resumed and [c.name for c in svc.manager.collectives()] == [
        "ag", "ar/allgather", "ar/reducescatter"]
    assert svc.store.measured()[TOPO.link_index("s0h0g0", "s0tor0")] == 50.0
    svc.manager.close()


@pytest.mark.parametrize("content", [b"\xff\xfe{}", b"[" * 100_000 + b"]" * 100_000,
                                     b'{"format":"mccl-controller-state/1","manager":' + b"[" * 500
                                     + b"]" * 500 + b"}", b"{half"])
def test_an_unreadable_state_file_is_one_clear_error(tmp_path, content):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    with pytest.raises(MCCLError, match="bad.json"):
        ControllerService(TOPO, "tcp://127.0.0.1:0", synthesize=PruningSynth(), state_path=bad)


def test_each_schedule_version_is_written_once_and_dropped_when_superseded(tmp_path):
    """The main file names version files by digest; telemetry-only writes add none, a new
    version adds one and removes the one it replaces; a restart reads them back."""
    from mccl_runtime.state import versions_dir

    state = tmp_path / "s.json"
    with Server(state_path=state, persist_interval_s=0.0) as svc, \
            ControllerClient(svc.endpoint, timeout_s=5.0) as cli:
        cli.register("world", "ag", "allgather")
        deadline = time.time() + 5
        while cli.get_schedule("world", "ag")[0] < 1 and time.time() < deadline:
            time.sleep(0.02)
        first = sorted(p.name for p in versions_dir(state).iterdir())
        mtime = (versions_dir(state) / first[0]).stat().st_mtime_ns
        for _ in range(5):                              # written each turn (interval 0)
            cli.push_telemetry([{"kind": "link", "src": "s0h0g0", "dst": "s0h0nvs", "gbps": 2000.0,
                                 "t": time.time()}])
        assert sorted(p.name for p in versions_dir(state).iterdir()) == first
        assert (versions_dir(state) / first[0]).stat().st_mtime_ns == mtime
        cli.push_telemetry(_degraded(time.time()))
        while cli.get_schedule("world", "ag")[0] < 2 and time.time() < deadline:
            time.sleep(0.02)
        second = sorted(p.name for p in versions_dir(state).iterdir())
        assert len(second) == 1 and second != first
        served = cli.get_schedule("world", "ag")
    assert json.loads(state.read_text())["manager"]["collectives"][0]["schedule"] == {"file": second[0]}
    with Server(state_path=state) as svc, ControllerClient(svc.endpoint, timeout_s=5.0) as cli:
        again = cli.get_schedule("world", "ag")
        assert again[0] == 2 and again[1].to_dict() == served[1].to_dict()


@pytest.mark.parametrize("damage, words", [
    ("edit", ["does not match its content"]), ("delete", ["cannot read"]),
    ("escape", ["must be a version file name"])])
def test_a_damaged_version_file_is_refused(tmp_path, damage, words):
    from mccl_runtime.state import versions_dir
    from tests.test_runtime_manager import bfs_allgather

    state = tmp_path / "s.json"
    svc = ControllerService(TOPO, "tcp://127.0.0.1:0", synthesize=PruningSynth(), state_path=state)
    svc.manager.register("world", "ag", "allgather", bfs_allgather(TOPO))
    svc.persist()
    svc.manager.close()
    (version,) = versions_dir(state).iterdir()
    if damage == "edit":
        data = json.loads(version.read_text())
        data["schedule"]["chunks"][0][1] = 0.5            # a chunk's share: [src, share, tree]
        version.write_text(json.dumps(data, separators=(",", ":")))
    elif damage == "delete":
        version.unlink()
    else:
        data = json.loads(state.read_text())
        data["manager"]["collectives"][0]["schedule"]["file"] = "../../etc/passwd"
        state.write_text(json.dumps(data))
    with pytest.raises(MCCLError) as err:
        ControllerService(TOPO, "tcp://127.0.0.1:0", synthesize=PruningSynth(), state_path=state)
    assert "manager.collectives[0].schedule.file" in str(err.value)
    assert all(w in str(err.value) for w in words), str(err.value)


def test_a_resumed_controller_does_not_rewrite_its_version_files(tmp_path, monkeypatch):
    from mccl_opt.schedule import Schedule
    from tests.test_runtime_manager import bfs_allgather

    state = tmp_path / "s.json"
    svc = ControllerService(TOPO, "tcp://127.0.0.1:0", synthesize=PruningSynth(), state_path=state)
    svc.manager.register("world", "ag", "allgather", bfs_allgather(TOPO))
    svc.persist()
    svc.manager.close()
    svc = ControllerService(TOPO, "tcp://127.0.0.1:0", synthesize=PruningSynth(), state_path=state)
    calls = []
    real = Schedule.to_dict
    monkeypatch.setattr(Schedule, "to_dict", lambda self: (calls.append(1), real(self))[1])
    svc.persist()
    svc.manager.close()
    assert calls == []


def test_telemetry_rewrites_the_state_at_most_once_per_interval(tmp_path, monkeypatch):
    import threading

    from mccl_runtime.state import StateWriter

    writes = []
    real = StateWriter.write
    monkeypatch.setattr(StateWriter, "write", lambda *a: (writes.append(time.time()), real(*a)))
    gate = threading.Event()                                     # holds the baseline synthesis
    with Server(synth=PruningSynth(gate=gate), state_path=tmp_path / "s.json",
                persist_interval_s=60.0) as svc, ControllerClient(svc.endpoint, timeout_s=5.0) as cli:
        for k in range(20):
            cli.push_telemetry([{"kind": "link", "src": "s0h0g0", "dst": "s0h0nvs", "gbps": 100.0,
                                 "t": time.time()}])
        assert writes == []
        cli.register("w", "ag", "allgather")                     # written before the reply
        assert len(writes) == 1
        gate.set()
    assert len(writes) >= 2                                      # the shutdown write


# ---------------------------------------------------------------------- 8. small
def test_temporary_files_of_an_interrupted_write_are_removed_at_start(tmp_path):
    state = tmp_path / "state.json"
    left = tmp_path / ".state.json.k3j4.tmp"
    left.write_text("{half")
    ControllerService(TOPO, "tcp://127.0.0.1:0", synthesize=PruningSynth(), state_path=state)
    assert not left.exists()


# ---------------------------------------------------------------------- the CLI: errors, never tracebacks
def _mccl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mccl_opt.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _one_error_line(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and all(w in errors[0] for w in words), proc.stderr


def test_cli_serve_refuses_a_bad_state_file_and_a_port_in_use(tmp_path):
    topo = tmp_path / "t.json"
    TOPO.save(topo)
    state = _good_state(tmp_path)
    state["telemetry"]["direct"][0]["value"] = float("nan")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(state))
    _one_error_line(_mccl("controller", "serve", "--topology", str(topo), "--bind", "tcp://127.0.0.1:0",
                          "--state", str(bad)), "telemetry.direct[0].value")
    with Server() as svc:
        _one_error_line(_mccl("controller", "serve", "--topology", str(topo), "--bind", svc.endpoint),
                        "cannot bind", "Address already in use")
