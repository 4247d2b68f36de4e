"""``mccl controller serve --frontends N``: telemetry front ends started with the controller
(docs/scale.md, "Telemetry front ends").

Each front end is its own process (``mccl controller frontend``, :mod:`.frontend_service`)
forwarding to the controller (shard 0 of a sharded one, whose ``ping`` names every shard);
front end ``i`` binds ``--frontend-bind`` with its port plus ``i`` (a free port each with
port 0) and is announced as ``frontend I on ENDPOINT``.  They are stopped with the
controller.  On several machines, start ``mccl controller frontend`` on each pod instead.
"""

from __future__ import annotations

import subprocess
import sys
from argparse import Namespace

from mccl_opt.errors import MCCLError

from .endpoints import shard_endpoint

__all__ = ["start_frontends", "stop_frontends", "MAX_FRONTENDS"]

#: front ends one ``serve`` starts at most
MAX_FRONTENDS = 256


def start_frontends(args: Namespace, upstream: str) -> list[subprocess.Popen]:
    """Start ``args.frontends`` front ends forwarding to ``upstream``, print their
    endpoints; raises :class:`~mccl_opt.errors.MCCLError` if one does not start (the
    others are stopped)."""
    procs: list[subprocess.Popen] = []
    try:
        for i in range(args.frontends):
            cmd = [sys.executable, "-m", "mccl_opt.cli", "controller", "frontend", "--topology", args.topology,
                   "--upstream", upstream, "--bind", shard_endpoint(args.frontend_bind, i)]
            cmd += ["--key-file", args.key_file] if args.key_file else []
            cmd += ["--allow-remote"] if args.allow_remote else []
            cmd += ["--id", str(i)] if args.frontend_maxima else []
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
            procs.append(proc)
            line = proc.stdout.readline()
            if not line.startswith("frontend on "):
                raise MCCLError(f"front end {i} did not start (its error is above); stopping")
            print(f"frontend {i} on {line.split()[2].rstrip(',')}", flush=True)
    except BaseException:
        stop_frontends(procs)
        raise
    return procs


def stop_frontends(procs: list[subprocess.Popen]) -> None:
    """Stop the front ends (SIGTERM, then SIGKILL after 10 s)."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(10.0)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10.0)
        if p.stdout is not None:
            p.stdout.close()
