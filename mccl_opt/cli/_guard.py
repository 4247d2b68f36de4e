"""Checks the commands run on their arguments and input files before any work starts,
so a bad path or schedule fails at once with one ``error:`` line instead of after a
long run or silently."""

from __future__ import annotations

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


def named_fabric(sched):
    """The library or generated fabric ``sched`` names in its ``topology`` field
    (``hpn-1x2x8``, ``dgx-8``; never a file), if it resolves and has the schedule's GPUs
    in order; otherwise ``None``."""
    from pathlib import Path

    from instances.names import resolve_topology

    from ..errors import MCCLError

    name = sched.topology
    if not name or name.endswith((".json", ".gz")) or Path(name).exists():
        return None
    try:
        topo = resolve_topology(name)
    except MCCLError:
        return None
    return topo if tuple(topo.gpus) == tuple(sched.gpus) else None


def check_self_consistent(sched) -> None:
    """Validate a schedule given without its topology.  If it names a library or
    generated fabric with its GPUs (:func:`named_fabric`), on that fabric: a hop that is
    no link of it is refused.  Otherwise on the fabric its own hops describe (its
    ``gpus`` are the GPUs, every other node a switch, every hop a link): chunks naming
    GPUs missing from ``gpus``, undelivered blocks, broken trees and bad shares are
    refused."""
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
