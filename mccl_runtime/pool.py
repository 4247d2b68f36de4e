"""Synthesis jobs in worker processes: a controller for many communicators (paper §3.1).

A failure in a cluster hits every collective whose schedule crosses the failed link, and
each needs its own warm re-synthesis.  In one controller process these jobs would run one
after another and compete with telemetry for the interpreter; :class:`SynthesisPool` runs
them in ``workers`` processes instead (one job per affected collective), so the
controller's loop only submits jobs and collects results.

* Workers start with the ``forkserver`` method (``spawn`` where there is none), never by
  forking the controller with its sockets and threads.  The forkserver imports the
  synthesis modules (:data:`FORKSERVER_PRELOAD`) once, so each worker is forked with them
  instead of importing them itself (~3 s of CPU per worker).  Each is warmed once: the
  synthesizer factory runs in the worker's initializer (the product synthesizer loads
  the compiled kernels there, :func:`mccl_runtime.warmup.load_kernels`), and
  :meth:`SynthesisPool.start` waits until every worker has done so.
* The fabric goes to each worker once, at start; a job sends only the capacities it is
  synthesized for (one float per link), the collective's kind, the warm schedule and the
  time limit, and for a communicator over a sub-fabric its members.  A worker builds the
  measured topology once per capacities and communicator fabric (the jobs of one failure
  share it), and each member list's sub-fabric (:func:`mccl_opt.subfabric.induced`) once.
* The worker synthesizes, validates (:func:`mccl_opt.validate.validate`) and profiles the
  result for Algorithm 1 (:func:`mccl_runtime.drift.profile_schedule`), so none of this
  runs in the controller.  A result comes back pickled: the schedule with its warm state
  (the next failure's warm start) and its profile arrays.
* A job is a :class:`concurrent.futures.Future`.  A queued job can be cancelled (the
  manager does so when the capacities move on before it starts); a running one cannot,
  and its result is discarded when it arrives if it is stale (docs/runtime.md, "Races").
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any, Callable

import numpy as np

from mccl_opt.errors import MCCLError, SolveError
from mccl_opt.schedule import Schedule
from mccl_opt.topology import Topology

from .drift import ScheduleProfile, profile_schedule

__all__ = ["SynthesisPool", "JobResult", "job_result"]

#: what a job returns: the schedule, the seconds it took and its Algorithm 1 profile
JobResult = tuple[Schedule, float, ScheduleProfile]

#: modules the forkserver imports before it forks the first worker (only a forkserver
#: this process has not started yet takes them)
FORKSERVER_PRELOAD = ("mccl_runtime.pool", "mccl_runtime.synthesizer", "mccl_opt.allgather",
                      "mccl_opt.alltoall")

_WORKER: dict[str, Any] = {}


def _init_worker(topo: Topology, factory: Callable[[], Callable]) -> None:
    """Worker initializer: keep the fabric and build the synthesizer (kernels load here)."""
    _WORKER["topo"] = topo
    _WORKER["synthesize"] = factory()


def _ready() -> int:
    """A no-op job: the worker's pid once its initializer has run."""
    time.sleep(0.05)                # long enough that each worker of the pool takes one
    return os.getpid()


def run_job(topo: Topology, synthesize: Callable, kind: str, warm: Schedule | None,
            time_limit_s: float | None, warm_fabric: Topology | None = None,
            clock: Callable[[], float] = time.perf_counter) -> JobResult:
    """Synthesize on ``topo``, validate and profile; what a worker (or a thread) runs.
    ``warm_fabric``: an AllToAll ``warm`` read from a file gets its warm state rebuilt on
    it first (:func:`mccl_opt.alltoall.restore_warm_state`; counted in the seconds).  The
    seconds are read on ``clock`` (wall time; ``time.process_time`` counts the process's
    CPU time instead, which other processes' load does not inflate)."""
    from mccl_opt.validate import validate

    t0 = clock()
    if warm is not None and warm_fabric is not None:
        from mccl_opt import restore_warm_state

        warm = restore_warm_state(warm, warm_fabric)
    schedule = synthesize(kind, topo, warm, time_limit_s)
    if not isinstance(schedule, Schedule):
        raise SolveError(f"the synthesizer returned {type(schedule).__name__}, not a schedule")
    validate(topo, schedule)            # an invalid result is a ``failed`` job, never published
    seconds = clock() - t0
    return schedule, seconds, profile_schedule(topo, schedule)


def _fabric(capacity: np.ndarray, gpus: tuple[str, ...] | None) -> Topology:
    """The fabric, or the sub-fabric ``gpus`` induce (built once), under ``capacity``."""
    from mccl_opt.subfabric import induced

    if gpus is None:
        return _WORKER["topo"].with_capacities(capacity)
    fabrics = _WORKER.setdefault("fabrics", {})
    if gpus not in fabrics:
        fabrics[gpus] = induced(_WORKER["topo"], gpus)
    return fabrics[gpus].measured(capacity)


