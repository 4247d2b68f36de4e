"""Synthesis jobs as Ray tasks: the manager's pool interface on a cluster (docs/scale.md).

Paper §3.1 re-synthesizes every collective a failure hits; at 10,000-100,000 GPUs one
event can need more synthesis than the controller machine has cores.  :class:`RayPool`
has the interface of :class:`~mccl_runtime.pool.SynthesisPool` (``submit`` returning a
:class:`concurrent.futures.Future` of a :data:`~mccl_runtime.pool.JobResult`, ``start``,
``shutdown``) and runs each job as a Ray task on any machine of a Ray cluster
(``ray://HOST:PORT`` or a local instance):

* The fabric and the synthesizer factory are put in the object store once; a worker
  process reads them once and keeps the synthesizer (kernels loaded) for every later job.
* A warm schedule (with its warm state, megabytes at 512+ GPUs) is put in the object store
  once and passed by reference; a job that restarts from the same schedule reuses it.
* A task whose worker process dies is retried (``max_retries``, Ray's own retry of
  system failures); the future completes once, so a version is published at most once.
* A job past its time limit (plus ``grace_s``) is cancelled (its worker is killed) and
  its future fails with :class:`~mccl_opt.errors.SolveError`.

Ray is an optional dependency (``pip install mccl[ray]``), imported only here.
"""

from __future__ import annotations

import os
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
_CACHE: dict[str, Any] = {}


def parse_synthesis(spec: str) -> str | None:
    """``ray`` (a local instance) or ``ray://ADDRESS`` -> the address for ``ray.init``
    (``None``: start one here); raises :class:`MCCLError` for anything else."""
    if spec == "ray":
        return None
    if spec.startswith("ray://") and len(spec) > len("ray://"):
        return spec
    raise MCCLError(f"--synthesis must be 'local', 'ray' or 'ray://HOST:PORT', got {spec[:60]!r}")


def _ray_job(shared: list, kind: str, capacity: np.ndarray, warm: list, time_limit_s: float | None,
             gpus: tuple[str, ...] | None, warm_capacity: np.ndarray | None) -> tuple:
    """A job in a Ray worker: the fabric and synthesizer of ``shared`` (a list holding their
    reference, so Ray does not fetch them per task) loaded once per worker, then
    :func:`mccl_runtime.pool._job` as in a process pool."""
    import ray

    from . import pool

    key = shared[0].hex()
    if _CACHE.get("key") != key:
        topo, factory = ray.get(shared[0])
        pool._WORKER.clear()
        pool._init_worker(topo, factory)
        _CACHE["key"] = key
    schedule = ray.get(warm[0]) if warm else None
    return pool._job(kind, capacity, schedule, time_limit_s, gpus, warm_capacity)


def _pid() -> int:
    time.sleep(0.05)
    return os.getpid()


class RayPool:
    """The pool interface over Ray tasks (module docstring).  ``address``: ``None`` starts
    a local Ray instance (``num_cpus`` CPUs) unless one is already initialised, else a
    ``ray://`` client address; ``factory`` builds the synthesizer in each worker."""

    def __init__(self, topo: Topology, factory: Callable[[], Callable], address: str | None = None,
                 num_cpus: int | None = None, max_retries: int = 1, grace_s: float = 5.0) -> None:
        try:
            import ray
        except ImportError:
            raise SolverNotAvailableError("synthesis on Ray needs the 'ray' package: pip install 'mccl[ray]'") from None
        self._ray = ray
        if not ray.is_initialized():
            kw: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if address is None and num_cpus is not None:
                kw["num_cpus"] = num_cpus
            try:
                ray.init(address=address, **kw)
            except Exception as exc:            # connection refused, bad address: Ray's own types
                raise MCCLError(f"cannot start or reach Ray at {address or 'a local instance'}: "
                                f"{type(exc).__name__}: {str(exc)[:200]}") from None
        self.topo, self.grace_s = topo, grace_s
        self._shared = [ray.put((topo, factory))]
        self._task = ray.remote(max_retries=max_retries, retry_exceptions=False)(_ray_job)
        self._warm: OrderedDict[int, tuple[Schedule, Any]] = OrderedDict()
        self.puts = 0                                   # warm schedules put in the object store
        self._pending: dict[Any, tuple[Future, float]] = {}
        self._lock = threading.Lock()
        self._stop, self._wake = threading.Event(), threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="mccl-ray-pool", daemon=True)
        self._watcher.start()

    def start(self, timeout_s: float | None = 120.0) -> set[int]:
        """Wait until Ray runs tasks (and each worker process can be started); their pids."""
        ray = self._ray
        refs = [ray.remote(_pid).remote() for _ in range(max(1, int(ray.cluster_resources().get("CPU", 1))))]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        if len(ready) < len(refs):
            raise MCCLError(f"Ray workers did not start within {timeout_s} s")
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
        """One job as a Ray task (arguments as :meth:`SynthesisPool.submit`); the future is
        running from the start (a task handed to Ray is not cancelled from here)."""
        future: Future = Future()
        future.set_running_or_notify_cancel()
        ref = self._task.remote(self._shared, kind, np.asarray(capacity, dtype=float), self._warm_ref(warm),
                                time_limit_s, None if gpus is None else tuple(gpus),
                                None if warm_capacity is None else np.asarray(warm_capacity, dtype=float))
        deadline = time.monotonic() + (time_limit_s + self.grace_s if time_limit_s is not None else float("inf"))
        with self._lock:
            self._pending[ref] = (future, deadline)
        self._wake.set()
        return future

    def _watch(self) -> None:
        """Complete futures as their tasks finish; cancel tasks past their deadline."""
        ray = self._ray
        while not self._stop.is_set():
            with self._lock:
                refs = list(self._pending)
            if not refs:
                self._wake.wait(0.5)                    # set by submit and shutdown
                self._wake.clear()
                continue
            ready, _ = ray.wait(refs, num_returns=1, timeout=0.02)
            for ref in ready:
                self._complete(ref)
            now = time.monotonic()
            for ref in refs:
                entry = self._pending.get(ref)
                if entry is not None and now > entry[1] and ref not in ready:
                    ray.cancel(ref, force=True)
                    with self._lock:
                        self._pending.pop(ref, None)
                    entry[0].set_exception(SolveError("the synthesis job ran past its time limit on Ray "
                                                      "and was cancelled"))

    def _complete(self, ref: Any) -> None:
        with self._lock:
            entry = self._pending.pop(ref, None)
        if entry is None:
            return
        try:
            result = self._ray.get(ref)
        except MCCLError as exc:                        # the job's own error (Ray keeps its type)
            entry[0].set_exception(exc)
        except Exception as exc:                        # a worker lost beyond its retries, ...
            entry[0].set_exception(MCCLError(f"synthesis on Ray failed: {type(exc).__name__}: {str(exc)[:200]}"))
        else:
            entry[0].set_result(result)

    def shutdown(self, wait: bool = False) -> None:
        """Stop watching; cancel the tasks still running (``wait``: let them finish first)."""
        if wait:
            with self._lock:
                refs = list(self._pending)
            self._ray.wait(refs, num_returns=len(refs))
        self._stop.set()
        self._wake.set()
        self._watcher.join(5.0)
        with self._lock:
            pending, self._pending = self._pending, {}
        for ref, (future, _) in pending.items():
            self._ray.cancel(ref, force=True)
            future.set_exception(MCCLError("the synthesis pool was shut down"))
