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

import errno
import hashlib
import json
import os
import re
import shutil
import stat
from pathlib import Path
from typing import Any

from mccl_opt.errors import MCCLError
from mccl_opt.files import MAX_JSON_BYTES, parse_json, read_bounded, refuse_shared
from mccl_opt.topology import Topology

from .state_check import MAX_COLLECTIVES, check_state
from .state_folder import StateFolder, write_atomic

__all__ = ["check_state_folder", "STATE_FORMAT", "StateWriter", "load_state", "remove_temporaries", "versions_dir"]

STATE_FORMAT = "mccl-controller-state/2"
_FORMATS = ("mccl-controller-state/1", STATE_FORMAT)
_VERSION_FILE = re.compile(r"[0-9a-f]{64}\.json")


def versions_dir(path: Path) -> Path:
    """The folder of ``path``'s schedule version files."""
    return path.with_name(path.name + ".d")


def check_state_folder(path: str | Path) -> StateFolder:
    """Open the folder of the state file ``path`` (:class:`.state_folder.StateFolder`:
    refused if missing, a symlink, another user's or writable by group or others) and
    refuse it, before the service starts, if no file can be created in it (a read-only
    file system: ``--state /sys/s.json``): no write could ever succeed, so the controller
    would start read-only and acknowledge nothing.  A disk that fails later (full, I/O
    errors) puts a running service in read-only mode instead (:mod:`.durability`)."""
    folder = StateFolder(path)
    try:                                          # an empty file: creatable even on a full disk
        folder.probe()
    except OSError as exc:
        folder.close()
        fix = "give a shorter file name" if exc.errno == errno.ENAMETOOLONG else "pick a writable folder"
        raise MCCLError(f"controller state {str(path)!r}: cannot create a file in its folder "
                        f"{str(folder.folder)!r} ({exc.strerror}); {fix}") from None
    return folder


def _check_file(folder: StateFolder, what: str) -> None:
    """Refuse a state file that is a symlink (the atomic rename would replace the link,
    leaving its target behind), belongs to another user or can be written by group or
    others (:func:`mccl_opt.files.refuse_shared`); seen in the folder held."""
    info = folder.lstat(folder.name)
    if info is None:
        return
    if stat.S_ISLNK(info.st_mode):
        raise MCCLError(f"{what} {str(folder.path)!r} is a symlink, not a regular file or folder; give the path "
                        "itself (a write would replace the link)")
    refuse_shared(info, folder.path, what, MCCLError)


def _write_atomic(path: Path, data: bytes, dir_fd: int) -> None:
    """``data`` to ``path`` (named by its last component in the open folder ``dir_fd``)
    by a flushed temporary file (mode 0600) and a rename (:func:`.state_folder.write_atomic`)."""
    write_atomic(dir_fd, path.name, data)