def _job(kind: str, capacity: np.ndarray, warm: Schedule | None, time_limit_s: float | None,
         gpus: tuple[str, ...] | None = None, warm_capacity: np.ndarray | None = None) -> JobResult:
    key = capacity.tobytes()
    last = _WORKER.get("measured")
    if last is None or last[0] != key:             # the jobs of one failure share their fabric
        last = _WORKER["measured"] = (key, {})
    topo = last[1].get(gpus)
    if topo is None:
        topo = last[1][gpus] = _fabric(capacity, gpus)
    warm_fabric = None if warm_capacity is None else _fabric(warm_capacity, gpus)
    return run_job(topo, _WORKER["synthesize"], kind, warm, time_limit_s, warm_fabric)


def job_result(future: Future) -> JobResult:
    """A finished job's ``(schedule, seconds, profile)``.  Anything else a job returned,
    and any exception but an :class:`~mccl_opt.errors.MCCLError` or a dead worker
    (``BrokenExecutor``, re-raised as is), is a :class:`~mccl_opt.errors.SolveError`:
    a synthesizer's bug fails its job, never the controller's loop."""
    from concurrent.futures import BrokenExecutor

    try:
        result = future.result()
    except (MCCLError, BrokenExecutor):
        raise
    except Exception as exc:
        raise SolveError(f"the synthesis job raised {type(exc).__name__}: {str(exc)[:200]}") from None
    if not (isinstance(result, tuple) and len(result) == 3 and isinstance(result[0], Schedule)
            and isinstance(result[1], float) and isinstance(result[2], ScheduleProfile)):
        raise SolveError(f"a synthesis job returned {type(result).__name__}, not (schedule, seconds, profile)")
    return result


class SynthesisPool:
    """``workers`` synthesis processes for ``topo`` (module docstring).

    ``factory`` builds the synthesizer in each worker and must be picklable (a module-level
    function, or :func:`functools.partial` of one), e.g.
    ``functools.partial(solver_synthesizer, "highs", 10)``.
    """

    def __init__(self, topo: Topology, factory: Callable[[], Callable], workers: int = 2,
                 start_method: str | None = None) -> None:
        if workers < 1:
            raise MCCLError(f"a synthesis pool needs at least 1 worker, got {workers}")
        methods = multiprocessing.get_all_start_methods()
        method = start_method or ("forkserver" if "forkserver" in methods else "spawn")
        if method not in methods:
            raise MCCLError(f"start method {method!r} is not available here; use one of {methods}")
        context = multiprocessing.get_context(method)
        if method == "forkserver":
            context.set_forkserver_preload(list(FORKSERVER_PRELOAD))
        self.topo = topo
        self.workers = workers
        self._executor = ProcessPoolExecutor(workers, mp_context=context,
                                             initializer=_init_worker, initargs=(topo, factory))

    def start(self, timeout_s: float | None = 120.0) -> set[int]:
        """Start every worker and wait until each has built its synthesizer; their pids."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pids: set[int] = set()
        while len(pids) < self.workers:      # a worker still in its initializer takes no job yet
            left = None if deadline is None else deadline - time.monotonic()
            futures = [self._executor.submit(_ready) for _ in range(self.workers)]
            done, pending = wait_futures(futures, timeout=left)
            if pending or (left is not None and left <= 0):
                raise MCCLError(f"synthesis workers did not start within {timeout_s} s")
            pids.update(f.result() for f in done)
        return pids

    def submit(self, kind: str, capacity: np.ndarray, warm: Schedule | None,
               time_limit_s: float | None, gpus: tuple[str, ...] | None = None,
               warm_capacity: np.ndarray | None = None) -> Future:
        """One synthesis job on the fabric with ``capacity`` (Gbps per link), or on the
        sub-fabric the members ``gpus`` induce in it; its future gives a :data:`JobResult`
        (the profile on the job's own fabric's links).  ``warm_capacity``: the capacities
        an AllToAll ``warm`` read from a file was synthesized for (its warm state is
        rebuilt on them in the worker, :func:`run_job`)."""
        return self._executor.submit(_job, kind, np.asarray(capacity, dtype=float), warm, time_limit_s,
                                     None if gpus is None else tuple(gpus),
                                     None if warm_capacity is None else np.asarray(warm_capacity, dtype=float))

    def shutdown(self, wait: bool = False) -> None:
        """Cancel queued jobs and stop the workers (``wait``: after running jobs finish)."""
        self._executor.shutdown(wait=wait, cancel_futures=True)
