"""One controller for a job's communicators over sub-fabrics (docs/runtime.md,
"Communicators over sub-fabrics"): tensor-, data- and expert-parallel groups of one
measured fabric, each synthesized on the fabric its members induce.  A drift
re-synthesizes only the communicators whose sub-fabric holds the link, their new
schedules are valid on their sub-fabrics and reach the optimum of a cold solve there,
and member lists are checked with typed errors."""

from __future__ import annotations

import functools
import time

import numpy as np
import pytest

import mccl_opt as mo
from instances import fail2, hpn
from mccl_opt.errors import TopologyError
from mccl_opt.subfabric import induced
from mccl_runtime.manager import Policy, ScheduleManager
from mccl_runtime.synthesizer import solver_synthesizer
from mccl_runtime.pool import SynthesisPool
from mccl_runtime.telemetry import MeasurementStore
from tests.state_files import saved_and_loaded

TOPO = hpn(1, 4, 4)                                   # 16 GPUs: 4 hosts of 4, 4 rails
GROUPS = {**{f"tp{h}": ("allgather", [f"s0h{h}g{i}" for i in range(4)]) for h in range(4)},
          **{f"dp{r}": ("allgather", [f"s0h{h}g{r}" for h in range(4)]) for r in range(4)},
          **{f"ep{k}": ("alltoall", [f"s0h{h}g{i}" for h in (2 * k, 2 * k + 1) for i in range(4)])
             for k in range(2)},
          "world": ("allgather", None)}
FAILED = ("s0h0g0", "s0tor0")


def _solve(kind: str, topo: mo.Topology, warm=None) -> mo.Schedule:
    return (mo.solve_allgather if kind == "allgather" else mo.solve_alltoall)(topo, warm=warm)


@functools.lru_cache(maxsize=None)
def _healthy(comm: str) -> mo.Schedule:
    kind, gpus = GROUPS[comm]
    return _solve(kind, TOPO if gpus is None else induced(TOPO, gpus).topology)


def _set_all(store: MeasurementStore, capacity: np.ndarray, t: float) -> None:
    links = np.arange(TOPO.num_links)
    store.ingest_links(links, np.full(links.size, t), np.asarray(capacity, dtype=float))


def _manager(**kw) -> ScheduleManager:
    store = MeasurementStore(TOPO, alpha=1.0)
    mgr = ScheduleManager(store, policy=Policy(min_dwell_s=0.0), **kw)
    for comm, (kind, gpus) in GROUPS.items():
        mgr.register(comm, "c", kind, _healthy(comm), gpus=gpus)
    return mgr


def _run(mgr: ScheduleManager, now: float, limit_s: float = 120.0) -> list:
    events, deadline = list(mgr.step(now)), time.monotonic() + limit_s
    while mgr.busy() and time.monotonic() < deadline:
        events += mgr.poll(now + 1.0, wait_s=0.05)
    assert not mgr.busy(), "jobs did not finish"
    return events


def _holds(comm: str, link: tuple[str, str]) -> bool:
    gpus = GROUPS[comm][1]
    return gpus is None or induced(TOPO, gpus).topology.has_link(*link)


def _check_against_cold_solves(mgr: ScheduleManager, degraded: mo.Topology, published: set[str]) -> None:
    """Every re-synthesized schedule is valid on its degraded sub-fabric and has the LP
    rate of a cold solve there; the others kept version 1."""
    for coll in mgr.collectives():
        if coll.comm not in published:
            assert coll.version == 1, coll.comm
            continue
        assert coll.version == 2
        on = degraded if coll.gpus is None else induced(degraded, coll.gpus).topology
        assert coll.schedule.gpus == on.gpus                       # ranks in the group's order
        mo.validate(on, coll.schedule)
        assert coll.schedule.lp_rate_gbps == pytest.approx(_solve(coll.kind, on).lp_rate_gbps, rel=1e-6)


