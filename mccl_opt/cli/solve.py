"""``mccl solve alltoall|allgather TOPO -o SCHED [--warm OLD.json [--warm-topology OLD]]``.

A warm schedule read from a file carries no solver state; it is rebuilt before the timed
solve (as a controller does on resume, docs/runtime.md).  AllToAll rebuilds it from the
chunk paths on the fabric the schedule was solved for, whose capacities a change is
measured against (``--warm-topology``; default: this topology when the schedule names
it).  AllGather's state records GPUs and links but no capacities, so it is rebuilt on
this topology, where the warm schedule must be valid anyway; ``--warm-topology`` is
only checked against the schedule's GPUs there.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time

from ..tables import print_json, print_table
from ._inputs import MAX_COUNT, backend_arg, number_arg

#: above this many GPUs, say before solving that it will take a while
LARGE_GPUS = 1024


WARM_TOPOLOGY_HELP = {
    "alltoall": "the topology --warm was solved for (same forms as TOPOLOGY), where its warm state is "
                "rebuilt; default: TOPOLOGY when the schedule names it, else the fabric it names found in "
                "TOPOLOGY's degrade record (mccl topo degrade) or the library",
    "allgather": "the topology --warm was solved for (same forms as TOPOLOGY), checked against its GPUs; "
                 "the trees' warm state is rebuilt on TOPOLOGY",
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("solve", help="synthesize a schedule for a topology file")
    ssub = p.add_subparsers(dest="collective", metavar="COLLECTIVE")
    ssub.required = True
    for name, help_text in (("alltoall", "AllToAll by column generation (paper §4.2)"),
                            ("allgather", "AllGather by ForestColl tree packing (paper §4.3)")):
        s = ssub.add_parser(name, help=help_text)
        s.add_argument("topology", help="topology: a mccl-topology/1 file, a library name (hpn-1x2x8-fail2, dgx-8) or hpn-SxHxN[-failK]")
        s.add_argument("-o", "--output", help="write the schedule file here (mccl-schedule/3 for AllToAll, /2 for AllGather; gzip-compressed if it ends in .gz)")
        s.add_argument("--warm", help="previous schedule to warm-start from")
        s.add_argument("--warm-topology", metavar="OLD", help=WARM_TOPOLOGY_HELP[name])
        s.add_argument("--backend", type=backend_arg, default="highs", help="LP/MIP backend: highs (default), gurobi, scip")
        s.add_argument("--max-chunks", type=_chunks, default=10,
                       help="chunk budget K (default 10; 'none' for the exact fractional optimum)")
        if name == "alltoall":
            s.add_argument("--max-steps", type=_max_steps, default=None,
                           help="step bound m_s: a positive integer, or 'min' for the smallest lossless one")
        else:
            s.add_argument("--step-aware", action="store_true",
                           help="step-aware switch removal: shallower trees (paper App. C)")
        s.add_argument("--time-limit", type=_seconds, default=None,
                       help="seconds; returns the best valid schedule found by then")
        s.add_argument("--json", action="store_true", help="print the result summary as JSON")
        s.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                       help="phase, round, bound and gap on stderr (default: when stderr is a terminal)")
        s.set_defaults(handler=_solve)


_chunk_count = number_arg(int, 1, high=MAX_COUNT, expected=f"an integer in [1, {MAX_COUNT}] or 'none'")
_step_count = number_arg(int, 1, high=MAX_COUNT, expected=f"an integer in [1, {MAX_COUNT}] or 'min'")
_seconds = number_arg(float, 0, low_open=True, high=1e9, expected="a positive number of seconds (at most 1e9)")


def _chunks(text: str) -> int | None:
    return None if text.lower() == "none" else _chunk_count(text)


def _max_steps(text: str) -> int | str:
    return text if text == "min" else _step_count(text)


def _first_problem(message: str) -> str:
    """The first listed problem of a validator message (its header says 'invalid')."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[1] if len(lines) > 1 else lines[0]


def _warm(args: argparse.Namespace, topo):
    """The ``--warm`` schedule, or ``None``.  Another collective's schedule is refused;
    one that is not valid on this topology (:func:`._guard.structure_problem`) is
    reported on stderr and the solve runs cold (a cold solve is always correct)."""
    import mccl_opt as mo

    from ..errors import ScheduleError
    from ._guard import structure_problem

    if not args.warm:
        return None
    warm = mo.Schedule.load(args.warm)
    if warm.collective != args.collective:
        raise ScheduleError(f"--warm {args.warm} is an {warm.collective} schedule; "
                            f"`mccl solve {args.collective}` needs an {args.collective} one")
    problem = structure_problem(topo, warm)
    if problem is not None:
        print(f"warning: --warm {args.warm} is not a valid schedule for {topo.name} "
              f"({_first_problem(problem)}); solving cold", file=sys.stderr)
        return None
    return warm


