"""A controller in its own process for the service tests (``python -m tests.controller_proc``).

It serves :data:`tests.test_runtime_manager.TOPO` with the fast ``PruningSynth`` and
prints ``controller on ENDPOINT`` once bound.  ``--crash before_write|after_write`` kills
the process (SIGKILL, after a pause that lets anything already sent leave the socket)
when it is about to write, or has just written, a state holding a version >= 2: the
moment between persisting a new version and publishing it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

from mccl_runtime.manager import Policy
from mccl_runtime.protocol import load_key
from mccl_runtime.service import ControllerService
from tests.test_runtime_manager import TOPO, PruningSynth


def _die() -> None:
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGKILL)


class CrashingService(ControllerService):
    crash: str | None = None

    def persist(self) -> bool:
        armed = self.crash and any(c.version >= 2 for c in self.manager.collectives())
        if armed and self.crash == "before_write":
            _die()
        saved = super().persist()
        if armed:
            _die()
        return saved


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--state")
    ap.add_argument("--key-file")
    ap.add_argument("--crash", choices=["before_write", "after_write"])
    ap.add_argument("--bind", default="tcp://127.0.0.1:0", help="an ipc:// path keeps its endpoint across restarts")
    args = ap.parse_args()
    CrashingService.crash = args.crash
    svc = CrashingService(TOPO, args.bind, synthesize=PruningSynth(), alpha=1.0,
                          policy=Policy(gamma=0.1, min_dwell_s=0.0), state_path=args.state,
                          key=load_key(args.key_file) if args.key_file else None)
    signal.signal(signal.SIGTERM, lambda *_: svc.stop())

    def announce() -> None:
        svc.ready.wait()
        print(f"controller on {svc.endpoint}", flush=True)

    threading.Thread(target=announce, daemon=True).start()
    svc.serve_forever()
    sys.exit(0)


if __name__ == "__main__":
    main()
