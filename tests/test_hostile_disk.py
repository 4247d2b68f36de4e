"""Hostile environment, a failing disk: every state write raises (an injected writer:
tests run as root, so a chmod would not stop the writes).  No registration is
acknowledged unless written, no version is served or published before it is on disk,
the failure is logged once, and the final write's failure is reported."""

from __future__ import annotations

import errno
import logging
import time

import pytest

import mccl_runtime.state as state_module
from mccl_runtime.client import ControllerClient
from mccl_runtime.protocol import ProtocolError
from tests.test_runtime_service import Server, _degraded


class Disk:
    """Makes ``mccl_runtime.state``'s atomic writes fail while ``broken``."""

    def __init__(self, monkeypatch) -> None:
        self.broken = False
        real = state_module._write_atomic

        def write(path, data, *where):
            if self.broken:
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
            real(path, data, *where)

        monkeypatch.setattr(state_module, "_write_atomic", write)


def _wait(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.02)


def test_a_registration_that_cannot_be_written_is_refused_and_undone(tmp_path, monkeypatch, caplog):
    disk, state = Disk(monkeypatch), tmp_path / "state.json"
    caplog.set_level(logging.WARNING, logger="mccl.controller")
    with Server(state_path=state) as svc, ControllerClient(svc.endpoint, timeout_s=5.0) as cli:
        cli.register("w", "keep", "allgather")
        disk.broken = True
        for i in range(5):
            with pytest.raises(ProtocolError) as err:
                cli.register("w", f"lost{i}", "allreduce")
            assert err.value.reason == "not_persisted" and "No space left" in str(err.value)
        assert [c["name"] for c in cli.list()] == ["keep"]
        assert cli.ping()["read_only"] and cli.stats()["failed_writes"] >= 5
        time.sleep(0.3)                               # turns go by while the disk fails
        disk.broken = False
        assert cli.register("w", "later", "allgather") == ["later"]
        assert cli.ping()["read_only"] is None
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1 and not errors[0].exc_info              # once, no traceback
    assert any("written again" in r.getMessage() for r in caplog.records)
    with Server(state_path=state) as svc:
        assert sorted(c.name for c in svc.manager.collectives()) == ["keep", "later"]


def test_no_version_is_served_or_published_before_it_is_on_disk(tmp_path, monkeypatch):
    disk, state = Disk(monkeypatch), tmp_path / "state.json"
    with Server(state_path=state) as svc, ControllerClient(svc.endpoint, timeout_s=5.0) as cli:
        sub = cli.subscribe()
        assert sub.wait_connected(5.0)
        cli.register("w", "ag", "allgather")
        assert sub.recv(10.0)[2] == 1
        v1 = cli.get_schedule("w", "ag")[1].to_dict()
        disk.broken = True
        assert cli.push_telemetry(_degraded(time.time()))["accepted"] == 2
        _wait(lambda: svc.manager.get("w", "ag").version == 2)     # synthesized, not written
        time.sleep(0.2)
        version, sched = cli.get_schedule("w", "ag")
        assert version == 1 and sched.to_dict() == v1 and cli.list()[0]["version"] == 1
        assert sub.recv(0.5) is None
        disk.broken = False                                          # the disk heals: v2 goes out
        upd = sub.recv(5.0)
        assert upd is not None and upd[2] == 2
        assert cli.get_schedule("w", "ag")[1].to_dict() == upd[3].to_dict()
        sub.close()
    with Server(state_path=state) as svc:                        # and it is the one on disk
        assert svc.manager.get("w", "ag").version == 2
        assert svc.manager.get("w", "ag").schedule.to_dict() == upd[3].to_dict()


