"""mccl_opt.kernel_time: numba compile/load seconds per block and thread, a notice on a
real compilation only."""

from __future__ import annotations

import threading

import numpy as np
from numba import njit

from mccl_opt.kernel_time import kernel_seconds


def _fresh_kernel():
    @njit(cache=False)
    def twice(x):
        return x * 2.0
    return twice


def test_compile_is_counted_and_announced_once_then_not_again():
    kernel, notices = _fresh_kernel(), []
    with kernel_seconds(on_compile=lambda: notices.append(1)) as first:
        assert kernel(np.ones(3))[0] == 2.0
        kernel(np.ones(2))                       # same types: no second compile
    with kernel_seconds(on_compile=lambda: notices.append(2)) as again:
        kernel(np.ones(4))
    assert first.seconds > 0.0 and again.seconds == 0.0
    assert notices == [1]


def test_other_threads_compiles_are_not_counted():
    kernel = _fresh_kernel()
    with kernel_seconds() as mine:
        worker = threading.Thread(target=kernel, args=(np.ones(2),))
        worker.start()
        worker.join()
    assert mine.seconds == 0.0
    with kernel_seconds() as after:
        kernel(np.ones(2))                       # compiled by the worker already
    assert after.seconds == 0.0


def test_solvers_report_kernel_time_apart_from_seconds():
    """A new process's first solves load kernels: that time is in ``kernel_load_s``,
    not in ``seconds``; the solves' own ``seconds`` plus it fit in the measured wall."""
    import json
    import subprocess
    import sys

    code = """
import json, time
from instances import hpn
import mccl_opt as mo
out = []
for solve, total in ((mo.solve_allgather, "total_s"), (mo.solve_allgather, "total_s"),
                     (mo.solve_alltoall, "seconds"), (mo.solve_alltoall, "seconds")):
    start = time.perf_counter(); s = solve(hpn(1, 2, 4)); wall = time.perf_counter() - start
    out.append([wall, s.solver["seconds"], s.stats[total], s.stats["kernel_load_s"]])
print(json.dumps(out))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=600, check=True)
    rows = json.loads(done.stdout)
    for (wall1, solver1, total1, load1), (wall2, solver2, total2, load2) in (rows[:2], rows[2:]):
        assert load1 > 0.0 and load2 == 0.0
        assert solver1 == total1 and solver1 + load1 <= wall1
        assert solver2 == total2 and solver2 <= wall2


def test_a_lock_taken_before_the_listener_existed_is_ignored():
    """A thread releasing numba's compiler lock it took before the listener was registered
    (another thread's first kernel_seconds) neither fails nor counts."""
    from numba.core import event

    from mccl_opt import kernel_time

    kernel_time._register_listener()
    outcome = []

    def release_then_measure():
        try:
            event.end_event("numba:compiler_lock")   # an end with no start in this thread
            with kernel_seconds() as clock:
                pass
            outcome.append(clock.seconds)
        except Exception as e:                      # noqa: BLE001 -- reported below
            outcome.append(e)

    worker = threading.Thread(target=release_then_measure)
    worker.start()
    worker.join()
    assert outcome == [0.0]
