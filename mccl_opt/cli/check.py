"""``mccl check TOPO SCHED [--strict]``: validate a schedule against a topology.

A schedule is *valid* on a fabric when it is structurally sound there (its GPUs are the
fabric's ranks, every block is delivered, every hop is a link, trees span, shares sum
to one: :func:`mccl_opt.validate`).  The rate it reaches is recomputed on the fabric's
capacities; a schedule synthesized before a capacity change stays valid and is reported
with the rate it runs at here.  ``--strict`` also requires that rate to be the one the
file states (what :func:`mccl_opt.validate` checks), exiting 2 otherwise.  The command
is :func:`mccl_opt.check` (the same contract in the library) plus the sub-fabric option.

A communicator's schedule (the controller synthesizes one per communicator on the
sub-fabric its members induce, :func:`mccl_opt.subfabric.induced`) is checked on that
sub-fabric: ``--members GPU,GPU,...`` names its ranks in order, ``--members schedule``
takes them from the schedule's GPU list.  Without the option the schedule must list the
topology's GPUs; when its GPUs are a strict subset of them, the error says to pass it
(a schedule of a smaller fabric whose GPU names recur, e.g. HPN 1x2x4 in 1x4x4, is not
silently taken for a communicator's).
"""

from __future__ import annotations

import argparse
import re
from ..tables import print_json, print_table

def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="validate a schedule file against a topology file")
    p.add_argument("topology", help="topology: a mccl-topology/1 file, a library name (hpn-1x2x8-fail2, dgx-8) or hpn-SxHxN[-failK]")
    p.add_argument("schedule", help="the schedule file to check (mccl-schedule/1, /2 or /3, .gz too; "
                   "also MSCCL XML (TACCL's, *.xml), ForestColl tree XML (*.xml) or a TE-CCL AllGather "
                   "output with '7-Flows', read on TOPOLOGY)")
    p.add_argument("--strict", action="store_true",
                   help="also fail (exit 2) when the schedule runs at another rate than it states")
    p.add_argument("--members", metavar="GPU,GPU,...",
                   help="a communicator's ranks in order: check on the sub-fabric they induce in TOPOLOGY; "
                        "'schedule': the schedule's own GPU list")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=_check)


def gpu_mismatch(topo, sched) -> str | None:
    """Why ``sched``'s GPUs are not ``topo``'s ranks (count first, then the first rank
    that differs), or ``None``."""
    mine, theirs = list(sched.gpus), list(topo.gpus)
    if len(mine) != len(theirs):
        return (f"schedule has {len(mine)} GPUs, topology {topo.name!r} has {len(theirs)}; "
                f"was it synthesized for another topology?")
    for rank, (a, b) in enumerate(zip(mine, theirs)):
        if a != b:
            return (f"schedule rank {rank} is GPU {a!r}, topology {topo.name!r} rank {rank} is {b!r}; "
                    f"was it synthesized for another topology?")
    return None


def _fabric(topo, sched, members: str | None):
    """The fabric to check ``sched`` on: ``topo``, or the sub-fabric the ``--members``
    induce (module docstring); and a line saying which (``None`` for ``topo``)."""
    from ..errors import ScheduleError, TopologyError
    from ..subfabric import induced

    if members is None:
        problem = gpu_mismatch(topo, sched)
        if problem and _subset(topo, sched):
            raise ScheduleError(f"{problem} Its {len(sched.gpus)} GPUs are all GPUs of {topo.name!r}: for a "
                                f"communicator's schedule, pass --members schedule (or its ranks, GPU,GPU,...)")
        return topo, None
    if members == "schedule":
        if not _subset(topo, sched):
            raise TopologyError(f"--members schedule: the schedule's GPUs are not a strict subset of "
                                f"{topo.name!r}'s; check it on its own topology")
        gpus, how = list(sched.gpus), "members from the schedule"
    else:
        gpus, how = [g.strip() for g in members.split(",")], "--members"
        if not all(gpus):
            raise TopologyError(f"--members {members!r} has an empty entry; list GPU ids separated by commas")
    sub = induced(topo, gpus)
    return sub.topology, f"the sub-fabric its {len(sub.gpus)} members induce in {topo.name} ({how})"


