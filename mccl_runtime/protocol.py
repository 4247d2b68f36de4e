"""The controller's wire protocol: versioned JSON messages, optionally HMAC-signed.

Every message is one JSON object ``{"v": 2, "type": T, "body": {...}, "sig": S}``.
With a shared key the sender adds ``ts`` (its wall clock, seconds) and ``nonce`` (128
random bits, hex), and ``sig`` is the hex HMAC-SHA256 of the canonical JSON of
``{"v", "type", "body", "ts", "nonce"}`` (sorted keys, no spaces).  A receiver holding a
key rejects unsigned or wrongly signed messages, so a stranger can neither inject
telemetry nor publish schedules, and (:class:`ReplayGuard`) messages sent more than a
window away from its clock or whose nonce it has already seen, so a captured message
cannot be replayed.  Without a key ``sig``, ``ts`` and ``nonce`` are ``null`` and
ignored.

Requests: ``ping``, ``register``, ``telemetry``, ``get_schedule``, ``list``, ``stats``.
A ``register`` body is ``{"comm", "name", "kind"}`` plus, for a communicator over part
of the fabric, ``"gpus"``: its members' GPU ids in rank order (docs/runtime.md,
"Communicators over sub-fabrics").
Replies: ``ok``, ``schedule``, ``error`` (body ``{"reason", "message"}``).  The
publisher sends ``schedule`` messages under the topic ``b"schedule"``.

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
from mccl_opt.files import has_digit_run, too_deep

__all__ = ["VERSION", "REQUESTS", "REPLIES", "MAX_MESSAGE_BYTES", "MAX_REQUEST_BYTES",
           "MAX_BATCH_SAMPLES", "MAX_DEPTH", "MAX_INT_DIGITS", "REPLAY_WINDOW_S",
           "ProtocolError", "Message", "ReplayGuard", "encode", "decode", "load_key",
           "brief", "SCHEDULE_TOPIC"]

VERSION = 2
REQUESTS = ("ping", "register", "telemetry", "get_schedule", "list", "stats")
REPLIES = ("ok", "schedule", "error")
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
#: digits of an integer literal (larger ones cannot be a count, time or rate)
MAX_INT_DIGITS = 20
_SIG = re.compile(r"[0-9a-f]{64}")
MIN_KEY_BYTES = 16
#: how far (seconds) a signed message's send time may be from the receiver's clock
REPLAY_WINDOW_S = 60.0
#: nonces a receiver remembers before it forgets the expired ones early
MAX_NONCES = 1 << 20


class ProtocolError(MCCLError):
    """A message that cannot be accepted; ``reason`` names why (an error-reply reason)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Message:
    type: str
    body: dict[str, Any]


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
        if not isinstance(nonce, str) or len(nonce) != 32:
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


def _canonical(v: int, type_: str, body: Any, ts: Any, nonce: Any) -> bytes:
    return json.dumps({"v": v, "type": type_, "body": body, "ts": ts, "nonce": nonce},
                      sort_keys=True, separators=(",", ":")).encode()


def _sign(key: bytes, v: int, type_: str, body: Any, ts: Any, nonce: Any) -> str:
    return hmac.new(key, _canonical(v, type_, body, ts, nonce), hashlib.sha256).hexdigest()


def encode(type_: str, body: Mapping[str, Any] | None = None, key: bytes | None = None) -> bytes:
    """Serialise (and, given ``key``, time-stamp and sign) one message."""
    body = dict(body or {})
    ts = nonce = sig = None
    if key:
        ts, nonce = time.time(), secrets.token_hex(16)
        sig = _sign(key, VERSION, type_, body, ts, nonce)
    return json.dumps({"v": VERSION, "type": type_, "body": body, "ts": ts, "nonce": nonce,
                       "sig": sig}, separators=(",", ":")).encode()


def decode(raw: bytes, key: bytes | None = None, types: tuple[str, ...] | None = None,
           guard: ReplayGuard | None = None, max_bytes: int = MAX_MESSAGE_BYTES) -> Message:
    """Parse and check one message; raises :class:`ProtocolError` with a reason:
    ``too_large``, ``malformed_json`` (also too deep or an over-long integer),
    ``bad_envelope``, ``unsupported_version``, ``unknown_type``, ``unsigned``,
    ``bad_signature``, and with a ``guard``, ``stale`` or ``replayed``.  Nothing else
    escapes, whatever the bytes."""
    if len(raw) > max_bytes:
        raise ProtocolError("too_large", f"message of {len(raw)} bytes exceeds {max_bytes}")
    try:
        # each integer literal is checked only if the message has a run of digits that long
        data = json.loads(raw, parse_int=_parse_int) if has_digit_run(raw, MAX_INT_DIGITS) \
            else json.loads(raw)
    except RecursionError:
        raise ProtocolError("malformed_json", f"message nests deeper than {MAX_DEPTH} levels") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError("malformed_json", f"message is not JSON: {brief(str(exc), 80)}") from None
    if not isinstance(data, dict) or not {"v", "type", "body"} <= set(data) or not isinstance(data["body"], dict):
        raise ProtocolError("bad_envelope", 'a message must be {"v": 2, "type": ..., "body": {...}, "sig": ...}')
    if too_deep(data, MAX_DEPTH):
        raise ProtocolError("malformed_json", f"message nests deeper than {MAX_DEPTH} levels")
    if data["v"] != VERSION:
        raise ProtocolError("unsupported_version", f"protocol version {brief(data['v'])} is not supported "
                                                   f"(this is {VERSION})")
    type_ = data["type"]
    if not isinstance(type_, str) or (types is not None and type_ not in types):
        raise ProtocolError("unknown_type", f"message type {brief(type_)} is not one of {types}")
    if key:
        sig = data.get("sig")
        if not isinstance(sig, str):
            raise ProtocolError("unsigned", "this controller requires signed messages; pass the shared key file")
        ts, nonce = data.get("ts"), data.get("nonce")
        if not _SIG.fullmatch(sig) or not hmac.compare_digest(sig, _sign(key, VERSION, type_, data["body"], ts, nonce)):
            raise ProtocolError("bad_signature", "message signature does not match the shared key")
        if guard is not None:
            guard.check(ts, nonce)
    return Message(type_, data["body"])


def load_key(path: str | Path) -> bytes:
    """Read a shared key file (at least 16 bytes after stripping whitespace) that only
    its owner can read (a key readable by group or others is refused)."""
    try:
        mode = os.stat(path).st_mode
        key = Path(path).read_bytes().strip()
    except OSError as exc:
        raise MCCLError(f"cannot read key file {str(path)!r}: {exc.strerror}") from None
    if os.name == "posix" and mode & 0o077:
        raise MCCLError(f"key file {str(path)!r} is readable by group or others (mode {mode & 0o777:o}); "
                        f"run `chmod 600 {path}`")
    if len(key) < MIN_KEY_BYTES:
        raise MCCLError(f"key file {str(path)!r} holds {len(key)} bytes; use at least {MIN_KEY_BYTES} "
                        "(e.g. `head -c 32 /dev/urandom | base64 > key`)")
    return key
