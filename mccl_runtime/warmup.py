"""Compile, or load, every numba kernel a solve can use before the work that is timed.

The numba kernels of both synthesizers, the validator and the simulator are compiled on
first use into numba's on-disk cache (``cache=True``), so only the first process after an
installation compiles them (20-40 s on two cores); every later process still *loads*
them on first use (about a second).  Neither belongs in a solve's ``seconds``: a
controller must not charge it to its reaction to the first gray failure, and ``mccl solve
--warm`` must not look slower than cold because the warm path's kernels load inside it.

A kernel is compiled once per *signature* (argument types and array layouts), and the
paths of a solve call the kernels with different ones, so :func:`load_kernels` runs every
path once, in the :data:`GROUPS` below, on small built-in fabrics (HPN 1x2x4 and 1x2x8,
the AllGather's packing on 16 GPUs takes a branch 8 GPUs do not): AllToAll cold, warm in
memory, warm from a file (with and without its warm state rebuilt), warm from a warm
result (a chain of events), the local re-solve and step bounds; AllGather ForestColl
cold and warm the same ways (and the first schedule of a time-limited solve on large
fabrics); AllGather on
unbalanced fabrics (weaker directions, the balanced restriction, the general column
generation, cold and warm, the symmetric quotient's pricing); step-aware trees; the validator and the simulator (event
and fluid).  ``tests/test_warmup.py`` checks, with numba's compile events, that no solve
on any path compiles after it.  ``mccl warmup`` runs it ahead (``make demo`` does) and
prints one line per group.

Where the cache lives: numba writes it next to the package's sources (``__pycache__``)
or, when that folder is read-only (a system-wide install), under the user's cache
folder (``~/.cache/numba``); set ``NUMBA_CACHE_DIR`` to choose a writable folder
explicitly (e.g. in containers whose home is read-only too).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from mccl_opt.schedule import Schedule
    from mccl_opt.topology import Topology

__all__ = ["load_kernels", "load_kernels_logged", "kernel_collectives", "load_kernels_in_background", "check_kernels_mode", "KERNEL_MODES",
           "COLLECTIVES", "GROUPS", "KernelGroup", "cache_location", "compiling_notice"]

#: When the product synthesizer loads its kernels (``controller serve --kernels``):
#: ``eager`` before it is returned (the first job pays nothing), ``background`` in a daemon
#: thread (a job during the load loads what it needs itself), ``lazy`` never ahead.
KERNEL_MODES = ("eager", "background", "lazy")

COLLECTIVES = ("allgather", "alltoall")

_lock = threading.Lock()


@dataclass(frozen=True)
class KernelGroup:
    """One warm-up step: ``run(backend)`` takes every path of ``label`` once; it is run
    for ``collective`` (``None``: whichever collective is asked for)."""

    key: str
    label: str
    collective: str | None
    run: Callable[[str], None]


def _fabrics() -> tuple[Topology, Topology]:
    """HPN 1x2x4 and 1x2x8 (``instances`` is imported lazily)."""
    from instances import hpn

    return hpn(1, 2, 4), hpn(1, 2, 8)


def _one_way(topo: Topology) -> Topology:
    """``topo`` with GPU 0's NIC degraded in one direction (unbalanced switches)."""
    return topo.with_capacity(src="s0h0g0", dst="s0tor0", gbps=100.0, both_directions=False)


def _from_file(schedule: Schedule) -> Schedule:
    """``schedule`` as a file gives it back: without its warm state."""
    from mccl_opt.schedule import Schedule

    return Schedule.from_dict(schedule.to_dict())


def _warm_every_way(solve: Callable[..., Schedule], topo: Topology, previous: Schedule,
                    healthy: Topology, backend: str) -> None:
    """A warm solve on ``topo`` from ``previous`` (solved on ``healthy``) in memory, read
    back from a file, and from a file with its warm state rebuilt
    (:func:`mccl_opt.restore_warm_state`)."""
    from mccl_opt import restore_warm_state

    on_file = _from_file(previous)
    for warm in (previous, on_file, restore_warm_state(on_file, healthy)):
        solve(topo, warm=warm, backend=backend)


