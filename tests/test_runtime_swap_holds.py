"""Swap holds sent to real executors (docs/runtime.md, "Swap holds on real
executors"): after a publish the service watches the version; a change that makes it
unfit (``ScheduleManager.swap_hold``) is published as a ``hold``, its clearing (or
``settle_max_s``) as a release; ``get_schedule`` carries the same state; a newer version
ends the watch of the older one, which is never released."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest

from mccl_opt.schedule import share_loads
from mccl_runtime.client import ControllerClient, HoldUpdate
from mccl_runtime.manager import Policy
from mccl_runtime.publish_decision import Estimate, held_against, swap_holding
from mccl_runtime.service import ControllerService
from mccl_runtime.swap_holds import SwapHolds
from tests.test_runtime_manager import TOPO, PruningSynth, bfs_allgather

LINK = ["s0h0g0", "s0tor0"]


class _Manager:
    """``swap_holds`` answers from a script (the test sets ``links``: held and unfit)."""

    def __init__(self, settle_max_s: float = 0.05) -> None:
        self.policy = SimpleNamespace(settle_max_s=settle_max_s)
        self.links: list[list[str]] = []
        self.fresh = True                  # the held links measured again since the hold

    def swap_holds(self, comm: str, name: str) -> tuple[list[list[str]], list[list[str]]]:
        return list(self.links), list(self.links)

    def hold_settled(self, comm: str, name: str, links: list[list[str]], since: float, recent_s: float) -> bool:
        return self.fresh

    def supersede_held(self, comm: str, name: str, now: float) -> None:
        return None                        # no job to replace the held version: it is released

    def superseding(self, comm: str, name: str, version: int) -> bool:
        return False


def test_a_hold_is_released_when_the_change_clears_or_after_settle_max():
    mgr, holds = _Manager(settle_max_s=0.05), SwapHolds(window_s=1.0)
    holds.published("w", "ag", 3, now=0.0)
    assert holds.turn(mgr, 0.01) == [] and holds.held("w", "ag", 3) == []
    mgr.links = [LINK]
    assert holds.turn(mgr, 0.02) == [("w", "ag", 3, [LINK])]
    assert holds.held("w", "ag", 3) == [LINK] and holds.held("w", "ag", 2) == []
    assert holds.turn(mgr, 0.03) == []                       # announced once
    assert holds.turn(mgr, 0.07) == [("w", "ag", 3, [])]     # settle_max_s after the hold: released
    assert holds.turn(mgr, 0.08) == [] and holds.held("w", "ag", 3) == []
    holds.published("w", "ag", 4, now=1.0)
    assert holds.turn(mgr, 1.01) == [("w", "ag", 4, [LINK])]
    mgr.links = []
    assert holds.turn(mgr, 1.02) == [("w", "ag", 4, [])]     # the change cleared: released
    assert holds.sent == 4


def test_a_hold_outlasts_settle_max_until_the_held_links_are_measured_again():
    """On real ranks a collective lasts longer than ``settle_max_s``: a hold is not
    released on the estimate that made it, only once a fresh reading of the held links
    arrived (or ``window_s`` after it began)."""
    mgr, holds = _Manager(settle_max_s=0.05), SwapHolds(window_s=1.0)
    mgr.links, mgr.fresh = [LINK], False
    holds.published("w", "ag", 3, now=0.0)
    assert holds.turn(mgr, 0.01) == [("w", "ag", 3, [LINK])]
    assert holds.turn(mgr, 0.07) == [] and holds.held("w", "ag", 3) == [LINK]   # past settle, not re-measured
    mgr.fresh = True
    assert holds.turn(mgr, 0.09) == [("w", "ag", 3, [])]
    holds.published("w", "ag", 4, now=2.0)
    mgr.fresh = False
    assert holds.turn(mgr, 2.01) == [("w", "ag", 4, [LINK])]
    assert holds.turn(mgr, 2.5) == []
    assert holds.turn(mgr, 3.01) == [("w", "ag", 4, [])]     # window_s: released whatever was heard


def _v2_published_for_a_drop():
    """A manager whose v2 was published for a drop of pair ``s0h0g0 -> s0h1g0`` to 50."""
    from mccl_runtime.manager import ScheduleManager
    from mccl_runtime.telemetry import MeasurementStore

    store = MeasurementStore(TOPO, alpha=1.0, clock=lambda: 10.0)
    mgr = ScheduleManager(store, PruningSynth(), Policy(min_dwell_s=0.0))
    mgr.register("w", "ag", "allgather", now=0.0)
    assert mgr.wait_idle(30.0)
    mgr.step(1.0)
    pair = {"kind": "pair", "src": "s0h0g0", "dst": "s0h1g0"}
    store.ingest([{**pair, "gbps": 50.0, "t": 9.0}])                 # a drop: v2 is built for it
    mgr.step(9.0)
    assert mgr.wait_idle(30.0)
    assert [e.action.value for e in mgr.step(9.1)] == ["published"]
    return store, mgr, pair


def test_the_manager_settles_a_hold_on_a_fresh_reading_unless_the_change_reverted():
    """``hold_settled``: not while a link's channel sampled before the hold has not been
    sampled since; once it has, yes if the links still differ from the version before's
    capacities (a real change), no if they read as that version was built for (the held
    version was made for a transient: the ranks keep the version before)."""
    store, mgr, pair = _v2_published_for_a_drop()
    assert mgr.swap_hold("w", "ag") == []
    store.ingest([{**pair, "gbps": 400.0, "t": 9.5}])                # ... it reverted
    held = mgr.swap_hold("w", "ag")
    assert LINK in held
    assert not mgr.hold_settled("w", "ag", held, since=9.6, recent_s=1.0)      # not heard since
    store.ingest([{**pair, "gbps": 399.0, "t": 9.7}])
    assert not mgr.hold_settled("w", "ag", held, since=9.6, recent_s=1.0)      # heard: v1 fits again
    store.ingest([{**pair, "gbps": 200.0, "t": 9.8}])
    assert mgr.hold_settled("w", "ag", mgr.swap_hold("w", "ag"), since=9.6, recent_s=1.0)   # a new change
    mgr.close()


def test_a_reverted_hold_settles_when_the_version_before_no_longer_fits_elsewhere():
    """A ramp on real ranks: v2 built on the NIC's drop, held because the drop it was
    built on reverted (a stalled reading), while the fabric moved elsewhere (another
    NIC's pair at 200): the version before fits no better, so the hold settles (a job
    replaces both) instead of running one of them until ``hold_window_s``."""
    store, mgr, pair = _v2_published_for_a_drop()
    store.ingest([{**pair, "gbps": 400.0, "t": 9.5}])                # reverted ...
    held = mgr.swap_hold("w", "ag")
    store.ingest([{**pair, "gbps": 399.0, "t": 9.7}])
    assert not mgr.hold_settled("w", "ag", held, since=9.6, recent_s=1.0)      # v1 fits: keep it
    store.ingest([{"kind": "pair", "src": "s0h0g1", "dst": "s0h1g1", "gbps": 200.0, "t": 9.8}])
    assert mgr.hold_settled("w", "ag", held, since=9.6, recent_s=1.0)          # ... v1 no longer fits
    mgr.close()


def test_a_version_unfit_for_a_settled_drop_is_replaced_at_once_without_a_hold():
    """A version built on a partial picture (one pair read low) no longer fits when a
    second pair reads low, but it still beats the version before under that estimate, so
    it is not held (the ranks would keep the slower v1: issue 26, real ranks); once a
    fresh reading confirms the drop, a job starts at once, within the dwell time, and its
    version is built for the whole picture.  Before, v2 was held (and, before that,
    released with the next version a dwell later)."""
    import mccl_opt as mo
    from mccl_runtime.manager import ScheduleManager
    from mccl_runtime.synthesizer import solver_synthesizer
    from mccl_runtime.telemetry import MeasurementStore

    store = MeasurementStore(TOPO, alpha=1.0, clock=lambda: 10.0)
    mgr = ScheduleManager(store, solver_synthesizer(), Policy(min_dwell_s=1.0))
    mgr.register("w", "ag", "allgather", now=0.0)
    assert mgr.wait_idle(30.0) and [e.action.value for e in mgr.step(1.0)] == ["published"]
    a = {"kind": "pair", "src": "s0h0g0", "dst": "s0h1g0"}
    b = {"kind": "pair", "src": "s0h0g1", "dst": "s0h1g1"}
    store.ingest([{**a, "gbps": 50.0, "t": 9.0}])                   # the partial picture
    mgr.step(9.0)
    assert mgr.wait_idle(30.0) and [e.action.value for e in mgr.step(9.1)] == ["published"]
    holds = SwapHolds(window_s=1.0)
    holds.published("w", "ag", 2, now=9.1)
    store.ingest([{**b, "gbps": 150.0, "t": 9.2}])                  # the rest of it
    assert mgr.swap_hold("w", "ag")                                  # v2 does not fit it ...
    assert holds.turn(mgr, 9.2) == [] and not holds.held("w", "ag", 2)   # ... but beats v1: not held
    store.ingest([{**b, "gbps": 150.0, "t": 9.3}])                  # a fresh reading: real
    assert mgr.step(9.3) == []                                       # within the dwell: no flag
    assert holds.turn(mgr, 9.3) == []
    events = holds.take_events()
    assert [e.action.value for e in events] == ["resynthesis"] and events[0].detail["unfit_version"]
    assert mgr.wait_idle(30.0) and [e.action.value for e in mgr.poll(9.35)] == ["published"]
    m = store.measured()
    best = mo.solve_allgather(TOPO.with_capacities(m)).rate_gbps
    loads = mgr.get("w", "ag").profile.loads
    assert float((m[loads > 1e-12] / loads[loads > 1e-12]).min()) == pytest.approx(best, rel=0.02)
    mgr.close()


def test_a_superseding_job_without_a_better_schedule_releases_the_held_version():
    mgr, holds = _Manager(), SwapHolds(window_s=1.0)
    replacing = [True]
    mgr.superseding = lambda comm, name, version: replacing[0]
    holds.published("w", "ag", 3, now=0.0)
    mgr.links = [LINK]
    assert holds.turn(mgr, 0.01) == [("w", "ag", 3, [LINK])]
    assert holds.turn(mgr, 0.07) == [] and holds.held("w", "ag", 3) == [LINK]   # settled, a job runs
    replacing[0] = False                                             # it ended no_gain
    assert holds.turn(mgr, 0.08) == [("w", "ag", 3, [])]


def test_a_newer_version_ends_the_hold_of_the_older_and_the_watch_ends_after_the_window():
    mgr, holds = _Manager(), SwapHolds(window_s=0.5)
    holds.published("w", "ag", 3, now=0.0)
    mgr.links = [LINK]
    assert holds.turn(mgr, 0.01) == [("w", "ag", 3, [LINK])]
    holds.published("w", "ag", 4, now=0.02)                  # never a release for 3
    mgr.links = []
    assert holds.turn(mgr, 0.03) == [] and holds.held("w", "ag", 3) == []
    assert holds.turn(mgr, 0.6) == []                        # 4 unheld for the window: no longer watched
    mgr.links = [LINK]
    assert holds.turn(mgr, 0.7) == []


def test_the_service_publishes_holds_and_serves_them_with_the_schedule():
    svc = ControllerService(TOPO, "tcp://127.0.0.1:0", synthesize=PruningSynth(), alpha=1.0,
                            policy=Policy(gamma=0.1, min_dwell_s=0.0, settle_max_s=30.0))
    mgr = _Manager()
    svc.manager.swap_holds = mgr.swap_holds                    # the scripted answer
    thread = threading.Thread(target=svc.serve_forever, daemon=True)
    thread.start()
    try:
        assert svc.ready.wait(5.0)
        with ControllerClient(svc.endpoint, timeout_s=5.0) as cli:
            sub = cli.subscribe()
            assert sub.wait_connected(5.0)
            cli.register("world", "ag", "allgather")
            upd = sub.recv_any(5.0)
            assert upd is not None and upd[:3] == ("world", "ag", 1)
            mgr.links = [LINK]
            hold = sub.recv_any(5.0)
            assert hold == HoldUpdate("world", "ag", 1, (tuple(LINK),)) and hold.held
            status = cli.schedule_status("world", "ag")
            assert status.version == 1 and status.held == (tuple(LINK),) and status.schedule is not None
            assert cli.get_schedule("world", "ag")[0] == 1   # the old call is unchanged
            mgr.links = []
            release = sub.recv_any(5.0)
            assert release == HoldUpdate("world", "ag", 1, ()) and not release.held
            assert cli.schedule_status("world", "ag").held == ()
            assert cli.stats()["swap_holds"] == 2
            assert sub.recv(0.2) is None                     # recv skips holds; nothing else came
            sub.close()
    finally:
        svc.stop()
        thread.join(5.0)
    assert not thread.is_alive()


def test_a_signed_hold_passes_the_subscriptions_checks():
    key = b"0123456789abcdef-test-key"
    svc = ControllerService(TOPO, "tcp://127.0.0.1:0", synthesize=PruningSynth(), alpha=1.0, key=key,
                            policy=Policy(gamma=0.1, min_dwell_s=0.0, settle_max_s=30.0))
    mgr = _Manager()
    svc.manager.swap_holds = mgr.swap_holds
    thread = threading.Thread(target=svc.serve_forever, daemon=True)
    thread.start()
    try:
        assert svc.ready.wait(5.0)
        with ControllerClient(svc.endpoint, key=key, timeout_s=5.0) as cli:
            sub = cli.subscribe()
            assert sub.wait_connected(5.0)
            cli.register("world", "ag", "allgather")
            assert sub.recv_any(5.0)[2] == 1
            mgr.links = [LINK]
            deadline = time.monotonic() + 5.0
            hold = None
            while hold is None and time.monotonic() < deadline:
                hold = sub.recv_any(0.5)
            assert isinstance(hold, HoldUpdate) and hold.version == 1 and sub.rejected == 0
            sub.close()
    finally:
        svc.stop()
        thread.join(5.0)


def test_a_malformed_held_field_is_a_protocol_error():
    import pytest

    from mccl_runtime.protocol import ProtocolError
    from mccl_runtime.updates import held_links

    assert held_links([LINK]) == (tuple(LINK),) and held_links([]) == ()
    for bad in (None, "s0h0g0", [["s0h0g0"]], [["a", 1]], [("a", "b")]):
        with pytest.raises(ProtocolError, match="'held' must be a list"):
            held_links(bad)


def test_a_drop_holds_a_version_only_when_it_costs_the_versions_rate():
    """Issue 26 on real ranks: a stalled NVSwitch link read at 0.65 of nominal held the
    version built for a NIC's step to the end of the run.  v2 here is built for the pair
    ``s0h0g0 -> s0h1g0`` at 50 (bottleneck 400 / 2 on ToR 1's cable); an NVSwitch link
    it uses read at 0.65 of 2880, and the NIC cable it avoids read lower still, cost it
    nothing: no hold (main held both); the NIC's other direction, which it uses, read at
    50: held."""
    store, mgr, pair = _v2_published_for_a_drop()
    store.ingest([{"kind": "link", "src": "s0h1nvs", "dst": "s0h1g1", "gbps": 0.65 * 2880.0, "t": 9.5},
                  {"kind": "link", "src": "s0h0g0", "dst": "s0tor0", "gbps": 10.0, "t": 9.5}])   # v2 avoids it
    assert mgr.swap_hold("w", "ag") == []
    store.ingest([{"kind": "link", "src": "s0tor0", "dst": "s0h0g0", "gbps": 50.0, "t": 9.6}])
    assert mgr.swap_hold("w", "ag") == [["s0tor0", "s0h0g0"]]
    mgr.close()


def test_swap_holding_keeps_rises_and_binding_drops():
    """:func:`swap_holding` on a BFS AllGather that uses the NIC ``s0h0g0 <-> s0tor0``,
    built for it at 137.5: its reverse direction read at 50 (binding) holds, an NVSwitch
    link at 0.65 of nominal does not, a rise back to 400 holds (a clear during synthesis
    never runs the failure's schedule)."""
    nominal = TOPO.arrays.capacity.copy()
    nic, back, nvs = (TOPO.link_index(*l) for l in (LINK, LINK[::-1], ("s0h0nvs", "s0h0g0")))
    built = nominal.copy()
    built[[nic, back]] = 137.5
    loads = share_loads(TOPO, bfs_allgather(TOPO).chunks)
    assert loads[back] > 0 and loads[nvs] > 0
    mine, none = np.ones(TOPO.num_links, dtype=bool), np.zeros(0, dtype=np.int64)

    def held(readings: dict[int, float], before: np.ndarray | None = None) -> list[int]:
        prov = built.copy()
        for i, gbps in readings.items():
            prov[i] = gbps
        pending = np.array(sorted(readings), dtype=np.int64)
        est = Estimate(built, prov, pending, none, none, nominal)
        unfit = swap_holding(est, mine, built, loads, tol=0.1, rate_loss=0.05)
        return (unfit if before is None else held_against(unfit, prov, loads, before, min_gain=0.01)).tolist()

    assert held({nvs: 0.65 * 2880.0}) == []
    assert held({back: 50.0}) == [back]
    assert held({back: 50.0, nvs: 0.65 * 2880.0}) == [back]
    assert held({nic: 400.0}) == [nic]
    # real executors: nothing holds while the version the ranks run meanwhile is slower
    slower, as_fast = loads.copy(), loads.copy()
    slower[back] *= 4.0                                   # leans on the dropped link: 4x slower there
    assert held({back: 50.0}, before=slower) == []
    assert held({back: 50.0}, before=as_fast) == [back]
    assert held({nic: 400.0}, before=as_fast) == [nic]    # a clear: the version before is as fast
    healthy = loads.copy()
    healthy[[nic, back]] *= 137.5 / 400.0                 # made for the NIC at 400: faster once it is
    assert held({nic: 400.0, back: 400.0}, before=healthy) == [nic, back]
    assert held({nic: 400.0}, before=slower) == []        # a reverted stall under a slower version
