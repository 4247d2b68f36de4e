"""The controller state on disk: incremental, atomic writes and a checked load.

``STATE`` (``--state``) is a small JSON file: the topology, the telemetry channels,
the counters and, per collective, its kind, version and last decision time.  Each
schedule version lives in its own file ``STATE.d/<sha256>.json`` (the schedule and the
capacities it was synthesized for), written once, when the version is first saved (and
again if an abort for no gain re-bases its capacities), so a write costs the small file
plus the new versions, not every schedule again.  Files are
written to a temporary name, flushed to disk and renamed; the main file's rename is the
commit point (a crash leaves the old or the new state, never half), and version files
no longer named by it are removed after it.

:func:`load_state` reads it back, inlines each version file after checking its digest,
and hands the result to :func:`.state_check.check_state`.  Format 1 (schedules inline
in the main file) is still read.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

from mccl_opt.errors import MCCLError
from mccl_opt.files import MAX_JSON_BYTES, parse_json, read_bounded, read_json, refuse_shared
from mccl_opt.topology import Topology

from .state_check import MAX_COLLECTIVES, check_state

__all__ = ["check_state_folder", "STATE_FORMAT", "StateWriter", "load_state", "remove_temporaries", "versions_dir"]

STATE_FORMAT = "mccl-controller-state/2"
_FORMATS = ("mccl-controller-state/1", STATE_FORMAT)
_VERSION_FILE = re.compile(r"[0-9a-f]{64}\.json")


def versions_dir(path: Path) -> Path:
    """The folder of ``path``'s schedule version files."""
    return path.with_name(path.name + ".d")