def test_fail2_resynthesizes_only_communicators_whose_sub_fabric_holds_the_link():
    mgr = _manager(synthesize=solver_synthesizer())
    _set_all(mgr.store, fail2(TOPO).arrays.capacity, 1.0)
    events = _run(mgr, 2.0)
    started = {e.comm for e in events if e.action == "resynthesis"}
    published = {e.comm for e in events if e.action == "published"}
    # the NIC cable is in the world's, dp0's and ep0's sub-fabrics only
    assert {c for c in GROUPS if _holds(c, FAILED)} == {"world", "dp0", "ep0"}
    assert started <= {"world", "dp0", "ep0"}
    # dp0 is a star through one ToR: no schedule can route around its member's NIC, so
    # Algorithm 1 (whose cut is that NIC alone) rightly leaves it; ep0 and the world reroute
    assert published == {"world", "ep0"}
    _check_against_cold_solves(mgr, fail2(TOPO), published)
    mgr.close()


def test_pool_jobs_run_on_sub_fabrics_in_worker_processes():
    """The same failure with synthesis in two worker processes: the workers induce the
    sub-fabrics themselves and the results equal cold solves there."""
    pool = SynthesisPool(TOPO, functools.partial(solver_synthesizer, "highs", 10, kernels="lazy"), workers=2)
    pool.start()
    mgr = _manager(pool=pool)
    _set_all(mgr.store, fail2(TOPO).arrays.capacity, 1.0)
    events = _run(mgr, 2.0)
    published = {e.comm for e in events if e.action == "published"}
    assert published == {"world", "ep0"}
    _check_against_cold_solves(mgr, fail2(TOPO), published)
    mgr.close()


def test_a_recovery_outside_a_sub_fabric_flags_nobody_there():
    """Schedules synthesized on the failed fabric; the NIC recovers.  The capacity-gained
    test flags the communicators that can use the NIC and no other."""
    degraded = fail2(TOPO)
    store = MeasurementStore(TOPO, alpha=1.0)
    _set_all(store, degraded.arrays.capacity, 1.0)
    mgr = ScheduleManager(store, solver_synthesizer(), Policy(min_dwell_s=0.0))
    for comm, (kind, gpus) in GROUPS.items():
        mgr.register(comm, "c", kind, _solve(kind, degraded if gpus is None else induced(degraded, gpus).topology),
                     gpus=gpus)
    _set_all(store, TOPO.arrays.capacity, 2.0)
    flagged = {coll.comm for coll, _ in mgr.check(3.0)}
    assert flagged == {"world", "dp0", "ep0"}
    mgr.close()


class _Gate:
    """A synthesizer that records what it was asked and waits for a gate."""

    def __init__(self) -> None:
        import threading

        self.gate, self.calls = threading.Event(), []

    def __call__(self, kind, topo, warm, time_limit_s):
        self.calls.append(topo.gpus)
        assert self.gate.wait(30.0)
        return _solve(kind, topo, warm)


def test_a_drift_outside_a_running_job_s_sub_fabric_does_not_supersede_it():
    """While ep0's job runs, a host-3 NVSwitch cable (not in ep0's sub-fabric) drops by
    half: ep0's result is published, not superseded; with the whole fabric's links
    compared, that change would have discarded it."""
    synth = _Gate()
    store = MeasurementStore(TOPO, alpha=1.0)
    mgr = ScheduleManager(store, synth, Policy(min_dwell_s=0.0))
    mgr.register("ep0", "c", "alltoall", _healthy("ep0"), gpus=GROUPS["ep0"][1])
    _set_all(store, fail2(TOPO).arrays.capacity, 1.0)
    assert [e.action for e in mgr.step(2.0)] == ["resynthesis"]
    elsewhere = fail2(TOPO).with_capacity(src="s0h3g1", dst="s0h3nvs", gbps=1000.0).arrays.capacity
    _set_all(store, elsewhere, 2.5)
    synth.gate.set()
    events = _run(mgr, 3.0)
    assert [e.action for e in events] == ["published"]
    assert synth.calls == [tuple(GROUPS["ep0"][1])]
    mgr.close()


