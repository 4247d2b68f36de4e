"""Speculation on real ranks (docs/executor.md, "Speculation on real ranks"): the ranks'
reporter sends a drop it is still confirming as ``early``, the EWMA store keeps it apart
from ``M``, and a controller with ``Policy.speculate`` synthesizes on it and publishes only
once the drop is reported; ``Policy.cable_wait_s`` waits for a cable's other direction.
Simulated clock, no timing asserts."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mccl_runtime.manager import Policy, ScheduleManager
from mccl_runtime.telemetry import MeasurementStore
from tests.test_runtime_manager import TOPO, PruningSynth, bfs_allgather

PAIR, BACK = ("s0h0g0", "s0h1g0"), ("s0h1g0", "s0h0g0")     # the two pairs across the NIC cable
NIC = ("s0h0g0", "s0tor0")


def _pair(key, gbps, t, early=None):
    s = {"kind": "pair", "src": key[0], "dst": key[1], "gbps": gbps, "t": t}
    return s if early is None else {**s, "early": early}


def _manager(speculate: bool, dwell: float = 0.0, cable_wait: float = 0.0):
    synth = PruningSynth()
    store = MeasurementStore(TOPO, alpha=1.0)                     # real ranks: the EWMA at alpha 1
    store.watch_early = speculate
    policy = Policy(gamma=0.3, min_dwell_s=dwell, speculate=speculate, early_hold_s=1.0, cable_wait_s=cable_wait)
    mgr = ScheduleManager(store, synth, policy, clock=lambda: 0.0)
    mgr.register("world", "ag", "allgather", bfs_allgather(TOPO))
    mgr.wait_idle(5.0)
    mgr.poll(0.0)
    return synth, store, mgr


@settings(max_examples=15, deadline=None)
@given(slow=st.floats(1.25, 3.0), noise=st.floats(0.0, 0.05))
def test_the_reporter_sends_a_drop_it_is_confirming_as_early(slow, noise):
    """A shallow drop (``1 / slow`` above ``DEEP``) is reported on its third window; on its
    second the sample carries it as ``early`` while ``gbps`` still reads the old level.  A
    single stall, or two stalls that disagree, send no ``early``; without ``early=True``
    nothing does."""
    from executor_cuda.faults import FabricEmulator
    from executor_cuda.pair_levels import ModelReporter
    from executor_cuda.reporting import pair_nominal
    from executor_cuda.telemetry import LinkSample
    from instances import hpn
    from mccl_opt.lowering.program import compile_schedule, direct_schedule

    topo = hpn(1, 1, 4)
    g = topo.gpus
    emu = FabricEmulator(topo, g, time_scale=1.0, byte_scale=1.0)
    prog = compile_schedule(direct_schedule("allgather", g), 1000)
    e = 3 * 4000 * 8 / 2880e9
    key = (g[0], g[1])
    for early in (True, False):
        rep = ModelReporter(emu, pair_nominal(topo), early=early)

        def push(factor: float) -> dict:
            samples = [LinkSample(a, b, 4000, (factor if (a, b) == key else 1.0 + noise) * e, 1, 0, 0)
                       for a in g for b in g if a != b]
            return {(x["src"], x["dst"]): x for x in rep(samples, prog, 4, 0.0)}.get(key, {})

        push(1.0)                                                  # the warm-up
        rep.calibrating = False
        for factor in (2.0,) + (1.0,) * 5 + (2.0, 3.0) + (1.0,) * 5:    # stalls: alone, or two that disagree
            got = push(factor)
            assert "early" not in got and got["gbps"] == pytest.approx(2880)
        first, second, third = push(slow), push(slow), push(slow)
        assert "early" not in first and first["gbps"] == pytest.approx(2880)
        assert second["gbps"] == pytest.approx(2880)
        if early:
            assert second["early"] == pytest.approx(2880 / slow)
        else:
            assert "early" not in second
        assert third["gbps"] == pytest.approx(2880 / slow) and "early" not in third


def test_the_store_keeps_early_estimates_apart_from_m_until_a_newer_sample():
    store = MeasurementStore(TOPO, alpha=1.0)
    a = TOPO.link_index(*NIC)
    store.ingest([_pair(PAIR, 400.0, 1.0, early=50.0)], now=1.0)
    assert store.early() is None and store.pending_links().size == 0      # not watched: ignored
    store.watch_early = True
    report = store.ingest([_pair(PAIR, 400.0, 1.1, early=50.0), _pair(BACK, 400.0, 1.1, early=float("nan"))], now=1.1)
    assert store.measured()[a] == pytest.approx(400.0)
    assert store.early()[a] == pytest.approx(50.0) and a in store.pending_links()
    assert report.rejected == {"nan": 1}                                  # a malformed early: its sample refused
    assert TOPO.link_index(*NIC[::-1]) not in store.pending_links()
    store.ingest([_pair(PAIR, 400.0, 1.2)], now=1.2)                       # read again without: gone
    assert store.early() is None and store.pending_links().size == 0


def test_the_early_m_follows_every_change_of_m():
    """The early ``M`` is built once per ``M`` (a decision and ``pending_links`` share it)
    but is ``M`` with the early values in place: a link that moves without any early value
    (a trusted link sample, which keeps the early values) moves in it too."""
    store = MeasurementStore(TOPO, alpha=1.0)
    store.watch_early = True
    a, other = TOPO.link_index(*NIC), TOPO.link_index("s0h0g1", "s0tor1")
    store.ingest([_pair(PAIR, 400.0, 1.0, early=50.0)], now=1.0)
    first = store.early()
    assert store.early() is first and first[a] == pytest.approx(50.0)
    store.ingest_links(np.array([other]), np.array([1.05]), np.array([120.0]))
    assert store.early()[other] == pytest.approx(120.0) and store.early()[a] == pytest.approx(50.0)
    pending = store.pending_links()                                        # the pair's path
    assert a in pending and other not in pending
    np.testing.assert_array_equal(np.delete(store.early(), pending), np.delete(store.measured(), pending))


@pytest.mark.parametrize("speculate", [False, True])
def test_a_speculative_job_starts_on_early_estimates_and_publishes_once_confirmed(speculate):
    synth, store, mgr = _manager(speculate)
    a = TOPO.link_index(*NIC)
    store.ingest([_pair(PAIR, 400.0, 1.0, early=50.0), _pair(BACK, 400.0, 1.0, early=52.0)], now=1.0)
    events = mgr.step(1.0)
    if speculate:
        assert [(e.action, e.detail.get("speculative")) for e in events] == [("resynthesis", True)]
        mgr.wait_idle(5.0)
        assert synth.capacities[-1][a] == pytest.approx(50.0)
        assert [e.action for e in mgr.poll(1.1)] == ["held"]               # the drop is not reported yet
    else:
        assert events == []
    store.ingest([_pair(PAIR, 50.0, 1.3), _pair(BACK, 52.0, 1.3)], now=1.3)  # the ranks report it
    actions = [e.action for e in mgr.step(1.3)]
    if not speculate:
        assert actions == ["resynthesis"]
        mgr.wait_idle(5.0)
        actions = [e.action for e in mgr.poll(1.4)]
    assert actions == ["published"] and len(synth.calls) == 1             # one job
    assert mgr.get("world", "ag").version == 2
    mgr.close()


def test_a_speculation_on_a_stall_publishes_nothing_and_leaves_the_dwell_alone():
    """Early readings that the ranks then read back at the old level (a stall) abort the
    speculative job as cleared; a real drop right after still starts a job at once, the
    dwell (1 s here) counting from the last decision that published."""
    synth, store, mgr = _manager(True, dwell=1.0)
    store.ingest([_pair(PAIR, 400.0, 2.0, early=150.0), _pair(BACK, 400.0, 2.0, early=160.0)], now=2.0)
    assert [e.action for e in mgr.step(2.0)] == ["resynthesis"]
    mgr.wait_idle(5.0)
    store.ingest([_pair(PAIR, 400.0, 2.2), _pair(BACK, 400.0, 2.2)], now=2.2)
    events = mgr.step(2.2)
    assert [(e.action, e.detail.get("reason")) for e in events] == [("aborted", "cleared")]
    assert mgr.get("world", "ag").version == 1
    store.ingest([_pair(PAIR, 50.0, 2.4), _pair(BACK, 50.0, 2.4)], now=2.4)
    assert [e.action for e in mgr.step(2.4)] == ["resynthesis"]
    mgr.close()


def test_one_direction_early_starts_nothing_speculative():
    synth, store, mgr = _manager(True)
    store.ingest([_pair(PAIR, 400.0, 1.0, early=50.0)], now=1.0)
    assert mgr.step(1.0) == [] and synth.calls == []
    assert np.all(store.measured() == TOPO.arrays.capacity)
    mgr.close()


@pytest.mark.parametrize("other_direction", [True, False])
def test_a_drop_read_one_way_waits_for_the_cables_other_direction(other_direction):
    """The NIC read at 50 Gbps by one rank's pair starts no job while the reverse pair, a
    rank that reports a push later, still reads 400; once it reads 50 too, one job covers
    both directions.  A one-way drop starts its job ``cable_wait_s`` after the first check."""
    synth, store, mgr = _manager(False, cable_wait=0.2)
    a, r = TOPO.link_index(*NIC), TOPO.link_index(*NIC[::-1])
    store.ingest([_pair(PAIR, 50.0, 1.0)], now=1.0)
    assert mgr.step(1.0) == [] and mgr.step(1.1) == []
    if other_direction:
        store.ingest([_pair(BACK, 50.0, 1.15)], now=1.15)
        assert [e.action for e in mgr.step(1.15)] == ["resynthesis"]
        mgr.wait_idle(5.0)
        assert synth.capacities[-1][a] == synth.capacities[-1][r] == pytest.approx(50.0)
    else:
        assert mgr.step(1.19) == []
        assert [e.action for e in mgr.step(1.21)] == ["resynthesis"]
        mgr.wait_idle(5.0)
        assert synth.capacities[-1][r] == pytest.approx(400.0)
    mgr.close()


def test_a_drop_the_ranks_reported_starts_on_the_confirmed_m_beside_early_stalls():
    """The NIC reported at 50 flags the collective on the confirmed ``M``; early readings of
    another cable (a stall the ranks may read back) stay out of its job."""
    synth, store, mgr = _manager(True)
    other = TOPO.link_index("s0h0g1", "s0tor1")
    store.ingest([_pair(PAIR, 50.0, 1.0), _pair(BACK, 50.0, 1.0),
                  _pair(("s0h0g1", "s0h1g1"), 400.0, 1.0, early=200.0),
                  _pair(("s0h1g1", "s0h0g1"), 400.0, 1.0, early=200.0)], now=1.0)
    events = mgr.step(1.0)
    assert [(e.action, e.detail.get("speculative")) for e in events] == [("resynthesis", None)]
    mgr.wait_idle(5.0)
    assert synth.capacities[-1][other] == pytest.approx(400.0)
    mgr.close()
