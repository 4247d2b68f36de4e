"""The project's files, safely: JSON input (topologies, schedules) and output paths.

Every input file is read by :func:`read_bounded`: a regular file of at most
:data:`MAX_FILE_BYTES` (a FIFO, ``/dev/zero`` or a folder is refused at once).
Whatever a file holds, :func:`read_json` either returns the parsed document or raises
the caller's :class:`~mccl_opt.errors.MCCLError` subclass with one message naming the
file: unreadable, larger than :data:`MAX_JSON_BYTES`, too costly to parse (its
:func:`parse_cost`, estimated from byte counts before parsing, above
:data:`MAX_PARSE_BYTES`: ``[{},{},...]`` takes 50 times its size in memory), not UTF-8,
malformed, nested deeper than :data:`MAX_DEPTH` levels, or holding an integer literal
longer than :data:`MAX_INT_DIGITS` digits (which no count, capacity or share needs, and
which would overflow a float later) or an object with a key twice.  A gzip-compressed
file (recognised by its magic bytes, whatever its name) is decompressed first as a stream,
refused as soon as it passes either limit (a gzip bomb costs no more memory than they
allow); :func:`write_json` writes compact JSON, compressed when the
file name ends in ``.gz``.
:func:`check_output_path` refuses an output file that cannot be written before any
work starts.

Longer than ~400 lines on purpose: every bound on a file the project reads or writes
(size, parse cost, depth, digits, duplicate keys, atomic writes) sits in one place, so
a reader is checked against all of them.
"""

from __future__ import annotations

import errno
import gzip
import io
import json
import os
import secrets
import stat
import zlib
from pathlib import Path
from typing import Any, Callable

from .errors import MCCLError

__all__ = ["read_json", "parse_json", "read_bounded", "refuse_shared", "MAX_FILE_BYTES", "write_json", "write_output", "check_output_path", "has_digit_run", "MAX_DEPTH",
           "MAX_INT_DIGITS", "MAX_JSON_BYTES", "MAX_PARSE_BYTES", "TOPOLOGY_PARSE_BYTES",
           "SMALL_PARSE_BYTES", "too_deep", "nesting", "unique_keys", "has_repeated_key",
           "parse_cost", "check_parse_cost", "xml_parse_cost", "check_xml", "XML_PARSE_BYTES",
           "RepeatedKey"]

#: nesting depth of a file (the deepest the project writes, an AllGather edge path, is 5)
MAX_DEPTH = 64
#: digits of an integer literal
MAX_INT_DIGITS = 30
#: size of a JSON file, plain or decompressed (a 512-GPU schedule is a few MB, a 200k-link
#: topology tens of MB); a gzip-compressed one is inflated as a stream and refused past it
MAX_JSON_BYTES = 1 << 29
#: size of any input file read (regular files only, :func:`read_bounded`); a JSON file
#: (plain or decompressed) is at most :data:`MAX_JSON_BYTES`
MAX_FILE_BYTES = 1 << 30
#: memory a JSON parse may take, as estimated before it starts (:func:`parse_cost`, 18-23
#: times the size of the project's own schedules, 2.7-2.8 times what their parse takes):
#: schedules and controller state (an AllToAll schedule of 2048 GPUs is 186 MiB, about
#: 3.3 GiB by the estimate, 1.9 GB parsed)
MAX_PARSE_BYTES = 4 << 30
#: the same for a topology (a 200k-link one is tens of MB)
TOPOLOGY_PARSE_BYTES = 1 << 30
#: the same for small hand-written files: scenarios, workload profiles
SMALL_PARSE_BYTES = 64 << 20
#: :func:`parse_cost`'s bytes per value (``,``), per quote, per object (``{``) and per list
#: (``[``), measured (``bench/bench_parse_memory.py``): a float is 24 bytes and its slot in
#: a list 8 more, a one-key object 184 bytes plus the key's pairs list and tuple while it is
#: built, a string 49 bytes and more
VALUE_COST = 40
QUOTE_COST = 40
OBJECT_COST = 288
LIST_COST = 192
#: memory an XML parse may take (MSCCL, ForestColl and NCCL topology XML), estimated before it
#: (:func:`xml_parse_cost`: 41 times the size of an exported MSCCL algorithm, 3.8 times what
#: its parse takes), as for JSON schedules: about 100 MB of MSCCL XML
XML_PARSE_BYTES = MAX_PARSE_BYTES
#: :func:`xml_parse_cost`'s bytes per ``<`` (an element: 80-140 bytes as an ``Element``)
#: and per ``=`` (an attribute: its name, value and dict slot, 290-330 bytes), measured
XML_ELEMENT_COST = 192
XML_ATTRIBUTE_COST = 360
_GZIP_MAGIC = b"\x1f\x8b"
_GZIP_WBITS = 16 + zlib.MAX_WBITS       # zlib's window bits for a gzip header and trailer
_CHUNK = 1 << 20                        # bytes in and out per inflation step
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")


