"""The publish decision as one pure function (``mccl_runtime.publish_decision``) and
speculative synthesis (``Policy.speculate``: start on early estimates, publish only once
the change is confirmed).  docs/runtime.md, "One publish decision" and "Speculative
synthesis"."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest

from mccl_runtime.manager import Policy, ScheduleManager
from mccl_runtime.publish_decision import Active, Estimate, Finished, Verdict, publish_decision, speculation_covers
from mccl_runtime.telemetry import MeasurementStore
from tests.test_runtime_manager import TOPO, PruningSynth, _cable, bfs_allgather

NIC = ("s0h0g0", "s0tor0")
NONE = np.zeros(0, dtype=np.int64)
NOMINAL = np.array([400.0, 400.0, 400.0])


def _est(m, provisional=None, pending=NONE):
    m = np.asarray(m, dtype=float)
    return Estimate(m, m if provisional is None else np.asarray(provisional, dtype=float), pending, NONE, NONE,
                    NOMINAL)


def _active(loads, cleared=False):
    return Active(SimpleNamespace(loads=np.asarray(loads, dtype=float)), NOMINAL.copy(), np.ones(3, dtype=bool),
                  cleared)


def test_the_decision_applies_its_rules_in_order():
    policy = Policy(restart_tol=0.1, min_gain=0.01, max_restarts=3, settle_max_s=0.05)
    cur = _active([1.0, 1.0, 0.0])                       # the active schedule, on links 0 and 1
    new = np.array([0.0, 1.0, 1.0])                      # the job's, around link 0 (read at 50)
    job = Finished(np.array([50.0, 400.0, 400.0]), new)
    m = [50.0, 400.0, 400.0]
    assert publish_decision(job, cur, _est(m), 0.0, policy).verdict is Verdict.PUBLISH
    assert publish_decision(Finished(job.capacity, new, reused=True), cur, _est(m), 0.0,
                            policy).verdict is Verdict.REUSE
    # a change still being confirmed on a link the new schedule uses holds it, for settle_max_s
    held = publish_decision(job, cur, _est(m, [50.0, 100.0, 400.0], np.array([1])), 0.0, policy)
    assert held.verdict is Verdict.HOLD and held.held.tolist() == [1]
    late = Finished(job.capacity, new, held_since=0.0)
    assert publish_decision(late, cur, _est(m, [50.0, 100.0, 400.0], np.array([1])), 0.06,
                            policy).verdict is Verdict.PUBLISH
    # the drift is gone: cleared, unless the job replaces a held version (then the gain decides)
    gone = _active([1.0, 1.0, 0.0], cleared=True)
    assert publish_decision(job, gone, _est(m), 0.0, policy).verdict is Verdict.CLEARED
    swap = Finished(job.capacity, new, replaces_held=True)
    assert publish_decision(swap, gone, _est(m), 0.0, policy).verdict is Verdict.PUBLISH
    # M moved 50 % on link 2: the new schedule loses half its rate there, so it restarts,
    # unless restarts ran out; a move on link 0, which it does not use, costs it nothing
    assert publish_decision(job, cur, _est([50.0, 400.0, 200.0]), 0.0, policy).verdict is Verdict.RESTART
    spent = Finished(job.capacity, new, restarts=3)
    assert publish_decision(spent, cur, _est([50.0, 400.0, 200.0]), 0.0, policy).verdict is Verdict.PUBLISH
    assert publish_decision(job, cur, _est([25.0, 400.0, 400.0]), 0.0, policy).verdict is Verdict.PUBLISH
    # no faster than the active schedule under M
    assert publish_decision(job, cur, _est([400.0, 400.0, 400.0]), 0.0, policy).verdict is Verdict.NO_GAIN


def test_a_speculative_job_waits_for_the_confirmation_whatever_its_estimate():
    """A job started on early estimates matches the newest estimate exactly, which holds a
    plain job nothing; a speculative one is held while its fabric has a change pending."""
    policy = Policy()
    job = Finished(np.array([50.0, 400.0, 400.0]), np.array([0.0, 1.0, 1.0]))
    est = _est([400.0, 400.0, 400.0], [50.0, 400.0, 400.0], np.array([0]))
    assert publish_decision(job, _active([1.0, 1.0, 0.0]), est, 0.0, policy).verdict is not Verdict.HOLD
    spec = Finished(job.capacity, job.loads, speculative=True)
    held = publish_decision(spec, _active([1.0, 1.0, 0.0]), est, 0.0, policy)
    assert held.verdict is Verdict.HOLD and held.held.tolist() == [0]


def _level_manager(speculate: bool):
    synth = PruningSynth()
    store = MeasurementStore(TOPO, estimator="level")           # n_min 8, hold_s 8 ms
    mgr = ScheduleManager(store, synth, Policy(gamma=0.1, min_dwell_s=0.0, speculate=speculate))
    mgr.register("world", "ag", "allgather", bfs_allgather(TOPO))
    return synth, store, mgr


def _feed(store, gbps, t, n, dt=0.0005):
    for _ in range(n):
        t += dt
        store.ingest(_cable(*NIC, gbps, t), now=t)
    return t


@pytest.mark.parametrize("speculate", [False, True])
def test_speculative_synthesis_starts_before_the_confirmation_and_publishes_after_it(speculate):
    synth, store, mgr = _level_manager(speculate)
    a = TOPO.link_index(*NIC)
    t = _feed(store, 50.0, 1.0, 10)                     # 5 ms of samples: early, not confirmed (hold_s)
    assert a in store.pending_links() and store.early()[a] == pytest.approx(50.0)
    events = mgr.step(t)
    if not speculate:
        assert events == [] and synth.calls == []
        mgr.close()
        return
    assert [(e.action, e.detail.get("speculative")) for e in events] == [("resynthesis", True)]
    assert synth.capacities[0][a] == pytest.approx(50.0)
    mgr.wait_idle(5.0)
    assert [e.action for e in mgr.poll(t)] == ["held"] and mgr.get("world", "ag").version == 1
    t = _feed(store, 50.0, t, 8)                        # the run now spans hold_s: confirmed
    assert store.pending_links().size == 0
    assert [e.action for e in mgr.step(t)] == ["published"] and len(synth.calls) == 1
    mgr.close()


def test_no_speculative_job_while_one_direction_of_the_cable_is_read():
    """The manager applies :func:`speculation_covers`: a change read on one direction of
    the NIC cable has an early estimate but starts nothing until the other direction is
    read at the same level (here: pending, once the first is confirmed)."""
    synth, store, mgr = _level_manager(True)
    a = TOPO.link_index(*NIC)
    t = 1.0
    for _ in range(10):
        t += 0.0005
        store.ingest([_cable(*NIC, 50.0, t)[0]], now=t)
    assert store.pending_links().tolist() == [a] and store.early() is not None
    assert mgr.step(t) == [] and synth.calls == []
    t = _feed(store, 50.0, t, 10)              # both directions: this one confirmed, the other early
    assert store.pending_links().tolist() == [TOPO.link_index(*NIC[::-1])]
    assert [e.detail.get("speculative") for e in mgr.step(t)] == [True]
    mgr.close()


def test_a_speculative_job_on_a_transient_publishes_nothing():
    """The change reverts before it is confirmed: the speculative job ends ``cleared``, no
    version (what keeps speculation from adding false swaps)."""
    synth, store, mgr = _level_manager(True)
    t = _feed(store, 50.0, 1.0, 10)
    assert [e.action for e in mgr.step(t)] == ["resynthesis"]
    mgr.wait_idle(5.0)
    t = _feed(store, 400.0, t, 12, dt=0.001)            # back at nominal: the run is dropped
    assert store.pending_links().size == 0
    events = mgr.step(t) or mgr.poll(t)
    assert [(e.action, e.detail.get("reason")) for e in events] == [("aborted", "cleared")]
    assert mgr.get("world", "ag").version == 1
    mgr.close()


def test_a_speculative_job_built_on_a_partial_picture_restarts_on_the_confirmed_one():
    """Confirmed ``M`` moved 11 % from the early picture on a link the new schedule uses
    with headroom (the cable's other direction, not alarmed when the job started): a plain
    job publishes (the move costs it nothing), a speculative one restarts, since the swap
    hold would keep that version from the ranks."""
    policy = Policy()
    new = np.array([0.0, 0.5, 1.0])
    plain = Finished(np.array([50.0, 400.0, 400.0]), new)
    spec = Finished(plain.capacity, new, speculative=True)
    est = _est([50.0, 356.0, 400.0])
    assert publish_decision(plain, _active([1.0, 1.0, 0.0]), est, 0.0, policy).verdict is Verdict.PUBLISH
    assert publish_decision(spec, _active([1.0, 1.0, 0.0]), est, 0.0, policy).verdict is Verdict.RESTART


def test_speculation_waits_for_both_directions_of_a_cable():
    """Links 0 and 1 are one cable, link 2 has no reverse.  A pending direction whose other
    direction still reads its old level is a partial picture (no speculative job); both
    pending at one level, or the other already confirmed there, is a whole one."""
    rev = np.array([1, 0, -1])
    mine = np.ones(3, dtype=bool)
    k = 0.05
    assert not speculation_covers(np.array([50.0, 400.0, 400.0]), np.array([0]), mine, rev, k)
    assert speculation_covers(np.array([50.0, 51.0, 400.0]), np.array([0, 1]), mine, rev, k)
    assert speculation_covers(np.array([50.0, 50.0, 400.0]), np.array([0]), mine, rev, k)   # 1 confirmed at 50
    assert not speculation_covers(np.array([50.0, 100.0, 400.0]), np.array([0, 1]), mine, rev, k)
    assert speculation_covers(np.array([400.0, 400.0, 50.0]), np.array([2]), mine, rev, k)  # no other direction
    # the other direction outside the collective's fabric does not count; nothing pending in it: no job
    assert speculation_covers(np.array([50.0, 400.0, 400.0]), np.array([0]), np.array([True, False, True]), rev, k)
    assert not speculation_covers(np.array([50.0, 400.0, 400.0]), np.array([0]), np.array([False, True, True]), rev, k)


@pytest.mark.parametrize("then", ["clear", "still-down"])
def test_a_speculative_result_waits_for_a_sample_newer_than_itself(then):
    """A synthesizer slow on purpose (held at a gate) finishes after its drop was
    confirmed, with no sample since: the result is held (*unheard*).  The next window
    reads the link back at nominal (a flap that cleared during the synthesis): the
    failure's version is never published, the clear aborts it as ``cleared``; read still
    down, it is published at that sample (issue 26: a clear during synthesis never
    publishes the failure's schedule)."""
    gate = threading.Event()
    synth = PruningSynth(gate=gate)
    store = MeasurementStore(TOPO, estimator="level")
    mgr = ScheduleManager(store, synth, Policy(gamma=0.1, min_dwell_s=0.0, speculate=True))
    mgr.register("world", "ag", "allgather", bfs_allgather(TOPO))
    t = _feed(store, 50.0, 1.0, 10)
    assert [(e.action, e.detail.get("speculative")) for e in mgr.step(t)] == [("resynthesis", True)]
    t = _feed(store, 50.0, t, 8)                        # confirmed while the job runs
    assert store.pending_links().size == 0 and mgr.step(t) == []
    gate.set()
    mgr.wait_idle(5.0)
    held = mgr.poll(t)
    assert [e.action for e in held] == ["held"] and held[0].detail["pending"] == [list(NIC), list(NIC[::-1])]
    if then == "still-down":
        t = _feed(store, 50.0, t, 1)
        assert [e.action for e in mgr.step(t)] == ["published"] and mgr.get("world", "ag").version == 2
    else:
        t = _feed(store, 400.0, t, 1)
        assert store.pending_links().size and mgr.step(t) == []        # the clear, being confirmed
        t = _feed(store, 400.0, t, 20)
        events = mgr.step(t)
        assert [(e.action, e.detail.get("reason")) for e in events] == [("aborted", "cleared")]
        assert mgr.get("world", "ag").version == 1
    assert len(synth.calls) == 1
    mgr.close()


def test_unheard_holds_only_a_speculative_job_within_fresh_s():
    policy = Policy(fresh_s=0.002)
    job = Finished(np.array([50.0, 400.0, 400.0]), np.array([0.0, 1.0, 1.0]), speculative=True, done_t=0.0,
                   unheard=np.array([0]))
    cur, est = _active([1.0, 1.0, 0.0]), _est([50.0, 400.0, 400.0])
    held = publish_decision(job, cur, est, 0.001, policy)
    assert (held.verdict, held.reason, held.held.tolist()) == (Verdict.HOLD, "unheard", [0])
    heard = Finished(job.capacity, job.loads, speculative=True, done_t=0.0, unheard=None)
    assert publish_decision(heard, cur, est, 0.001, policy).verdict is Verdict.PUBLISH
