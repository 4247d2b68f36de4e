"""``mccl controller serve`` and ``mccl loop`` (registered by ``mccl_opt.cli``)."""

from __future__ import annotations

import argparse
import sys


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("controller", help="run the MCCL controller service (paper §3)")
    csub = c.add_subparsers(dest="controller_command", metavar="ACTION")
    csub.required = True
    s = csub.add_parser("serve", help="serve telemetry ingest and schedule versions over ZeroMQ")
    s.add_argument("--topology", required=True, help="mccl-topology/1 file of the fabric")
    s.add_argument("--bind", default="tcp://127.0.0.1:5555",
                   help="request endpoint (ROUTER); port 0 picks a free one (default %(default)s)")
    s.add_argument("--pub-bind", help="publisher endpoint (default: same host, a free port; see `ping`)")
    s.add_argument("--key-file", help="shared key: sign and check every message with HMAC-SHA256")
    s.add_argument("--state", help="state file: resume from it and keep it up to date")
    s.add_argument("--collective", action="append", default=[], metavar="COMM/NAME:KIND",
                   help="register a collective at start, e.g. world/ag:allgather (repeatable)")
    s.add_argument("--alpha", type=float, default=0.012, help="EWMA smoothing factor (default %(default)s)")
    s.add_argument("--gamma", type=float, default=0.1, help="Algorithm 1 threshold Gamma (default %(default)s)")
    s.add_argument("--dwell", type=float, default=1.0, help="minimum seconds between decisions per collective")
    s.add_argument("--time-limit", type=float, default=60.0, help="re-synthesis time bound in seconds")
    s.add_argument("--backend", default="highs", help="LP backend for the synthesizers")
    s.add_argument("--allow-remote", action="store_true", help="allow binding a non-loopback address")
    s.set_defaults(handler=_serve)

    lp = sub.add_parser("loop", help="closed-loop simulation: gray failure, detection, re-synthesis, swap")
    from .loop_report import add_arguments

    add_arguments(lp)
    lp.set_defaults(handler=_loop)


def _serve(args: argparse.Namespace) -> int:
    import signal

    from mccl_opt.errors import MCCLError
    from mccl_opt.topology import Topology

    from .manager import Policy, solver_synthesizer
    from .protocol import load_key
    from .service import ControllerService

    topo = Topology.load(args.topology)
    svc = ControllerService(
        topo, args.bind, pub_bind=args.pub_bind, key=load_key(args.key_file) if args.key_file else None,
        state_path=args.state, synthesize=solver_synthesizer(args.backend), alpha=args.alpha,
        policy=Policy(gamma=args.gamma, min_dwell_s=args.dwell, time_limit_s=args.time_limit),
        allow_remote=args.allow_remote)
    for spec in args.collective:
        comm_name, _, kind = spec.partition(":")
        comm, _, name = comm_name.partition("/")
        if not (comm and name and kind):
            raise MCCLError(f"--collective must look like COMM/NAME:KIND, got {spec!r}")
        if not any(c.key == (comm, name) or c.name.startswith(name + "/") for c in svc.manager.collectives()):
            svc.manager.register(comm, name, kind)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: svc.stop())
    import threading

    threading.Thread(target=_announce, args=(svc,), daemon=True).start()
    svc.serve_forever()
    print("controller stopped; state saved" if args.state else "controller stopped", file=sys.stderr)
    return 0


def _announce(svc) -> None:
    svc.ready.wait()
    print(f"controller on {svc.endpoint} (publisher {svc.pub_endpoint}), topology {svc.store.topo.name}"
          f"{', resumed from state' if svc.resumed else ''}", flush=True)


def _loop(args: argparse.Namespace) -> int:
    from .loop_report import main

    return main(args, out=sys.stdout)
