"""The project's files, safely: JSON input (topologies, schedules) and output paths.

Whatever a file holds, :func:`read_json` either returns the parsed document or raises
the caller's :class:`~mccl_opt.errors.MCCLError` subclass with one message naming the
file: unreadable, not UTF-8, malformed, nested deeper than :data:`MAX_DEPTH` levels, or
holding an integer literal longer than :data:`MAX_INT_DIGITS` digits (which no count,
capacity or share needs, and which would overflow a float later).
:func:`check_output_path` refuses an output file that cannot be written before any
work starts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .errors import MCCLError

__all__ = ["read_json", "check_output_path", "MAX_DEPTH", "MAX_INT_DIGITS", "too_deep"]

#: nesting depth of a file (the deepest the project writes, an AllGather edge path, is 5)
MAX_DEPTH = 64
#: digits of an integer literal
MAX_INT_DIGITS = 30


class _LongInteger(ValueError):
    pass


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _LongInteger(f"an integer literal has {len(text)} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def too_deep(obj: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether containers nest deeper than ``limit`` (an explicit stack, no recursion)."""
    stack = [(obj, 1)]
    while stack:
        o, depth = stack.pop()
        if isinstance(o, (dict, list)):
            for v in (o.values() if isinstance(o, dict) else o):
                if isinstance(v, (dict, list)):
                    if depth >= limit:
                        return True
                    stack.append((v, depth + 1))
    return False


def read_json(path: str | Path, error: type[MCCLError], what: str) -> Any:
    """Parse the JSON file ``path``; any failure raises ``error`` naming the file
    (``what`` says what the file should be, e.g. ``"topology"``)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise error(f"cannot read {what} file {str(path)!r}: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start}); is it a {what} file?") from None
    try:
        data = json.loads(text, parse_int=_parse_int)
    except RecursionError:
        raise error(f"{path}: JSON nested deeper than {MAX_DEPTH} levels") from None
    except _LongInteger as exc:
        raise error(f"{path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise error(f"{path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if too_deep(data):
        raise error(f"{path}: JSON nested deeper than {MAX_DEPTH} levels")
    return data


def check_output_path(path: str | None, option: str) -> None:
    """Refuse an output file whose folder is missing or not writable, naming the
    command-line ``option`` that gave it (``None``: no output)."""
    if path is None:
        return
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise MCCLError(f"{option} {path!r} is a folder; give a file name")
    if not folder.is_dir():
        raise MCCLError(f"{option} {path!r}: the folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise MCCLError(f"{option} {path!r} cannot be written (permission denied)")
