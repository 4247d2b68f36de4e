"""nccl-tests conventions for simulated collectives: a size sweep with time, algbw and
busbw per size and method (docs/sim.md "mccl eval", docs/benchmarks.md).

Sizes follow ``all_gather_perf`` / ``alltoall_perf``: from ``-b`` to ``-e`` multiplied
by ``-f``, elements of nccl-tests' default type ``float`` (4 bytes), and each size is
rounded down the way nccl-tests rounds it:

* AllGather: ``count`` = elements each rank sends; ``size`` = the receive buffer,
  ``N x count x 4`` bytes.  The simulated shard (README "Units and definitions") is
  ``count x 4`` bytes.
* AllToAll: ``count`` = elements each rank sends to each peer, a multiple of 4 (16
  bytes); ``size`` = each rank's send buffer, ``N x count x 4`` bytes.  The simulated
  block ``B`` per ordered pair is ``count x 4`` bytes.

``algbw = size / time`` and ``busbw = algbw x factor`` with nccl-tests' factors
(:data:`BUS_FACTORS`), GB/s = 1e9 bytes/s; ``time`` in microseconds.  Each size is
simulated with latency by the event-level model (pieces as :mod:`.piece_rule`, paper §6.1 /
docs/sim.md) while the schedules' total piece count stays within ``event_limit``, and
by the fluid model beyond; every row says which (``model``).
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .evaluate import NO_REOPT, REOPT, FailureCase, figure9_row
from .piece_rule import PIECE_RULE
from .schedule import PathChunk, Schedule
from .sim import SimulationError, simulate
from .topology import Topology

__all__ = ["ELEMENT_BYTES", "BUS_FACTORS", "DEFAULT_EVENT_LIMIT", "MODELS", "ROW_FIELDS",
           "bus_factor", "sweep_sizes", "nccl_count", "nccl_size", "check_sizes",
           "piece_count", "sweep_rows", "summary_rows"]

#: bytes per element: nccl-tests' default ``-d float``
ELEMENT_BYTES = 4
#: nccl-tests' bus-bandwidth factors ``busbw / algbw`` on ``n`` ranks
BUS_FACTORS: dict[str, Callable[[int], float]] = {
    "allgather": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "allreduce": lambda n: 2 * (n - 1) / n,
}
#: the event-level model runs while the schedules of one size have at most this many
#: pieces (sum over chunks of segments x pieces); about 1 s of simulation
DEFAULT_EVENT_LIMIT = 4096
MODELS = ("auto", "event", "fluid")
ROW_FIELDS = ("failure", "collective", "method", "size", "count", "type", "time_us",
              "algbw_GBps", "busbw_GBps", "model")
#: AllToAll per-peer counts are a multiple of this many elements (16 bytes), as in nccl-tests
_ALLTOALL_ALIGN = 16 // ELEMENT_BYTES


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' ``busbw / algbw`` for ``collective`` on ``n`` ranks."""
    try:
        return BUS_FACTORS[collective](n)
    except KeyError:
        raise SimulationError(f"no bus-bandwidth factor for {collective!r}; "
                              f"known: {sorted(BUS_FACTORS)}") from None


def sweep_sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """``min_bytes, min_bytes x factor, ...`` up to ``max_bytes`` (nccl-tests ``-b -e -f``)."""
    if min_bytes < 1 or max_bytes < min_bytes:
        raise SimulationError(f"sizes must satisfy 1 <= -b <= -e; got -b {min_bytes} -e {max_bytes}")
    if not isinstance(factor, int) or isinstance(factor, bool) or factor < 2:
        if min_bytes != max_bytes:
            raise SimulationError(f"-f must be an integer >= 2 to step from -b to -e; got {factor!r}")
        return [min_bytes]
    sizes = [min_bytes]
    while sizes[-1] * factor <= max_bytes:
        sizes.append(sizes[-1] * factor)
    return sizes


def nccl_count(collective: str, size: int, n: int) -> int:
    """The ``count`` nccl-tests prints for ``size`` bytes on ``n`` ranks (module docstring)."""
    per_rank = size // ELEMENT_BYTES // n
    if collective == "alltoall":
        per_rank -= per_rank % _ALLTOALL_ALIGN
    return per_rank


def nccl_size(count: int, n: int) -> int:
    """The ``size`` column: ``N x count`` elements in bytes (AllGather receive buffer,
    AllToAll send buffer per rank)."""
    return n * count * ELEMENT_BYTES


