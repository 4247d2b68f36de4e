"""Schedule manager: cut filtering, one re-synthesis per failure, abort when cleared,
time bound, dwell, AllReduce decomposition, persistence."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import mccl_opt as mo
from instances import hpn
from mccl_opt.errors import TopologyError
from mccl_opt.paths import switch_paths_from
from mccl_opt.schedule import Schedule, TreeChunk, bottleneck_links, schedule_rate, share_loads
from mccl_opt.topology import Topology
from mccl_runtime.drift import detect
from mccl_runtime.manager import Policy, ScheduleManager
from mccl_runtime.telemetry import MeasurementStore
from tests.state_files import saved_and_loaded

# ---------------------------------------------------------------------- test helpers
# A deterministic, capacity-oblivious AllGather (one BFS tree per root over switch-only
# GPU-to-GPU hops): a hand-built schedule that works on pruned fabrics too.
def _gpu_hops(topo: Topology, src: int) -> dict[int, list[int]]:
    """Shortest switch-only paths (as node lists) from GPU node ``src`` to every GPU."""
    tail, head = topo.arrays.tail, topo.arrays.head
    return {g: [int(tail[arcs[0]]), *(int(head[a]) for a in arcs)]
            for g, arcs in switch_paths_from(topo, src).items()}


def bfs_allgather(topo: Topology) -> Schedule:
    """The BFS-tree AllGather of ``topo`` (one whole-shard tree per root)."""
    ids = [n.id for n in topo.nodes]
    hops = {int(g): _gpu_hops(topo, int(g)) for g in topo.arrays.gpu_nodes}
    chunks = []
    for root in topo.arrays.gpu_nodes:
        root = int(root)
        reached, frontier, edges = {root}, [root], []
        while frontier:
            nxt = []
            for g in sorted(int(x) for x in topo.arrays.gpu_nodes if int(x) not in reached):
                parents = [p for p in frontier if g in hops[p]]
                if parents:
                    p = min(parents, key=lambda q: (len(hops[q][g]), int(topo.arrays.rank_of[q])))
                    edges.append(tuple(ids[v] for v in hops[p][g]))
                    nxt.append(g)
            reached.update(nxt)
            frontier = sorted(nxt, key=lambda q: int(topo.arrays.rank_of[q]))
        if len(reached) != topo.num_gpus:
            raise TopologyError(f"GPU {ids[root]!r} cannot reach every GPU through switch-only hops")
        chunks.append(TreeChunk(ids[root], 1.0, tuple(edges)))
    loads = share_loads(topo, chunks)
    rate = schedule_rate(topo, loads)
    return Schedule("allgather", topo.name, topo.gpus, rate, rate, 1, tuple(chunks),
                    bottleneck_links(topo, loads, rate, 1), solver={"backend": "static-bfs"})



TOPO = hpn(1, 2, 2)


class PruningSynth:
    """A capacity-aware stand-in for the real optimizer: BFS trees on the topology
    without links measured below half their nominal capacity.  ``started`` is set when
    a call begins; with a ``gate`` the call then waits for it."""

    def __init__(self, gate: threading.Event | None = None, sleep_s: float = 0.0) -> None:
        self.calls: list[tuple[str, bool]] = []
        self.capacities: list[np.ndarray] = []
        self.gate, self.sleep_s = gate, sleep_s
        self.started = threading.Event()

    def __call__(self, kind, topo, warm, time_limit_s):
        self.calls.append((kind, warm is not None))
        self.capacities.append(topo.arrays.capacity.copy())
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(10.0)
        time.sleep(self.sleep_s)
        keep = [l for l, nom in zip(topo.links, TOPO.links) if l.capacity_gbps >= 0.5 * nom.capacity_gbps]
        try:
            pruned = Topology(topo.name, topo.nodes, keep, topo.extra)
        except mo.TopologyError:
            pruned = topo
        s = bfs_allgather(pruned)
        # rate and cut on the full measured topology
        loads = mo.schedule.share_loads(topo, s.chunks)
        rate = mo.schedule.schedule_rate(topo, loads)
        return mo.Schedule("allgather", topo.name, topo.gpus, rate, rate, 1, s.chunks,
                           mo.schedule.bottleneck_links(topo, loads, rate, 1))


def _cable(src, dst, gbps, t):
    return [{"kind": "link", "src": src, "dst": dst, "gbps": gbps, "t": t},
            {"kind": "link", "src": dst, "dst": src, "gbps": gbps, "t": t}]


def _manager(synth, clock=time.monotonic, **policy):
    store = MeasurementStore(TOPO, alpha=1.0)
    mgr = ScheduleManager(store, synth, Policy(**{"gamma": 0.1, "min_dwell_s": 0.0, **policy}), clock=clock)
    mgr.register("world", "ag", "allgather", bfs_allgather(TOPO))
    return store, mgr


def test_failure_outside_the_cut_triggers_nothing():
    synth = PruningSynth()
    store, mgr = _manager(synth)
    store.ingest(_cable("s0h0g0", "s0h0nvs", 1000.0, 1.0), now=1.0)   # NVSwitch, not the NIC cut
    assert mgr.step(1.0) == [] and mgr.poll(2.0, wait_s=1.0) == []
    assert synth.calls == [] and mgr.get("world", "ag").version == 1
    mgr.close()


def test_failure_inside_the_cut_publishes_exactly_one_new_version():
    synth = PruningSynth()
    store, mgr = _manager(synth)
    old = mgr.get("world", "ag").schedule
    events = []
    for i in range(1, 6):
        store.ingest(_cable("s0h0g0", "s0tor0", 50.0, float(i)), now=float(i))
        events += mgr.step(float(i))
        events += mgr.poll(float(i), wait_s=5.0)
    actions = [e.action for e in events]
    assert actions == ["resynthesis", "published"], actions
    assert synth.calls == [("allgather", True)]                # warm from the old schedule
    coll = mgr.get("world", "ag")
    assert coll.version == 2 and coll.schedule.version == 2
    pub = events[1].detail
    assert pub["rate_after"] > pub["rate_before"]
    mo.validate(store.measured_topology(), coll.schedule)      # executable and consistent
    assert coll.schedule.chunks != old.chunks
    mgr.close()


def test_degradation_that_clears_during_resynthesis_is_not_published():
    gate = threading.Event()
    synth = PruningSynth(gate=gate)
    store, mgr = _manager(synth)
    store.ingest(_cable("s0h0g0", "s0tor0", 50.0, 1.0), now=1.0)
    assert [e.action for e in mgr.step(1.0)] == ["resynthesis"]
    store.ingest(_cable("s0h0g0", "s0tor0", 400.0, 2.0), now=2.0)   # cleared meanwhile
    assert mgr.poll(2.0) == []                                      # still running
    gate.set()
    events = mgr.poll(3.0, wait_s=5.0)
    assert [(e.action, e.detail.get("reason")) for e in events] == [("aborted", "cleared")]
    assert mgr.get("world", "ag").version == 1
    assert mgr.counters["published"] == 0 and mgr.counters["aborted"] == 1
    mgr.close()


class FakeClock:
    """An injected wall clock: time moves only when the test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_slow_synthesis_is_abandoned_at_the_time_bound():
    gate, clock = threading.Event(), FakeClock()
    synth = PruningSynth(gate=gate)
    store, mgr = _manager(synth, clock=clock, time_limit_s=0.1)
    store.ingest(_cable("s0h0g0", "s0tor0", 50.0, 1.0), now=1.0)
    mgr.step(1.0)
    assert synth.started.wait(5.0)
    clock.now += 0.05                                               # within the bound
    assert mgr.poll(1.05) == []
    clock.now += 0.1                                                # past it
    assert [e.action for e in mgr.poll(1.15)] == ["timeout"]
    gate.set()                                                      # the late result is discarded
    mgr.wait_idle(5.0)
    assert mgr.poll(2.0) == [] and mgr.get("world", "ag").version == 1
    mgr.close()