def check_state_folder(path: str | Path) -> None:
    """Refuse, before the service starts, a state file whose folder is missing, not a
    folder or not writable (a read-only file system: ``--state /sys/s.json``): no write
    could ever succeed, so the controller would start read-only and acknowledge nothing.
    A disk that fails later (full, I/O errors) puts a running service in read-only mode
    instead (:mod:`.durability`)."""
    folder = Path(path).parent
    if not folder.is_dir():
        raise MCCLError(f"controller state {str(path)!r}: its folder {str(folder)!r} does not exist "
                        "(create it first)")
    check_private_folder(path)
    try:                                          # an empty file: creatable even on a full disk
        fd, probe = tempfile.mkstemp(prefix=f".{Path(path).name}.", suffix=".tmp", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise MCCLError(f"controller state {str(path)!r}: cannot create a file in its folder {str(folder)!r} "
                        f"({exc.strerror}); pick a writable folder") from None


def check_owned(path: Path, what: str) -> None:
    """Refuse a state file or version folder that is a symlink (the atomic rename would
    replace the link, leaving its target behind), belongs to another user or can be
    written by group or others (:func:`mccl_opt.files.refuse_shared`)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(info.st_mode):
        raise MCCLError(f"{what} {str(path)!r} is a symlink, not a regular file or folder; give the path itself "
                        "(a write would replace the link)")
    refuse_shared(info, path, what, MCCLError)


def check_private_folder(path: str | Path) -> None:
    """Refuse a state file whose folder another user owns or group or others can write
    (``/tmp``, a shared project folder): another user could plant a state or a version
    folder there, or, without the sticky bit, swap the files between writes.  The state
    folder must be the user's alone (docs/runtime.md, "Threat model")."""
    folder = Path(path).parent
    try:
        info = os.stat(folder)
    except OSError as exc:
        raise MCCLError(f"controller state {str(path)!r}: cannot inspect its folder {str(folder)!r} "
                        f"({exc.strerror})") from None
    refuse_shared(info, folder, f"controller state {str(path)!r}: its folder", MCCLError)


def _write_atomic(path: Path, data: bytes) -> None:
    """``data`` to ``path`` by a flushed temporary file (mode 0600) and a rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _replace_durably(path: Path, data: bytes) -> None:
    """``data`` to ``path`` (:func:`_write_atomic`), then its folder synced.  If that
    sync fails (``EIO``: the rename may never reach the disk, or reach it after a
    crash), the previous file is put back (kept as a hard link, or a copy, until then) and
    the error raised: the caller tells its client the write failed, so the file must not
    hold what the client was refused (a registration answered with an error, found again
    after a restart)."""
    prev = path.with_name(f".{path.name}.prev.tmp")       # removed by remove_temporaries after a crash
    had = path.exists()
    try:
        if had:
            prev.unlink(missing_ok=True)
            try:
                os.link(path, prev)
            except OSError:                               # no hard links here: a copy
                shutil.copyfile(path, prev)
        _write_atomic(path, data)
        try:
            _sync_dir(path.parent)
        except OSError:
            if had:
                os.replace(prev, path)
            else:
                path.unlink(missing_ok=True)
            raise
    finally:
        prev.unlink(missing_ok=True)


def _sync_dir(folder: Path) -> None:
    """Make the renames in ``folder`` durable (POSIX; a no-op elsewhere)."""
    if os.name == "posix":
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class StateWriter:
    """Writes the state of a store, a manager and error counters to ``path``,
    serializing each schedule version once (module docstring)."""

    def __init__(self, path: str | Path, topo: Topology) -> None:
        self.path = Path(path)
        self.dir = versions_dir(self.path)
        self._topology = json.dumps(topo.to_dict(), separators=(",", ":"))
        # key -> (version, schedule, synthesis capacities, file)
        self._files: dict[tuple[str, str], tuple[int, Any, Any, str]] = {}

    def _version_file(self, coll: Any) -> str:
        """The file of ``coll``'s current version, written if it is new or its synthesis
        capacities moved (an abort for no gain keeps the schedule and re-bases them)."""
        known = self._files.get(coll.key)
        if known is not None and known[0] == coll.version and known[1] is coll.schedule \
                and known[2] is coll.synth_capacity:
            return known[3]
        data = json.dumps({"schedule": coll.schedule.to_dict(),
                           "synth_capacity": coll.synth_capacity.tolist()}, separators=(",", ":")).encode()
        name = hashlib.sha256(data).hexdigest() + ".json"
        if not (self.dir / name).exists():
            self.dir.mkdir(mode=0o700, exist_ok=True)
            _write_atomic(self.dir / name, data)
        self._files[coll.key] = (coll.version, coll.schedule, coll.synth_capacity, name)
        return name

    def adopt(self, manager: Any, state: dict[str, Any]) -> None:
        """Remember the version files a loaded ``state`` named for the collectives the
        manager restored from it, so the next write does not serialize them again."""
        for d in state["manager"]["collectives"]:
            if d.get("schedule_file"):
                coll = manager.get(d["comm"], d["name"])
                self._files[coll.key] = (coll.version, coll.schedule, coll.synth_capacity, d["schedule_file"])

    def write(self, store: Any, manager: Any, protocol_errors: dict[str, int]) -> None:
        """Save now: new version files, then the main file, then drop unnamed versions.  A
        version folder that has become a symlink or someone else's (:func:`check_owned`)
        is a failed write (``PermissionError``): nothing is written into it."""
        try:
            check_owned(self.dir, "controller state folder")
        except MCCLError as exc:
            raise PermissionError(str(exc)) from None
        colls = [c.record() | {"schedule": {"file": self._version_file(c)} if c.schedule is not None
                                else None} for c in manager.collectives()]
        rest = json.dumps({"telemetry": store.to_dict(),
                           "manager": {"collectives": colls, "counters": dict(manager.counters)},
                           "protocol_errors": dict(protocol_errors)}, separators=(",", ":"))
        data = f'{{"format":"{STATE_FORMAT}","topology":{self._topology},{rest[1:]}'.encode()
        if self.dir.exists():
            _sync_dir(self.dir)
        _replace_durably(self.path, data)
        self._drop_unnamed({c["schedule"]["file"] for c in colls if c["schedule"]})

    def _drop_unnamed(self, named: set[str]) -> None:
        """Remove version files the main file no longer names (best effort: the state is
        already committed, and a file left now is removed by a later write)."""
        self._files = {k: v for k, v in self._files.items() if v[3] in named}
        try:
            for f in self.dir.iterdir() if self.dir.exists() else ():
                if _VERSION_FILE.fullmatch(f.name) and f.name not in named:
                    f.unlink(missing_ok=True)
        except OSError:
            pass


def remove_temporaries(path: str | Path) -> list[Path]:
    """Delete the ``.*.tmp`` files a process killed inside a write left next to
    ``path`` and in its version folder; returns them."""
    path = Path(path)
    left = sorted(path.parent.glob(f".{path.name}.*.tmp"))
    if versions_dir(path).is_dir():
        left += sorted(versions_dir(path).glob(".*.tmp"))
    for tmp in left:
        tmp.unlink(missing_ok=True)
    return left


def _inline_versions(data: dict[str, Any], path: Path) -> None:
    """Replace each ``{"file": name}`` schedule by the version file's content, checking
    that its name is its SHA-256."""
    colls = data.get("manager", {}).get("collectives") if isinstance(data.get("manager"), dict) else None
    for i, c in enumerate(colls if isinstance(colls, list) else []):
        ref = c.get("schedule") if isinstance(c, dict) else None
        if not isinstance(ref, dict) or "file" not in ref:
            continue
        where = f"manager.collectives[{i}].schedule.file"
        name = ref["file"]
        if not isinstance(name, str) or not _VERSION_FILE.fullmatch(name):
            raise MCCLError(f"{where} must be a version file name (64 hex digits + .json)")
        file = versions_dir(path) / name
        raw = read_bounded(file, MCCLError, f"{where}: schedule version", MAX_JSON_BYTES, private=True)
        if hashlib.sha256(raw).hexdigest() + ".json" != name:
            raise MCCLError(f"{where}: {name} does not match its content (corrupt)")
        content = parse_json(raw, file, MCCLError, "schedule version")     # the bytes checked, not a second open
        if not isinstance(content, dict) or not {"schedule", "synth_capacity"} <= set(content):
            raise MCCLError(f"{where}: {name} must hold 'schedule' and 'synth_capacity'")
        c["schedule"], c["synth_capacity"] = content["schedule"], content["synth_capacity"]
        c["schedule_file"] = name


def load_state(path: str | Path, topo: Topology, *, now: float | None = None,
               max_ratio: float = 1.5, future_tolerance_s: float = 0.5,
               max_collectives: int = MAX_COLLECTIVES) -> dict[str, Any] | None:
    """The saved state checked against ``topo`` (:func:`.state_check.check_state`) and
    normalised, or ``None`` if ``path`` does not exist.  Any problem raises one
    :class:`MCCLError` naming the file and the field."""
    path = Path(path)
    check_private_folder(path)
    check_owned(path, "controller state")
    check_owned(versions_dir(path), "controller state folder")
    if not path.exists():
        return None
    try:
        data = read_json(path, MCCLError, "controller state", private=True)
        if not isinstance(data, dict) or data.get("format") not in _FORMATS:
            raise MCCLError(f"not a {STATE_FORMAT} file; pass another --state")
        _inline_versions(data, path)
        if not path.exists():                    # gone while read: swapped by someone else
            raise MCCLError("the file disappeared while it was read")
        check_owned(path, "controller state")    # again: what was read is the file checked
        check_owned(versions_dir(path), "controller state folder")
        return check_state(data, topo, now=now, max_ratio=max_ratio, future_tolerance_s=future_tolerance_s,
                           max_collectives=max_collectives)
    except MCCLError as exc:
        raise MCCLError(f"controller state {str(path)!r}: {exc}; fix it or delete the file (and "
                        f"{versions_dir(path).name}/) to start fresh") from None
