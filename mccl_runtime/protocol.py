"""The controller's wire protocol: versioned JSON messages, optionally HMAC-signed.

Every message is one JSON object ``{"v": 3, "type": T, "body": {...}, "sig": S, ...}``.
With a shared key the sender adds ``ts`` (its wall clock, seconds), ``nonce`` (128
random bits, exactly 32 lower-case hex digits), ``epoch`` (the controller's epoch, see
below), ``client`` (the sender's id, 32 hex digits) and ``seq`` (the sender's message
counter), and ``sig`` is the hex HMAC-SHA256 of the canonical JSON of
``{"v", "type", "body", "ts", "nonce", "epoch", "client", "seq"}`` (sorted keys, no
spaces).  A receiver holding a key rejects unsigned or wrongly signed messages, so a
stranger can neither inject telemetry nor publish schedules, and (:class:`ReplayGuard`)
messages sent more than a window away from its clock or whose nonce it has already
seen.  A request that changes the controller (:data:`MUTATING`: ``register``,
``telemetry``) must also name the controller's current *epoch* (128 random bits drawn at
every start, sent in every reply) and carry a ``seq`` above the last one accepted from
its ``client`` in that epoch (:class:`SequenceGuard`): a message captured before a
restart, or a fresh start, names another epoch and is refused whatever its time, and
one replayed within the epoch repeats a ``seq``.  :class:`Session` is the sender's side.
Without a key these fields are ``null`` and ignored (docs/runtime.md, "Threat model").

Requests: ``ping``, ``register``, ``telemetry``, ``telemetry_columns``, ``get_schedule``,
``list``, ``stats``.  ``telemetry_columns`` is the binary form of ``telemetry``
(:mod:`mccl_runtime.columns`): the multipart message ``[COLUMNS_MARK, header, column
frames...]`` (:func:`encode_frames`), whose header is an ordinary message whose
signature also covers every column frame; replay and ``seq`` rules are the same.
A ``register`` body is ``{"comm", "name", "kind"}`` plus, for a communicator over part
of the fabric, ``"gpus"``: its members' GPU ids in rank order (docs/runtime.md,
"Communicators over sub-fabrics").
Replies: ``ok``, ``schedule``, ``error`` (body ``{"reason", "message"}``).  The
publisher sends :data:`PUBLICATIONS` under the topic ``b"schedule"``: ``schedule``
(a new version) and ``hold`` (``{"comm", "name", "version", "held"}``: the version must
not be swapped in while ``held``, a list of ``[src, dst]`` links, is non-empty; an
empty list releases it; docs/runtime.md, "Swap holds on real executors").  A
``get_schedule`` reply carries the same ``held`` for the version it serves.

Limits (docs/runtime.md, "Limits and guarantees"): a request is at most
:data:`MAX_REQUEST_BYTES` (replies and publications, which carry schedules, at most
:data:`MAX_MESSAGE_BYTES`), nested at most :data:`MAX_DEPTH` deep, with integer
literals of at most :data:`MAX_INT_DIGITS` digits; a telemetry request carries at most
:data:`MAX_BATCH_SAMPLES` samples.  Error messages never quote more than a few dozen
characters of what the sender sent.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from mccl_opt.errors import InputError, MCCLError
from mccl_opt.files import (RepeatedKey, has_digit_run, has_repeated_key, nesting, parse_cost, read_bounded,
                            unique_keys)

__all__ = ["VERSION", "REQUESTS", "MUTATING", "REPLIES", "MAX_MESSAGE_BYTES", "MAX_REQUEST_BYTES",
           "MAX_BATCH_SAMPLES", "MAX_DEPTH", "MAX_INT_DIGITS", "MAX_PARSE_BYTES", "REPLAY_WINDOW_S", "MAX_CLIENTS",
           "ProtocolError", "Message", "ReplayGuard", "SequenceGuard", "Session", "new_id",
           "encode", "decode", "encode_frames", "split_frames", "load_key", "brief", "SCHEDULE_TOPIC",
           "COLUMNS_MARK", "PUBLICATIONS"]

VERSION = 3
REQUESTS = ("ping", "register", "telemetry", "telemetry_columns", "get_schedule", "list", "stats")
#: requests that change the controller: with a key they must carry its epoch and a fresh seq
MUTATING = ("register", "telemetry", "telemetry_columns")
#: the frame that starts a message with binary frames (:func:`encode_frames`)
COLUMNS_MARK = b"mccl-frames/1"
REPLIES = ("ok", "schedule", "error")
#: what the publisher sends: new versions and swap holds
PUBLICATIONS = ("schedule", "hold")
SCHEDULE_TOPIC = b"schedule"
#: largest reply or publication (a schedule of a large fabric)
MAX_MESSAGE_BYTES = 64 << 20
#: largest request; the service's socket drops the connection of a peer sending more
MAX_REQUEST_BYTES = 1 << 20
#: samples per telemetry request (the client splits larger batches): one batch costs
#: the service milliseconds, so a ping never waits long behind one
MAX_BATCH_SAMPLES = 2048
#: nesting depth of a message (the deepest legitimate one, a schedule, has 7 levels)
MAX_DEPTH = 32
#: memory a message's parse may take, as estimated before it (``mccl_opt.files.parse_cost``:
#: a legitimate message of MAX_MESSAGE_BYTES costs at most ~700 MiB, ``[{},{},...]`` 3 GiB)
MAX_PARSE_BYTES = 1 << 30
#: digits of an integer literal (larger ones cannot be a count, time or rate)
MAX_INT_DIGITS = 20
_SIG = re.compile(r"[0-9a-f]{64}")
#: a nonce, a client id and an epoch: 128 bits as 32 lower-case hex digits, nothing else
_ID = re.compile(r"[0-9a-f]{32}")
MIN_KEY_BYTES = 16
#: largest key file read
MAX_KEY_FILE_BYTES = 1 << 16
#: how far (seconds) a signed message's send time may be from the receiver's clock
REPLAY_WINDOW_S = 60.0
#: nonces a receiver remembers before it forgets the expired ones early
MAX_NONCES = 1 << 20
#: senders whose last ``seq`` a controller remembers in one epoch (one whose last message
#: left the replay window is forgotten first: its replays fail the time check)
MAX_CLIENTS = 1 << 16
#: largest ``seq`` (a signed 64-bit counter)
MAX_SEQ = (1 << 63) - 1


class ProtocolError(MCCLError):
    """A message that cannot be accepted; ``reason`` names why (an error-reply reason)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Message:
    type: str
    body: dict[str, Any]
    ts: Any = None
    epoch: Any = None
    client: Any = None
    seq: Any = None


