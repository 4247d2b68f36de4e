"""Synthesis jobs in worker processes (:class:`mccl_runtime.pool.SynthesisPool`): one job per
affected collective, the same optimum as in-process synthesis, the loop never waits for a
job, and stale jobs are cancelled while queued or discarded when they finish."""

from __future__ import annotations

import functools
import os
import time

import numpy as np
import pytest

import mccl_opt as mo
from instances import fail2, hpn
from mccl_opt.baselines import direct_alltoall, ring_allgather
from mccl_runtime.manager import Policy, ScheduleManager
from mccl_runtime.synthesizer import solver_synthesizer
from mccl_runtime.pool import SynthesisPool
from mccl_runtime.telemetry import MeasurementStore

TOPO = hpn(1, 2, 4)


def slow_baseline(delay_s: float):
    """Synthesizer factory for the workers: the NCCL-style baseline after ``delay_s``."""
    def synthesize(kind, topo, warm, time_limit_s):
        time.sleep(delay_s)
        return ring_allgather(topo) if kind == "allgather" else direct_alltoall(topo)
    return synthesize


def _degrade(store: MeasurementStore, src: str, dst: str, gbps: float, t: float) -> None:
    links = [TOPO.link_index(src, dst), TOPO.link_index(dst, src)]
    store.ingest_links(np.array(links), np.array([t, t]), np.array([gbps, gbps]))


def _run_until_idle(mgr: ScheduleManager, now: float, limit_s: float = 60.0) -> list:
    events, deadline = [], time.monotonic() + limit_s
    while mgr.busy() and time.monotonic() < deadline:
        events += mgr.poll(now, wait_s=0.05)
    assert not mgr.busy(), "jobs did not finish"
    return events


def test_fail2_resynthesized_in_two_worker_processes_matches_in_process():
    """Four collectives hit by Fail2 at once: each gets its own job in the pool, and every new
    version has the rate an in-process warm solve reaches on the degraded fabric."""
    pool = SynthesisPool(TOPO, functools.partial(solver_synthesizer, "highs", 10, kernels="lazy"), workers=2)
    pids = pool.start()
    assert len(pids) == 2 and os.getpid() not in pids
    store = MeasurementStore(TOPO, alpha=1.0)
    mgr = ScheduleManager(store, policy=Policy(min_dwell_s=0.0), pool=pool)
    healthy = {"allgather": mo.solve_allgather(TOPO), "alltoall": mo.solve_alltoall(TOPO)}
    for i in range(4):
        kind = ("allgather", "alltoall")[i % 2]
        mgr.register(f"comm{i}", kind, kind, healthy[kind])
    _degrade(store, "s0h0g0", "s0tor0", 50.0, 1.0)
    started = mgr.step(2.0)
    assert sorted(e.comm for e in started if e.action == "resynthesis") == [f"comm{i}" for i in range(4)]
    events = _run_until_idle(mgr, 3.0)
    assert sorted(e.comm for e in events if e.action == "published") == [f"comm{i}" for i in range(4)]
    degraded = fail2(TOPO)
    for coll in mgr.collectives():
        assert coll.version == 2
        mo.validate(degraded, coll.schedule)
        want = (mo.solve_allgather if coll.kind == "allgather" else mo.solve_alltoall)(
            degraded, warm=healthy[coll.kind])
        assert coll.schedule.lp_rate_gbps == pytest.approx(want.lp_rate_gbps, rel=1e-6)
        assert coll.schedule.warm_state is not None          # the next failure starts warm again
    mgr.close()


