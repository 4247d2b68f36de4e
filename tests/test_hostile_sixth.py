"""Hostile input, sixth pass (issue 27): the remainders of the fifth pass and cases of our
own, each failing on the code of 2026-12-06 before its fix (docs/runtime.md,
"Hostile-input audit, sixth pass").  Every case ends in one typed error (an error reply,
exit status 2 with one ``error:`` line saying what to fix), never in a traceback, a hang,
a silent acceptance or a lost write."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from mccl_opt.errors import MCCLError
from tests.test_hostile_third import _cli

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ exports without --topology
def _alltoall_with_a_jump(topo, tmp_path: Path, name: str) -> tuple[Path, Path]:
    """A good AllToAll schedule of ``topo`` and the same with one path cut to a hop
    between two GPUs of two hosts (no link joins them)."""
    import mccl_opt as mo

    d = mo.solve_alltoall(topo).to_dict(compact=False)
    good, bad = tmp_path / f"{name}-good.json", tmp_path / f"{name}-bad.json"
    good.write_text(json.dumps(d))
    chunk = next(c for c in d["chunks"] if c["src"] == "s0h0g0" and c["dst"] == "s0h1g0")
    assert not topo.has_link("s0h0g0", "s0h1g0")
    chunk["path"] = ["s0h0g0", "s0h1g0"]
    bad.write_text(json.dumps(d))
    return good, bad


@pytest.mark.parametrize("exporter", [("export", "msccl"), ("export", "mscclpp")])
def test_an_export_checks_a_schedule_on_the_fabric_file_or_sub_fabric_it_names(capsys, tmp_path, exporter):
    """Without ``--topology`` a schedule naming a topology file or a communicator's
    sub-fabric was checked on its own paths only, where every hop is a link: a path
    jumping between two GPUs no link joins was exported.  The named fabric is now rebuilt
    (the file read with the bounded readers; the sub-fabric induced by the schedule's
    GPUs in its parent, its name checked) and the schedule checked on it."""
    import mccl_opt as mo
    from mccl_opt.subfabric import induced

    base = mo.Topology.load(ROOT / "instances" / "data" / "hpn-1x2x4.json")
    data = base.to_dict()
    data["name"] = str(tmp_path / "fabric.json")                 # a fabric named by its file
    (tmp_path / "fabric.json").write_text(json.dumps(data))
    sub = induced(base, ["s0h0g0", "s0h0g1", "s0h1g0", "s0h1g1"]).topology
    assert sub.name.startswith("hpn-1x2x4/group-4-")
    out = tmp_path / "out"
    for name, topo in (("file", mo.Topology.load(tmp_path / "fabric.json")), ("sub", sub)):
        good, bad = _alltoall_with_a_jump(topo, tmp_path, name)
        assert _cli(capsys, *exporter, str(good), "-o", str(out))[0] == 0
        out.unlink()
        rc, err = _cli(capsys, *exporter, str(bad), "-o", str(out))
        assert rc == 2 and err.count("error:") == 1 and "s0h0g0 -> s0h1g0 is not a link" in err, err
        assert "the fabric the schedule names" in err and not out.exists()


@pytest.mark.parametrize("edit, words", [
    ("missing file", "names the fabric file .* cannot be read .* pass --topology"),
    ("unknown parent", "sub-fabric of 'nowhere', a fabric that cannot be rebuilt .* pass --topology"),
    ("wrong tag", "GPUs induce 'hpn-1x2x4/group-4-.*', not the sub-fabric .* pass --topology"),
])
def test_an_export_refuses_a_named_fabric_it_cannot_rebuild(capsys, tmp_path, edit, words):
    """A schedule naming a fabric file that is gone, or a sub-fabric whose parent or
    members do not give it back, was checked on its own paths and exported; it is now
    refused with a message asking for ``--topology``."""
    import mccl_opt as mo
    from mccl_opt.subfabric import induced

    base = mo.Topology.load(ROOT / "instances" / "data" / "hpn-1x2x4.json")
    sub = induced(base, ["s0h0g0", "s0h0g1", "s0h1g0", "s0h1g1"]).topology
    d = mo.solve_alltoall(sub).to_dict(compact=False)
    d["topology"] = {"missing file": str(tmp_path / "gone.json"),
                     "unknown parent": "nowhere/" + sub.name.split("/")[1],
                     "wrong tag": "hpn-1x2x4/group-4-00000000"}[edit]
    sched, out = tmp_path / "s.json", tmp_path / "out.xml"
    sched.write_text(json.dumps(d))
    rc, err = _cli(capsys, "export", "msccl", str(sched), "-o", str(out))
    assert rc == 2 and err.count("error:") == 1, err
    assert __import__("re").search(words, err), err
    assert not out.exists()


def test_an_export_of_a_fabric_it_cannot_locate_says_what_it_checked(capsys, tmp_path):
    """A schedule whose fabric is named by no file, library or sub-fabric (a fabric read
    from a file carries its own name) is still checked on its own paths, and the export
    now says so instead of passing silently."""
    import mccl_opt as mo

    base = mo.Topology.load(ROOT / "instances" / "data" / "hpn-1x2x4.json")
    d = mo.solve_alltoall(base).to_dict(compact=False)
    d["topology"] = "my-cluster"
    sched = tmp_path / "s.json"
    sched.write_text(json.dumps(d))
    rc, err = _cli(capsys, "export", "msccl", str(sched), "-o", str(tmp_path / "o.xml"))
    assert rc == 0 and "warning:" in err and "checked on its own paths only" in err and "--topology" in err


# ------------------------------------------------------------------ the collective quota
def test_a_key_holder_rotating_client_ids_is_held_to_a_registration_budget():
    """The per-client quota is keyed by the ``client`` id a request carries, which its
    sender chooses: one key holder signing with a fresh id every 4 registrations took 65
    collectives at once (and could take all 256).  A budget over every registration,
    whoever sends it (64 new collectives a minute), now refuses the 65th."""
    from mccl_runtime.client import ControllerClient
    from mccl_runtime.protocol import ProtocolError
    from tests.test_runtime_service import KEY, Server

    with Server(key=KEY, max_client_collectives=4) as svc:
        taken, refused = 0, None
        for ident in range(17):
            with ControllerClient(svc.endpoint, key=KEY, timeout_s=10.0) as cli:   # a fresh client id
                for k in range(4):
                    try:
                        cli.register(f"c{ident}", f"a{k}", "allgather")
                        taken += 1
                    except ProtocolError as exc:
                        refused = exc
                        break
            if refused is not None:
                break
        assert taken == 64, taken
        assert refused.reason == "rejected" and "a minute from all clients" in str(refused)
        assert len(svc.manager.collectives()) == 64


# ------------------------------------------------------------------ the key file
def test_a_key_file_swapped_between_the_check_and_the_read_is_not_taken(tmp_path, monkeypatch):
    """The key file was ``stat``-checked, then opened again by its path to be read: a
    group-readable file renamed over it in between was read (the check had seen the
    private one).  It is now opened once and checked on the open file."""
    import mccl_opt.files as files_module
    from mccl_runtime.protocol import load_key

    key, planted = tmp_path / "key", tmp_path / "planted"
    key.write_bytes(b"0123456789abcdef-the-real-key")
    key.chmod(0o600)
    planted.write_bytes(b"0123456789abcdef-a-planted-key")
    planted.chmod(0o644)
    real_open = os.open

    def racing_open(path, *args, **kw):
        if str(path) == str(key) and planted.exists():
            os.replace(planted, key)                 # the swap lands just before the open
        return real_open(path, *args, **kw)

    monkeypatch.setattr(files_module.os, "open", racing_open)
    with pytest.raises(MCCLError, match="readable by group or others"):
        load_key(key)


def test_a_key_file_behind_a_symlink_is_read_and_checked_on_its_target(tmp_path):
    """Mounted secrets are often symlinks: the link is followed on purpose, and the file
    it names is what is checked."""
    from mccl_runtime.protocol import load_key

    target, link = tmp_path / "secret", tmp_path / "key"
    target.write_bytes(b"0123456789abcdef-mounted\n")
    target.chmod(0o600)
    link.symlink_to(target)
    assert load_key(link) == b"0123456789abcdef-mounted"
    target.chmod(0o640)
    with pytest.raises(MCCLError, match="readable by group or others"):
        load_key(link)


# ------------------------------------------------------------------ the state folder held open
def test_a_state_folder_replaced_while_serving_does_not_receive_the_writes(tmp_path):
    """The state folder was checked at start, then written by path: a folder renamed
    away and replaced (by a user who can write its parent) received the next write, so
    the state went where the replacement's owner could read and swap it.  The folder is
    now held open and every write goes through its descriptor; a write finding that the
    path names another folder fails (read-only mode) and writes nothing there."""
    from mccl_runtime.client import ControllerClient
    from mccl_runtime.protocol import ProtocolError
    from tests.test_runtime_service import Server

    home = tmp_path / "ctl"
    home.mkdir(mode=0o700)
    state = home / "state.json"
    with Server(state_path=state) as svc, ControllerClient(svc.endpoint, timeout_s=10.0) as cli:
        cli.register("w", "keep", "allgather")
        assert svc.manager.wait_idle(10.0)
        home.rename(tmp_path / "moved")
        home.mkdir(mode=0o700)                       # the replacement
        with pytest.raises(ProtocolError) as err:
            cli.register("w", "lost", "allgather")
        assert err.value.reason == "not_persisted" and "moved or replaced" in str(err.value)
        assert [c["name"] for c in cli.list()] == ["keep"]
    assert list(home.iterdir()) == []
    assert "keep" in (tmp_path / "moved" / "state.json").read_text()


def test_a_state_folder_that_is_a_symlink_is_refused(tmp_path):
    """The state's folder given through a symlink was followed at every write (a link
    re-pointed between writes redirected them); the folder itself must be given."""
    from mccl_runtime.state import load_state
    from tests.test_runtime_manager import TOPO
    from tests.test_runtime_service import Server

    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(MCCLError, match="its folder .* is a symlink"):
        with Server(state_path=tmp_path / "link" / "state.json"):
            pass
    with pytest.raises(MCCLError, match="its folder .* is a symlink"):
        load_state(tmp_path / "link" / "state.json", TOPO)


def test_a_version_folder_swapped_between_the_check_and_the_write_is_not_written_into(tmp_path, monkeypatch):
    """The version folder was checked by path, then each version file created by path
    (``mkstemp(dir=...)``): a folder swapped for a symlink between the two received the
    file.  The version folder is now opened ``O_NOFOLLOW`` once per write and every file
    created through that descriptor."""
    import mccl_runtime.state as state_module
    from mccl_runtime.state import versions_dir
    from tests.test_runtime_service import Server, settled

    state, elsewhere = tmp_path / "state.json", tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    with Server(state_path=state) as svc:
        svc.register("w", "ag", "allgather", 0.0)
        assert settled(svc)
    assert svc.durable.save(svc.store, svc.manager, svc.protocol_errors)
    real_dumps, swapped = state_module.json.dumps, []

    def dumps(obj, *a, **kw):                       # serializing a version: just after the check
        if isinstance(obj, dict) and "synth_capacity" in obj and not swapped:
            shutil.rmtree(versions_dir(state))
            versions_dir(state).symlink_to(elsewhere)
            swapped.append(True)
        return real_dumps(obj, *a, **kw)

    monkeypatch.setattr(state_module.json, "dumps", dumps)
    svc.writer._files.clear()                        # every version file is written again
    svc.durable.save(svc.store, svc.manager, svc.protocol_errors)
    assert swapped and not list(elsewhere.iterdir())


# ------------------------------------------------------------------ outputs that never open
@pytest.mark.parametrize("argv", [("solve", "allgather", "hpn-1x2x4"), ("topo", "hpn", "1x2x4"),
                                  ("export", "mps", "hpn-1x2x4")])
def test_an_output_that_is_a_fifo_is_refused_before_the_work(tmp_path, argv):
    """``-o`` naming a FIFO made every writing command block forever after its work
    (opening a FIFO to write waits for a reader).  Refused before the work starts (run
    as a process with a time limit: the old code never returned)."""
    import subprocess
    import sys

    fifo = tmp_path / "out"
    os.mkfifo(fifo, 0o600)
    proc = subprocess.run([sys.executable, "-m", "mccl_opt", *argv, "-o", str(fifo)], cwd=ROOT, timeout=120,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and proc.stderr.count("error:") == 1 and "FIFO" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


# ------------------------------------------------------------------ a state path that names a folder
@pytest.mark.parametrize("state", [".", "/", "sub/.."])
def test_a_state_path_naming_a_folder_is_refused(capsys, tmp_path, monkeypatch, state):
    """``--state .`` or ``--state /`` ended in a ValueError traceback (``PosixPath('.')
    has an empty name``), ``sub/..`` in a message about the parent folder's mode."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    rc, err = _cli(capsys, "controller", "serve", "--topology", "hpn-1x2x4", "--bind", "tcp://127.0.0.1:0",
                   "--state", state)
    assert rc == 2 and err.count("error:") == 1 and "names a folder, not a file" in err, err


# ------------------------------------------------------------------ names the file system refuses
def test_a_fabric_name_too_long_for_a_path_is_read_as_a_name(capsys, tmp_path):
    """A topology spec, or a warm schedule's ``topology`` field, of 5000 characters was
    tried as a path first: the ``OSError`` (``File name too long``) ended the command with
    the 5000 characters echoed and no word of what to give.  It is now an unknown name,
    quoted at most 80 characters, with the usual advice."""
    import mccl_opt as mo

    rc, err = _cli(capsys, "solve", "allgather", "a" * 5000)
    assert rc == 2 and "neither a topology file nor an instance name" in err and len(err) < 600, err[:300]
    d = mo.solve_alltoall(mo.Topology.load(ROOT / "instances" / "data" / "hpn-1x2x4.json")).to_dict(compact=False)
    d["topology"] = "a" * 5000
    warm = tmp_path / "w.json"
    warm.write_text(json.dumps(d))
    rc, err = _cli(capsys, "solve", "alltoall", "hpn-1x2x4-fail1", "--warm", str(warm), "-o", str(tmp_path / "o.json"))
    assert rc == 2 and err.count("error:") == 1 and "--warm-topology" in err and len(err) < 1000, err[:300]