def test_further_degradation_during_synthesis_restarts_on_the_newest_estimate():
    gate = threading.Event()
    synth = PruningSynth(gate=gate)
    store, mgr = _manager(synth)
    nic = TOPO.link_index("s0h0g0", "s0tor0")
    store.ingest(_cable("s0h0g0", "s0tor0", 250.0, 1.0), now=1.0)
    assert [e.action for e in mgr.step(1.0)] == ["resynthesis"]
    store.ingest(_cable("s0h0g0", "s0tor0", 50.0, 2.0), now=2.0)   # worse while synthesizing
    gate.set()
    events = mgr.poll(2.0, wait_s=5.0)
    assert [e.action for e in events] == ["superseded", "resynthesis"]
    assert events[0].detail["moved"] > 0.5
    events = mgr.poll(3.0, wait_s=5.0)
    assert [e.action for e in events] == ["published"]
    assert [c[nic] for c in synth.capacities] == [250.0, 50.0]      # the newest estimate won
    assert mgr.get("world", "ag").synth_capacity[nic] == 50.0
    mgr.close()


def test_a_move_that_costs_the_finished_schedule_nothing_does_not_restart_it():
    """A further drop on a link the finished schedule does not use (pruned below half of
    nominal) leaves its rate as it was built: it is published, not re-synthesized."""
    gate = threading.Event()
    synth = PruningSynth(gate=gate)
    store, mgr = _manager(synth)
    store.ingest(_cable("s0h0g0", "s0tor0", 190.0, 1.0), now=1.0)
    assert [e.action for e in mgr.step(1.0)] == ["resynthesis"]
    store.ingest(_cable("s0h0g0", "s0tor0", 50.0, 2.0), now=2.0)   # worse while synthesizing
    gate.set()
    events = mgr.poll(2.0, wait_s=5.0)
    assert [e.action for e in events] == ["published"]
    assert len(synth.capacities) == 1
    coll = mgr.get("world", "ag")
    used = coll.profile.loads > 1e-12
    assert coll.synth_capacity[TOPO.link_index("s0h0g0", "s0tor0")] == 190.0 and not used[TOPO.link_index("s0h0g0", "s0tor0")]
    assert np.min(store.measured()[used] / coll.profile.loads[used]) == \
        pytest.approx(np.min(coll.synth_capacity[used] / coll.profile.loads[used]))
    mgr.close()


