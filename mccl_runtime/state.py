"""Atomic persistence of the controller state (JSON file, written by rename)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from mccl_opt.errors import MCCLError

__all__ = ["STATE_FORMAT", "save_state", "load_state"]

STATE_FORMAT = "mccl-controller-state/1"


def save_state(path: str | Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically: a temporary file in the same directory,
    flushed to disk, then renamed over the old file (readers see old or new, never half)."""
    path = Path(path)
    data = json.dumps({"format": STATE_FORMAT, **state}, separators=(",", ":")).encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
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


def load_state(path: str | Path) -> dict[str, Any] | None:
    """The saved state, or ``None`` if ``path`` does not exist."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise MCCLError(f"cannot read controller state {str(path)!r} ({exc}); delete it to start fresh") from None
    if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
        raise MCCLError(f"{path} is not a {STATE_FORMAT} file; delete it or pass another --state")
    return data
