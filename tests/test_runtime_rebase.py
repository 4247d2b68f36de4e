"""What a collective is re-based on after a ``no_gain`` job (issue 26; docs/runtime.md,
"Ramps after no gain"): the confirmed ``M`` the decision was made under, not the job's
input, except links that rose above that input (:meth:`~mccl_runtime.manager.ScheduleManager._rebase`)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from mccl_runtime.drift import detect
from mccl_runtime.manager import Policy, ScheduleManager
from mccl_runtime.telemetry import MeasurementStore
from tests.test_runtime_manager import TOPO, bfs_allgather

UP = ("s0h0g0", "s0tor0")          # the BFS AllGather's bottleneck after the drop (load 2)
FAR = ("s0tor0", "s0h1g0")         # a cut link that is not the bottleneck (load 2)
SIDE = ("s0h0g1", "s0tor1")        # another cut link


class SameTrees:
    """The BFS AllGather again, whatever the capacities (it can never gain); each call
    waits for ``gate``, so that the test changes ``M`` while the job runs."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def __call__(self, kind, topo, warm, time_limit_s):
        assert self.gate.wait(10.0)
        return bfs_allgather(topo)


def _sample(link: tuple[str, str], gbps: float, t: float) -> dict:
    return {"kind": "link", "src": link[0], "dst": link[1], "gbps": gbps, "t": t}


def _no_gain_job(start: list[tuple[tuple[str, str], float]], during: list[tuple[tuple[str, str], float]]):
    """A job started on ``start``'s readings that ends ``no_gain`` after ``during``'s."""
    synth = SameTrees()
    store = MeasurementStore(TOPO, alpha=1.0)
    mgr = ScheduleManager(store, synth, Policy(gamma=0.1, min_dwell_s=0.0))
    mgr.register("world", "ag", "allgather", bfs_allgather(TOPO))
    store.ingest([_sample(link, g, 1.0) for link, g in start], now=1.0)
    assert [e.action.value for e in mgr.step(1.0)] == ["resynthesis"]
    store.ingest([_sample(link, g, 1.005) for link, g in during], now=1.005)
    synth.gate.set()
    assert mgr.wait_idle(10.0)
    events = mgr.poll(1.01)
    assert [(e.action.value, e.detail.get("reason")) for e in events] == [("aborted", "no_gain")]
    return store, mgr, mgr.get("world", "ag")


def test_a_no_gain_job_re_bases_on_the_estimate_it_was_decided_under():
    """A cut link falls 17.5 % while the job runs (no cost to its schedule: not its
    bottleneck, no restart): re-based on the job's input, the profile kept a stale slack
    there and the same ``M`` flagged again at once (deviation 0.16)."""
    far = TOPO.link_index(*FAR)
    store, mgr, coll = _no_gain_job([(UP, 300.0)], [(FAR, 330.0)])
    assert coll.synth_capacity[far] == pytest.approx(330.0)
    assert coll.built_for[far] == pytest.approx(400.0)              # what it was built for: untouched
    assert detect(store.measured(), coll.profile, 0.1).max_delta == pytest.approx(0.0, abs=1e-9)
    assert mgr.step(1.02) == []                                     # the same drift does not flag again
    mgr.close()


def test_a_rise_during_a_no_gain_job_stays_drift():
    """A cut link read low at the job's start rises back while it runs: no synthesis saw
    the rise, so the re-base keeps the job's reading and the rise flags a new job."""
    side = TOPO.link_index(*SIDE)
    store, mgr, coll = _no_gain_job([(UP, 300.0), (SIDE, 330.0)], [(SIDE, 400.0)])
    assert coll.synth_capacity[side] == pytest.approx(330.0)
    assert np.array_equal(coll.synth_capacity[TOPO.link_index(*UP)], 300.0)
    assert [e.action.value for e in mgr.step(1.02)] == ["resynthesis"]
    mgr.close()
