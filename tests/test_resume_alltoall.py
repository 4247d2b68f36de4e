"""A controller resumed from its state file warm-starts AllToAll on the local path: the
schedule read back has no solver state, and its first synthesis job rebuilds it from the
chunk paths on the capacities the schedule was synthesized for (docs/runtime.md,
"Warm state after a restart"), in a worker thread or a pool process."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import mccl_opt as mo
from instances import fail2, hpn
from mccl_opt.subfabric import induced
from mccl_runtime.manager import Policy, ScheduleManager
from mccl_runtime.synthesizer import solver_synthesizer
from mccl_runtime.pool import SynthesisPool
from mccl_runtime.state import StateWriter, load_state
from mccl_runtime.telemetry import MeasurementStore

BASE = hpn(1, 2, 8)
FAILED = fail2(BASE)
REL = 1e-6


def _samples(topo, target, t):
    """Link samples moving ``topo``'s capacities to ``target``'s (the changed links)."""
    changed = np.flatnonzero(topo.arrays.capacity != target.arrays.capacity)
    return [{"kind": "link", "src": topo.links[a].src, "dst": topo.links[a].dst,
             "gbps": float(target.arrays.capacity[a]), "t": t} for a in changed.tolist()]


def _manager(pool=None):
    store = MeasurementStore(BASE, alpha=1.0)
    synth = None if pool else solver_synthesizer()
    return store, ScheduleManager(store, synth, Policy(min_dwell_s=0.0), pool=pool)


def _saved_and_resumed(tmp_path, register, pool=None):
    """A manager whose collectives got their baselines, written to a state file and read
    back into a fresh manager (and store)."""
    store, mgr = _manager()
    register(mgr)
    events = mgr.poll(0.0, wait_s=60.0)
    assert {e.action for e in events} == {"published"}
    path = tmp_path / "state.json"
    StateWriter(path, BASE).write(store, mgr, {})
    mgr.close()
    state = load_state(path, BASE)
    store2, mgr2 = _manager(pool)
    store2.restore(state["telemetry"])
    mgr2.restore(state["manager"])
    for d in state["manager"]["collectives"]:       # checked once while loading, not parsed again
        assert mgr2.get(d["comm"], d["name"]).schedule.chunks is d["parsed_schedule"].chunks
    return store2, mgr2


def _fail2(store, mgr, t=10.0):
    store.ingest(_samples(BASE, FAILED, t), now=t)
    started = mgr.step(t)
    events = mgr.poll(t, wait_s=60.0)
    return started, events


def _same_as_cold(topo, sched):
    cold = mo.solve_alltoall(topo)
    mo.validate(topo, sched)
    assert sched.lp_rate_gbps == pytest.approx(cold.lp_rate_gbps, rel=REL)
    assert sched.rate_gbps == pytest.approx(cold.rate_gbps, rel=REL)


def test_a_resumed_controller_warm_starts_alltoall_locally(tmp_path):
    def register(mgr):
        mgr.register("world", "a2a", "alltoall")
        mgr.register("world", "ag", "allgather")

    store, mgr = _saved_and_resumed(tmp_path, register)
    a2a, ag = mgr.get("world", "a2a"), mgr.get("world", "ag")
    assert a2a.version == 1 and a2a.schedule.warm_state is None       # not rebuilt while loading
    np.testing.assert_array_equal(a2a.restore_on, BASE.arrays.capacity)
    assert ag.schedule.warm_state is not None and ag.restore_on is None   # AllGather: at load, as before
    loaded = a2a.schedule

    started, events = _fail2(store, mgr)
    assert [(e.name, e.action) for e in started] == [("a2a", "resynthesis"), ("ag", "resynthesis")]
    assert {(e.name, e.action) for e in events} == {("a2a", "published"), ("ag", "published")}
    assert a2a.version == 2 and a2a.restore_on is None
    assert a2a.schedule.stats["warm_mode"] == "local"
    _same_as_cold(FAILED, a2a.schedule)
    # without the rebuilt state the same warm start does not take the local path
    assert mo.solve_alltoall(FAILED, warm=loaded).stats["warm_mode"] != "local"
    mgr.close()


def test_a_registered_alltoall_schedule_from_a_file_is_restored_in_its_first_job(tmp_path):
    path = tmp_path / "healthy.json"
    mo.solve_alltoall(BASE).save(path)
    store, mgr = _manager()
    mgr.register("world", "a2a", "alltoall", mo.Schedule.load(path))
    coll = mgr.get("world", "a2a")
    np.testing.assert_array_equal(coll.restore_on, BASE.arrays.capacity)
    _, events = _fail2(store, mgr, 1.0)
    assert [e.action for e in events] == ["published"]
    assert coll.schedule.stats["warm_mode"] == "local" and coll.restore_on is None
    mgr.close()


def test_a_resumed_controller_with_a_pool_restores_a_sub_fabric_alltoall_in_the_worker(tmp_path):
    members = list(BASE.gpus[:8]) + [BASE.gpus[8], BASE.gpus[9]]   # host 0 and two GPUs of host 1
    pool = SynthesisPool(BASE, functools.partial(solver_synthesizer, "highs", 10, kernels="lazy"), workers=1)
    pool.start()
    store, mgr = _saved_and_resumed(
        tmp_path, lambda m: m.register("tp", "a2a", "alltoall", gpus=members), pool=pool)
    coll = mgr.get("tp", "a2a")
    assert coll.gpus == tuple(members) and coll.schedule.warm_state is None
    _, events = _fail2(store, mgr)
    assert [e.action for e in events] == ["published"]
    assert coll.schedule.stats["warm_mode"] == "local"
    _same_as_cold(induced(FAILED, members).topology, coll.schedule)
    mgr.close()


def test_the_depth_check_walks_version_file_schedules_once(tmp_path, monkeypatch):
    import json

    from mccl_opt.errors import MCCLError
    from mccl_runtime import state_check

    store, mgr = _manager()
    mgr.register("world", "a2a", "alltoall", mo.solve_alltoall(BASE))
    path = tmp_path / "state.json"
    StateWriter(path, BASE).write(store, mgr, {})
    mgr.close()
    walked = []
    real = state_check.too_deep
    monkeypatch.setattr(state_check, "too_deep", lambda obj, limit: walked.append(obj) or real(obj, limit))
    assert load_state(path, BASE)["manager"]["collectives"][0]["parsed_schedule"].collective == "alltoall"
    assert [c["schedule"] for c in walked[0]["manager"]["collectives"]] == [None]   # read_json bounded it
    data = json.loads(path.read_text())
    deep: list = []
    data["protocol_errors"] = {"x": deep}
    for _ in range(30):
        deep.append([])
        deep = deep[0]
    path.write_text(json.dumps(data))
    with pytest.raises(MCCLError, match="nests deeper than 24"):
        load_state(path, BASE)


def test_capacities_re_based_by_a_no_gain_abort_are_saved(tmp_path):
    from dataclasses import replace

    from mccl_opt.schedule import bottleneck_links, schedule_rate, share_loads

    healthy = mo.solve_alltoall(BASE)

    def same_chunks(kind, topo, warm, time_limit_s):      # nothing better than the current schedule
        loads = share_loads(topo, healthy.chunks)
        rate = schedule_rate(topo, loads)
        return replace(healthy, rate_gbps=rate, lp_rate_gbps=rate, warm_state=None,
                       bottleneck=bottleneck_links(topo, loads, rate, healthy.max_chunks))

    store = MeasurementStore(BASE, alpha=1.0)
    mgr = ScheduleManager(store, same_chunks, Policy(min_dwell_s=0.0))
    mgr.register("world", "a2a", "alltoall", healthy)
    path = tmp_path / "state.json"
    writer = StateWriter(path, BASE)
    writer.write(store, mgr, {})
    _, events = _fail2(store, mgr, 1.0)
    assert [(e.action, e.detail.get("reason")) for e in events] == [("aborted", "no_gain")]
    coll = mgr.get("world", "a2a")
    np.testing.assert_array_equal(coll.synth_capacity, FAILED.arrays.capacity)
    writer.write(store, mgr, {})
    mgr.close()
    state = load_state(path, BASE)
    store2, mgr2 = _manager()
    store2.restore(state["telemetry"])
    mgr2.restore(state["manager"])
    again = mgr2.get("world", "a2a")
    np.testing.assert_array_equal(again.synth_capacity, FAILED.arrays.capacity)
    assert again.version == coll.version == 1
    assert len(list((tmp_path / "state.json.d").iterdir())) == 1
    mgr2.close()
