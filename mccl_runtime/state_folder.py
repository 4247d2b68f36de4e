"""The controller's state folder, held open (docs/runtime.md, "Threat model").

Checks by path (``lstat``, then ``open``) race whoever can rename the folder or the
files in it: a folder renamed or replaced between the check and the write redirects the
write.  :class:`StateFolder` opens the state's folder once (``O_DIRECTORY |
O_NOFOLLOW``), checks the open folder (``fstat``: a folder, the user's, not writable by
group or others, :func:`mccl_opt.files.refuse_shared`) and does every later operation
relative to that descriptor (``dir_fd=``): the state file, its temporaries, and the
version folder, itself opened ``O_NOFOLLOW`` in it and checked on its descriptor.  So a
rename or replacement of either folder after the check cannot redirect a read or a
write.  Before each write :meth:`StateFolder.check` also asks whether the state's path
still names the folder held: if not, the write fails (read-only mode, :mod:`.durability`),
since a restart, which finds the state by its path, would not see what was written.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import stat
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from mccl_opt.errors import MCCLError
from mccl_opt.files import refuse_shared

__all__ = ["StateFolder", "write_atomic"]

_DIR_FLAGS = (os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
              | getattr(os, "O_CLOEXEC", 0))
_NEW_FILE = (os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
             | getattr(os, "O_CLOEXEC", 0))


def _open_dir(name: str | Path, shown: Path, what: str, dir_fd: int | None = None) -> int:
    """``name`` opened as a folder, never through a symlink, and checked on the open
    descriptor (the user's, not writable by group or others)."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        try:
            link = stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except OSError:
            link = False
        if link:
            raise MCCLError(f"{what} {str(shown)!r} is a symlink, not a regular file or folder; give the "
                            "folder itself (a write would go where the link points)") from None
        if exc.errno == errno.ENOENT:
            raise
        if exc.errno == errno.ENOTDIR:
            raise MCCLError(f"{what} {str(shown)!r} is not a folder") from None
        raise MCCLError(f"{what} {str(shown)!r} cannot be opened ({exc.strerror})") from None
    try:
        refuse_shared(os.fstat(fd), shown, what, MCCLError)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_atomic(dir_fd: int, name: str, data: bytes) -> None:
    """``data`` to ``name`` in the open folder ``dir_fd``: a new temporary file (mode
    0600, ``O_EXCL | O_NOFOLLOW``), written, flushed to disk, then renamed over ``name``."""
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, _NEW_FILE, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


class StateFolder:
    """The folder of the state file ``path``, open for the life of this object (module
    docstring).  ``fd`` is the folder's descriptor; ``name`` the state file's name in it,
    ``versions_name`` its version folder's."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.name in ("", ".", ".."):
            raise MCCLError(f"controller state {str(path)[:80]!r} names a folder, not a file; give a file in it, "
                            "e.g. DIR/state.json")
        self.folder = self.path.parent
        self.name, self.versions_name = self.path.name, self.path.name + ".d"
        what = f"controller state {str(self.path)!r}: its folder"
        try:
            self.fd = _open_dir(self.folder, self.folder, what)
        except FileNotFoundError:
            raise MCCLError(f"controller state {str(self.path)!r}: its folder {str(self.folder)!r} does not "
                            "exist (create it first)") from None
        info = os.fstat(self.fd)
        self._ident = (info.st_dev, info.st_ino)
        self._closer = weakref.finalize(self, os.close, self.fd)

    def close(self) -> None:
        """Close the folder's descriptor (also done when the object is collected)."""
        self._closer()

    def lock(self) -> None:
        """Hold an exclusive lock on ``.NAME.lock`` in the folder for the life of this
        object, or raise :class:`MCCLError` if another process holds it: two controllers
        started on one state file each acknowledged registrations that the other's next
        write replaced (issue 27, eighth pass).  A POSIX record lock (``lockf``): the kernel
        drops it when its process dies, so a restart after ``kill -9`` takes it, and it
        binds processes, not objects (a controller restarted within one process, as the
        tests do, takes it again).  A folder that cannot be written and has no lock file is
        served unlocked (nothing can write there)."""
        name = f".{self.name}.lock"
        flags = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(name, os.O_RDWR | os.O_CREAT | flags, 0o600, dir_fd=self.fd)
        except OSError as exc:
            if exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise MCCLError(f"controller state {str(self.path)!r}: cannot open its lock file {name} "
                                f"({exc.strerror})") from None
            try:
                fd = os.open(name, os.O_RDONLY | flags, dir_fd=self.fd)
            except OSError:
                return
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            raise MCCLError(f"another process serves the controller state {str(self.path)!r} (it holds {name}); "
                            "two controllers on one state file overwrite each other's writes: stop the other, "
                            "or give this one another --state") from None
        self._unlock = weakref.finalize(self, os.close, fd)

    def unlock(self) -> None:
        """Release :meth:`lock` (the controller stopped: a restart in this process takes it)."""
        if hasattr(self, "_unlock"):
            self._unlock()

    def check(self) -> None:
        """Before a write: the folder held is still the user's alone, and the state's path
        still names it (else a restart would not find the write)."""
        refuse_shared(os.fstat(self.fd), self.folder, f"controller state {str(self.path)!r}: its folder", MCCLError)
        try:
            now = os.lstat(self.folder)
            same = (now.st_dev, now.st_ino) == self._ident
        except (FileNotFoundError, NotADirectoryError):
            same = False
        if not same:
            raise MCCLError(f"the state folder {str(self.folder)!r} was moved or replaced since the controller "
                            "opened it; nothing is written elsewhere (a restart finds the state by its path): "
                            "put the folder back, or restart the controller")

    def lstat(self, name: str, dir_fd: int | None = None) -> os.stat_result | None:
        """``name``'s ``lstat`` in the folder (or in ``dir_fd``), ``None`` if it is absent."""
        try:
            return os.stat(name, dir_fd=self.fd if dir_fd is None else dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def probe(self) -> None:
        """Create and remove an empty file: a folder on a read-only file system, or one
        this user cannot write, raises ``OSError``."""
        name = f".{self.name}.{secrets.token_hex(6)}.tmp"
        os.close(os.open(name, _NEW_FILE, 0o600, dir_fd=self.fd))
        os.unlink(name, dir_fd=self.fd)

    @contextmanager
    def versions(self, create: bool = False) -> Iterator[int | None]:
        """The version folder's descriptor (opened ``O_NOFOLLOW`` in the state folder and
        checked on the open descriptor), created first if ``create``; ``None`` when it
        does not exist and ``create`` is false."""
        if create:
            try:
                os.mkdir(self.versions_name, 0o700, dir_fd=self.fd)
            except FileExistsError:
                pass
        try:
            fd = _open_dir(self.versions_name, self.folder / self.versions_name, "controller state folder",
                           dir_fd=self.fd)
        except FileNotFoundError:
            if create:
                raise
            yield None
            return
        try:
            yield fd
        finally:
            os.close(fd)
