"""The controller's wire protocol: versioned JSON messages, optionally HMAC-signed.

Every message is one JSON object ``{"v": 1, "type": T, "body": {...}, "sig": S}``.
With a shared key, ``sig`` is the hex HMAC-SHA256 of the canonical JSON of
``{"v", "type", "body"}`` (sorted keys, no spaces); a receiver holding a key rejects
unsigned or wrongly signed messages, so a stranger can neither inject telemetry nor
publish schedules.  Without a key ``sig`` is ``null`` and ignored.  Signing does not
stop a replay of a captured message (documented in docs/runtime.md).

Requests: ``ping``, ``register``, ``telemetry``, ``get_schedule``, ``list``, ``stats``.
Replies: ``ok``, ``schedule``, ``error`` (body ``{"reason", "message"}``).  The
publisher sends ``schedule`` messages under the topic ``b"schedule"``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from mccl_opt.errors import MCCLError

__all__ = ["VERSION", "REQUESTS", "REPLIES", "MAX_MESSAGE_BYTES", "ProtocolError", "Message",
           "encode", "decode", "load_key", "SCHEDULE_TOPIC"]

VERSION = 1
REQUESTS = ("ping", "register", "telemetry", "get_schedule", "list", "stats")
REPLIES = ("ok", "schedule", "error")
SCHEDULE_TOPIC = b"schedule"
MAX_MESSAGE_BYTES = 64 << 20
MIN_KEY_BYTES = 16


class ProtocolError(MCCLError):
    """A message that cannot be accepted; ``reason`` names why (an error-reply reason)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Message:
    type: str
    body: dict[str, Any]


def _canonical(v: int, type_: str, body: Any) -> bytes:
    return json.dumps({"v": v, "type": type_, "body": body}, sort_keys=True,
                      separators=(",", ":")).encode()


def _sign(key: bytes, v: int, type_: str, body: Any) -> str:
    return hmac.new(key, _canonical(v, type_, body), hashlib.sha256).hexdigest()


def encode(type_: str, body: Mapping[str, Any] | None = None, key: bytes | None = None) -> bytes:
    """Serialise (and sign, given ``key``) one message."""
    body = dict(body or {})
    sig = _sign(key, VERSION, type_, body) if key else None
    return json.dumps({"v": VERSION, "type": type_, "body": body, "sig": sig},
                      separators=(",", ":")).encode()


def decode(raw: bytes, key: bytes | None = None, types: tuple[str, ...] | None = None) -> Message:
    """Parse and check one message; raises :class:`ProtocolError` with a reason:
    ``too_large``, ``malformed_json``, ``bad_envelope``, ``unsupported_version``,
    ``unknown_type``, ``unsigned`` or ``bad_signature``."""
    if len(raw) > MAX_MESSAGE_BYTES:
        raise ProtocolError("too_large", f"message of {len(raw)} bytes exceeds {MAX_MESSAGE_BYTES}")
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError("malformed_json", f"message is not JSON: {exc}") from None
    if not isinstance(data, dict) or not {"v", "type", "body"} <= set(data) or not isinstance(data["body"], dict):
        raise ProtocolError("bad_envelope", 'a message must be {"v": 1, "type": ..., "body": {...}, "sig": ...}')
    if data["v"] != VERSION:
        raise ProtocolError("unsupported_version", f"protocol version {data['v']!r} is not supported (this is {VERSION})")
    type_ = data["type"]
    if not isinstance(type_, str) or (types is not None and type_ not in types):
        raise ProtocolError("unknown_type", f"message type {type_!r} is not one of {types}")
    if key:
        sig = data.get("sig")
        if not isinstance(sig, str):
            raise ProtocolError("unsigned", "this controller requires signed messages; pass the shared key file")
        if not hmac.compare_digest(sig, _sign(key, VERSION, type_, data["body"])):
            raise ProtocolError("bad_signature", "message signature does not match the shared key")
    return Message(type_, data["body"])


def load_key(path: str | Path) -> bytes:
    """Read a shared key file (at least 16 bytes after stripping whitespace)."""
    try:
        key = Path(path).read_bytes().strip()
    except OSError as exc:
        raise MCCLError(f"cannot read key file {str(path)!r}: {exc.strerror}") from None
    if len(key) < MIN_KEY_BYTES:
        raise MCCLError(f"key file {str(path)!r} holds {len(key)} bytes; use at least {MIN_KEY_BYTES} "
                        "(e.g. `head -c 32 /dev/urandom | base64 > key`)")
    return key
