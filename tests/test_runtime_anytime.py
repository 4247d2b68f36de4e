"""Anytime publication (``Policy.anytime_s``, docs/runtime.md "Anytime publication"): a
job that the latest estimate outdates, but whose synthesis took long, is published when it
beats the active version and restarted at once, instead of only restarted (a ramp's step
on loaded real ranks then ran on the version before to its end)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np

from mccl_runtime.manager import Policy, ScheduleManager
from mccl_runtime.publish_decision import Active, Estimate, Finished, Verdict, publish_decision
from mccl_runtime.telemetry import MeasurementStore
from tests.test_runtime_manager import TOPO, PruningSynth, _cable, bfs_allgather

NONE = np.zeros(0, dtype=np.int64)


def _decide(job: Finished, m: list[float], policy: Policy) -> Verdict:
    m_ = np.array(m)
    active = Active(SimpleNamespace(loads=np.array([1.0, 1.0, 0.0])), np.full(3, 400.0), np.ones(3, dtype=bool))
    return publish_decision(job, active, Estimate(m_, m_, NONE, NONE, NONE, np.full(3, 400.0)), 0.0, policy).verdict


def test_an_outdated_slow_job_that_beats_the_active_version_is_published_and_restarted():
    """The active schedule uses links 0 and 1, the job's links 1 and 2 (built with link 0
    at 50).  Link 2 then read at 200: the job lost half its rate, so it restarts, unless it
    took ``anytime_s`` and still beats the active one (200 > 50): then ``ANYTIME``."""
    anytime = Policy(anytime_s=0.5)
    slow = Finished(np.array([50.0, 400.0, 400.0]), np.array([0.0, 1.0, 1.0]), synth_s=0.8)
    moved = [50.0, 400.0, 200.0]
    assert _decide(slow, moved, Policy()) is Verdict.RESTART                       # off by default
    assert _decide(slow, moved, anytime) is Verdict.ANYTIME
    fast = Finished(slow.capacity, slow.loads, synth_s=0.2)
    assert _decide(fast, moved, anytime) is Verdict.RESTART                        # a restart is cheap
    assert _decide(slow, [50.0, 400.0, 40.0], anytime) is Verdict.RESTART          # 40 < 50: no better
    assert _decide(slow, [50.0, 400.0, 52.5], anytime) is Verdict.RESTART          # 5 % better: not worth it
    spec = Finished(slow.capacity, slow.loads, synth_s=0.8, speculative=True)
    assert _decide(spec, moved, anytime) is Verdict.RESTART                        # waits for confirmation
    assert _decide(slow, [50.0, 400.0, 400.0], anytime) is Verdict.PUBLISH         # up to date


def test_the_manager_publishes_an_anytime_version_and_restarts_on_the_latest_estimate():
    """Each synthesis takes 1 s on the injected clock: the job for a NIC drop finishes
    after a second cable dropped too; it is published (v2, ``anytime``) and a job on the
    latest estimate starts in the same step, without the dwell time (1 s)."""
    store, synth = MeasurementStore(TOPO, alpha=1.0), PruningSynth()
    ticks = itertools.count(0.0, 0.5)
    mgr = ScheduleManager(store, synth, Policy(gamma=0.1, min_dwell_s=1.0, anytime_s=0.5),
                          synth_clock=lambda: next(ticks))
    mgr.register("world", "ag", "allgather", bfs_allgather(TOPO))
    store.ingest(_cable("s0h0g0", "s0tor0", 150.0, 1.0), now=1.0)
    assert [e.action.value for e in mgr.step(1.0)] == ["resynthesis"]
    assert mgr.wait_idle(10.0)
    store.ingest(_cable("s0h0g1", "s0tor1", 300.0, 1.1), now=1.1)           # moved during synthesis
    events = mgr.step(1.1)
    assert [e.action.value for e in events] == ["published", "resynthesis"]
    assert events[0].detail["anytime"] and mgr.get("world", "ag").version == 2
    assert mgr.wait_idle(10.0) and len(mgr.step(1.2)) == 1                  # decided (here: no gain)
    assert synth.capacities[-1][TOPO.link_index("s0h0g1", "s0tor1")] == 300.0   # on the latest estimate
    mgr.close()


def test_a_job_held_for_a_rise_is_restarted_at_once_when_a_settled_drop_outdates_it():
    """Real ranks: a stall's recovery (link 2 back from 300 to 400, still moving) held a
    job for ``moving_max_s`` (2.5 s), and a ramp's next step (link 0 at 200, settled) read
    meanwhile waited for it: the step ran on the version before.  Now rule 4 restarts the
    job on the step at once; with nothing settled moved, the rise still holds it."""
    nominal, moving = np.full(3, 400.0), np.array([2])
    active = Active(SimpleNamespace(loads=np.array([1.0, 1.0, 0.0])), np.array([400.0, 400.0, 300.0]),
                    np.ones(3, dtype=bool))
    job = Finished(np.full(3, 400.0), np.array([1.0, 0.0, 1.0]))

    def verdict(m: list[float]) -> Verdict:
        m_ = np.array(m)
        return publish_decision(job, active, Estimate(m_, m_, NONE, moving, NONE, nominal), 0.0, Policy()).verdict

    assert verdict([400.0, 400.0, 400.0]) is Verdict.HOLD
    assert verdict([200.0, 400.0, 400.0]) is Verdict.RESTART


def test_a_job_replacing_a_held_or_unfit_version_must_gain_rate_loss():
    """A job started by ``supersede_held`` publishes only for a gain above ``rate_loss`` (5 %):
    on real ranks 1-3 % gains were telemetry noise and a third version for one event."""
    for gain, replaces, verdict in ((1.03, True, Verdict.NO_GAIN), (1.07, True, Verdict.PUBLISH),
                                    (1.03, False, Verdict.PUBLISH)):
        job = Finished(np.array([50.0, 400.0, 400.0]), np.array([1.0 / gain, 0.0, 0.0]), replaces_held=replaces)
        assert _decide(job, [50.0, 400.0, 400.0], Policy()) is verdict
