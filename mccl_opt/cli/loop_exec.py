"""``mccl loop --executor gloo``: the closed loop on real ranks (docs/executor.md).

Adds ``--executor``, ``--world``, ``--block-kib`` and ``--collective-ms`` to the
``mccl loop`` command registered by :mod:`mccl_runtime.cli`, and sends ``gloo`` runs to
:mod:`executor_cuda.scenario_run` (the CLI is the one place that may import the
executor layer; the runtime must not).
"""

from __future__ import annotations

import argparse
import sys

from ._inputs import float_arg, int_arg

#: defaults of the real-rank controller where the simulated loop's differ
GLOO_ALPHA, GLOO_GAMMA = 1.0, 0.3


def register(sub: argparse._SubParsersAction) -> None:
    loop = sub.choices.get("loop")
    if loop is None:                          # the runtime layer is not installed
        return
    g = loop.add_argument_group("real ranks (--executor gloo)")
    g.add_argument("--executor", choices=["sim", "gloo"], default="sim",
                   help="sim: the fabric simulator (default); gloo: real torch.distributed CPU ranks, "
                        "a controller process and an emulated fabric (needs --scenario)")
    g.add_argument("--world", type=int_arg, default=None, help="ranks to launch (the scenario's GPU count)")
    g.add_argument("--block-kib", type=float_arg, default=32.0,
                   help="real bytes per block (KiB) standing for the scenario's message (default %(default)s)")
    g.add_argument("--collective-ms", type=float_arg, default=60.0,
                   help="real time of a healthy collective; fabric time is dilated to it (default %(default)s)")
    g.add_argument("--pieces", type=int_arg, default=1,
                   help="run each collective in this many pieces; a new version takes over between pieces "
                        "(the in-flight switch, docs/executor.md; costs per piece on gloo)")
    g.add_argument("--abort", action=argparse.BooleanOptionalAction, default=True,
                   help="abort a collective stuck on a (nearly) dead link once the ranks agreed on a new "
                        "version, and re-run it on that version; links are read while messages are in flight "
                        "(default; --no-abort: the new version waits for the collective's end; "
                        "docs/executor.md, \"Aborting a stale collective\")")
    g.add_argument("--telemetry-frontend", action="store_true",
                   help="start a telemetry front end with the controller (`serve --frontends 1`) and send "
                        "the ranks' telemetry to it; schedules and subscriptions stay with the controller")
    g.add_argument("--max-real-s", type=float_arg, default=600.0,
                   help="refuse scenarios that would run longer than this on real ranks (default %(default)s)")
    sim_handler = loop.get_default("handler")

    def handler(args: argparse.Namespace) -> int:
        if args.executor == "gloo":
            return _gloo(args)
        if args.world is not None or args.telemetry_frontend:
            from mccl_opt.errors import MCCLError

            raise MCCLError("--world and --telemetry-frontend apply to --executor gloo (the simulation takes "
                            "its GPUs from the fabric and has no telemetry transport)")
        _refuse_real_rank_flags(args, loop)
        return sim_handler(args)

    loop.set_defaults(handler=handler)


#: the real-rank options the simulated loop has no use for (it always aborts a stale collective)
REAL_RANK_ONLY = ("block_kib", "collective_ms", "pieces", "abort", "max_real_s")


def _refuse_real_rank_flags(args: argparse.Namespace, loop: argparse.ArgumentParser) -> None:
    """A real-rank option given to the simulated loop is an error, not silently ignored
    (issue 27, seventh pass): ``--pieces 4`` or ``--abort`` there changed nothing."""
    from mccl_opt.errors import MCCLError

    given = [f"--{'no-' if loop.get_default(name) is True else ''}{name.replace('_', '-')}"
             for name in REAL_RANK_ONLY if getattr(args, name) != loop.get_default(name)]
    if given:
        raise MCCLError(f"{', '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to --executor gloo only; the "
                        f"simulated loop (--executor sim) ignores {'it' if len(given) == 1 else 'them'} (it always "
                        "aborts a collective stuck on a stale version): drop "
                        f"{'it' if len(given) == 1 else 'them'} or add --executor gloo --scenario FILE")


def _gloo(args: argparse.Namespace) -> int:
    import json

    from mccl_opt.errors import MCCLError
    from mccl_runtime.loop import LoopConfig
    from mccl_runtime.scenario import load_scenario

    if not args.scenario:
        raise MCCLError("--executor gloo needs --scenario FILE (a mccl-scenario/1 file)")
    if args.png or args.workload:
        raise MCCLError("--png and --workload are simulation-only; drop them with --executor gloo")
    from executor_cuda.scenario_report import print_summary
    from executor_cuda.scenario_run import MAX_WORLD, GlooLoopConfig, run_gloo_loop

    scenario = load_scenario(args.scenario, max_gpus=MAX_WORLD)
    d = LoopConfig()
    cfg = GlooLoopConfig(world=args.world if args.world is not None else scenario.topology.num_gpus,
                         block_kib=args.block_kib, collective_ms=args.collective_ms,
                         alpha=args.alpha if args.alpha != d.alpha else GLOO_ALPHA,
                         gamma=args.gamma if args.gamma != d.gamma else GLOO_GAMMA,
                         backend=args.backend, max_real_s=args.max_real_s, pieces=args.pieces,
                         abort=args.abort, telemetry_frontend=args.telemetry_frontend)
    summary = run_gloo_loop(scenario, cfg)
    if args.json:
        print(json.dumps(summary), file=sys.stdout)
    else:
        print_summary(summary, sys.stdout)
    return 0