def test_no_synthesis_while_a_link_change_is_unconfirmed():
    from mccl_runtime.level import LevelParams

    synth = PruningSynth()
    store = MeasurementStore(TOPO, estimator="level", level_params=LevelParams(n_min=4, hold_s=0.0))
    mgr = ScheduleManager(store, synth, Policy(gamma=0.1, min_dwell_s=0.0, settle_max_s=10.0))
    mgr.register("world", "ag", "allgather", bfs_allgather(TOPO))
    nic, other = ("s0h0g0", "s0tor0"), ("s0tor1", "s0h1g1")
    t = 1.0
    for _ in range(4):                                       # the NIC cable's drop is confirmed
        t += 0.01
        store.ingest(_cable(*nic, 50.0, t), now=t)
    assert store.measured()[TOPO.link_index(*nic)] == pytest.approx(50.0)

    def other_sample(t):
        store.ingest([{"kind": "link", "src": other[0], "dst": other[1], "gbps": 100.0, "t": t}], now=t)

    for _ in range(2):                                       # a second link: alarmed, not confirmed
        t += 0.01
        other_sample(t)
    assert TOPO.link_index(*other) in store.pending_links()
    assert mgr.step(t) == [] and synth.calls == []          # held back while a change is unconfirmed
    for _ in range(2):
        t += 0.01
        other_sample(t)
    assert store.pending_links().size == 0
    assert [e.action for e in mgr.step(t)] == ["resynthesis"]
    mgr.poll(t, wait_s=5.0)
    cap = synth.capacities[0]                                # both changes in the one synthesis
    assert cap[TOPO.link_index(*nic)] == pytest.approx(50.0)
    assert cap[TOPO.link_index(*other)] == pytest.approx(100.0)
    mgr.close()


def test_capacity_gained_on_an_avoided_link_flags_the_schedule():
    synth = PruningSynth()
    store, mgr = _manager(synth)
    store.ingest(_cable("s0h0g0", "s0tor0", 50.0, 1.0), now=1.0)
    mgr.step(1.0)
    assert [e.action for e in mgr.poll(1.0, wait_s=5.0)] == ["published"]
    coll = mgr.get("world", "ag")
    nic = TOPO.link_index("s0h0g0", "s0tor0")
    assert coll.profile.loads[nic] == 0                             # the new schedule avoids the NIC
    store.ingest(_cable("s0h0g0", "s0tor0", 400.0, 2.0), now=2.0)   # recovered (seen by a probe)
    report = detect(store.measured(), coll.profile, 0.1)
    assert not report.flagged                                       # Algorithm 1 alone cannot see it
    assert [e.action for e in mgr.step(2.0)] == ["resynthesis"]
    # the fabric is v1's again: v1 is reused, not synthesized; this capacity-oblivious
    # stand-in's v1 is no faster than v2, so the re-check keeps v2
    assert [(e.action, e.detail.get("reason")) for e in mgr.poll(2.0, wait_s=5.0)] == [("aborted", "no_gain")]
    assert len(synth.calls) == 1
    # a third fabric, never seen: synthesized
    store.ingest(_cable("s0h0g1", "s0tor1", 100.0, 3.0), now=3.0)
    mgr.step(3.0)
    mgr.poll(3.0, wait_s=5.0)
    assert len(synth.calls) == 2 and synth.capacities[-1][nic] == 400.0
    mgr.close()


def test_dwell_time_holds_back_a_second_flag():
    synth = PruningSynth()
    store, mgr = _manager(synth, min_dwell_s=10.0)
    store.ingest(_cable("s0h0g0", "s0tor0", 50.0, 1.0), now=1.0)
    mgr.step(1.0)
    assert [e.action for e in mgr.poll(1.0, wait_s=5.0)] == ["published"]
    # the new schedule's cut is rail 1; degrade one of its NICs
    store.ingest(_cable("s0h0g1", "s0tor1", 300.0, 2.0), now=2.0)
    assert mgr.step(2.0) == []                                      # within the dwell time
    assert [e.action for e in mgr.step(11.5)] == ["resynthesis"]
    assert len(mgr.poll(11.5, wait_s=5.0)) == 1 and len(synth.calls) == 2
    mgr.close()