def _replace_durably(path: Path, data: bytes, dir_fd: int) -> None:
    """``data`` to ``path`` (:func:`_write_atomic`, in the open folder ``dir_fd``), then
    its folder synced.  If that sync fails (``EIO``: the rename may never reach the disk,
    or reach it after a crash), the previous file is put back (kept as a hard link, or a
    copy, until then) and the error raised: the caller tells its client the write
    failed, so the file must not hold what the client was refused (a registration
    answered with an error, found again after a restart)."""
    name, prev = path.name, f".{path.name}.prev.tmp"       # removed by remove_temporaries after a crash
    had = _exists(name, dir_fd)
    try:
        if had:
            _unlink(prev, dir_fd)
            try:
                os.link(name, prev, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            except OSError:                               # no hard links here: a copy
                _copy(name, prev, dir_fd)
        _write_atomic(path, data, dir_fd)
        try:
            _sync_dir(path.parent, dir_fd)
        except OSError:
            if had:
                os.replace(prev, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            else:
                _unlink(name, dir_fd)
            raise
    finally:
        _unlink(prev, dir_fd)


def _exists(name: str, dir_fd: int) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False


def _unlink(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass


def _copy(src: str, dst: str, dir_fd: int) -> None:
    """Copy ``src`` to a new ``dst`` (mode 0600), both in the open folder ``dir_fd``."""
    nofollow = getattr(os, "O_NOFOLLOW", 0)
    with os.fdopen(os.open(src, os.O_RDONLY | nofollow, dir_fd=dir_fd), "rb") as fin, \
            os.fdopen(os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | nofollow, 0o600, dir_fd=dir_fd),
                      "wb") as fout:
        shutil.copyfileobj(fin, fout)


def _sync_dir(folder: Path, dir_fd: int) -> None:
    """Make the renames in ``folder`` (open as ``dir_fd``) durable (POSIX; a no-op elsewhere)."""
    if os.name == "posix":
        os.fsync(dir_fd)


class StateWriter:
    """Writes the state of a store, a manager and error counters to ``path``,
    serializing each schedule version once (module docstring)."""

    def __init__(self, path: str | Path, topo: Topology, folder: StateFolder | None = None) -> None:
        self.path = Path(path)
        self.folder = folder if folder is not None else StateFolder(self.path)
        self.dir = versions_dir(self.path)
        self._topology = json.dumps(topo.to_dict(), separators=(",", ":"))
        # key -> (version, schedule, synthesis capacities, file)
        self._files: dict[tuple[str, str], tuple[int, Any, Any, str]] = {}

    def _version_file(self, coll: Any, dir_fd: int) -> str:
        """The file of ``coll``'s current version, written (in the open version folder
        ``dir_fd``) if it is new or its synthesis capacities moved (an abort for no gain
        keeps the schedule and re-bases them)."""
        known = self._files.get(coll.key)
        if known is not None and known[0] == coll.version and known[1] is coll.schedule \
                and known[2] is coll.synth_capacity:
            return known[3]
        data = json.dumps({"schedule": coll.schedule.to_dict(),
                           "synth_capacity": coll.synth_capacity.tolist()}, separators=(",", ":")).encode()
        name = hashlib.sha256(data).hexdigest() + ".json"
        if not _exists(name, dir_fd):
            _write_atomic(self.dir / name, data, dir_fd)
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
        """Save now: new version files, then the main file, then drop unnamed versions,
        each relative to the folders held open (:class:`.state_folder.StateFolder`).  A
        state folder moved, replaced or made shared, or a version folder that has become
        a symlink or someone else's, is a failed write (``PermissionError``): nothing is
        written into it."""
        try:
            self.folder.check()
            with self.folder.versions(create=any(c.schedule is not None for c in manager.collectives())) as vfd:
                self._write(store, manager, protocol_errors, vfd)
        except MCCLError as exc:
            raise PermissionError(str(exc)) from None

    def _write(self, store: Any, manager: Any, protocol_errors: dict[str, int], vfd: int | None) -> None:
        colls = [c.record() | {"schedule": {"file": self._version_file(c, vfd)} if c.schedule is not None
                                else None} for c in manager.collectives()]
        rest = json.dumps({"telemetry": store.to_dict(),
                           "manager": {"collectives": colls, "counters": dict(manager.counters)},
                           "protocol_errors": dict(protocol_errors)}, separators=(",", ":"))
        data = f'{{"format":"{STATE_FORMAT}","topology":{self._topology},{rest[1:]}'.encode()
        if vfd is not None:
            _sync_dir(self.dir, vfd)
            held, named = os.fstat(vfd), self.folder.lstat(self.folder.versions_name)
            if named is None or (named.st_dev, named.st_ino) != (held.st_dev, held.st_ino):
                raise PermissionError(f"the version folder {str(self.dir)!r} was moved or replaced during the "
                                      "write; the state file is not written (it would name files a restart "
                                      "cannot find)")
        _replace_durably(self.path, data, self.folder.fd)
        self._drop_unnamed({c["schedule"]["file"] for c in colls if c["schedule"]}, vfd)

    def _drop_unnamed(self, named: set[str], vfd: int | None) -> None:
        """Remove version files the main file no longer names (best effort: the state is
        already committed, and a file left now is removed by a later write)."""
        self._files = {k: v for k, v in self._files.items() if v[3] in named}
        try:
            for name in os.listdir(vfd) if vfd is not None else ():
                if _VERSION_FILE.fullmatch(name) and name not in named:
                    _unlink(name, vfd)
        except OSError:
            pass


def remove_temporaries(path: str | Path, folder: StateFolder | None = None) -> list[Path]:
    """Delete the ``.*.tmp`` files a process killed inside a write left next to
    ``path`` and in its version folder (in ``folder``, the state folder held open, or
    one opened now); returns them."""
    path = Path(path)
    folder = folder if folder is not None else StateFolder(path)
    left: list[Path] = []
    for name in sorted(os.listdir(folder.fd)):
        if name.startswith(f".{path.name}.") and name.endswith(".tmp"):
            _unlink(name, folder.fd)
            left.append(path.parent / name)
    try:
        with folder.versions() as vfd:
            for name in sorted(os.listdir(vfd)) if vfd is not None else ():
                if name.startswith(".") and name.endswith(".tmp"):
                    _unlink(name, vfd)
                    left.append(versions_dir(path) / name)
    except MCCLError:                             # refused when the state is loaded, with its message
        pass
    return left


def _inline_versions(data: dict[str, Any], path: Path, vfd: int | None) -> None:
    """Replace each ``{"file": name}`` schedule by the version file's content (read in
    the open version folder ``vfd``), checking that its name is its SHA-256."""
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
        if vfd is None:
            raise MCCLError(f"{where}: cannot read schedule version file {str(file)!r}: its folder does not exist")
        raw = read_bounded(file, MCCLError, f"{where}: schedule version", MAX_JSON_BYTES, private=True, dir_fd=vfd)
        if hashlib.sha256(raw).hexdigest() + ".json" != name:
            raise MCCLError(f"{where}: {name} does not match its content (corrupt)")
        content = parse_json(raw, file, MCCLError, "schedule version")     # the bytes checked, not a second open
        if not isinstance(content, dict) or not {"schedule", "synth_capacity"} <= set(content):
            raise MCCLError(f"{where}: {name} must hold 'schedule' and 'synth_capacity'")
        c["schedule"], c["synth_capacity"] = content["schedule"], content["synth_capacity"]
        c["schedule_file"] = name


def load_state(path: str | Path, topo: Topology, *, now: float | None = None,
               max_ratio: float = 1.5, future_tolerance_s: float = 0.5,
               max_collectives: int = MAX_COLLECTIVES, folder: StateFolder | None = None) -> dict[str, Any] | None:
    """The saved state checked against ``topo`` (:func:`.state_check.check_state`) and
    normalised, or ``None`` if ``path`` does not exist.  Every file is read in ``folder``
    (the state's folder held open, :class:`.state_folder.StateFolder`; opened now if
    ``None``) and checked on the open file.  Any problem raises one :class:`MCCLError`
    naming the file and the field."""
    path = Path(path)
    own = folder is None
    folder = StateFolder(path) if folder is None else folder
    try:
        _check_file(folder, "controller state")
        with folder.versions() as vfd:
            if folder.lstat(folder.name) is None:
                return None
            try:
                raw = read_bounded(path, MCCLError, "controller state", MAX_JSON_BYTES, private=True, dir_fd=folder.fd)
                data = parse_json(raw, path, MCCLError, "controller state")
                if not isinstance(data, dict) or data.get("format") not in _FORMATS:
                    raise MCCLError(f"not a {STATE_FORMAT} file; pass another --state")
                _inline_versions(data, path, vfd)
                return check_state(data, topo, now=now, max_ratio=max_ratio, future_tolerance_s=future_tolerance_s,
                                   max_collectives=max_collectives)
            except MCCLError as exc:
                raise MCCLError(f"controller state {str(path)!r}: {exc}; fix it or delete the file (and "
                                f"{versions_dir(path).name}/) to start fresh") from None
    finally:
        if own:
            folder.close()
