"""What a schedule publication or ``get_schedule`` reply says about a version's swap
hold (docs/runtime.md, "Swap holds on real executors"; the executor side in
docs/executor.md, "Swap holds from the controller")."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mccl_opt.schedule import Schedule

from .protocol import ProtocolError

__all__ = ["HoldUpdate", "ScheduleStatus", "held_links", "publication_key"]


@dataclass(frozen=True)
class HoldUpdate:
    """A published swap hold (docs/runtime.md, "Swap holds on real executors"): the
    executors must not swap ``version`` in while ``links`` (``(src, dst)`` pairs) is
    non-empty; an empty ``links`` releases it."""

    comm: str
    name: str
    version: int
    links: tuple[tuple[str, str], ...]

    @property
    def held(self) -> bool:
        return bool(self.links)


@dataclass(frozen=True)
class ScheduleStatus:
    """A ``get_schedule`` reply with the served version's swap hold (``held``: the links
    that hold it; empty when it may be swapped in)."""

    version: int
    schedule: Schedule | None
    held: tuple[tuple[str, str], ...]


def held_links(held: Any) -> tuple[tuple[str, str], ...]:
    """A ``held`` field: a list of ``[src, dst]`` link names (else ``ProtocolError("bad_reply")``)."""
    if not isinstance(held, list) or not all(isinstance(x, list) and len(x) == 2 and
                                             all(isinstance(g, str) for g in x) for x in held):
        raise ProtocolError("bad_reply", "'held' must be a list of [src, dst] links")
    return tuple((a, b) for a, b in held)


def publication_key(body: dict[str, Any]) -> tuple[str, str, int]:
    """A publication's communicator, collective and version, as the controller sends
    them (non-empty strings, a non-negative integer); else ``ProtocolError("bad_reply")``
    (``"7"``, ``True`` or ``2.5`` were taken for versions)."""
    comm, name, version = body.get("comm"), body.get("name"), body.get("version")
    if not (isinstance(comm, str) and comm and isinstance(name, str) and name
            and isinstance(version, int) and not isinstance(version, bool) and version >= 0):
        raise ProtocolError("bad_reply", "a publication needs string 'comm' and 'name' and a version >= 0")
    return comm, name, version