def _restored(args: argparse.Namespace, topo, warm):
    """``warm`` with its warm state rebuilt (module docstring) and the seconds that took;
    a ``--warm-topology`` with other GPUs than the schedule, or an AllToAll schedule of
    another topology without one, is an error."""
    from ..errors import ScheduleError
    from ._inputs import load_topology
    from .check import gpu_mismatch

    old = topo
    if args.warm_topology:
        old = load_topology(args.warm_topology)
        problem = gpu_mismatch(old, warm)
        if problem:
            raise ScheduleError(f"--warm-topology {args.warm_topology} is not the fabric --warm {args.warm} "
                                f"was solved for: {problem}")
    elif warm.topology != topo.name and args.collective == "alltoall":
        old = _named_fabric(args, topo, warm)
    from mccl_opt import restore_warm_state

    if args.collective == "allgather":
        old = topo              # trees are restored on the new fabric, then rerouted there
    start = time.perf_counter()
    restored = restore_warm_state(warm, old)
    seconds = time.perf_counter() - start
    if restored.warm_state is None:
        print(f"warning: --warm {args.warm}: its warm state could not be rebuilt on {old.name} (its "
              f"chunks are not paths or trees of it); the warm start is slower", file=sys.stderr)
    return restored, seconds


def _named_fabric(args: argparse.Namespace, topo, warm):
    """The fabric ``warm`` names, found without ``--warm-topology``: an ancestor in
    ``topo``'s degrade record (:func:`mccl_opt.lineage.ancestor`), else a library or
    ``hpn-SxHxN[-failK]`` name; says on stderr which it used.  Neither: an error."""
    from ..errors import MCCLError, ScheduleError
    from ..lineage import ancestor
    from ._inputs import load_topology
    from .check import gpu_mismatch

    found, how = ancestor(topo, warm.topology), f"undoing {args.topology}'s degrade record"
    if found is None:
        try:
            found, how = load_topology(warm.topology), "its library name"
        except MCCLError:
            found = None
    if found is None or gpu_mismatch(found, warm):
        raise ScheduleError(f"--warm {args.warm} was solved for topology {warm.topology[:80]!r}, not {topo.name!r}, "
                            f"and that fabric is neither in {args.topology}'s degrade record (mccl topo degrade "
                            f"writes one) nor a library name; pass --warm-topology with it (a file, a library "
                            f"name or hpn-SxHxN[-failK]) so its warm state can be rebuilt on it")
    print(f"--warm {args.warm}: rebuilt its fabric {warm.topology!r} by {how}", file=sys.stderr)
    return found


def certificate(schedule) -> dict:
    """``status``, ``bound_gbps`` and ``certified_gap`` of a schedule: its typed properties
    (:attr:`mccl_opt.Schedule.status` and the others, from its report)."""
    return {"status": schedule.status, "bound_gbps": schedule.bound_gbps,
            "certified_gap": schedule.certified_gap}


def warm_mode(schedule) -> str:
    """``cold``, or ``warm:<how>`` the solve used its warm start (the report's
    :class:`mccl_opt.report.WarmUse`).  AllToAll (paper §4.2, docs/alltoall.md):
    ``columns`` (the old columns in the master), ``basis`` (and the old basis), ``local``
    (certified local re-optimisation), ``kept`` (the old schedule, re-certified).
    AllGather (paper §4.3, docs/allgather.md): ``kept`` (the old trees, re-certified),
    ``rerouted`` (the old trees with their broken edges rerouted), ``shapes`` (new trees
    packed from a warm guess, seeded with the old shapes), ``columns`` (the general
    method's master seeded with the old trees), ``declined`` (the warm start did not pay
    within its budget: solved cold)."""
    report = schedule.report
    if report is None or report.warm.value == "cold":
        return "cold"
    return f"warm:{report.warm.value}"


#: the two rows of the result table (each <= 100 columns); ``--json`` has every key
TABLE_ROWS = (("collective", "topology", "gpus", "chunks", "steps", "warm", "backend", "seconds"),
              ("rate_gbps", "lp_rate_gbps", "rounding_gap", "status", "bound_gbps",
               "certified_gap", "bottleneck_links"))


