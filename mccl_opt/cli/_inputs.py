"""Arguments every subcommand reads the same way: a topology given as a file, a library
instance name or a generated HPN name, and byte sizes with K/M/G suffixes."""

from __future__ import annotations

import argparse
import math
import re

from ..errors import MCCLError
from ..number_args import float_arg, int_arg, number_arg

__all__ = ["load_topology", "parse_bytes", "format_bytes", "number_arg", "int_arg", "float_arg",
           "gbps_arg", "latency_arg", "backend_arg", "MAX_BYTES", "MAX_COUNT", "MAX_GBPS", "MAX_LATENCY_US"]

#: binary multiples, as nccl-tests reads ``-b 1K -e 1G``
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
#: the largest byte size an option takes (1 PiB: no buffer is larger)
MAX_BYTES = 1 << 50
#: the largest chunk budget, step bound or other count an option takes
MAX_COUNT = 1 << 20
#: a link bandwidth (Gbps) and latency (µs) an option takes: what a topology file may hold
MIN_GBPS = 1e-6
MAX_GBPS = 1e12
MAX_LATENCY_US = 1e6
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([KMGT]?)(?:I?B)?\s*", re.IGNORECASE | re.ASCII)


def load_topology(spec: str):
    """The topology ``spec`` names (:func:`instances.names.resolve_topology`): an existing
    ``mccl-topology/1`` file, a library instance (``hpn-1x2x8-fail2``, ``dgx-8``,
    ``irregular-3``) or any HPN shape with an optional paper failure (``hpn-4x64x8``,
    ``hpn 2x32x8-fail1``), generated on the fly."""
    from instances.names import resolve_topology

    return resolve_topology(spec)


def parse_bytes(text: str | int | float, what: str = "size") -> int:
    """Bytes from ``"512"``, ``"1K"``, ``"4M"``, ``"1G"``, ``"1.5MiB"`` (binary
    multiples, like nccl-tests); must be a positive whole number of bytes, at most
    :data:`MAX_BYTES`."""
    match = _SIZE.fullmatch(str(text)[:100])
    if not match:
        raise MCCLError(f"{what} must be a byte count like 1024, 64K, 4M or 1G; got {str(text)[:40]!r}")
    try:
        value = float(match.group(1)) * _UNITS[match.group(2).upper()]
    except OverflowError:
        value = math.inf
    if not math.isfinite(value) or value < 1 or value != int(value):
        raise MCCLError(f"{what} must be a positive whole number of bytes; got {str(text)[:40]!r}")
    if value > MAX_BYTES:
        raise MCCLError(f"{what} must be at most {format_bytes(MAX_BYTES)} ({MAX_BYTES} bytes); "
                        f"got {str(text)[:40]!r}")
    return int(value)


def backend_arg(text: str) -> str:
    """An argparse ``type=`` for ``--backend``: one of the known LP backends (whether it
    is installed is checked when it is used)."""
    from ..backends import BACKENDS

    if text.lower() not in BACKENDS:
        raise argparse.ArgumentTypeError(f"unknown backend {text[:40]!r}; choose one of {', '.join(sorted(BACKENDS))}")
    return text.lower()


def format_bytes(n: int) -> str:
    """``1048576`` -> ``"1M"``; sizes that are no whole multiple keep their bytes."""
    for unit in ("T", "G", "M", "K"):
        if n >= _UNITS[unit] and n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}"
    return str(n)


#: argparse ``type=`` of a link bandwidth and a latency option (a topology's ranges)
gbps_arg = number_arg(float, MIN_GBPS, high=MAX_GBPS, expected=f"a bandwidth in [{MIN_GBPS:g}, {MAX_GBPS:g}] Gbps")
latency_arg = number_arg(float, 0, high=MAX_LATENCY_US, expected=f"a latency in [0, {MAX_LATENCY_US:g}] us")
