"""The communicator and collective specs of ``mccl controller serve`` (``--members
COMM=GPU,...``, ``--collective COMM/NAME:KIND``), parsed and checked before anything starts."""
from __future__ import annotations

from mccl_opt.errors import MCCLError

from .manager import KINDS

__all__ = ["member_specs", "collective_specs"]


def member_specs(specs: list[str]) -> dict[str, list[str]]:
    """``COMM=GPU,GPU,...`` strings as ``{comm: members}`` (the ids are checked against
    the topology when the collectives are registered)."""
    out: dict[str, list[str]] = {}
    for spec in specs:
        comm, _, gpus = spec.partition("=")
        members = [g.strip() for g in gpus.split(",") if g.strip()]
        if not comm or not members:
            raise MCCLError(f"--members must look like COMM=GPU,GPU,..., got {spec!r}")
        if comm in out:
            raise MCCLError(f"--members names communicator {comm!r} twice; give its GPUs once")
        out[comm] = members
    return out


def collective_specs(specs: list[str]) -> list[tuple[str, str, str]]:
    """``COMM/NAME:KIND`` strings as triples, checked before anything starts."""
    out = []
    for spec in specs:
        comm_name, _, kind = spec.partition(":")
        comm, _, name = comm_name.partition("/")
        if not (comm and name and kind):
            raise MCCLError(f"--collective must look like COMM/NAME:KIND, got {spec!r}")
        if kind not in KINDS:
            raise MCCLError(f"--collective {spec!r}: KIND must be one of {', '.join(KINDS)}")
        out.append((comm, name, kind))
    return out
