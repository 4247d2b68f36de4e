"""What a server checks of every request before acting on it: one code path for the
controller (:mod:`mccl_runtime.service`) and a telemetry front end (:mod:`mccl_runtime.frontend_service`).

A request's frames are split (JSON header, binary columns), its header decoded and, with a
key, its signature (covering every column frame), send time and nonce checked
(:class:`~mccl_runtime.protocol.ReplayGuard`); a request that changes the server must name
its epoch and a fresh ``seq`` (:class:`~mccl_runtime.protocol.SequenceGuard`; the server's
epoch is drawn at every start and sent in every reply); a read-only request may name no
epoch (a client's first ``ping``), but one naming an earlier start's is refused too.
:meth:`RequestGate.answer` turns anything a request raises into an ``error`` reply and
counts it: a message never stops a server (docs/runtime.md, "Threat model", "Limits and
guarantees").
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Callable

from mccl_opt.errors import MCCLError

from .protocol import (MAX_BATCH_SAMPLES, MAX_REQUEST_BYTES, MUTATING, REPLAY_WINDOW_S, REQUESTS, Message, ProtocolError,
                       ReplayGuard, SequenceGuard, decode, encode, split_frames)

__all__ = ["RequestGate", "MAX_ERROR_CHARS", "telemetry_samples"]

#: characters of an error reply's message
MAX_ERROR_CHARS = 300

Dispatch = Callable[[Message, tuple[bytes, ...]], tuple[str, dict[str, Any]]]


class RequestGate:
    """A server's request checks and counters (module docstring): ``epoch`` (``None``
    without a key), ``protocol_errors`` per reason and ``requests`` per type."""

    def __init__(self, key: bytes | None, replay_window_s: float = REPLAY_WINDOW_S,
                 max_request_bytes: int = MAX_REQUEST_BYTES, log: logging.Logger | None = None) -> None:
        self.key, self.max_request_bytes = key, max_request_bytes
        self.replay = ReplayGuard(replay_window_s) if key else None
        # a new epoch at every start: requests signed for an earlier one are refused
        self.sequence = SequenceGuard(window_s=replay_window_s) if key else None
        self.epoch = self.sequence.epoch if self.sequence else None
        self.protocol_errors: Counter[str] = Counter()
        self.requests: Counter[str] = Counter()
        self.log = log or logging.getLogger("mccl")

    def check(self, frames: list[bytes]) -> tuple[list[bytes], Message, tuple[bytes, ...]]:
        """``(envelope, message, column frames)`` of a request that passes every check;
        raises :class:`~mccl_runtime.protocol.ProtocolError` naming the first that fails."""
        envelope, payload, columns = split_frames(frames)
        msg = decode(payload, self.key, REQUESTS, self.replay, max_bytes=self.max_request_bytes, frames=columns)
        if (msg.type == "telemetry_columns") != bool(columns):
            raise ProtocolError("bad_body", "binary column frames come only with a 'telemetry_columns' "
                                            "header, and it needs them (mccl_runtime.columns)")
        if self.sequence is not None:
            if msg.type in MUTATING:
                self.sequence.check(msg)
            elif msg.epoch is not None and msg.epoch != self.epoch:      # every message, read-only too
                raise ProtocolError("wrong_epoch", "this request names another epoch of this server (it "
                                                   "was signed for an earlier start); the reply's 'epoch' "
                                                   "is the current one")
        return envelope, msg, columns

    def answer(self, frames: list[bytes], dispatch: Dispatch) -> list[bytes] | None:
        """The reply frames to one request (``dispatch`` acts on a checked one); never
        raises: a refusal or a failure is an ``error`` reply, counted (and logged if it is
        a bug).  ``None`` for frames with no envelope to answer to."""
        if len(frames) < 2:
            self.protocol_errors["bad_frames"] += 1
            return None
        envelope, payload = frames[:-1], frames[-1]           # until check has read them
        try:
            envelope, msg, columns = self.check(frames)
            self.requests[msg.type] += 1
            return envelope + [self.encode(*dispatch(msg, columns))]
        except ProtocolError as exc:
            self.protocol_errors[exc.reason] += 1
            body = {"reason": exc.reason, "message": str(exc)[:MAX_ERROR_CHARS]}
        except MCCLError as exc:
            self.protocol_errors["rejected"] += 1
            body = {"reason": "rejected", "message": str(exc)[:MAX_ERROR_CHARS]}
        except Exception as exc:                   # a bug: answer, count, log, keep serving
            self.protocol_errors["internal"] += 1
            self.log.exception("a %d-byte request raised %s", len(payload), type(exc).__name__)
            body = {"reason": "internal", "message": f"the server failed on this request "
                                                     f"({type(exc).__name__}); it is logged"}
        return envelope + [self.encode("error", body)]

    def encode(self, type_: str, body: dict[str, Any]) -> bytes:
        """A reply, signed with this start's epoch (a client learns the epoch from it)."""
        return encode(type_, body, self.key, epoch=self.epoch)


def telemetry_samples(body: dict[str, Any]) -> list[Any]:
    """The ``samples`` list of a ``telemetry`` request body, at most
    ``MAX_BATCH_SAMPLES`` of them; :class:`ProtocolError` otherwise (both services)."""
    samples = body.get("samples")
    if not isinstance(samples, list):
        raise ProtocolError("bad_body", "telemetry body needs 'samples': a list of samples")
    if len(samples) > MAX_BATCH_SAMPLES:
        raise ProtocolError("too_large", f"{len(samples)} samples in one request; at most "
                                         f"{MAX_BATCH_SAMPLES} (split the batch)")
    return samples