def test_allreduce_is_static_reducescatter_plus_dynamic_allgather():
    synth = PruningSynth()
    store = MeasurementStore(TOPO, alpha=1.0)
    mgr = ScheduleManager(store, synth, Policy(min_dwell_s=0.0))
    colls = mgr.register("tp", "grad", "allreduce")
    assert [(c.name, c.dynamic) for c in colls] == [("grad/reducescatter", False), ("grad/allgather", True)]
    events = mgr.poll(0.0, wait_s=5.0)                 # baseline synthesis of the AllGather
    assert [(e.name, e.action, e.version) for e in events] == [("grad/allgather", "published", 1)]
    assert synth.calls == [("allgather", False)]
    assert mgr.get("tp", "grad/reducescatter").schedule is None
    with pytest.raises(mo.ScheduleError, match="already registered"):
        mgr.register("tp", "grad/allgather", "allgather")
    mgr.register("tp", "y/allgather", "allgather")
    with pytest.raises(mo.ScheduleError, match="already registered"):
        mgr.register("tp", "y", "allreduce")            # all or nothing
    assert ("tp", "y/reducescatter") not in {c.key for c in mgr.collectives()}
    mgr.close()


def test_state_round_trip_does_not_resynthesize(tmp_path):
    """Through the state file the service writes (tests/state_files.py)."""
    synth = PruningSynth()
    store, mgr = _manager(synth)
    store.ingest(_cable("s0h0g0", "s0tor0", 50.0, 1.0), now=1.0)
    mgr.step(1.0)
    mgr.poll(1.0, wait_s=5.0)
    state = saved_and_loaded(tmp_path, store, mgr, TOPO)
    mgr.close()
    fresh = PruningSynth()
    store2 = MeasurementStore(TOPO, alpha=1.0)
    store2.restore(state["telemetry"])
    mgr2 = ScheduleManager(store2, fresh, Policy(gamma=0.1, min_dwell_s=0.0))
    mgr2.restore(state["manager"])
    coll = mgr2.get("world", "ag")
    assert coll.version == 2 and coll.schedule.to_dict() == mgr.get("world", "ag").schedule.to_dict()
    assert mgr2.step(5.0) == [] and fresh.calls == []
    np.testing.assert_array_equal(coll.synth_capacity, mgr.get("world", "ag").synth_capacity)
    mgr2.close()


def test_an_invalid_synthesized_schedule_is_never_published():
    def broken(kind, topo, warm, time_limit_s):
        good = bfs_allgather(topo)
        return mo.Schedule("allgather", topo.name, topo.gpus, good.rate_gbps, good.lp_rate_gbps, 1,
                           good.chunks[1:], good.bottleneck)        # one root's shard never sent

    store, mgr = _manager(broken)
    store.ingest(_cable("s0h0g0", "s0tor0", 50.0, 1.0), now=1.0)
    mgr.step(1.0)
    events = mgr.poll(1.0, wait_s=5.0)
    assert [e.action for e in events] == ["failed"] and "s0h0g0" in events[0].detail["error"]
    assert mgr.get("world", "ag").version == 1
    mgr.close()


@pytest.mark.parametrize("digits, expected", [(3, 49.9), (0, 49.943)])
def test_a_job_synthesizes_on_the_estimate_rounded_to_its_precision(digits, expected):
    """The job's input (and the capacities its version is kept for) is ``M`` rounded to
    ``capacity_digits`` significant digits; untouched links keep their nominal value."""
    synth = PruningSynth()
    store, mgr = _manager(synth, capacity_digits=digits)
    for i in range(1, 6):
        store.ingest(_cable("s0h0g0", "s0tor0", 49.943, float(i)), now=float(i))
        mgr.step(float(i))
        mgr.poll(float(i), wait_s=5.0)
    assert len(synth.capacities) == 1
    nic = TOPO.link_index("s0h0g0", "s0tor0")
    assert synth.capacities[0][nic] == pytest.approx(expected, abs=1e-9)
    others = np.arange(TOPO.num_links) != nic
    others[TOPO.link_index("s0tor0", "s0h0g0")] = False
    assert np.array_equal(synth.capacities[0][others], TOPO.arrays.capacity[others])
    coll = mgr.get("world", "ag")
    assert coll.version == 2 and coll.synth_capacity[nic] == pytest.approx(expected, abs=1e-9)
    mgr.close()


def test_capacity_digits_must_be_a_count():
    with pytest.raises(mo.MCCLError, match="capacity_digits"):
        Policy(capacity_digits=-1)
