"""Controller endpoints: which are loopback-only, ZeroMQ's spelling of a free port, and
the endpoint of the I-th process one ``mccl controller serve`` starts (shards, front ends)."""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback", "ephemeral", "shard_endpoint"]


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
    """zmq spells an ephemeral TCP port ``*``; accept ``:0`` too."""
    return endpoint[:-2] + ":*" if endpoint.startswith("tcp://") and endpoint.endswith(":0") else endpoint


def shard_endpoint(endpoint: str | None, index: int) -> str | None:
    """Shard ``index``'s endpoint: the TCP port plus ``index`` (a free port stays free;
    any other endpoint gets ``-shardI`` appended)."""
    if endpoint is None:
        return None
    if endpoint.startswith("tcp://"):
        host, _, port = endpoint.rpartition(":")
        return endpoint if port in ("0", "*") else f"{host}:{int(port) + index}"
    return f"{endpoint}-shard{index}"