def summary(schedule, seconds: float, steps: int) -> dict:
    """The result row; ``seconds`` is the solve's wall time without kernel loading
    (reported apart as ``kernel_load_s``, :mod:`mccl_opt.kernel_time`); ``steps`` the
    schedule's step count as the validator derives it (AllToAll: the longest path's
    steps; AllGather: the deepest tree's depth; docs/modelling.md)."""
    return {"collective": schedule.collective, "topology": schedule.topology,
            "gpus": schedule.num_gpus, "chunks": len(schedule.chunks), "steps": steps,
            "warm": warm_mode(schedule), "backend": str(schedule.solver.get("backend", "unknown")),
            "rate_gbps": schedule.rate_gbps, "lp_rate_gbps": schedule.lp_rate_gbps,
            "rounding_gap": schedule.rounding_gap, **certificate(schedule),
            "bottleneck_links": len(schedule.bottleneck), "seconds": seconds}


def _solve(args: argparse.Namespace) -> int:
    import mccl_opt as mo

    from ..errors import MCCLError
    from ._guard import output_path
    from ._inputs import load_topology

    output_path(args.output, "-o")
    if args.warm_topology and not args.warm:
        raise MCCLError("--warm-topology names the fabric of the --warm schedule; pass --warm too")
    topo = load_topology(args.topology)
    warm = _warm(args, topo)
    from mccl_opt import progress
    from mccl_opt.kernel_time import kernel_seconds
    from mccl_runtime.warmup import compiling_notice

    restore_s = None
    with kernel_seconds(on_compile=compiling_notice) as restore_kernels:
        if warm is not None:                    # the warm state, rebuilt outside the timing
            warm, restore_s = _restored(args, topo, warm)
    if restore_s is not None:
        restore_s -= restore_kernels.seconds
    if topo.num_gpus > LARGE_GPUS:
        print(f"solving {args.collective} for {topo.name}: {topo.num_gpus} GPUs, {len(topo.nodes)} nodes, "
              f"{topo.num_links} links; fabrics this large take minutes (Ctrl-C stops)", file=sys.stderr)
    progress.start(args.progress, label=topo.name)
    if args.collective == "alltoall":           # imported here, outside the timing
        solve = functools.partial(mo.solve_alltoall, max_steps=args.max_steps,
                                  time_limit=args.time_limit)
    else:
        solve = functools.partial(mo.solve_allgather, step_aware=args.step_aware,
                                  time_limit=args.time_limit)
    with kernel_seconds(on_compile=compiling_notice) as kernels:
        start = time.perf_counter()
        sched = solve(topo, warm=warm, backend=args.backend, max_chunks=args.max_chunks)
        wall = time.perf_counter() - start
    seconds = wall - kernels.seconds        # kernel compilation/loading is not the solve's
    kernel_load_s = kernels.seconds + restore_kernels.seconds
    progress.stop()
    if "step_aware" in sched.stats:
        print(f"step-aware: {sched.stats['step_aware']}", file=sys.stderr)
    sched.stats["kernel_load_s"] = kernel_load_s
    report = mo.validate(topo, sched)
    if args.output:
        sched.save(args.output)
    info = summary(sched, seconds, report.max_steps)
    if info["status"] != "optimal" and info["certified_gap"] == 0:    # the bound met: optimal after all
        print(f"note: the solve stopped early ({info['status']}), but the schedule meets its certified bound "
              f"({info['bound_gbps']:.4g} Gbps): it is optimal", file=sys.stderr)
    elif info["status"] != "optimal":
        bound = "no bound yet" if info["bound_gbps"] is None else \
            f"bound {info['bound_gbps']:.4g} Gbps, certified gap {info['certified_gap']:.2%}"
        print(f"warning: the solve stopped early ({info['status']}): the schedule runs at "
              f"{sched.rate_gbps:.4g} Gbps, not proven optimal ({bound})", file=sys.stderr)
    if args.json:
        print_json({**info, "kernel_load_s": kernel_load_s, "warm_restore_s": restore_s})
    else:
        for keys in TABLE_ROWS:
            print_table(keys, [["none" if info[k] is None else info[k] for k in keys]])
    if args.output:
        print(f"wrote {args.output}", file=sys.stderr)
    else:
        print("the schedule was not saved: pass -o FILE to keep it", file=sys.stderr)
    return 0
