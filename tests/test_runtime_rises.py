"""Recoveries read in steps (issue 26, docs/runtime.md): with the EWMA at alpha 1 (real
ranks) a rise still moving holds a synthesis built on it; the newest settled reading wins."""

from __future__ import annotations

import threading

import pytest

import tests.test_runtime_manager as tm
from mccl_runtime.telemetry import MeasurementStore

TOPO = tm.TOPO
NIC = ("s0h0g0", "s0tor0")
A = TOPO.link_index(*NIC)


def _feed(store, gbps, t):
    store.ingest(tm._cable(*NIC, gbps, t), now=t)
    return t


def test_a_rise_moves_until_quiet_or_back_at_nominal_and_drops_are_not_tracked():
    store = MeasurementStore(TOPO, alpha=1.0)
    quiet = store.rises.quiet_s
    _feed(store, 50.0, 1.0)                          # a drop: confirmed by the sender
    assert store.moving_links().size == 0
    _feed(store, 102.0, 1.1)                         # a partial reading of a recovery
    assert A in store.moving_links()
    _feed(store, 141.0, 1.2)
    _feed(store, 124.0, 1.3)                         # still moving, either way
    _feed(store, 126.0, 1.2 + quiet)                 # the same level again is not enough ...
    assert A in store.moving_links()
    _feed(store, 125.0, 1.31 + quiet)                # ... quiet_s without a move settles it
    assert store.moving_links().size == 0
    _feed(store, 250.0, 5.0)
    assert A in store.moving_links()
    _feed(store, 400.0, 5.1)                         # at nominal it cannot read higher
    assert store.moving_links().size == 0
    _feed(store, 295.0, 5.2)                         # a swing right after the recovery moves it again
    assert A in store.moving_links()
    _feed(store, 400.0, 5.3)
    _feed(store, 300.0, 5.3 + quiet)                 # a drop quiet_s after it: the sender confirmed it
    assert store.moving_links().size == 0
    _feed(store, 400.0, 9.0)                         # a stall that recovers in one reading ...
    _feed(store, 300.0, 9.1)                         # ... is no recovery read in steps: no swing
    assert store.moving_links().size == 0
    smooth = MeasurementStore(TOPO, alpha=0.5)       # an EWMA below 1 is its own smoothing
    _feed(smooth, 50.0, 1.0)
    _feed(smooth, 250.0, 1.1)
    assert smooth.moving_links().size == 0


def _held_on_a_rise():
    """v2 built for the NIC at 50 Gbps (avoiding it); the NIC then reads 250 (a rise still
    moving), a job starts on it and finishes: ``(synth, store, mgr, t)``."""
    synth = tm.PruningSynth(gate=threading.Event())
    store, mgr = tm._manager(synth)
    synth.gate.set()
    t = _feed(store, 50.0, 1.0)
    assert [e.action for e in mgr.step(t)] == ["resynthesis"]
    assert [e.action for e in mgr.poll(t, wait_s=5.0)] == ["published"]
    t = _feed(store, 250.0, t + 0.1)
    assert [e.action for e in mgr.step(t)] == ["resynthesis"]
    mgr.wait_idle(5.0)
    events = mgr.poll(t)
    assert [e.action for e in events] == ["held"] and events[0].detail["pending"]
    assert mgr.poll(t + 0.01) == [] and mgr.get("world", "ag").version == 2
    return synth, store, mgr, t


def test_a_synthesis_on_a_rise_still_moving_is_held_and_the_settled_reading_wins():
    synth, store, mgr, t = _held_on_a_rise()
    t = _feed(store, 400.0, t + 0.1)                 # the rest of the recovery
    events = mgr.step(t)
    assert [e.action for e in events] == ["superseded", "resynthesis"]
    assert events[0].detail["moved"] == pytest.approx(0.6)     # 250 -> 400: decided on 400, not 250
    events = mgr.poll(t, wait_s=5.0)                 # v1's healthy fabric, reused (no synthesis)
    assert [(e.action, e.detail.get("reason")) for e in events] == [("aborted", "no_gain")]
    assert [float(c[A]) for c in synth.capacities] == [50.0, 250.0]
    assert mgr.counters["published"] == 1            # nothing was published for 250
    mgr.close()


