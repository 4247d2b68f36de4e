"""Controller endpoints: which are loopback-only, ZeroMQ's spelling of a free port, a
port's range, connecting with a typed error, and the endpoint of the I-th process one
``mccl controller serve`` starts (shards, front ends)."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from mccl_opt.errors import InputError

from .protocol import ProtocolError

__all__ = ["is_loopback", "ephemeral", "shard_endpoint", "check_port", "connect", "MAX_PORT"]

MAX_PORT = 65535


def check_port(endpoint: str | None, what: str = "endpoint", offset: int = 0) -> None:
    """A TCP endpoint's port must be ``*`` or a number in [0, :data:`MAX_PORT`], and a
    non-zero one stay in range with ``offset`` added (the last shard's or front end's):
    ZeroMQ took ``:70000`` for port 4464 and ``:-1`` for 65535.  Raises
    :class:`~mccl_opt.errors.InputError` naming ``what``."""
    if endpoint is None or not endpoint.startswith("tcp://"):
        return
    port = endpoint.rpartition(":")[2]
    if port == "*":
        return
    number = int(port) if re.fullmatch(r"[0-9]{1,6}", port) else None
    if number is None or number > MAX_PORT or (number and number + offset > MAX_PORT):
        last = f" (plus {offset} for the last process)" if offset else ""
        raise InputError(f"{what} {endpoint[:80]!r}: the port must be a number in [0, {MAX_PORT}]{last}; "
                         "0 picks a free one (tcp://HOST:PORT)")


def is_loopback(endpoint: str) -> bool:
    """True for ``ipc://``/``inproc://`` endpoints and TCP on a loopback address
    (``localhost``, ``127.0.0.0/8``, ``::1``); the host is parsed as an IP address, so
    a host name that merely starts with ``127.`` is not loopback."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    if not endpoint.startswith("tcp://"):
        return False
    host = endpoint[len("tcp://"):].rpartition(":")[0]
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ephemeral(endpoint: str) -> str:
    """zmq spells an ephemeral TCP port ``*``; accept ``:0`` too (the port range-checked)."""
    check_port(endpoint)
    return endpoint[:-2] + ":*" if endpoint.startswith("tcp://") and endpoint.endswith(":0") else endpoint


def shard_endpoint(endpoint: str | None, index: int) -> str | None:
    """Shard ``index``'s endpoint: the TCP port plus ``index`` (a free port stays free;
    any other endpoint gets ``-shardI`` appended)."""
    if endpoint is None:
        return None
    if endpoint.startswith("tcp://"):
        check_port(endpoint, offset=index)
        host, _, port = endpoint.rpartition(":")
        return endpoint if port in ("0", "*") else f"{host}:{int(port) + index}"
    return f"{endpoint}-shard{index}"


def connect(sock: Any, endpoint: str, what: str) -> None:
    """Connect the ZeroMQ socket ``sock`` to ``what`` (a controller, a publisher) at
    ``endpoint``; a port out of range or an endpoint ZeroMQ refuses is a
    :class:`~mccl_runtime.protocol.ProtocolError` (``bad_endpoint``), not a ``ZMQError``."""
    import zmq

    try:
        check_port(endpoint, f"{what} endpoint")
        sock.connect(endpoint)
    except InputError as exc:
        sock.close(0)
        raise ProtocolError("bad_endpoint", str(exc)) from None
    except zmq.ZMQError as exc:
        sock.close(0)
        raise ProtocolError("bad_endpoint", f"cannot connect to the {what} at {endpoint[:80]!r}: {exc.strerror}; "
                                            "give tcp://HOST:PORT or ipc://PATH") from None
