"""Cold re-synthesis on small fabrics (``--cold-gpus``, docs/runtime.md "Ramps and
equal-rate optima"): the loop drops the warm start on fabrics of at most N GPUs, where a
cold solve costs milliseconds and the warm optimum of the same rate can simulate slower."""

from __future__ import annotations

import pytest

import mccl_opt
import tests.test_runtime_manager as tm
from instances import hpn, irregular
from mccl_opt.errors import MCCLError
from mccl_runtime.loop import LoopConfig, run_loop
from mccl_runtime.synthesizer import cold_on_small

TOPO = hpn(1, 2, 4)                              # 8 GPUs


@pytest.fixture
def synth(monkeypatch):
    monkeypatch.setattr(tm, "TOPO", TOPO)        # PruningSynth prunes against this fabric
    return tm.PruningSynth()


def test_the_warm_start_is_dropped_exactly_at_or_below_the_bound(synth):
    warm = synth("allgather", TOPO, None, None)
    synth.calls.clear()
    for bound in (7, 8, 9):
        cold_on_small(synth, bound)("allgather", TOPO, warm, None)
    # 8 GPUs: warm kept under a bound of 7, dropped at 8 and 9
    assert synth.calls == [("allgather", True), ("allgather", False), ("allgather", False)]


@pytest.mark.parametrize("cold_gpus, warm_seen", [(16, False), (0, True)])
def test_the_loop_resynthesizes_cold_on_a_small_fabric_unless_told_otherwise(synth, cold_gpus, warm_seen):
    # synthesis and dispatch modelled: measured ones made the versions depend on the load (failed at 8)
    res = run_loop(LoopConfig(duration_ms=100.0, cold_gpus=cold_gpus, synth_ms=5.0, dispatch_ms=1.0),
                   synthesize=synth)
    assert [v["version"] for v in res.summary["events"][0]["versions"]] == [2]
    jobs = sum(e["action"] == "resynthesis" for e in res.events)
    resyntheses = synth.calls[1:1 + jobs]        # after the baseline, before the offline references (cold)
    assert resyntheses and all(warm is warm_seen for _, warm in resyntheses)


def test_a_negative_bound_names_the_flag(synth):
    with pytest.raises(MCCLError, match="--cold-gpus"):
        cold_on_small(synth, -1)


@pytest.mark.parametrize("collective", ["allgather", "alltoall"])
@pytest.mark.parametrize("share", [0.5, 0.125, 0.01])
def test_cold_and_warm_reach_the_same_rate_on_the_small_irregular_fabric(collective, share):
    """The cold path gives up no rate: the two are equal-rate optima of the fluid LP."""
    solve = mccl_opt.solve_allgather if collective == "allgather" else mccl_opt.solve_alltoall
    topo = irregular(7)
    cap = topo.arrays.capacity.copy()
    for a in (topo.link_index("h1g2", "spine"), topo.link_index("spine", "h1g2")):
        cap[a] *= share
    degraded = topo.with_capacities(cap)
    healthy = solve(topo)
    warm = solve(degraded, warm=healthy)
    seen = []

    def synthesize(kind, t, w, limit):
        seen.append(w)
        return solve(t, warm=w)

    cold = cold_on_small(synthesize, 16)(collective, degraded, healthy, None)
    assert seen == [None]                                  # solved cold
    assert cold.rate_gbps == pytest.approx(warm.rate_gbps, rel=1e-9)