def test_registration_checks_members_and_keeps_them_per_communicator():
    mgr = ScheduleManager(MeasurementStore(TOPO, alpha=1.0), solver_synthesizer(), Policy())
    tp0 = GROUPS["tp0"][1]
    mgr.register("tp0", "ag", "allgather", _healthy("tp0"), gpus=tp0)
    [rs, ag] = mgr.register("tp0", "ar", "allreduce", _healthy("tp0"))     # inherits the members
    assert rs.gpus == ag.gpus == tuple(tp0)
    with pytest.raises(TopologyError, match="is registered over 4 GPUs from 's0h0g0'"):
        mgr.register("tp0", "x", "allgather", gpus=GROUPS["tp1"][1])
    for bad, match in ((["s0h0g0", "s0h0g0"], "listed twice"), (["s0h0g0", "nope"], "not a node"),
                       (["s0h0g0", "s0h1g1"], "connected sub-fabric")):
        with pytest.raises(TopologyError, match=match):
            mgr.register("bad", "x", "allgather", gpus=bad)
    assert [c.comm for c in mgr.collectives()] == ["tp0"] * 3          # nothing half-registered
    # a schedule for other GPUs than the members is refused
    with pytest.raises(mo.ScheduleError):
        mgr.register("tp1", "ag", "allgather", _healthy("tp0"), gpus=GROUPS["tp1"][1])
    # every GPU in rank order is the whole fabric
    assert mgr.register("all", "ag", "allgather", _healthy("world"), gpus=list(TOPO.gpus))[0].gpus is None
    mgr.close()


def test_state_round_trip_keeps_members_and_sub_fabric_profiles(tmp_path):
    """Through the state file the service writes (tests/state_files.py)."""
    mgr = _manager(synthesize=solver_synthesizer())
    _set_all(mgr.store, fail2(TOPO).arrays.capacity, 1.0)
    _run(mgr, 2.0)
    data = saved_and_loaded(tmp_path, mgr.store, mgr, TOPO)["manager"]
    again = ScheduleManager(MeasurementStore(TOPO, alpha=1.0), solver_synthesizer(), Policy())
    again.restore(data)
    for a, b in zip(mgr.collectives(), again.collectives()):
        assert (a.comm, a.gpus, a.version) == (b.comm, b.gpus, b.version)
        assert np.array_equal(a.profile.n, b.profile.n) and np.array_equal(a.profile.cut, b.profile.cut)
    mgr.close()
    again.close()


def test_a_state_file_with_bad_members_is_refused_naming_the_field():
    from mccl_opt.errors import MCCLError
    from mccl_runtime.state_check import check_state

    entry = {"comm": "x", "name": "c", "kind": "allgather", "dynamic": True, "version": 0,
             "gpus": ["s0h0g0", "s0h0g0"]}
    with pytest.raises(MCCLError, match=r"manager\.collectives\[0\]\.gpus: GPU 's0h0g0' is listed twice"):
        check_state({"topology": TOPO.to_dict(), "manager": {"collectives": [entry]}}, TOPO)
    # a schedule of the group's sub-fabric is checked there (and would fail on the whole fabric)
    tp0 = _healthy("tp0")
    entry = {**entry, "gpus": GROUPS["tp0"][1], "version": 1, "schedule": tp0.to_dict(),
             "synth_capacity": TOPO.arrays.capacity.tolist()}
    out = check_state({"topology": TOPO.to_dict(), "manager": {"collectives": [entry]}}, TOPO)
    assert out["manager"]["collectives"][0]["gpus"] == GROUPS["tp0"][1]
    with pytest.raises(MCCLError, match=r"collectives\[0\]\.schedule"):
        check_state({"topology": TOPO.to_dict(), "manager": {"collectives": [{**entry, "gpus": None}]}}, TOPO)
