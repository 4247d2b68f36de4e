"""Stopping a subprocess the tests started (a controller, a job): SIGTERM, then a kill if it
does not exit in time, so a hung child never outlives its test."""

from __future__ import annotations

import signal
import subprocess


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