def new_id() -> str:
    """128 random bits as 32 hex digits (a nonce, a client id or an epoch)."""
    return secrets.token_hex(16)


def is_id(value: Any) -> bool:
    """Whether ``value`` is exactly 32 lower-case hex digits."""
    return isinstance(value, str) and _ID.fullmatch(value) is not None


class Session:
    """A sender's replay-protection fields: a random ``client`` id, the ``epoch`` it last
    heard from the controller (``None`` before the first reply) and a counter ``seq``
    that grows with every message."""

    def __init__(self) -> None:
        self.client = new_id()
        self.epoch: str | None = None
        self.seq = 0

    def next(self) -> dict[str, Any]:
        """The fields of the next message."""
        self.seq += 1
        return {"epoch": self.epoch, "client": self.client, "seq": self.seq}

    def heard(self, epoch: Any) -> bool:
        """Adopt the epoch a (checked) controller reply names; True if it changed."""
        if not is_id(epoch) or epoch == self.epoch:
            return False
        self.epoch = epoch
        return True


class SequenceGuard:
    """The controller's high-water marks: in its ``epoch``, a :data:`MUTATING` request
    must name that epoch and carry a ``seq`` above the last one accepted from its
    ``client``.  Refusals: ``wrong_epoch`` (a message for an earlier start, or from a
    sender that has not heard the epoch yet: the reply names the epoch, the sender
    retries), ``replayed`` (a ``seq`` not above the client's mark), ``bad_envelope``,
    ``busy`` (:data:`MAX_CLIENTS` senders active within the replay window)."""

    def __init__(self, epoch: str | None = None, window_s: float = REPLAY_WINDOW_S,
                 max_clients: int = MAX_CLIENTS) -> None:
        self.epoch = epoch or new_id()
        self.window_s, self.max_clients = float(window_s), max_clients
        self._marks: dict[str, tuple[int, float]] = {}    # client -> (seq, send time), oldest first

    def check(self, msg: Message) -> None:
        if msg.epoch != self.epoch:
            raise ProtocolError("wrong_epoch", "this request names another controller epoch (it was "
                                               "signed for an earlier start, or before the first reply); "
                                               "the reply's 'epoch' is the current one")
        seq = msg.seq
        if not is_id(msg.client) or isinstance(seq, bool) or not isinstance(seq, int) or not 0 < seq <= MAX_SEQ:
            raise ProtocolError("bad_envelope", "a signed request needs a 32-hex-digit 'client' and an "
                                                f"integer 'seq' in [1, {MAX_SEQ}]")
        mark = self._marks.pop(msg.client, None)
        if mark is None and len(self._marks) >= self.max_clients:
            self._forget_quiet(_seconds(msg.ts))
            if len(self._marks) >= self.max_clients:
                raise ProtocolError("busy", f"{self.max_clients} senders are active; retry later")
        if mark is not None and seq <= mark[0]:
            self._marks[msg.client] = mark
            raise ProtocolError("replayed", f"seq {seq} is not above {mark[0]}, the last one accepted "
                                            "from this client (a replay, or a client id reused)")
        self._marks[msg.client] = (seq, _seconds(msg.ts))

    def _forget_quiet(self, now: float) -> None:
        """Drop the clients whose last message left the replay window: a replay of any of
        their messages is refused as ``stale`` by :class:`ReplayGuard`."""
        for client, (_, ts) in list(self._marks.items()):
            if ts >= now - self.window_s:
                break
            del self._marks[client]


