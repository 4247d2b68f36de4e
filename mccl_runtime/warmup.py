"""Compile, or load, the synthesizers' numba kernels before the work that is timed.

The numba kernels of both synthesizers are compiled on first use into numba's on-disk
cache (``cache=True``), so only the first process after an installation compiles them
(about a minute on two cores); every later process still *loads* them on first use
(0.5-1 s).  Neither belongs in a solve's ``seconds``: a controller must not charge it to
its reaction to the first gray failure, and ``mccl solve --warm`` must not look slower
than cold because the warm path's kernels load inside it.  :func:`load_kernels` runs
every path the product synthesizer takes (cold; warm after a degraded NVSwitch link, a
degraded NIC and a NIC degraded in one direction, which takes the AllGather's path for
unbalanced switches) once per collective, on two small built-in fabrics, and says how long
that took; ``mccl warmup`` runs it ahead (``make demo`` does).

Where the cache lives: numba writes it next to the package's sources (``__pycache__``)
or, when that folder is read-only (a system-wide install), under the user's cache
folder (``~/.cache/numba``); set ``NUMBA_CACHE_DIR`` to choose a writable folder
explicitly (e.g. in containers whose home is read-only too).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

__all__ = ["load_kernels", "COLLECTIVES", "cache_location", "compiling_notice"]

COLLECTIVES = ("allgather", "alltoall")

_lock = threading.Lock()


class _Fabrics:
    """HPN 1x2x4 and 1x2x8: the AllGather's tree packing on 16 GPUs takes a path (and
    compiles a kernel) that 8 GPUs do not; built on first use (``instances`` is imported
    lazily)."""

    def __iter__(self):
        from instances import hpn

        return iter((hpn(1, 2, 4), hpn(1, 2, 8)))


WARMUP_FABRICS = _Fabrics()
_loaded: set[tuple[str, str]] = set()


def load_kernels(backend: str = "highs", collectives: tuple[str, ...] = COLLECTIVES) -> dict[str, float]:
    """Run each collective's cold and warm paths once on HPN 1x2x4 and 1x2x8 (idempotent per
    process, backend and collective; thread-safe).  Returns the seconds this call spent
    per collective (0.0 for one already loaded in this process)."""
    spent: dict[str, float] = {}
    with _lock:
        todo = [c for c in collectives if (backend, c) not in _loaded]
        spent.update({c: 0.0 for c in collectives})
        if not todo:
            return spent
        from instances import fail1, fail2
        from mccl_opt.allgather import solve_allgather
        from mccl_opt.alltoall import solve_alltoall

        solvers = {"allgather": solve_allgather, "alltoall": solve_alltoall}
        for collective in todo:
            solve = solvers[collective]
            start = time.perf_counter()
            for healthy in WARMUP_FABRICS:
                one_way = healthy.with_capacity(src="s0h0g0", dst="s0tor0", gbps=100.0,
                                                both_directions=False)
                previous = solve(healthy, backend=backend)
                for degraded in (fail1(healthy), fail2(healthy), one_way):
                    solve(degraded, warm=previous, backend=backend)
            spent[collective] = time.perf_counter() - start
            _loaded.add((backend, collective))
    return spent


def cache_location() -> str:
    """Where numba keeps the compiled kernels for this installation (see the module
    docstring)."""
    chosen = os.environ.get("NUMBA_CACHE_DIR")
    if chosen:
        return f"{chosen} (NUMBA_CACHE_DIR)"
    import mccl_opt

    package = Path(mccl_opt.__file__).resolve().parent
    if os.access(package, os.W_OK):
        return f"{package}/**/__pycache__ (next to the sources)"
    return (f"{Path('~/.cache/numba').expanduser()} ({package} is read-only; "
            f"set NUMBA_CACHE_DIR to choose another folder)")


def compiling_notice() -> None:
    """One line on stderr when a command's solve starts compiling kernels (an empty cache;
    passed as ``on_compile`` to :func:`mccl_opt.kernel_time.kernel_seconds`)."""
    print("compiling the synthesizers' numba kernels: once after installation, about a minute "
          "(`mccl warmup` does it ahead)...", file=sys.stderr, flush=True)