def test_queued_jobs_are_cancelled_and_running_ones_discarded_when_m_moves():
    """One slow worker, six flagged collectives.  While the first job runs, the loop keeps
    deciding, and a second failure arrives: jobs still queued are dropped before they start
    (``superseded``, ``queued``; the executor hands up to two jobs ahead to the worker's
    queue, and those can no longer be cancelled), the ones already handed over are discarded when
    they return, and every collective is decided once, on the latest capacities."""
    pool = SynthesisPool(TOPO, functools.partial(slow_baseline, 0.3), workers=1)
    pool.start()
    store = MeasurementStore(TOPO, alpha=1.0)
    mgr = ScheduleManager(store, policy=Policy(min_dwell_s=0.0), pool=pool)
    comms = [f"comm{i}" for i in range(6)]
    for comm in comms:
        mgr.register(comm, "ag", "allgather", ring_allgather(TOPO))
    _degrade(store, "s0h0g0", "s0tor0", 50.0, 1.0)
    assert len(mgr.step(2.0)) == 6
    while not any(c.job.wall_start for c in mgr.collectives()):
        mgr.poll(2.0, wait_s=0.02)
    assert not mgr.step(2.1)                             # the loop returns while the job runs
    assert all(c.job is not None and not c.job.future.done() for c in mgr.collectives())
    _degrade(store, "s0h1g1", "s0tor1", 20.0, 2.2)                 # below the first: it costs the running jobs rate
    dropped = mgr.poll(2.3)
    queued = [e for e in dropped if e.action == "superseded" and e.detail.get("queued")]
    assert queued and sum(e.action == "resynthesis" for e in dropped) == len(queued)
    events = _run_until_idle(mgr, 3.0)
    finished = [e for e in events if e.action == "superseded"]
    assert finished and not any(e.detail.get("queued") for e in finished)   # discarded on return
    assert len(queued) + len(finished) == len(comms)
    # the baseline is no faster than the active ring: each ends in one no-gain abort, whose
    # capacities (what drift is measured from next) are the latest ones
    ends = [e for e in events if e.action in ("published", "aborted")]
    assert sorted(e.comm for e in ends) == comms and {e.detail.get("reason") for e in ends} == {"no_gain"}
    for coll in mgr.collectives():
        assert np.array_equal(coll.synth_capacity, store.measured())
    mgr.close()


def test_queued_job_aborted_when_the_failure_clears():
    """A failure that clears while jobs wait: the queued ones are aborted (``cleared``) before
    they start, the handed-over ones when they return; no version is published."""
    pool = SynthesisPool(TOPO, functools.partial(slow_baseline, 0.3), workers=1)
    pool.start()
    store = MeasurementStore(TOPO, alpha=1.0)
    mgr = ScheduleManager(store, policy=Policy(min_dwell_s=0.0), pool=pool)
    for i in range(6):
        mgr.register(f"comm{i}", "ag", "allgather", ring_allgather(TOPO))
    _degrade(store, "s0h0g0", "s0tor0", 50.0, 1.0)
    assert len(mgr.step(2.0)) == 6
    _degrade(store, "s0h0g0", "s0tor0", 400.0, 2.1)     # cleared before the second job starts
    events = mgr.poll(2.2) + _run_until_idle(mgr, 3.0)
    aborted = [e for e in events if e.action == "aborted"]
    assert {e.detail["reason"] for e in aborted} == {"cleared"} and len(aborted) == 6
    assert any(e.detail.get("queued") for e in aborted)
    assert all(c.version == 1 for c in mgr.collectives())
    mgr.close()


def test_service_with_a_pool_publishes_versions_synthesized_in_a_worker():
    """``ControllerService(pool=...)`` (``mccl controller serve --workers``): the first
    schedule and the re-synthesis after a failure come from the worker process."""
    from mccl_runtime.client import ControllerClient
    from tests.test_runtime_manager import TOPO as SMALL
    from tests.test_runtime_manager import PruningSynth
    from tests.test_runtime_service import Server, _degraded

    pool = SynthesisPool(SMALL, PruningSynth, workers=1)
    pool.start()
    server = Server(pool=pool)
    with server as svc, ControllerClient(svc.endpoint, timeout_s=5.0) as cli:
        sub = cli.subscribe()
        assert sub.wait_connected(5.0)
        assert cli.register("world", "ag", "allgather") == ["ag"]
        assert sub.recv(10.0)[:3] == ("world", "ag", 1)
        cli.push_telemetry(_degraded(time.time()))
        upd = sub.recv(10.0)
        assert upd is not None and upd[:3] == ("world", "ag", 2)
        nic = SMALL.link_index("s0h0g0", "s0tor0")
        assert svc.manager.get("world", "ag").profile.n[nic] == 0      # the new trees avoid the failed NIC
    assert server.synth.calls == []                 # the in-process synthesizer never ran


def test_workers_fork_from_a_forkserver_that_imported_the_synthesis_modules():
    """A pool's forkserver preloads the synthesis modules (each worker would otherwise
    import them itself, ~3 s of CPU); a misspelt name would be skipped there silently."""
    import importlib
    from multiprocessing import forkserver

    from mccl_runtime.pool import FORKSERVER_PRELOAD

    SynthesisPool(TOPO, functools.partial(slow_baseline, 0.0), workers=1).shutdown()
    assert set(FORKSERVER_PRELOAD) <= set(forkserver._forkserver._preload_modules)
    for name in FORKSERVER_PRELOAD:
        importlib.import_module(name)