def _warm_chain(solve: Callable[..., Schedule], healthy: Topology, previous: Schedule,
                backend: str) -> None:
    """A chain of events, as the closed loop re-solves them: a NIC halved (warm from
    ``previous``), then down to 1/8 (warm from that warm result, whose state shares its
    routes with the previous one: AllToAll's layered rows, :class:`mccl_opt.alltoall.rows.Rows`)."""
    halved = healthy.with_capacity(src="s0h0g0", dst="s0tor0", gbps=200.0)
    first = solve(halved, warm=previous, backend=backend)
    solve(halved.with_capacity(src="s0h0g0", dst="s0tor0", gbps=50.0), warm=first, backend=backend)


def _alltoall(backend: str) -> None:
    from instances import fail1, fail2
    from mccl_opt.alltoall import solve_alltoall

    for healthy in _fabrics():
        previous = solve_alltoall(healthy, backend=backend)
        solve_alltoall(healthy, backend=backend, max_chunks=None)
        solve_alltoall(healthy, backend=backend, max_steps="min")
        for degraded in (fail1(healthy), fail2(healthy), _one_way(healthy)):
            _warm_every_way(solve_alltoall, degraded, previous, healthy, backend)
        _warm_chain(solve_alltoall, healthy, previous, backend)
        solve_alltoall(fail2(healthy), backend=backend, max_steps=2)


def _forestcoll(backend: str) -> None:
    from instances import fail1, fail2
    from instances.aggregation import shared_aggregation
    from mccl_opt.allgather import solve_allgather

    for healthy in _fabrics():
        previous = solve_allgather(healthy, backend=backend)
        solve_allgather(healthy, backend=backend, max_chunks=None)
        for degraded in (fail1(healthy), fail2(healthy)):
            solve_allgather(degraded, backend=backend)
            _warm_every_way(solve_allgather, degraded, previous, healthy, backend)
        _warm_chain(solve_allgather, healthy, previous, backend)
    # an NVLink at an odd capacity both ways: 1137 exact trees per root, packed scaled,
    # classes cut where they straddle two paths (forestcoll.packing.scaled, .mapping)
    odd = shared_aggregation(2, 1, 8).with_capacity(
        {("s1h0g2", "s1h0nvs"): 36.608, ("s1h0nvs", "s1h0g2"): 36.608})
    solve_allgather(odd, backend=backend, max_chunks=None)
    # a time limit's first schedule above 64 GPUs: the greedy GPU line (its kernels'
    # types do not depend on the size, so a small fabric compiles them)
    from mccl_opt.allgather.first_line import line_trees

    line_trees(_fabrics()[1])
    _greedy_orders()
    _few_trees()
    _exact_split()


def _greedy_orders() -> None:
    """Both orders of ForestColl's greedy packing (:func:`~mccl_opt.allgather.forestcoll.
    packing.trees.greedy_pack`) on two GPUs: the exact path reaches it on fabrics larger
    than the warm-up's (a SuperPOD-like 2x2x8 with a NIC degraded one way compiled it
    inside the first such solve, 6 s of a 7 s cold solve)."""
    import numpy as np

    from mccl_opt.allgather.forestcoll.packing.trees import greedy_pack

    tail, head, units = np.array([0, 1], np.int64), np.array([1, 0], np.int64), np.ones(2, np.int64)
    for widest in (False, True):
        greedy_pack(2, tail, head, units, 1, {0: np.array([-1, 0], np.int64)}, widest)


def _few_trees() -> None:
    """ForestColl's few-trees packing (:func:`~mccl_opt.allgather.forestcoll.packing.
    few_trees.few_trees_pack`) on two GPUs, and on two triangles of GPUs joined by one
    tight link each way (split along them: :mod:`~mccl_opt.allgather.forestcoll.packing.
    contraction`): the exact split reaches it on fabrics larger than the warm-up's
    (SuperPOD 2x4x8 at ``max_chunks=None`` dispatched its kernel with a signature the
    warm-up had not given it: bench/bench_warmup_compiles.py)."""
    import numpy as np

    from mccl_opt.allgather.forestcoll.packing.few_trees import few_trees_pack

    few_trees_pack(2, np.array([0, 1], np.int64), np.array([1, 0], np.int64),
                   np.ones(2, np.int64), 1)
    pairs = [(u, v) for t in (0, 3) for u in range(t, t + 3) for v in range(t, t + 3)
             if u != v] + [(2, 3), (5, 0)]
    tail, head = (np.array([p[i] for p in pairs], np.int64) for i in (0, 1))
    few_trees_pack(6, tail, head, np.array([6] * (len(pairs) - 2) + [3, 3], np.int64), 1)


