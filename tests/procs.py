"""Stopping a subprocess the tests started (a controller, a job): SIGTERM, then a kill if it
does not exit in time, so a hung child never outlives its test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def stop(proc: subprocess.Popen, timeout: float = 10.0) -> int | None:
    """Ask ``proc`` to stop (SIGTERM) and wait up to ``timeout`` s; kill it if it is still
    running.  Returns its exit status, or ``None`` when it had to be killed."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
        return None


def start_controller(topology: Path, state: Path) -> subprocess.Popen:
    """``mccl controller serve`` on ``topology`` with its state in ``state``, bound to a free
    loopback port (its first stdout line names the endpoint); text pipes for stdout/stderr."""
    return subprocess.Popen(
        [sys.executable, "-m", "mccl_opt.cli", "controller", "serve", "--kernels", "lazy", "--estimator", "ewma", "--topology", str(topology),
         "--bind", "tcp://127.0.0.1:0", "--state", str(state)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