class ReplayGuard:
    """A receiver's defence against replayed signed messages: a message must have been
    sent within ``window_s`` of ``clock()`` (else ``stale``) and carry a nonce not seen
    before (else ``replayed``).  Nonces are remembered only while their send time is
    inside the window; a replay of an older message fails the time check instead."""

    def __init__(self, window_s: float = REPLAY_WINDOW_S,
                 clock: Callable[[], float] = time.time) -> None:
        if not window_s > 0:
            raise InputError(f"window_s must be positive, got {window_s!r}")
        self.window_s, self.clock = float(window_s), clock
        self._seen: dict[str, float] = {}          # nonce -> send time, in arrival order

    def check(self, ts: Any, nonce: Any) -> None:
        now = self.clock()
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not _finite(ts):
            raise ProtocolError("bad_envelope", "a signed message needs a finite numeric 'ts'")
        if not is_id(nonce):
            raise ProtocolError("bad_envelope", "a signed message needs a 32-hex-digit 'nonce'")
        if abs(now - ts) > self.window_s:
            raise ProtocolError("stale", f"message sent {now - ts:+.1f} s from this clock, outside "
                                         f"the {self.window_s:g} s replay window (check the clocks)")
        self._forget(now)
        if nonce in self._seen:
            raise ProtocolError("replayed", "this message was received before (same nonce)")
        self._seen[nonce] = float(ts)

    def _forget(self, now: float) -> None:
        expired = now - self.window_s
        seen = self._seen
        while seen:
            nonce, sent = next(iter(seen.items()))
            if sent >= expired:
                break
            del seen[nonce]
        if len(seen) > MAX_NONCES:                 # out-of-order send times kept old ones
            self._seen = {n: t for n, t in seen.items() if t >= expired}


def _seconds(ts: Any) -> float:
    """A send time as a float (0 for one that is none: only a checked ``ts`` gets here)."""
    return float(ts) if isinstance(ts, (int, float)) and _finite(ts) else 0.0


def _finite(x: int | float) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:                       # an int beyond float range
        return False


def brief(value: Any, limit: int = 40) -> str:
    """``repr(value)`` cut to ``limit`` characters: error replies never echo a
    sender's input back at length."""
    text = repr(value) if not isinstance(value, (str, bytes)) or len(value) <= limit else repr(value[:limit])
    return text if len(text) <= limit + 2 else text[:limit] + "..."


