"""Checks the commands run on their arguments and input files before any work starts,
so a bad path or schedule fails at once with one ``error:`` line instead of after a
long run or silently."""

from __future__ import annotations

import re
from dataclasses import replace

from ..errors import ScheduleError
from ..files import check_output_path as output_path

__all__ = ["output_path", "structure_problem", "named_fabric", "check_self_consistent"]


def structure_problem(topo, sched) -> str | None:
    """Why ``sched`` is not a valid schedule on ``topo`` (:func:`mccl_opt.validate`:
    GPUs, every block delivered, hops real links, trees spanning, shares), or ``None``.
    The stated rate is not compared: a schedule from before a capacity change is
    structurally fine on the changed fabric."""
    from ..errors import TopologyError
    from ..schedule import schedule_rate, share_loads
    from ..validate import validate

    try:
        rate = schedule_rate(topo, share_loads(topo, sched.chunks))
    except TopologyError:
        rate = sched.rate_gbps                   # validate names the hop that is no link
    try:
        validate(topo, replace(sched, rate_gbps=rate, lp_rate_gbps=max(rate, sched.lp_rate_gbps)))
    except ScheduleError as exc:
        return str(exc)
    return None


_GROUP = re.compile(r"(.+)/group-([0-9]+)-([0-9a-f]{8})")


def _names_file(name: str) -> bool:
    """Whether a schedule's ``topology`` field names a file (as ``mccl solve`` reads it)."""
    from pathlib import Path

    try:
        return name.endswith((".json", ".gz")) or Path(name).exists()
    except (OSError, ValueError):                    # a name too long for a path, a NUL byte
        return False


def _rebuilt(name: str, members=None):
    """The fabric a schedule's ``topology`` field names: a file (read with the bounded
    readers), a library or generated fabric (with ``members``, a generated fabric only
    in the part they can use: :func:`instances.names.resolve_part`); ``None`` for a name
    that is neither (the name of a fabric read from a file, which the schedule does not
    locate).  A file that cannot be read raises :class:`ScheduleError` asking for
    ``--topology``."""
    from instances.names import resolve_part, resolve_topology

    from ..errors import MCCLError

    try:
        return resolve_topology(name) if members is None else resolve_part(name, members)
    except MCCLError as exc:
        if _names_file(name):
            raise ScheduleError(f"the schedule names the fabric file {name[:80]!r}, which cannot be read "
                                f"({str(exc)[:200]}); pass --topology with its fabric") from None
        return None
    except (OSError, ValueError):                    # a name the file system refuses (too long, NUL)
        return None


def named_fabric(sched):
    """The fabric ``sched`` names in its ``topology`` field, rebuilt: a topology file
    (``t.json``), a library or generated fabric (``hpn-1x2x8``, ``dgx-8``) or a
    communicator's sub-fabric of one (``hpn-1x2x4/group-4-1a2b3c4d``,
    :func:`mccl_opt.subfabric.induced` of the schedule's GPUs, whose name must come out
    the same), with the schedule's GPUs in order; ``None`` for a name that is none of
    these.  A file or sub-fabric named but not rebuilt (missing, unreadable, other GPUs)
    raises :class:`ScheduleError` asking for ``--topology``: checking such a schedule on
    its own paths would take a hop the named fabric lacks."""
    from instances.names import generated_gpus

    from ..errors import TopologyError
    from ..subfabric import induced

    name, ask = sched.topology, "pass --topology with the fabric to check it on"
    group = _GROUP.fullmatch(name) if name else None
    if not name:
        return None
    if group is None:
        if not _names_file(name) and generated_gpus(name) not in (None, len(sched.gpus)):
            return None                              # a generated shape of other GPUs: not built in vain
        topo = _rebuilt(name)
        if topo is not None and tuple(topo.gpus) != tuple(sched.gpus):
            if _names_file(name):
                raise ScheduleError(f"the schedule's GPUs are not those of the fabric file it names "
                                    f"({name[:80]!r}); {ask}")
            return None                              # a library name reused for other GPUs
        return topo
    parent = _rebuilt(group.group(1), sched.gpus)
    if parent is None:
        raise ScheduleError(f"the schedule names a sub-fabric of {group.group(1)[:80]!r}, a fabric that "
                            f"cannot be rebuilt (not a file, a library or a generated fabric); {ask}")
    try:
        sub = induced(parent, list(sched.gpus)).topology
    except TopologyError as exc:
        raise ScheduleError(f"the schedule's GPUs do not form the sub-fabric {name[:80]!r} it names "
                            f"({str(exc)[:200]}); {ask}") from None
    if sub.name != name:
        raise ScheduleError(f"the schedule's GPUs induce {sub.name!r}, not the sub-fabric {name[:80]!r} "
                            f"it names; {ask}")
    return sub


def check_self_consistent(sched) -> None:
    """Validate a schedule given without its topology.  If it names a fabric that can be
    rebuilt (:func:`named_fabric`: a file, a library or generated fabric, a sub-fabric of
    one), on that fabric: a hop that is no link of it is refused.  Otherwise on the
    fabric its own hops describe (its ``gpus`` are the GPUs, every other node a switch,
    every hop a link), with a warning that its hops were not checked: chunks naming
    GPUs missing from ``gpus``, undelivered blocks, broken trees and bad shares are
    refused."""
    import sys

    from ..errors import TopologyError
    from ..schedule import PathChunk
    from ..topology import Link, Node, Topology

    named = named_fabric(sched)
    if named is not None:
        problem = structure_problem(named, sched)
        if problem:
            raise ScheduleError(f"{problem}\n(checked on {named.name!r}, the fabric the schedule names; pass "
                                "--topology to check it on another)")
        return
    gpus = list(sched.gpus)
    gpu_set = set(gpus)
    hops: dict[tuple[str, str], None] = {}
    for c in sched.chunks:
        for path in ((c.path,) if isinstance(c, PathChunk) else c.edges):
            hops.update(dict.fromkeys(zip(path[:-1], path[1:])))
    others = sorted({v for hop in hops for v in hop} - gpu_set)
    try:
        fabric = Topology("<the schedule's own paths>", [Node(g, "gpu") for g in gpus]
                          + [Node(v, "switch") for v in others],
                          [Link(a, b, 1.0, 0.0) for a, b in hops])
    except TopologyError as exc:
        raise ScheduleError(f"the schedule's own paths do not form a fabric its GPUs share: {exc}") from None
    problem = structure_problem(fabric, sched)
    if problem:
        raise ScheduleError(problem)
    print(f"warning: the schedule's fabric {sched.topology[:80]!r} was not rebuilt (no file, library or "
          "generated fabric with its GPUs, nor a sub-fabric of one): checked on its own paths only, where "
          "a hop that is no link of the real fabric passes; pass --topology to check it there", file=sys.stderr)
