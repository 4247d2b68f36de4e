"""Load the synthesizers' compiled kernels before the first failure.

The numba kernels of both synthesizers are compiled once into the on-disk cache, but
each process still loads them on first use: the first warm AllGather re-synthesis of a
process took ~95 ms instead of ~4 ms on 8 GPUs, most of it loading the max-flow,
rerouting and packing kernels.  A controller must not charge that to its reaction to
the first gray failure, so :func:`load_kernels` runs every path the product
synthesizer takes (cold; warm after a degraded NVSwitch link, a degraded NIC and a NIC
degraded in one direction, which takes the AllGather's path for unbalanced switches;
for both collectives) once, on a tiny built-in fabric, when the synthesizer is made.
"""

from __future__ import annotations

import threading

__all__ = ["load_kernels"]

_lock = threading.Lock()
_loaded: set[str] = set()


def load_kernels(backend: str = "highs") -> None:
    """Run both synthesizers' cold and warm paths once on HPN 1x2x4 (idempotent per
    process and backend; thread-safe)."""
    with _lock:
        if backend in _loaded:
            return
        from instances import fail1, fail2, hpn
        from mccl_opt.allgather import solve_allgather
        from mccl_opt.alltoall import solve_alltoall

        healthy = hpn(1, 2, 4)
        one_way = healthy.with_capacity(src="s0h0g0", dst="s0tor0", gbps=100.0, both_directions=False)
        for solve in (solve_allgather, solve_alltoall):
            previous = solve(healthy, backend=backend)
            for degraded in (fail1(healthy), fail2(healthy), one_way):
                solve(degraded, warm=previous, backend=backend)
        _loaded.add(backend)
