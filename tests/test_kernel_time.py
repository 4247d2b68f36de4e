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