def _parse_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise ProtocolError("malformed_json", f"an integer literal has {len(text)} digits; "
                                              f"at most {MAX_INT_DIGITS} are accepted")
    return int(text)


_SIGNED = ("ts", "nonce", "epoch", "client", "seq")
#: parsers of a message's text: any, one with a long run of digits, one with a key twice
_DECODE = json.JSONDecoder().decode
_DECODE_LONG = json.JSONDecoder(parse_int=_parse_int).decode
_DECODE_UNIQUE = json.JSONDecoder(parse_int=_parse_int, object_pairs_hook=unique_keys).decode


def _sign(key: bytes, v: Any, type_: str, body: Any, fields: Mapping[str, Any],
          frames: tuple[bytes, ...] = ()) -> str:
    """HMAC-SHA256 of the canonical JSON, then of every binary frame with its length
    (8 bytes, little-endian) before it, so a frame cannot be cut, moved or swapped."""
    canonical = json.dumps({"v": v, "type": type_, "body": body, **{f: fields.get(f) for f in _SIGNED}},
                           sort_keys=True, separators=(",", ":")).encode()
    mac = hmac.new(key, canonical, hashlib.sha256)
    for frame in frames:
        mac.update(len(frame).to_bytes(8, "little"))
        mac.update(frame)
    return mac.hexdigest()


def encode(type_: str, body: Mapping[str, Any] | None = None, key: bytes | None = None, *,
           epoch: str | None = None, client: str | None = None, seq: int | None = None,
           frames: tuple[bytes, ...] = ()) -> bytes:
    """Serialise (and, given ``key``, time-stamp and sign) one message; ``epoch``,
    ``client`` and ``seq`` are the replay fields (:class:`Session`, or a controller's
    epoch on its replies), sent only with a key.  ``frames``: the binary frames sent
    after this header (:func:`encode_frames`), covered by the signature."""
    body = dict(body or {})
    fields: dict[str, Any] = dict.fromkeys(_SIGNED)
    sig = None
    if key:
        fields.update(ts=time.time(), nonce=new_id(), epoch=epoch, client=client, seq=seq)
        sig = _sign(key, VERSION, type_, body, fields, frames)
    return json.dumps({"v": VERSION, "type": type_, "body": body, **fields, "sig": sig},
                      separators=(",", ":")).encode()


def decode(raw: bytes, key: bytes | None = None, types: tuple[str, ...] | None = None,
           guard: ReplayGuard | None = None, max_bytes: int = MAX_MESSAGE_BYTES,
           frames: tuple[bytes, ...] = ()) -> Message:
    """Parse and check one message (``frames``: the binary frames that followed its
    header, which the signature covers); raises :class:`ProtocolError` with a reason:
    ``too_large`` (also a reply too costly to parse: :func:`mccl_opt.files.parse_cost`),
    ``malformed_json`` (also not UTF-8, too deep, an over-long integer or
    a key twice in one object),
    ``bad_envelope``, ``unsupported_version``, ``unknown_type``, ``unsigned``,
    ``bad_signature``, and with a ``guard``, ``stale`` or ``replayed``.  Nothing else
    escapes, whatever the bytes."""
    if len(raw) > max_bytes:
        raise ProtocolError("too_large", f"message of {len(raw)} bytes exceeds {max_bytes}")
    if len(raw) > MAX_REQUEST_BYTES and parse_cost(raw) > MAX_PARSE_BYTES:     # a reply: up to 64 MiB
        raise ProtocolError("too_large", f"message of {len(raw)} bytes would take more than "
                                         f"{MAX_PARSE_BYTES >> 20} MiB to parse (mccl_opt.files.parse_cost)")
    try:
        # each integer literal is checked only if the message has a run of digits that long
        text = raw.decode("utf-8")          # only UTF-8 (json.loads would take UTF-16 and -32 too)
        data = (_DECODE_LONG if has_digit_run(raw, MAX_INT_DIGITS) else _DECODE)(text)
        if not isinstance(data, dict) or not {"v", "type", "body"} <= set(data) or not isinstance(data["body"], dict):
            raise ProtocolError("bad_envelope", 'a message must be {"v": 3, "type": ..., "body": {...}, "sig": ...}')
        deep, keys = nesting(data, MAX_DEPTH)
        if has_repeated_key(raw, data, keys):      # parse again to tell
            _DECODE_UNIQUE(text)
    except RecursionError:
        raise ProtocolError("malformed_json", f"message nests deeper than {MAX_DEPTH} levels") from None
    except RepeatedKey as exc:
        raise ProtocolError("malformed_json", f"message is not accepted JSON: {exc}") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError("malformed_json", f"message is not JSON: {brief(str(exc), 80)}") from None
    if deep:
        raise ProtocolError("malformed_json", f"message nests deeper than {MAX_DEPTH} levels")
    if type(data["v"]) is not int or data["v"] != VERSION:         # not 3.0, not true
        raise ProtocolError("unsupported_version", f"protocol version {brief(data['v'])} is not supported "
                                                   f"(this is {VERSION})")
    type_ = data["type"]
    if not isinstance(type_, str) or (types is not None and type_ not in types):
        raise ProtocolError("unknown_type", f"message type {brief(type_)} is not one of {types}")
    if not key:
        return Message(type_, data["body"])
    sig = data.get("sig")
    if not isinstance(sig, str):
        raise ProtocolError("unsigned", "this controller requires signed messages; pass the shared key file")
    if not _SIG.fullmatch(sig) or not hmac.compare_digest(sig, _sign(key, VERSION, type_, data["body"], data, frames)):
        raise ProtocolError("bad_signature", "message signature does not match the shared key")
    if guard is not None:
        guard.check(data.get("ts"), data.get("nonce"))
    return Message(type_, data["body"], data.get("ts"), data.get("epoch"), data.get("client"), data.get("seq"))