def test_a_version_lost_with_the_disk_is_never_reused_for_other_chunks(tmp_path, monkeypatch):
    """The issue's case: v2 synthesized while writes fail, the controller stops (its final
    write fails too), restarts, and a different degradation gives v2 other chunks.  No
    client saw the first v2, so no number was reused for two schedules anyone saw."""
    disk, state = Disk(monkeypatch), tmp_path / "state.json"
    seen: dict[int, dict] = {}
    with Server(state_path=state) as svc, ControllerClient(svc.endpoint, timeout_s=5.0) as cli:
        cli.register("w", "ag", "allgather")
        _wait(lambda: cli.get_schedule("w", "ag")[0] == 1)
        seen[1] = cli.get_schedule("w", "ag")[1].to_dict()
        disk.broken = True
        cli.push_telemetry(_degraded(time.time()))
        _wait(lambda: svc.manager.get("w", "ag").version == 2)
        time.sleep(0.1)
        version, sched = cli.get_schedule("w", "ag")
        seen.setdefault(version, sched.to_dict())
    assert svc.final_write_ok is False
    disk.broken = False
    with Server(state_path=state) as svc, ControllerClient(svc.endpoint, timeout_s=5.0) as cli:
        assert svc.manager.get("w", "ag").version == 1
        other = [{**s, "src": s["src"].replace("g0", "g1"), "dst": s["dst"].replace("g0", "g1").replace(
            "tor0", "tor1")} for s in _degraded(time.time())]
        cli.push_telemetry(other)
        _wait(lambda: cli.get_schedule("w", "ag")[0] == 2)
        version, sched = cli.get_schedule("w", "ag")
        assert seen.get(version, sched.to_dict()) == sched.to_dict() and seen[1] != sched.to_dict()


def test_serve_exits_2_when_its_final_write_fails(tmp_path):
    """A real failing disk (no injection): the state folder is replaced by a file while
    the controller runs, so every write fails with ENOTDIR.  Registration refused, one
    error line in the log, and SIGTERM ends in exit 2 naming the failed write, not
    "state saved"."""
    from tests.procs import start_controller, stop
    from tests.test_runtime_manager import TOPO

    topo_file, folder = tmp_path / "t.json", tmp_path / "run"
    TOPO.save(topo_file)
    folder.mkdir()
    proc = start_controller(topo_file, folder / "state.json")
    try:
        line = proc.stdout.readline()
        assert line.startswith("controller on "), line + proc.stderr.read()
        folder.rename(tmp_path / "gone")
        folder.write_text("not a folder")
        with ControllerClient(line.split()[2], timeout_s=5.0) as cli:
            with pytest.raises(ProtocolError) as err:
                cli.register("w", "ag", "allgather")
            assert err.value.reason == "not_persisted"
            assert cli.push_telemetry(_degraded(time.time()))["accepted"] == 2
            time.sleep(2.5)                          # retries every second
            assert cli.ping()["read_only"]
        assert stop(proc, 20) == 2
    finally:
        if proc.poll() is None:
            stop(proc, 1)
    err_text = proc.stderr.read()
    assert "final state write" in err_text and "failed" in err_text and "state saved" not in err_text
    assert err_text.count("READ-ONLY") == 1 and "Traceback" not in err_text


@pytest.mark.parametrize("where", ["missing", "file", "readonly_fs"])
def test_a_state_folder_no_write_could_reach_is_refused_before_serving(tmp_path, where):
    """A typo'd or read-only state folder: before, the controller started read-only and
    acknowledged nothing until stopped; now the start is refused (a disk that fails
    later still gives read-only mode, above)."""
    from mccl_opt.errors import MCCLError
    from mccl_runtime.service import ControllerService
    from tests.test_runtime_manager import TOPO

    if where == "readonly_fs":
        import os
        if not os.path.isdir("/sys/kernel"):
            pytest.skip("no sysfs")
        state = "/sys/mccl-state.json"                    # sysfs refuses new files, even to root
    elif where == "file":
        (tmp_path / "f").write_text("x")
        state = str(tmp_path / "f" / "state.json")
    else:
        state = str(tmp_path / "no" / "such" / "state.json")
    with pytest.raises(MCCLError, match="folder"):
        ControllerService(TOPO, "tcp://127.0.0.1:0", state_path=state)
