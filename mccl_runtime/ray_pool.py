"""Synthesis jobs on long-lived Ray actors: the manager's pool interface on a cluster (docs/scale.md).

Paper §3.1 re-synthesizes every collective a failure hits; at 10,000-100,000 GPUs one
event can need more synthesis than the controller machine has cores.  :class:`RayPool`
has the interface of :class:`~mccl_runtime.pool.SynthesisPool` (``submit`` returning a
:class:`concurrent.futures.Future` of a :data:`~mccl_runtime.pool.JobResult`, ``start``,
``shutdown``) and runs each job on one of ``actors`` Ray actors (one per CPU of the
cluster by default; ``ray://HOST:PORT`` or a local instance):

* Each actor loads the fabric and builds the synthesizer (kernels loaded) once, when it
  starts; a job goes to the actor with the fewest jobs in flight.  An actor is a warm
  process with an open call channel, so a job costs one actor call, not a task placement
  and a worker lease (the per-job overhead measured in docs/scale.md "Synthesis on Ray").
* A warm schedule (with its warm state, megabytes at 512+ GPUs) is put in the object store
  once and passed by reference; each actor deserializes it once (:data:`ACTOR_WARM_CACHE`).
* A local instance started here inlines results up to ``inline_result_bytes`` in the
  reply (Ray's ``max_direct_call_object_size``) instead of a store round trip.
* An actor whose process dies is restarted and its job retried once (``max_task_retries``);
  the future completes once (from the retry), so a version is published at most once.
* A job past its time limit (plus ``grace_s``) fails with :class:`~mccl_opt.errors.SolveError`
  and its actor is killed and restarted (Ray cannot interrupt an actor call); a retry of
  that job after its deadline returns at once without solving (the deadline is wall
  time, so clocks of the cluster's machines must agree within ``grace_s``); another job
  queued on that actor is retried on its restart, which uses its one retry.

Ray is an optional dependency (``pip install mccl[ray]``), imported only here.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any, Callable

import numpy as np

from mccl_opt.errors import MCCLError, SolveError, SolverNotAvailableError
from mccl_opt.schedule import Schedule
from mccl_opt.topology import Topology

__all__ = ["RayPool", "parse_synthesis"]

#: warm schedules kept in the object store (the latest ones submitted)
MAX_WARM_REFS = 256
#: deserialized warm schedules an actor keeps (the latest ones it was given)
ACTOR_WARM_CACHE = 8


def parse_synthesis(spec: str) -> str | None:
    """``ray`` (a local instance) or ``ray://ADDRESS`` -> the address for ``ray.init``
    (``None``: start one here); raises :class:`MCCLError` for anything else."""
    if spec == "ray":
        return None
    if spec.startswith("ray://") and len(spec) > len("ray://"):
        return spec
    raise MCCLError(f"--synthesis must be 'local', 'ray' or 'ray://HOST:PORT', got {spec[:60]!r}")


class _Synthesizer:
    """A Ray actor: the fabric and synthesizer of ``shared`` (a list holding their reference,
    read when the actor starts or restarts), then :func:`mccl_runtime.pool._job` per call."""

    def __init__(self, shared: list) -> None:
        import ray

        from . import pool

        pool._WORKER.clear()
        pool._init_worker(*ray.get(shared[0]))
        self._warm: OrderedDict[str, Schedule] = OrderedDict()

    def pid(self) -> int:
        import os

        return os.getpid()

    def job(self, kind: str, capacity: np.ndarray, warm: list, time_limit_s: float | None,
            gpus: tuple[str, ...] | None, warm_capacity: np.ndarray | None, deadline: float) -> tuple:
        """One job; ``deadline`` (``time.time()``): a retry that starts after it (its first
        attempt was cancelled at the deadline) returns at once."""
        import ray

        from . import pool

        if time.time() > deadline:
            raise SolveError("the synthesis job started after its time limit on Ray")
        schedule = None
        if warm:
            key = warm[0].hex()
            schedule = self._warm.get(key)
            if schedule is None:
                schedule = self._warm[key] = ray.get(warm[0])
                while len(self._warm) > ACTOR_WARM_CACHE:
                    self._warm.popitem(last=False)
            self._warm.move_to_end(key)
        return pool._job(kind, capacity, schedule, time_limit_s, gpus, warm_capacity)


class RayPool:
    """The pool interface over Ray actors (module docstring).  ``address``: ``None`` starts
    a local Ray instance (``num_cpus`` CPUs) unless one is already initialised, else a
    ``ray://`` client address; ``factory`` builds the synthesizer in each actor;
    ``actors``: how many (default: the cluster's CPUs), each holding one CPU."""

    def __init__(self, topo: Topology, factory: Callable[[], Callable], address: str | None = None,
                 num_cpus: int | None = None, max_retries: int = 1, grace_s: float = 5.0,
                 actors: int | None = None, inline_result_bytes: int = 8 << 20) -> None:
        try:
            import ray
        except ImportError:
            raise SolverNotAvailableError("synthesis on Ray needs the 'ray' package: pip install 'mccl[ray]'") from None
        self._ray = ray
        if not ray.is_initialized():
            kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if address is None:
                if num_cpus is not None:
                    kw["num_cpus"] = num_cpus
                if inline_result_bytes > 0:
                    kw["_system_config"] = {"max_direct_call_object_size": int(inline_result_bytes)}
            try:
                ray.init(address=address, **kw)
            except Exception as exc:            # connection refused, bad address: Ray's own types
                raise MCCLError(f"cannot start or reach Ray at {address or 'a local instance'}: "
                                f"{type(exc).__name__}: {str(exc)[:200]}") from None
        self.topo, self.grace_s = topo, grace_s
        count = actors if actors is not None else max(1, int(ray.cluster_resources().get("CPU", 1)))
        if count < 1:
            raise MCCLError(f"a Ray pool needs at least one actor, got {count}")
        self._shared = [ray.put((topo, factory))]        # kept: a restarted actor reads it again
        cls = ray.remote(num_cpus=1, max_restarts=-1, max_task_retries=max_retries)(_Synthesizer)
        self._actors = [cls.remote(self._shared) for _ in range(count)]
        self._busy = [0] * count                        # jobs in flight per actor
        self._warm: OrderedDict[int, tuple[Schedule, Any]] = OrderedDict()
        self.puts = 0                                   # warm schedules put in the object store
        self._pending: dict[int, tuple[Future, int, Any]] = {}    # job -> (future, actor, ref)
        self._deadlines: list[tuple[float, int]] = []   # heap of (monotonic deadline, job)
        self._next = 0
        self._lock = threading.Lock()
        self._stop, self._wake = threading.Event(), threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="mccl-ray-pool", daemon=True)
        self._watcher.start()

    def start(self, timeout_s: float | None = 120.0) -> set[int]:
        """Wait until every actor has loaded the fabric and synthesizer; their pids."""
        ray = self._ray
        refs = [a.pid.remote() for a in self._actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if len(ready) < len(refs):
            raise MCCLError(f"Ray actors did not start within {timeout_s} s "
                            f"({len(ready)} of {len(refs)}; each needs one free CPU)")
        return set(ray.get(ready))

    def _warm_ref(self, warm: Schedule | None) -> list:
        """``[reference]`` of ``warm`` in the object store (put once), or ``[]``."""
        if warm is None:
            return []
        hit = self._warm.get(id(warm))
        if hit is None or hit[0] is not warm:
            hit = self._warm[id(warm)] = (warm, self._ray.put(warm))
            self.puts += 1
            while len(self._warm) > MAX_WARM_REFS:
                self._warm.popitem(last=False)
        self._warm.move_to_end(id(warm))
        return [hit[1]]

    def submit(self, kind: str, capacity: np.ndarray, warm: Schedule | None, time_limit_s: float | None,
               gpus: tuple[str, ...] | None = None, warm_capacity: np.ndarray | None = None) -> Future:
        """One job on the least busy actor (arguments as :meth:`SynthesisPool.submit`); the
        future is running from the start (a call handed to Ray is not cancelled from here)."""
        future: Future = Future()
        future.set_running_or_notify_cancel()
        budget = time_limit_s + self.grace_s if time_limit_s is not None else float("inf")
        with self._lock:
            actor = min(range(len(self._actors)), key=self._busy.__getitem__)
            self._busy[actor] += 1
            job, self._next = self._next, self._next + 1
            ref = self._actors[actor].job.remote(
                kind, np.asarray(capacity, dtype=float), self._warm_ref(warm), time_limit_s,
                None if gpus is None else tuple(gpus),
                None if warm_capacity is None else np.asarray(warm_capacity, dtype=float), time.time() + budget)
            self._pending[job] = (future, actor, ref)
            if budget != float("inf"):
                heapq.heappush(self._deadlines, (time.monotonic() + budget, job))
                self._wake.set()
        ref.future().add_done_callback(lambda done: self._complete(job, done))
        return future

    def _finish(self, job: int) -> tuple[Future, int, Any] | None:
        with self._lock:
            entry = self._pending.pop(job, None)
            if entry is not None:
                self._busy[entry[1]] -= 1
        return entry

    def _complete(self, job: int, done: Future) -> None:
        """Ray's callback when a job's call finished (its result or error)."""
        entry = self._finish(job)
        if entry is None:                               # cancelled at its deadline, or shut down
            return
        exc = done.exception()
        if exc is None:
            entry[0].set_result(done.result())
        elif isinstance(exc, MCCLError):                # the job's own error (Ray keeps its type)
            entry[0].set_exception(exc)
        else:                                           # an actor lost beyond its retries, ...
            entry[0].set_exception(MCCLError(f"synthesis on Ray failed: {type(exc).__name__}: {str(exc)[:200]}"))

    def _watch(self) -> None:
        """Fail jobs past their deadline and restart their actors."""
        while not self._stop.is_set():
            with self._lock:
                while self._deadlines and self._deadlines[0][1] not in self._pending:
                    heapq.heappop(self._deadlines)      # finished before its deadline
                wait = self._deadlines[0][0] - time.monotonic() if self._deadlines else None
            if wait is None or wait > 0:
                self._wake.wait(wait)                   # set by submit and shutdown
                self._wake.clear()
                continue
            with self._lock:
                _, job = heapq.heappop(self._deadlines)
            entry = self._finish(job)
            if entry is not None:
                self._ray.kill(self._actors[entry[1]], no_restart=False)
                entry[0].set_exception(SolveError("the synthesis job ran past its time limit on Ray "
                                                  "and was cancelled"))

    def shutdown(self, wait: bool = False) -> None:
        """Stop the actors; fail the jobs still running (``wait``: let them finish first)."""
        if wait:
            with self._lock:
                refs = [entry[2] for entry in self._pending.values()]
            self._ray.wait(refs, num_returns=len(refs))
        self._stop.set()
        self._wake.set()
        self._watcher.join(5.0)
        with self._lock:
            pending, self._pending = self._pending, {}
        for actor in self._actors:
            self._ray.kill(actor, no_restart=True)
        for future, _, _ in pending.values():
            future.set_exception(MCCLError("the synthesis pool was shut down"))