def check_sizes(collectives: Iterable[str], min_bytes: int, max_bytes: int, factor: int,
                n: int) -> list[int]:
    """The sweep's sizes, refused before any work when the smallest one holds no element."""
    sizes = sweep_sizes(min_bytes, max_bytes, factor)
    for coll in collectives:
        if nccl_count(coll, min_bytes, n) == 0:
            step = ELEMENT_BYTES * (_ALLTOALL_ALIGN if coll == "alltoall" else 1)
            raise SimulationError(
                f"-b {min_bytes} is too small for {coll} on {n} GPUs: the smallest size is "
                f"{n * step} bytes ({step} bytes per {'peer' if coll == 'alltoall' else 'rank'})")
    return sizes


def _chunk_shape(topo: Topology, schedule: Schedule) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per chunk: its share, its GPU-to-GPU segments (simulator streams) and its GPU hops
    (a path's segments, a tree's depth)."""
    shares = np.array([c.share for c in schedule.chunks])
    segs = np.array([1 + sum(topo.is_gpu(v) for v in c.path[1:-1]) if isinstance(c, PathChunk)
                     else len(c.edges) for c in schedule.chunks])
    hops = np.array([s if isinstance(c, PathChunk) else max(c.depths().values())
                     for c, s in zip(schedule.chunks, segs)])
    return shares, segs, hops


def _pieces(shape: tuple[np.ndarray, np.ndarray, np.ndarray], block_bytes: float) -> int:
    shares, segs, hops = shape
    return int(np.dot(segs, PIECE_RULE.counts(shares * block_bytes, hops)))


def piece_count(topo: Topology, schedule: Schedule, block_bytes: float) -> int:
    """Pieces the event-level model moves: per chunk, segments x its pieces (:mod:`.piece_rule`)
    (identical chunks counted each; an upper bound on the simulator's streams x pieces)."""
    return _pieces(_chunk_shape(topo, schedule), block_bytes)


def sweep_rows(cases: Sequence[FailureCase], collective: str, sizes: Sequence[int], *,
               model: str = "auto", event_limit: int = DEFAULT_EVENT_LIMIT,
               progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """One row (:data:`ROW_FIELDS`) per case, size and method, simulated on the case's fabric.

    ``model="auto"`` runs the event-level model for a size when every method's
    :func:`piece_count` is within ``event_limit`` (one model per size, so the methods of
    a size compare like for like), the fluid model otherwise; ``"event"``/``"fluid"``
    force one.
    """
    if model not in MODELS:
        raise SimulationError(f"model must be one of {MODELS}, got {model!r}")
    say = progress or (lambda msg: None)
    rows: list[dict[str, Any]] = []
    for case in cases:
        n = case.topo.num_gpus
        factor = bus_factor(collective, n)
        say(f"{collective}/{case.failure}: simulating {len(sizes)} sizes x {len(case.schedules)} methods")
        shapes = [_chunk_shape(case.topo, s) for s in case.schedules.values()] if model == "auto" else []
        for size in sizes:
            count = nccl_count(collective, size, n)
            block = float(count * ELEMENT_BYTES)
            event = model == "event" or (model == "auto" and max(
                _pieces(shape, block) for shape in shapes) <= event_limit)
            for method, sched in case.schedules.items():
                sim = simulate(case.topo, sched, block, fluid=not event)
                algbw = nccl_size(count, n) / sim.completion_s / 1e9
                rows.append({"failure": case.failure, "collective": collective, "method": method,
                             "size": nccl_size(count, n), "count": count, "type": "float",
                             "time_us": sim.completion_s * 1e6, "algbw_GBps": algbw,
                             "busbw_GBps": algbw * factor, "model": "event" if event else "fluid"})
    return rows


def summary_rows(cases: Sequence[FailureCase], collective: str,
                 rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Figure 9 (paper §6.1) at the sweep's largest size: speedups of no re-opt and
    re-opt over the baseline, from the sweep's own rows."""
    out = []
    for case in cases:
        mine = [r for r in rows if r["failure"] == case.failure and r["collective"] == collective]
        if not mine:
            raise SimulationError(f"no sweep rows for {collective}/{case.failure}")
        size = max(r["size"] for r in mine)
        at = {r["method"]: r for r in mine if r["size"] == size}
        algbw = {m: at[m]["algbw_GBps"] for m in (case.baseline, NO_REOPT, REOPT) if m in at}
        row = figure9_row(case, collective, at[REOPT]["count"] * ELEMENT_BYTES, algbw)
        row.update(size=size, model=at[REOPT]["model"])
        out.append(row)
    return out
