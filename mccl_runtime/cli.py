"""``mccl controller serve``, ``mccl controller frontend`` and ``mccl loop`` (registered by ``mccl_opt.cli``)."""

from __future__ import annotations

import argparse
import sys

from mccl_opt.number_args import float_arg, int_arg, number_arg

from .telemetry import CLI_ESTIMATOR, ESTIMATORS


#: synthesis worker processes at most
MAX_WORKERS = 256
#: a front end's ``--id``, in [0, 2^30) (:data:`mccl_runtime.columns.MAX_REPORTER`),
#: checked before the controller is contacted
_reporter_id = number_arg(int, 0, high=(1 << 30) - 1, expected="an integer in [0, 2^30)")


def _path(text: str) -> str:
    """A ``--key-file`` or ``--state`` path: an empty one (``--key-file "$KEY"`` with
    ``KEY`` unset) was taken for none, so the controller served without a key or a state."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty path; give a file, or leave the option out")
    return text


def _round_pieces(text: str):
    """``--round-pieces`` (:meth:`mccl_opt.lowering.rounds.RoundPieces.parse`)."""
    from mccl_opt.errors import InputError
    from mccl_opt.lowering.rounds import RoundPieces

    try:
        return RoundPieces.parse(text)
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def register(sub: argparse._SubParsersAction) -> None:
    c = sub.add_parser("controller", help="run the MCCL controller service (paper §3)")
    csub = c.add_subparsers(dest="controller_command", metavar="ACTION")
    csub.required = True
    s = csub.add_parser("serve", help="serve telemetry ingest and schedule versions over ZeroMQ")
    s.add_argument("--topology", required=True,
                   help="the fabric: a mccl-topology/1 file, a library name (hpn-1x2x8, dgx-8) or hpn-SxHxN[-failK]")
    s.add_argument("--bind", default="tcp://127.0.0.1:5555",
                   help="request endpoint (ROUTER); port 0 picks a free one (default %(default)s)")
    s.add_argument("--pub-bind", help="publisher endpoint (default: same host, a free port; see `ping`)")
    s.add_argument("--key-file", type=_path, help="shared key: sign and check every message with HMAC-SHA256")
    s.add_argument("--state", type=_path, help="state file: resume from it and keep it up to date")
    s.add_argument("--collective", action="append", default=[], metavar="COMM/NAME:KIND",
                   help="register a collective at start, e.g. world/ag:allgather (repeatable)")
    s.add_argument("--members", action="append", default=[], metavar="COMM=GPU,GPU,...",
                   help="the GPUs of a communicator of --collective, in rank order, e.g. "
                        "tp0=s0h0g0,s0h0g1 (repeatable; default: every GPU of the fabric); its "
                        "schedules are synthesized on the sub-fabric they induce")
    s.add_argument("--estimator", choices=list(ESTIMATORS), default=CLI_ESTIMATOR,
                   help="link estimate: the change-point level (re-synthesizes for a new level once "
                        "confirmed) or the paper's EWMA (--alpha); default %(default)s, as `mccl loop` "
                        "(docs/runtime.md)")
    s.add_argument("--alpha", type=float_arg, default=0.012, help="EWMA smoothing factor (default %(default)s)")
    s.add_argument("--gamma", type=float_arg, default=0.1, help="Algorithm 1 threshold Gamma (default %(default)s)")
    s.add_argument("--dwell", type=float_arg, default=1.0, help="minimum seconds between decisions per collective")
    s.add_argument("--time-limit", type=float_arg, default=60.0, help="re-synthesis time bound in seconds")
    s.add_argument("--gather", type=float_arg, default=0.0, metavar="SECONDS",
                   help="after a drift is flagged, wait up to this long for a new sample of every channel "
                        "sampled in the last SECONDS, so links that fail together are synthesized for "
                        "together (default 0: start at once; docs/runtime.md)")
    s.add_argument("--anytime", type=float_arg, default=None, metavar="SECONDS",
                   help="publish a re-synthesis that took at least SECONDS even when the estimate moved "
                        "meanwhile, if it beats the active version, and restart on the latest estimate "
                        "(default: off, restart only; docs/runtime.md \"Anytime publication\")")
    s.add_argument("--speculate", action="store_true",
                   help="start a re-synthesis on changes still being confirmed (level estimator: early "
                        "estimates; EWMA: the executors' 'early' pair estimates) and publish only once they "
                        "are confirmed (docs/runtime.md \"Speculative synthesis\")")
    s.add_argument("--early-hold", type=float_arg, default=None, metavar="SECONDS",
                   help="with --speculate: how long a finished speculative re-synthesis waits for the "
                        "confirmation (default: the settle time, 0.05 s; real ranks confirm a collective later)")
    s.add_argument("--cable-wait", type=float_arg, default=0.0, metavar="SECONDS",
                   help="a drift whose drop is read on one direction of a cable the schedule loads both "
                        "ways waits up to this long for the other direction before synthesizing (default 0: "
                        "off; real-rank runs pass 0.2; docs/runtime.md)")
    s.add_argument("--backend", default="highs", help="LP backend for the synthesizers")
    s.add_argument("--shallow-trees", action="store_true",
                   help="for executors that run a GPU hop per round: AllGather: when a warm start deepens the "
                        "trees, also solve cold and keep the shallower schedule of equal rate; AllToAll: also "
                        "solve cold and keep it if of equal rate and faster in the round model")
    s.add_argument("--round-pieces", type=_round_pieces, default=None, metavar="BYTES[,FLOOR]",
                   help="with --shallow-trees: the round model cuts blocks of BYTES as the simulator does, "
                        "or with FLOOR as real ranks do (docs/executor.md \"The round model in pieces\"); "
                        "default: one piece per chunk")
    s.add_argument("--kernels", choices=["eager", "background", "lazy"], default="eager",
                   help="when the synthesizers' compiled kernels load (those of the --collective kinds and of "
                        "the collectives a --state file holds; every kind's when there are none): eager (before "
                        "serving, so the first failure's job does not pay, ~1.5-2.6 s at start), background (in a thread once "
                        "serving), lazy (each on its first use); default %(default)s")
    s.add_argument("--workers", type=int_arg, default=0,
                   help="run re-syntheses in this many worker processes (default: one thread in the controller)")
    s.add_argument("--synthesis", default="local", metavar="local|ray|ray://HOST:PORT",
                   help="where re-syntheses run: in this machine's thread or --workers processes (local, "
                        "default), or as Ray tasks on a local Ray instance (ray; --workers CPUs) or a Ray "
                        "cluster (ray://HOST:PORT); Ray needs pip install 'mccl[ray]'")
    s.add_argument("--shards", type=int_arg, default=1,
                   help="run N controller processes, each serving the communicators hashed to it "
                        "(ports --bind+I, state files STATE.shardI; docs/scale.md)")
    s.add_argument("--frontends", type=int_arg, default=0, metavar="N",
                   help="also start N telemetry front ends (`mccl controller frontend` processes forwarding "
                        "to this controller; hosts send telemetry to them; docs/scale.md)")
    s.add_argument("--frontend-bind", default="tcp://127.0.0.1:0", metavar="ENDPOINT",
                   help="front end I binds this endpoint's port + I (port 0: a free port each; default %(default)s)")
    s.add_argument("--frontend-maxima", action="store_true",
                   help="the front ends send pair telemetry as link maxima (their --id is their index)")
    s.add_argument("--allow-remote", action="store_true", help="allow binding a non-loopback address")
    s.add_argument("-v", "--verbose", action="count", default=0,
                   help="log one line per decision on stderr (-v: info; -vv: debug, adds telemetry ingest)")
    s.add_argument("--log-level", choices=["warning", "info", "debug"],
                   help="log level of the controller's lines (default warning; overrides -v)")
    s.set_defaults(handler=_serve)

    f = csub.add_parser("frontend", help="a telemetry front end: take a pod's hosts' telemetry, fold it per "
                                         "interval, send the controller one request (docs/scale.md)")
    f.add_argument("--topology", required=True, help="the fabric, as given to `serve` (checked against it)")
    f.add_argument("--upstream", required=True, metavar="ENDPOINT",
                   help="the controller's request endpoint (any shard's for a sharded controller)")
    f.add_argument("--bind", default="tcp://127.0.0.1:0",
                   help="endpoint the hosts send telemetry to; port 0 picks a free one (default %(default)s)")
    f.add_argument("--key-file", type=_path, help="shared key (the controller's): check the hosts' messages, sign the forwards")
    f.add_argument("--interval", type=float_arg, default=0.05,
                   help="seconds between forwarded batches (default %(default)s: the executors' flush)")
    f.add_argument("--id", type=_reporter_id, metavar="N",
                   help="this front end's id, in [0, 2^30) and the same after a restart: forward pair telemetry "
                        "as one maximum per link instead of one row per pair (the same M; docs/scale.md)")
    f.add_argument("--allow-remote", action="store_true", help="allow binding a non-loopback address")
    f.add_argument("-v", "--verbose", action="count", default=0, help="log at info (-v) or debug (-vv)")
    f.set_defaults(handler=_frontend)

    lp = sub.add_parser("loop", help="closed-loop simulation: gray failure, detection, re-synthesis, swap")
    from .loop_cli import add_arguments

    add_arguments(lp)
    lp.set_defaults(handler=_loop)


class _LazySynthesizer:
    """The product synthesizer, built (backend checked) by :meth:`load` or the first call,
    its kernels loaded apart (``--kernels``, :func:`.warmup.load_kernels_logged`): the state file
    is checked before that cost."""

    def __init__(self, backend: str, shallow: bool = False, pieces=None) -> None:
        import threading

        self.backend, self.shallow, self._fn, self._lock = backend, shallow, None, threading.Lock()
        self.pieces = pieces

    def load(self):
        from .synthesizer import solver_synthesizer

        with self._lock:
            if self._fn is None:
                self._fn = solver_synthesizer(self.backend, shallow=self.shallow, kernels="lazy", pieces=self.pieces)
            return self._fn

    def __call__(self, *args):
        return self.load()(*args)


def _start_pool(topo, backend: str, workers: int, synthesis: str = "local", shallow: bool = False,
                kernels: str = "eager", pieces=None):
    """A started pool of the product synthesizer: a :class:`~mccl_runtime.pool.SynthesisPool`
    of ``workers`` processes, or a :class:`~mccl_runtime.ray_pool.RayPool`; ``None`` for
    the manager's own thread (local, no workers).  Each worker loads its kernels as
    ``kernels`` says."""
    import functools

    from .synthesizer import solver_synthesizer

    factory = functools.partial(solver_synthesizer, backend, shallow=shallow, kernels=kernels, pieces=pieces)
    if synthesis != "local":
        from .ray_pool import RayPool, parse_synthesis

        pool = RayPool(topo, factory, address=parse_synthesis(synthesis), num_cpus=workers or None)
    elif workers > 0:
        from .pool import SynthesisPool

        pool = SynthesisPool(topo, factory, workers=workers)
    else:
        return None
    pool.start()
    return pool


def _serve(args: argparse.Namespace) -> int:
    import logging
    import signal
    import threading

    from instances.names import resolve_topology

    from .decision_log import LEVELS
    from .manager import Policy
    from .protocol import load_key
    from .service import ControllerService
    from .warmup import kernel_collectives, load_kernels_in_background, load_kernels_logged

    level = args.log_level or ("warning", "info", "debug")[min(args.verbose, 2)]
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("mccl").setLevel(LEVELS[level])     # numba and zmq stay at warning
    from .cli_specs import collective_specs, member_specs

    specs = collective_specs(args.collective)
    members = member_specs(args.members)
    if set(members) - {comm for comm, _, _ in specs}:
        from mccl_opt.errors import MCCLError

        raise MCCLError(f"--members {sorted(set(members) - {c for c, _, _ in specs})[0]!r}: no --collective "
                        "of that communicator; register one with --collective COMM/NAME:KIND")
    _check_serve_flags(args)
    if args.shards > 1:
        from .shards import launch

        return launch(_serve, args, args.shards)
    topo = resolve_topology(args.topology)
    key = load_key(args.key_file) if args.key_file else None
    policy = Policy(gamma=args.gamma, min_dwell_s=args.dwell, time_limit_s=args.time_limit,
                    gather_s=args.gather, anytime_s=args.anytime, speculate=args.speculate,
                    early_hold_s=args.early_hold, cable_wait_s=args.cable_wait)
    synthesize = _LazySynthesizer(args.backend, args.shallow_trees, args.round_pieces)
    pool = _start_pool(topo, args.backend, args.workers, args.synthesis, args.shallow_trees, args.kernels,
                       args.round_pieces)
    svc = ControllerService(
        topo, args.bind, pub_bind=args.pub_bind, key=key, state_path=args.state,
        synthesize=synthesize, alpha=args.alpha, estimator=args.estimator, policy=policy, allow_remote=args.allow_remote,
        pool=pool)
    # the kernels of the collectives given and of those a resumed state holds
    kinds = kernel_collectives([k for _, _, k in specs] + [c.kind for c in svc.manager.collectives()])
    if pool is None and args.kernels == "eager":
        load_kernels_logged(args.backend, "before serving", collectives=kinds)
    elif pool is None and args.kernels == "background":
        load_kernels_in_background(args.backend, after=svc.ready, collectives=kinds)
    svc.shard = getattr(args, "shard", None)
    for comm, name, kind in specs:          # a resumed controller already has them
        names = [f"{name}/reducescatter", f"{name}/allgather"] if kind == "allreduce" else [name]
        if not all(any(c.key == (comm, n) for c in svc.manager.collectives()) for n in names):
            svc.register(comm, name, kind, now=0.0, gpus=members.get(comm))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: svc.stop())
    frontends: list = []                     # started once the controller answers (--frontends)
    errors: list = []                        # a front end that did not start
    if getattr(args, "shard_conn", None) is not None:
        from .shards import announce_shard

        announcer = threading.Thread(target=announce_shard, args=(svc, args.shard_conn), daemon=True)
    else:
        announcer = threading.Thread(target=_announce, args=(svc, args, frontends, errors), daemon=True)
    announcer.start()
    try:
        svc.serve_forever()
    finally:
        from .frontends import stop_frontends

        announcer.join(60.0)                 # a front end still starting is then in the list
        stop_frontends(frontends)
    if errors:
        raise errors[0]                      # exit 2, after the controller stopped
    if args.state and not svc.final_write_ok:
        from mccl_opt.errors import MCCLError

        raise MCCLError(f"controller stopped, but the final state write to {args.state!r} failed "
                        f"({svc.durable.failure or 'see the log'}); the file holds the last state written "
                        "successfully")
    print("controller stopped; state saved" if args.state else "controller stopped", file=sys.stderr)
    return 0


def _frontend(args: argparse.Namespace) -> int:
    import logging
    import signal
    import threading

    from instances.names import resolve_topology

    from .frontend_service import FrontEndService
    from .protocol import load_key

    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("mccl").setLevel(("WARNING", "INFO", "DEBUG")[min(args.verbose, 2)])
    key = load_key(args.key_file) if args.key_file else None
    fe = FrontEndService(resolve_topology(args.topology), args.upstream, args.bind, key=key,
                         interval_s=args.interval, allow_remote=args.allow_remote, reporter=args.id)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: fe.stop())

    def announce() -> None:
        fe.ready.wait()
        if fe.endpoint is not None:
            print(f"frontend on {fe.endpoint}, forwarding every {fe.interval_s:g} s to "
                  f"{', '.join(fe.upstream.endpoints)}", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    fe.serve_forever()
    print("frontend stopped", file=sys.stderr)
    return 0


def _check_serve_flags(args: argparse.Namespace) -> None:
    """``--backend`` names a known LP backend and ``--workers`` is in [0, MAX_WORKERS]."""
    from mccl_opt.backends import backend_class
    from mccl_opt.errors import MCCLError

    backend_class(args.backend)                 # an unknown name raises, naming the choices
    if args.synthesis != "local":
        from .ray_pool import parse_synthesis

        parse_synthesis(args.synthesis)
    from .frontends import MAX_FRONTENDS

    if not 0 <= args.frontends <= MAX_FRONTENDS:
        raise MCCLError(f"--frontends must be in [0, {MAX_FRONTENDS}], got {str(args.frontends)[:40]}")
    if args.frontends and args.estimator != "ewma":
        raise MCCLError(f"--frontends needs --estimator ewma: a front end folds EWMA statistics, and the "
                        f"{args.estimator!r} change-point estimator needs every sample (send it telemetry directly)")
    if not 1 <= args.shards <= 64:
        raise MCCLError(f"--shards must be in [1, 64], got {str(args.shards)[:40]}")
    from .endpoints import check_port

    check_port(args.bind, "--bind", args.shards - 1)
    check_port(args.pub_bind, "--pub-bind", args.shards - 1)
    check_port(args.frontend_bind, "--frontend-bind", max(args.frontends - 1, 0))
    if not 0 <= args.workers <= MAX_WORKERS:
        raise MCCLError(f"--workers must be in [0, {MAX_WORKERS}], got {str(args.workers)[:40]}")


def _announce(svc, args: argparse.Namespace, frontends: list, errors: list) -> None:
    """Print the controller's endpoints once bound, then start its front ends (a front
    end that does not start stops the controller, its error in ``errors``, unless the
    controller was asked to stop meanwhile: its front ends then find no controller)."""
    svc.ready.wait()
    if svc.endpoint is not None:            # None: binding failed, the error follows
        print(f"controller on {svc.endpoint} (publisher {svc.pub_endpoint}), topology {svc.store.topo.name}"
              f"{', resumed from state' if svc.resumed else ''}", flush=True)
        if args.frontends:
            from mccl_opt.errors import MCCLError

            from .frontends import start_frontends

            try:
                frontends.extend(start_frontends(args, svc.endpoint))
            except MCCLError as exc:
                if not svc.stopping:        # a stop asked while they started is no error
                    errors.append(exc)
                svc.stop()


def _loop(args: argparse.Namespace) -> int:
    from mccl_opt.files import check_output_path

    from .loop_cli import main

    _check_loop_flags(args)
    check_output_path(args.png, "--png")
    return main(args, out=sys.stdout)


def _check_loop_flags(args: argparse.Namespace) -> None:
    """The built-in case's flags, held to the rules of a scenario file
    (:mod:`.scenario`) before the simulation starts: every time and cost finite and in
    range (``--t1-ms nan`` simulated forever, ``--size-mib 1e300`` overflowed, ``--seed -1``
    reached numpy)."""
    import math

    from mccl_opt.errors import MCCLError

    from .scenario import MAX_DURATION_MS, MAX_MESSAGE_BYTES, MAX_SEED

    if args.scenario or args.workload:
        return
    for flag, value, top in (("--duration-ms", args.duration_ms, MAX_DURATION_MS),
                             ("--size-mib", args.size_mib, MAX_MESSAGE_BYTES / 2**20)):
        if not (math.isfinite(value) and 0 < value <= top):
            raise MCCLError(f"{flag} must be a positive number at most {top:g}, got {value:g}")
    if not (math.isfinite(args.t0_ms) and 0 <= args.t0_ms < args.duration_ms):
        raise MCCLError(f"--t0-ms must be in [0, --duration-ms) = [0, {args.duration_ms:g}), got {args.t0_ms:g}")
    if args.t1_ms is not None and not (math.isfinite(args.t1_ms) and args.t0_ms < args.t1_ms < args.duration_ms):
        raise MCCLError(f"--t1-ms must be in (--t0-ms, --duration-ms) = ({args.t0_ms:g}, {args.duration_ms:g}), "
                        f"got {args.t1_ms:g}")
    if not 0 <= args.noise < 0.5:
        raise MCCLError(f"--noise must be in [0, 0.5), got {args.noise:g}")
    for flag, value in (("--probe-period-ms", args.probe_period_ms), ("--oob-ms", args.oob_ms)):
        if not (math.isfinite(value) and 0 <= value <= args.duration_ms):
            raise MCCLError(f"{flag} must be in [0, --duration-ms] = [0, {args.duration_ms:g}], got {value:g}")
    if not 0 <= args.seed <= MAX_SEED:
        raise MCCLError(f"--seed must be in [0, 2^63), got {args.seed}")