def _exact_split() -> None:
    """ForestColl's exact split (:func:`~mccl_opt.allgather.forestcoll.removal.exact_split.
    split_all`: a ToR alone, then the NVSwitches guessed in one batch) of HPN 1x2x4, and
    the independence check of the re-weighting to fewer trees (:func:`~mccl_opt.allgather.
    independence.independent_columns`): the exact paths reach them at ``max_chunks=None``
    on fabrics larger than the warm-up's (leaf-spine 8x2x8 with 4 spines)."""
    import numpy as np

    from mccl_opt.allgather.canonical import canonical
    from mccl_opt.allgather.forestcoll.pipeline import balanced_split, phase_one_budget
    from mccl_opt.allgather.forestcoll.removal.exact_split import MAX_GUESSES, split_all
    from mccl_opt.allgather.independence import independent_columns

    topo = canonical(_fabrics()[0])
    budget = phase_one_budget(topo, None, {})
    split = balanced_split(budget.fab, topo.arrays.is_switch, budget.k, budget.y, None).split
    for guesses in (0, MAX_GUESSES):                     # by checks alone, and guessed
        split_all(split.copy(), guesses)
    independent_columns(np.array([0, 1], np.int64), np.array([0, 1, 2], np.int64),
                        np.array([0, 0], np.int64), np.array([2], np.int64), 3)


def _unbalanced(backend: str) -> None:
    """Weaker directions (a one-way NIC; on two segments the repair packer gives up and
    the greedy one packs), the balanced restriction (a one-way NVSwitch lane), the
    general method (capacities whose exact trees explode: seeded with ForestColl's trees,
    and from its own multiplicative-weights start), a warm start from its schedule, and the
    symmetric quotient's certified sparse arborescences."""
    from instances import hpn
    from mccl_opt.allgather import solve_allgather

    for healthy in _fabrics():
        previous = solve_allgather(healthy, backend=backend)
        degraded = _one_way(healthy)
        solve_allgather(degraded, backend=backend)
        _warm_every_way(solve_allgather, degraded, previous, healthy, backend)
    solve_allgather(_one_way(hpn(2, 2, 4)), backend=backend)     # greedy packing, min over sinks
    lane = hpn(1, 2, 8).with_capacity({("s0h0g1", "s0h0nvs"): 360.0})
    solve_allgather(lane, backend=backend, max_chunks=None)
    odd = hpn(1, 2, 4).with_capacity(src="s0h0g1", dst="s0h0nvs", gbps=594.087) \
        .with_capacity(src="s0h1g2", dst="s0tor2", gbps=445.565)
    general = solve_allgather(odd, backend=backend, max_chunks=None)
    solve_allgather(odd.with_capacity(src="s0h0g2", dst="s0h0nvs", gbps=500.0), warm=general,
                    backend=backend, max_chunks=None)
    # the chain seeds ``odd`` with ForestColl's trees and its first master certifies, so
    # nothing is priced there: the general method's own start prices every round
    from mccl_opt.allgather.general.method import solve_general
    from mccl_opt.allgather.general.sparse_arborescence import min_arborescences_sparse
    import numpy as np

    solve_general(odd, backend=backend, max_chunks=None)
    # the symmetric quotient's pricing (fabrics of >= 128 GPUs, too large to solve here)
    min_arborescences_sparse(np.ones((4, 4)), np.arange(2), 1)


def _step_aware(backend: str) -> None:
    from instances import fail2
    from mccl_opt.allgather import solve_allgather

    healthy = _fabrics()[0]
    solve_allgather(healthy, backend=backend, step_aware=True)
    solve_allgather(fail2(healthy), backend=backend, step_aware=True)


def _validate_simulate(backend: str) -> None:
    from instances import fail2
    from mccl_opt.allgather import solve_allgather
    from mccl_opt.alltoall import solve_alltoall
    from mccl_opt.sim import simulate
    from mccl_opt.validate import validate

    topo = fail2(_fabrics()[0])
    for solve in (solve_allgather, solve_alltoall):
        schedule = solve(topo, backend=backend)
        validate(topo, schedule)
        simulate(topo, schedule, 2**20)
        simulate(topo, schedule, 2**20, fluid=True)


