"""Controller endpoints: which are loopback-only, and ZeroMQ's spelling of a free port."""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback", "ephemeral"]


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