def load_any_schedule(path: str, topo):
    """An MCCL schedule file, or a peer's schedule read on ``topo`` (docs/interop.md): a
    file ending in ``.xml`` is MSCCL XML (``<algo>``: TACCL, MSCCLang, ``mccl export
    msccl``) or ForestColl tree XML; a TE-CCL output (JSON: AllToAll with volumes in its
    ``Chunk paths``, else AllGather ``7-Flows``) is tried when the file is no MCCL schedule."""
    from ..errors import ScheduleError
    from ..files import read_bounded, read_json
    from ..schedule import Schedule

    if path.endswith(".xml"):
        from ..interop.forestcoll import from_forestcoll_xml
        from ..interop.msccl_xml import from_msccl_xml

        raw = read_bounded(path, ScheduleError, "algorithm XML")
        msccl = re.match(rb"\s*(<\?xml[^>]*>\s*)?<algo\b", raw[:4096]) is not None
        return from_msccl_xml(raw, topo) if msccl else from_forestcoll_xml(raw, topo)
    try:
        return Schedule.load(path)
    except ScheduleError:
        data = read_json(path, ScheduleError, "schedule")
        from ..interop.teccl_alltoall import is_teccl_alltoall

        alltoall = is_teccl_alltoall(data)
        if not (isinstance(data, dict) and (alltoall or "7-Flows" in data) and "format" not in data):
            raise
    if alltoall:
        from ..interop.teccl_alltoall import from_teccl_alltoall

        return from_teccl_alltoall(data, topo)
    from ..interop.teccl_flows import from_teccl_flows

    return from_teccl_flows(data, topo)


def _subset(topo, sched) -> bool:
    """``sched``'s GPUs are fewer than ``topo``'s and all GPUs of it."""
    return len(sched.gpus) < topo.num_gpus and all(topo.has_node(g) and topo.is_gpu(g) for g in sched.gpus)


def _check(args: argparse.Namespace) -> int:
    from ..check_result import check
    from ..errors import ScheduleError
    from ._inputs import load_topology

    topo = load_topology(args.topology)
    sched = load_any_schedule(args.schedule, topo)
    topo, sub_fabric = _fabric(topo, sched, args.members)
    problem = gpu_mismatch(topo, sched)
    if problem:
        raise ScheduleError(problem)
    result = check(topo, sched, strict=args.strict)      # the library's contract, mccl_opt.check
    if not result.valid:
        shown = "\n  ".join(result.problems[:10])
        raise ScheduleError(f"schedule is invalid for topology {topo.name!r}:\n  {shown}")
    info = {"valid": True, "collective": sched.collective, "fabric": topo.name,
            "members": None if sub_fabric is None else topo.num_gpus, "chunks": result.chunks,
            "rate_gbps": result.rate_gbps, "schedule_rate_gbps": sched.rate_gbps,
            "rate_as_stated": result.rate_as_stated, "lp_rate_gbps": sched.lp_rate_gbps,
            "rounding_gap": sched.rounding_gap, "max_steps": result.max_steps,
            "max_link_utilisation": result.max_link_utilisation}
    if args.json:
        print_json(info)
        return 0
    if sub_fabric is not None:
        print(f"checking {args.schedule} on {sub_fabric}")
    if result.rate_as_stated:
        print(f"OK: {args.schedule} is a valid {sched.collective} schedule for {topo.name}")
    else:
        print(f"OK: {args.schedule} is a valid {sched.collective} schedule for {topo.name}; "
              f"runs at {result.rate_gbps:.4g} Gbps on this fabric (schedule says {sched.rate_gbps:.4g}; "
              f"re-synthesize for this fabric, or pass --strict to make this an error)")
    keys = [k for k in info if k not in ("valid", "fabric", "members")]
    print_table(keys, [[info[k] for k in keys]])
    return 0