#: AllGather's groups first: the test suite's first modules need them (``make test`` warms
#: the cache in a second process while pytest runs, docs/benchmarks.md "Test suite time")
GROUPS: tuple[KernelGroup, ...] = (
    KernelGroup("allgather", "AllGather ForestColl: cold, warm (in memory, from a file)",
                "allgather", _forestcoll),
    KernelGroup("allgather_unbalanced", "AllGather unbalanced switches: weaker directions, "
                "balanced restriction, general method", "allgather", _unbalanced),
    KernelGroup("allgather_step_aware", "AllGather step-aware trees", "allgather", _step_aware),
    KernelGroup("validate_simulate", "validator and simulator", None, _validate_simulate),
    KernelGroup("alltoall", "AllToAll: cold, warm (in memory, from a file), local re-solve, "
                "step bounds", "alltoall", _alltoall),
)

_loaded: set[tuple[str, str]] = set()


def load_kernels(backend: str = "highs", collectives: tuple[str, ...] = COLLECTIVES,
                 on_group: Callable[[KernelGroup], None] | None = None) -> dict[str, float]:
    """Run the :data:`GROUPS` of ``collectives`` (and the shared ones) once per process
    and backend (idempotent, thread-safe); ``on_group`` is called before each group that
    runs.  Returns the seconds this call spent per group key (0.0 for a group already run
    in this process)."""
    chosen = [g for g in GROUPS if g.collective is None or g.collective in collectives]
    spent = {g.key: 0.0 for g in chosen}
    with _lock:
        for group in chosen:
            if (backend, group.key) in _loaded:
                continue
            if on_group is not None:
                on_group(group)
            start = time.perf_counter()
            group.run(backend)
            spent[group.key] = time.perf_counter() - start
            _loaded.add((backend, group.key))
    return spent


def kernel_collectives(kinds: list[str]) -> tuple[str, ...]:
    """The :data:`COLLECTIVES` whose kernels collectives of ``kinds`` need (AllToAll's for
    ``alltoall``, AllGather's for the others: a reduce-scatter is synthesized as an
    AllGather); all of them when ``kinds`` is empty."""
    if not kinds:
        return COLLECTIVES
    return tuple(c for c in COLLECTIVES if any((kind == "alltoall") == (c == "alltoall") for kind in kinds))


def check_kernels_mode(mode: str) -> str:
    """``mode`` if it is one of :data:`KERNEL_MODES`, else a typed error naming them."""
    if mode not in KERNEL_MODES:
        from mccl_opt.errors import MCCLError

        raise MCCLError(f"kernels mode must be one of {', '.join(KERNEL_MODES)}, got {str(mode)[:40]!r}")
    return mode


def load_kernels_logged(backend: str, when: str, after: threading.Event | None = None,
                        collectives: tuple[str, ...] = COLLECTIVES) -> None:
    """:func:`load_kernels` of ``collectives`` once ``after`` (an event: the controller
    serving) is set, logged at info on ``mccl.controller`` with ``when`` and the seconds it took."""
    if after is not None:
        after.wait()
    start = time.perf_counter()
    load_kernels(backend, collectives)
    logging.getLogger("mccl.controller").info("synthesizer kernels loaded %s (%.2f s)", when,
                                              time.perf_counter() - start)


def load_kernels_in_background(backend: str = "highs", after: threading.Event | None = None,
                               collectives: tuple[str, ...] = COLLECTIVES) -> threading.Thread:
    """Start :func:`load_kernels_logged` (``in the background``, once ``after`` is set) in a
    daemon thread named ``mccl-kernels`` and return it; a solve meanwhile loads or compiles
    the kernels it needs itself (numba serializes it)."""
    thread = threading.Thread(target=load_kernels_logged, args=(backend, "in the background", after, collectives),
                              name="mccl-kernels", daemon=True)
    thread.start()
    return thread


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
    print("compiling the synthesizers' numba kernels: once after installation, 20-40 s "
          "(`mccl warmup` does it ahead)...", file=sys.stderr, flush=True)
