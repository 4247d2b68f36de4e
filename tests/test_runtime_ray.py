"""Synthesis on Ray (mccl_runtime.ray_pool.RayPool): the manager's pool tests on a local Ray
instance, a killed worker costs one retry and no lost or duplicated version, the time limit
is enforced, and a warm schedule goes to the object store once."""

from __future__ import annotations

import functools
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

import mccl_opt as mo
from instances import fail2
from mccl_opt.baselines import ring_allgather
from mccl_opt.errors import SolveError
from mccl_runtime.manager import Policy, ScheduleManager
from mccl_runtime.synthesizer import solver_synthesizer
from mccl_runtime.telemetry import MeasurementStore
from tests.test_runtime_pool import TOPO, _degrade, _run_until_idle

ray = pytest.importorskip("ray")
from mccl_runtime.ray_pool import RayPool, parse_synthesis  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def recording(path: str, delay_s: float):
    """Synthesizer factory: each call appends its worker's pid to ``path``, then sleeps
    ``delay_s`` and solves the AllGather."""
    def synthesize(kind, topo, warm, time_limit_s):
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(delay_s)
        return mo.solve_allgather(topo)
    return synthesize


def test_fail2_resynthesized_on_ray_matches_in_process():
    """The pool test of mccl_runtime.pool on Ray: collectives hit by Fail2 each get a Ray
    task, and every new version has the rate an in-process warm solve reaches."""
    pool = RayPool(TOPO, functools.partial(solver_synthesizer, "highs", 10, kernels="lazy"))
    assert pool.start() and os.getpid() not in pool.start()
    store = MeasurementStore(TOPO, alpha=1.0)
    mgr = ScheduleManager(store, policy=Policy(min_dwell_s=0.0), pool=pool)
    healthy = {"allgather": mo.solve_allgather(TOPO), "alltoall": mo.solve_alltoall(TOPO)}
    for i, kind in enumerate(("allgather", "alltoall")):
        mgr.register(f"comm{i}", kind, kind, healthy[kind])
    _degrade(store, "s0h0g0", "s0tor0", 50.0, 1.0)
    assert sum(e.action == "resynthesis" for e in mgr.step(2.0)) == 2
    events = _run_until_idle(mgr, 3.0)
    assert sorted(e.comm for e in events if e.action == "published") == ["comm0", "comm1"]
    degraded = fail2(TOPO)
    for coll in mgr.collectives():
        assert coll.version == 2
        mo.validate(degraded, coll.schedule)
        want = (mo.solve_allgather if coll.kind == "allgather" else mo.solve_alltoall)(
            degraded, warm=healthy[coll.kind])
        assert coll.schedule.lp_rate_gbps == pytest.approx(want.lp_rate_gbps, rel=1e-6)
        assert coll.schedule.warm_state is not None
    assert pool.puts == 2                       # one warm schedule per collective, put once
    mgr.close()


def test_killed_worker_costs_one_retry_and_no_lost_or_duplicated_version(tmp_path: Path):
    log = tmp_path / "pids"
    pool = RayPool(TOPO, functools.partial(recording, str(log), 1.5))
    store = MeasurementStore(TOPO, alpha=1.0)
    mgr = ScheduleManager(store, policy=Policy(min_dwell_s=0.0, time_limit_s=60.0), pool=pool)
    mgr.register("world", "ag", "allgather", ring_allgather(TOPO))      # beaten after Fail2
    _degrade(store, "s0h0g0", "s0tor0", 50.0, 1.0)
    assert [e.action for e in mgr.step(2.0)] == ["resynthesis"]
    deadline = time.monotonic() + 30.0
    while not (log.exists() and log.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(int(log.read_text().split()[0]), signal.SIGKILL)       # the worker, mid-job
    events = _run_until_idle(mgr, 3.0)
    attempts = log.read_text().split()
    assert len(attempts) == 2 and attempts[0] != attempts[1]     # one retry, in another process
    assert [e.version for e in events if e.action == "published"] == [2]
    assert mgr.get("world", "ag").version == 2
    mgr.close()


def test_time_limit_cancels_the_job_and_its_retry_does_not_solve(tmp_path: Path):
    log = tmp_path / "pids"
    pool = RayPool(TOPO, functools.partial(recording, str(log), 30.0), grace_s=0.5, actors=1)
    first = pool.start()
    t0 = time.monotonic()
    future = pool.submit("allgather", TOPO.arrays.capacity, None, 0.5)
    with pytest.raises(SolveError, match="time limit"):
        future.result(timeout=20.0)
    assert time.monotonic() - t0 < 15.0
    restarted = pool.start()                # answers after Ray's retry of the killed call ran
    assert restarted != first and len(log.read_text().split()) == 1   # the retry did not solve
    pool.shutdown()


def test_jobs_go_to_the_least_busy_actor(tmp_path: Path):
    log = tmp_path / "pids"
    pool = RayPool(TOPO, functools.partial(recording, str(log), 0.5), actors=2)
    pids = pool.start()
    futures = [pool.submit("allgather", TOPO.arrays.capacity, None, 60.0) for _ in range(2)]
    for f in futures:
        mo.validate(TOPO, f.result(timeout=60.0)[0])
    assert set(map(int, log.read_text().split())) == pids        # one job on each actor
    pool.shutdown()


def test_synthesis_spec():
    assert parse_synthesis("ray") is None and parse_synthesis("ray://10.0.0.1:10001") == "ray://10.0.0.1:10001"
    with pytest.raises(mo.MCCLError, match="--synthesis"):
        parse_synthesis("dask://x")