def encode_frames(type_: str, body: Mapping[str, Any], frames: tuple[bytes, ...], key: bytes | None = None,
                  **fields: Any) -> list[bytes]:
    """A message with binary frames: ``[COLUMNS_MARK, header, *frames]``, the header an
    :func:`encode` message whose signature covers the frames."""
    return [COLUMNS_MARK, encode(type_, body, key, frames=frames, **fields), *frames]


def split_frames(frames: list[bytes]) -> tuple[list[bytes], bytes, tuple[bytes, ...]]:
    """A received multipart request as ``(envelope, header, binary frames)``: the binary
    frames follow :data:`COLUMNS_MARK` and the header (none for a JSON request, whose
    header is the last frame).  The routing identity (``frames[0]``) is never a mark."""
    try:
        i = frames.index(COLUMNS_MARK, 1)
    except ValueError:
        return frames[:-1], frames[-1], ()
    if i + 1 >= len(frames):
        raise ProtocolError("bad_envelope", "a binary message needs a header frame after the mark")
    return frames[:i], frames[i + 1], tuple(frames[i + 2:])


def load_key(path: str | Path) -> bytes:
    """Read a shared key file (at least 16 bytes after stripping whitespace) that only
    its owner can read (a key readable by group or others is refused), the owner being
    this user (another user, even one whose file root may read, could rewrite the key
    and then forge any message).  The file is opened once and checked on the open file
    (``fstat``: a regular file, owner, mode, size), then read from it, so a file swapped
    in between the check and the read cannot be taken.  A symlink is followed on purpose
    (a mounted secret is often one): what is checked is the file it names."""
    def private(info: os.stat_result) -> None:
        if os.name == "posix" and info.st_uid != os.geteuid():
            raise MCCLError(f"key file {str(path)!r} belongs to user id {info.st_uid}, not this user "
                            f"({os.geteuid()}); use a key file of your own (`chmod 600`)")
        if os.name == "posix" and info.st_mode & 0o077:
            raise MCCLError(f"key file {str(path)!r} is readable by group or others (mode "
                            f"{info.st_mode & 0o777:o}); run `chmod 600 {path}`")

    key = read_bounded(path, MCCLError, "key", MAX_KEY_FILE_BYTES, check=private).strip()
    if len(key) < MIN_KEY_BYTES:
        raise MCCLError(f"key file {str(path)!r} holds {len(key)} bytes; use at least {MIN_KEY_BYTES} "
                        "(e.g. `head -c 32 /dev/urandom | base64 > key`)")
    return key