def has_digit_run(raw: bytes, longer_than: int) -> bool:
    """Whether ``raw`` holds more than ``longer_than`` ASCII digits in a row (only then
    must a JSON parser check each integer literal's length).  Searched for with every
    digit made "0" (JSON numbers are ASCII): a regular expression scans a digit-dense
    50 MB schedule ten times slower."""
    return b"0" * (longer_than + 1) in raw.translate(_DIGITS_AS_ZERO)


class _LongInteger(ValueError):
    pass


class RepeatedKey(ValueError):
    """A JSON object with a key twice (:func:`unique_keys`)."""


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _LongInteger(f"an integer literal has {len(text)} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def too_deep(obj: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether containers nest deeper than ``limit`` (:func:`nesting`)."""
    return nesting(obj, limit)[0]


def nesting(obj: Any, limit: int = MAX_DEPTH) -> tuple[bool, int]:
    """``(deeper than limit, keys)``: whether containers nest deeper than ``limit``, and
    how many keys the objects hold in all (an explicit stack, no recursion; a container's
    element types are collected in one C-level pass, so the long lists of numbers of
    schedule files cost little; every container is visited once)."""
    stack = [(obj, 1)] if isinstance(obj, (dict, list)) else []
    keys = 0
    while stack:
        o, depth = stack.pop()
        if isinstance(o, dict):
            keys += len(o)
            values = o.values()
        else:
            values = o
        if any(issubclass(k, (dict, list)) for k in set(map(type, values))):
            if depth >= limit:
                return True, keys
            stack.extend((v, depth + 1) for v in values if isinstance(v, (dict, list)))
    return False, keys


def string_colons(obj: Any) -> int:
    """The ``:`` inside the keys and strings of ``obj`` (with :func:`nesting`'s key count,
    the ``:`` a JSON text of it holds unless it had a key twice or an escaped ``:``)."""
    stack, colons = [obj], 0
    while stack:
        o = stack.pop()
        if isinstance(o, dict):
            colons += "".join(o).count(":")
            o = o.values()
        if isinstance(o, str):
            colons += o.count(":")
        elif str in (types := set(map(type, o))) or dict in types or list in types:
            stack.extend(v for v in o if isinstance(v, (dict, list, str)))
    return colons


def has_repeated_key(raw: bytes | bytearray, obj: Any, keys: int) -> bool:
    """Whether the JSON text ``raw`` may hold a key twice in one object: its ``:`` are
    more than ``obj``'s ``keys`` and the ``:`` inside its strings, or it escapes a
    character as ``\\u003X`` (``\\u003a`` is a ``:`` the count cannot see, which could
    hide a repeat); then only a parse with :func:`unique_keys` tells."""
    colons = raw.count(b":")
    if b"\\u003" in raw:
        return True
    return colons != keys and colons != keys + string_colons(obj)


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are all different (an ``object_pairs_hook``; Python's
    ``json`` keeps the last of a repeated key silently: a hand-edited file, or a message,
    would mean what its reader did not see).  Raises :class:`RepeatedKey`."""
    obj = dict(pairs)
    if len(obj) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise RepeatedKey(f"the key {key[:60]!r} appears twice in one object; keep one")
            seen.add(key)
    return obj


def refuse_shared(info: os.stat_result, path: str | Path, what: str, error: type[MCCLError]) -> None:
    """Refuse a file or folder (its ``stat``) that another user owns or that group or
    others can write (POSIX): the controller trusts its state as its own, and in a shared
    folder another user could plant or swap it (docs/runtime.md, "Threat model")."""
    if os.name != "posix":
        return
    if info.st_uid != os.geteuid():
        raise error(f"{what} {str(path)!r} belongs to user id {info.st_uid}, not this user "
                    f"({os.geteuid()}); use one of your own")
    if info.st_mode & 0o022:
        raise error(f"{what} {str(path)!r} can be written by group or others (mode "
                    f"{info.st_mode & 0o777:o}); run `chmod go-w {path}`")


def read_bounded(path: str | Path, error: type[MCCLError], what: str, limit: int = MAX_FILE_BYTES,
                 private: bool = False, *, check: Callable[[os.stat_result], None] | None = None,
                 dir_fd: int | None = None) -> bytes:
    """The bytes of ``path``, which must be a regular file (after symlinks) of at most
    ``limit`` bytes: a FIFO, a device (``/dev/zero``), a socket or a folder is refused at
    once, without reading (opened non-blocking, so a FIFO cannot hang the open).
    ``private``: the file itself must be no symlink (opened with ``O_NOFOLLOW``) and the
    user's alone (:func:`refuse_shared`), checked on the open file, so the bytes read are
    those of the file checked.  ``check``: more checks of the open file's ``fstat`` (it
    raises), run before a byte is read.  ``dir_fd``: ``path``'s last component is opened
    in that open folder (the rest of ``path`` only names it in messages), so a folder
    renamed or replaced since it was opened cannot redirect the read."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | (getattr(os, "O_NOFOLLOW", 0) if private else 0)
    try:
        fd = os.open(path, flags) if dir_fd is None else os.open(Path(path).name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if private and exc.errno == errno.ELOOP:
            raise error(f"{what} file {str(path)!r} is a symlink; give the file itself "
                        "(a write would replace the link)") from None
        raise error(f"cannot read {what} file {str(path)!r}: {exc.strerror}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise error(f"{what} file {str(path)!r} is not a regular file (a FIFO, device, socket or "
                    "folder); give a file")
    with os.fdopen(fd, "rb") as f:
        if private:
            refuse_shared(info, path, f"{what} file", error)
        if check is not None:
            check(info)
        if info.st_size > limit:
            raise error(f"{what} file {str(path)!r} has {info.st_size} bytes; at most {limit} are read")
        try:
            data = _read_upto(f, info.st_size, limit + 1)
        except OSError as exc:
            raise error(f"cannot read {what} file {str(path)!r}: {exc.strerror}") from None
    if len(data) > limit:
        raise error(f"{what} file {str(path)!r} grew beyond {limit} bytes while read")
    return data


def _read_upto(f: Any, size: int, most: int) -> bytes:
    """At most ``most`` bytes of ``f``, whose size is said to be ``size``: read at once
    (asking for ``most`` would allocate it, whatever the file holds); a file longer
    than it said (growing, or a ``/proc`` file saying 0) is read on in chunks."""
    data = f.read(min(size + 1, most))
    if len(data) <= size or len(data) >= most:
        return data
    parts, got = [data], len(data)
    while got < most and (part := f.read(min(_CHUNK, most - got))):
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def parse_cost(raw: bytes | bytearray) -> int:
    """An upper estimate of the memory (bytes) that parsing the JSON text ``raw`` takes,
    from byte counts alone (C speed, nothing parsed): 4 bytes per byte of text (the bytes,
    the ``str``, the strings parsed from it: 3, and a margin), 12 unless the text is ASCII
    (one character beyond the Basic Multilingual Plane makes the ``str`` and a string 4
    bytes a character), and its share of the objects: :data:`VALUE_COST` per value (``,``), :data:`QUOTE_COST`
    per ``"`` (a string is an object), :data:`OBJECT_COST` per ``{`` and :data:`LIST_COST`
    per ``[``.  It bounds what the parse takes (the peak, text and objects together): on
    hostile shapes (``[{"k1":0},...]`` takes 27 bytes of memory per byte of text) the peak
    is 0.12-0.80 times the estimate, measured by ``bench/bench_parse_memory.py``
    (docs/runtime.md, "Hostile-input audit, fifth pass")."""
    text = (4 if raw.isascii() else 12) * len(raw)
    return (text + VALUE_COST * raw.count(b",") + QUOTE_COST * raw.count(b'"')
            + OBJECT_COST * raw.count(b"{") + LIST_COST * raw.count(b"["))


def check_parse_cost(raw: bytes | bytearray, what: str, error: type[MCCLError], most: int = MAX_PARSE_BYTES) -> None:
    """Refuse a JSON text whose :func:`parse_cost` passes ``most`` bytes."""
    cost = parse_cost(raw)
    if cost > most:
        raise error(f"{what}: {len(raw) >> 20} MiB of JSON holding {raw.count(b',')} values and "
                    f"{raw.count(b'{') + raw.count(b'[')} objects/lists would take about {cost >> 20} MiB "
                    f"to parse (at most {most >> 20} MiB for this kind of file); is it the right file?")


def xml_parse_cost(raw: bytes | str) -> int:
    """An upper estimate of the memory (bytes) ``xml.etree`` takes to parse ``raw``, from
    counts alone: 8 bytes per byte of text (the bytes, the ``str``, expat's UTF-8 buffer,
    the text pieces and the strings), 20 unless it is ASCII without character references
    (``&#128512;`` is 9 ASCII bytes that make a string 4 bytes a character), plus
    :data:`XML_ELEMENT_COST` per ``<`` and :data:`XML_ATTRIBUTE_COST` per ``=``; the peak
    is 0.25-0.82 times it on hostile shapes (``bench/bench_parse_memory.py --xml``)."""
    def n(token: str) -> int:
        return raw.count(token.encode() if isinstance(raw, (bytes, bytearray)) else token)

    text = 8 if raw.isascii() and not n("&#") else 20
    return text * len(raw) + XML_ELEMENT_COST * n("<") + XML_ATTRIBUTE_COST * n("=")


def check_xml(raw: bytes | str, what: str, error: type[MCCLError], most: int = XML_PARSE_BYTES) -> None:
    """Refuse, before expat sees it, an XML text with a document type declaration (its
    entities expand: a billion-laughs document, or an external entity naming a local
    file; no MSCCL, ForestColl or NCCL file has one) or whose :func:`xml_parse_cost`
    passes ``most`` bytes (20 MB of ``<x/>`` took 530 MB to be refused)."""
    if ("<!DOCTYPE" if isinstance(raw, str) else b"<!DOCTYPE") in raw:
        raise error(f"{what}: holds a <!DOCTYPE> declaration (entities); MSCCL, ForestColl and NCCL XML have "
                    "none: remove it")
    cost = xml_parse_cost(raw)
    if cost > most:
        raise error(f"{what}: {len(raw) >> 20} MiB of XML would take about {cost >> 20} MiB to parse "
                    f"(at most {most >> 20} MiB); is it the right file?")


def read_json(path: str | Path, error: type[MCCLError], what: str, max_cost: int = MAX_PARSE_BYTES,
              private: bool = False) -> Any:
    """Parse the JSON file ``path`` (:func:`read_bounded`, at most :data:`MAX_JSON_BYTES`,
    ``private`` as there, then :func:`parse_json`); any failure raises ``error`` naming
    the file (``what`` says what the file should be, e.g. ``"topology"``)."""
    return parse_json(read_bounded(path, error, what, MAX_JSON_BYTES, private), path, error, what, max_cost)


def parse_json(raw: bytes, path: str | Path, error: type[MCCLError], what: str,
               max_cost: int = MAX_PARSE_BYTES) -> Any:
    """Parse the bytes ``raw`` read from ``path`` (inflated if gzip; refused by
    :func:`check_parse_cost` against ``max_cost`` before it is parsed; nesting, integer
    literals and repeated keys bounded as the module docstring says)."""
    path = Path(path)
    raw = _gunzip(raw, path, error, max_cost) if raw[:2] == _GZIP_MAGIC else raw
    check_parse_cost(raw, str(path), error, max_cost)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {exc.start}); is it a {what} file?") from None
    try:
        long_digits = has_digit_run(raw, MAX_INT_DIGITS)
        data = json.loads(text, parse_int=_parse_int if long_digits else None, object_pairs_hook=unique_keys)
    except RecursionError:
        raise error(f"{path}: JSON nested deeper than {MAX_DEPTH} levels") from None
    except (_LongInteger, RepeatedKey) as exc:
        raise error(f"{path}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise error(f"{path}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if too_deep(data):
        raise error(f"{path}: JSON nested deeper than {MAX_DEPTH} levels")
    return data


def _gunzip(raw: bytes, path: Path, error: type[MCCLError], max_cost: int) -> bytearray:
    """Inflate gzip ``raw`` (one or more members) as a stream: at most :data:`_CHUNK`
    bytes out per step, refused as soon as the total passes :data:`MAX_JSON_BYTES`, so a
    gzip bomb (a few MB inflating to GBs) costs the cap in memory, never its full size."""
    out = bytearray()
    cost = 0
    inflate = zlib.decompressobj(_GZIP_WBITS)
    view = memoryview(raw)
    try:
        for start in range(0, len(raw), _CHUNK):
            data = view[start:start + _CHUNK]
            while data:
                if inflate.eof:                                   # a member ended: another or padding
                    tail = bytes(data)
                    if not tail.strip(b"\0"):
                        break
                    if tail[:2] != _GZIP_MAGIC:
                        raise error(f"{path}: damaged gzip data (not gzip after a member)")
                    inflate = zlib.decompressobj(_GZIP_WBITS)
                piece = inflate.decompress(data, _CHUNK)
                out += piece
                cost += parse_cost(piece)
                if cost > max_cost:
                    check_parse_cost(out, str(path), error, max_cost)
                if len(out) > MAX_JSON_BYTES:
                    raise error(f"{path}: decompresses to more than {MAX_JSON_BYTES >> 20} MiB "
                                "(the most a schedule or topology file may hold); is it a gzip bomb?")
                data = inflate.unused_data if inflate.eof else inflate.unconsumed_tail
    except zlib.error as exc:
        raise error(f"{path}: damaged gzip data ({exc})") from None
    if not inflate.eof:
        raise error(f"{path}: damaged gzip data (truncated)")
    return out


def write_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as compact JSON (no indentation) to ``path``, gzip-compressed when
    the name ends in ``.gz`` (:func:`write_output`)."""
    data = (json.dumps(obj, separators=(",", ":")) + "\n").encode()
    if str(path).endswith(".gz"):
        data = gzip.compress(data, compresslevel=6, mtime=0)
    write_output(path, data)


def write_output(path: str | Path, data: bytes | str) -> None:
    """Write an output file whole or not at all: a temporary file in the same folder,
    flushed to disk, then renamed over ``path`` (a symlink's target is replaced, not the
    link; the mode of a file replaced is kept).  Written in place, a full disk or a kill
    mid-write left a truncated file where the previous one was (``solve --warm S -o S``
    lost S), and two commands writing one file at once could leave a mixture of both
    (issue 27, eighth pass).  A path that exists and is no regular file (``/dev/null``)
    is written in place."""
    raw = data.encode() if isinstance(data, str) else data
    target = Path(os.path.realpath(path))
    try:
        info: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        info = None
    if info is not None and not stat.S_ISREG(info.st_mode):
        with open(target, "wb") as f:
            f.write(raw)
        return
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                 0o666 if info is None else stat.S_IMODE(info.st_mode))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        if info is not None:
            os.chmod(tmp, stat.S_IMODE(info.st_mode))       # the umask narrowed it at creation
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_figure(fig: Any, path: str | Path, dpi: int = 120) -> None:
    """Save a matplotlib figure as PNG through :func:`write_output` (``savefig`` to a
    path writes in place)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    write_output(path, buf.getvalue())


def check_output_path(path: str | None, option: str) -> None:
    """Refuse an output file whose folder is missing or not writable, or that is a FIFO,
    a socket or a block device (opening a FIFO to write blocks until a reader comes:
    the command hung after its work), naming the command-line ``option`` that gave it
    (``None``: no output).  A character device (``/dev/null``) is taken."""
    if path is None:
        return
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise MCCLError(f"{option} {path!r} is a folder; give a file name")
    try:
        mode = os.stat(p).st_mode
    except (OSError, ValueError):
        mode = 0
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISBLK(mode):
        raise MCCLError(f"{option} {path!r} is a FIFO, socket or block device, not a file (writing to a FIFO "
                        "waits for a reader); give a file name")
    if not folder.is_dir():
        raise MCCLError(f"{option} {path!r}: the folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise MCCLError(f"{option} {path!r} cannot be written (permission denied)")