def test_a_rise_quiet_at_its_level_decides_the_held_synthesis_as_usual():
    synth, store, mgr, t = _held_on_a_rise()
    store.rises.quiet_s = 0.3
    t0 = t
    t = _feed(store, 245.0, t + 0.2)                 # within 5 %: no move, not settled yet
    assert mgr.step(t) == []
    t = _feed(store, 245.0, t0 + 0.3)                # quiet for quiet_s: settled, no restart
    events = mgr.step(t)
    assert [(e.action, e.detail.get("reason")) for e in events] == [("aborted", "no_gain")]
    assert events[0].detail["held_s"] == pytest.approx(0.3)
    assert [float(c[A]) for c in synth.capacities] == [50.0, 250.0]
    mgr.close()


def test_a_rise_that_keeps_moving_is_held_at_most_moving_max_s():
    synth = tm.PruningSynth(gate=threading.Event())
    synth.gate.set()
    store, mgr = tm._manager(synth, moving_max_s=0.2)
    t = _feed(store, 50.0, 1.0)
    mgr.step(t)
    mgr.poll(t, wait_s=5.0)
    t = _feed(store, 250.0, t + 0.1)
    mgr.step(t)
    mgr.wait_idle(5.0)
    assert [e.action for e in mgr.poll(t)] == ["held"]
    t = _feed(store, 300.0, t + 0.1)                 # moving again: still held
    assert mgr.poll(t) == [] and A in store.moving_links()
    events = mgr.poll(t + 0.15)                      # past moving_max_s: restarted on 300 ...
    assert [e.action for e in events] == ["superseded", "resynthesis"]
    events = mgr.poll(t + 0.15, wait_s=5.0)          # ... and not held again: the bound is the collective's
    assert [(e.action, e.detail.get("reason")) for e in events] == [("aborted", "no_gain")]
    assert A in store.moving_links() and [float(c[A]) for c in synth.capacities] == [50.0, 250.0, 300.0]
    assert mgr.get("world", "ag").rising_since is None
    mgr.close()


def test_a_job_replacing_a_held_version_is_decided_by_its_gain_not_cleared(monkeypatch):
    """``supersede_held``'s job replaces a version built on a transient: under the latest
    ``M`` that version may read as fitting (the drift "cleared"), yet the job's schedule
    does better; it is published, not aborted ``cleared`` (the held version then ran at
    0.75-0.80 of offline to the end of a ramp's step on real ranks)."""
    from mccl_runtime.manager import Policy, ScheduleManager
    from mccl_runtime.synthesizer import solver_synthesizer

    store = MeasurementStore(TOPO, alpha=1.0)
    mgr = ScheduleManager(store, solver_synthesizer(), Policy(gamma=0.1, min_dwell_s=0.0))
    mgr.register("world", "ag", "allgather", now=0.0)
    assert mgr.wait_idle(30.0) and [e.action for e in mgr.poll(0.5)] == ["published"]
    t = _feed(store, 50.0, 1.0)                      # the transient the held version is built on
    mgr.step(t)
    assert [e.action for e in mgr.poll(t, wait_s=30.0)] == ["published"]
    t = _feed(store, 400.0, t + 0.1)                 # it reverted
    monkeypatch.setattr(mgr, "_recovered", lambda m, coll: True)     # the drift reads as gone
    assert mgr.supersede_held("world", "ag", t).detail["held_version"]
    events = mgr.poll(t, wait_s=30.0)
    assert [e.action for e in events] == ["published"]
    assert events[0].detail["rate_after"] > 1.01 * events[0].detail["rate_before"]
    mgr.close()


def test_a_settled_drop_elsewhere_is_never_held_for_a_rise():
    """A ramp's step (a drop the executor confirmed) with a link rising elsewhere (an
    NVSwitch link back from a stall): the job is decided at once, not held."""
    synth = tm.PruningSynth(gate=threading.Event())
    synth.gate.set()
    store, mgr = tm._manager(synth)
    t = _feed(store, 50.0, 1.0)
    mgr.step(t)
    mgr.poll(t, wait_s=5.0)
    t += 0.1
    store.ingest(tm._cable(*NIC, 250.0, t) + tm._cable("s0h0g1", "s0tor1", 100.0, t), now=t)
    assert A in store.moving_links()
    assert [e.action for e in mgr.step(t)] == ["resynthesis"]
    mgr.wait_idle(5.0)
    assert [e.action for e in mgr.poll(t)] != ["held"]
    mgr.close()
