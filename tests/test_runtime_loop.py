"""Closed-loop simulation (mccl loop) and the workload speedup estimate."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

import tests.test_runtime_manager as tm
from instances import fail2, hpn
from mccl_opt.baselines import ring_allgather
from mccl_opt.errors import MCCLError
from mccl_opt.sim import simulate
from mccl_runtime.loop import LoopConfig, run_loop, telemetry_from_sim
from mccl_runtime.workload import estimate_speedup, load_workload

TOPO = hpn(1, 2, 4)


@pytest.fixture
def fake_synth(monkeypatch):
    monkeypatch.setattr(tm, "TOPO", TOPO)       # PruningSynth prunes against this fabric
    return tm.PruningSynth


def test_telemetry_reports_saturated_links_at_their_capacity():
    topo = fail2(TOPO)
    res = simulate(topo, ring_allgather(TOPO), 2**20)
    samples = telemetry_from_sim(res, topo.arrays.capacity, 1.0, np.random.default_rng(0), 0.0)
    assert samples
    for s in samples:
        assert s["gbps"] == pytest.approx(topo.link(s["src"], s["dst"]).capacity_gbps)
    assert ("s0h0g0", "s0tor0") in {(s["src"], s["dst"]) for s in samples}


def test_loop_detects_resynthesizes_and_recovers(fake_synth):
    synth = fake_synth()
    res = run_loop(LoopConfig(alpha=0.2, duration_ms=150.0), synthesize=synth)
    s = res.summary
    assert s["detect_ms"] > 0 and s["synth_ms"] > 0 and s["swap_ms"] > 0
    assert s["reaction_ms"] == pytest.approx(s["detect_ms"] + s["synth_ms"] + s["swap_ms"])
    assert s["algbw_before"] > s["algbw_after"] > s["algbw_degraded"]
    assert [v["version"] for v in s["versions"]][:1] == [2]
    versions = [r["version"] for r in res.rows]
    assert versions == sorted(versions)                    # swaps only forward, at boundaries
    assert all(r["version"] == 1 for r in res.rows if r["t_ms"] < 20.0 + s["reaction_ms"] - 1e-9)


def test_loop_does_not_publish_when_failure_clears_during_synthesis(fake_synth):
    synth = fake_synth(sleep_s=0.08)                      # 80 ms of synthesis
    res = run_loop(LoopConfig(alpha=0.3, t0_ms=10.0, t1_ms=40.0, duration_ms=150.0), synthesize=synth)
    actions = [e["action"] for e in res.events]
    assert "resynthesis" in actions and "published" not in actions
    assert [e["detail"]["reason"] for e in res.events if e["action"] == "aborted"][0] == "cleared"
    assert res.summary["versions"] == [] and {r["version"] for r in res.rows} == {1}


def test_builtin_scenario_with_real_solver_json():
    pytest.importorskip("mccl_opt.allgather")
    from mccl_opt.cli import main

    out = io.StringIO()
    import contextlib
    with contextlib.redirect_stdout(out):
        assert main(["loop", "--json", "--duration-ms", "120"]) == 0
    s = json.loads(out.getvalue())
    for key in ("detect_ms", "synth_ms", "swap_ms", "reaction_ms", "algbw_before", "algbw_degraded",
                "algbw_after", "versions"):
        assert key in s
    assert s["versions"] and s["algbw_after"] > s["algbw_degraded"]


def test_workload_speedup_orders_the_three_cases():
    pytest.importorskip("mccl_opt.allgather")
    pytest.importorskip("mccl_opt.alltoall")
    profile = {"format": "mccl-workload/1", "name": "t", "compute_share": 0.5,
               "collectives": [{"kind": "allgather", "bytes": 2**24, "count": 10},
                               {"kind": "allreduce", "bytes": 2**26, "count": 1},
                               {"kind": "alltoall", "bytes": 2**24, "count": 4}]}
    res = estimate_speedup(profile, TOPO, fail2(TOPO))
    it = res["iteration_s"]
    assert it["healthy"] <= it["mccl"] <= it["static"] and res["speedup"] > 1.0
    # compute is half of the healthy iteration
    assert res["compute_s"] == pytest.approx(it["healthy"] / 2)
    # the static ReduceScatter half of the AllReduce is the same for static and MCCL
    assert res["rates_gbps"]["static"]["ring"] == res["rates_gbps"]["mccl"]["ring"]


@pytest.mark.parametrize("bad, match", [
    ({"format": "x"}, "format"),
    ({"format": "mccl-workload/1", "compute_share": 1.5, "collectives": []}, "compute_share"),
    ({"format": "mccl-workload/1", "compute_share": 0.1, "collectives": [{"kind": "gossip"}]}, "kind"),
    ({"format": "mccl-workload/1", "compute_share": 0.1,
      "collectives": [{"kind": "allgather", "bytes": -1, "count": 1}]}, "bytes"),
])
def test_bad_workload_profiles_name_the_problem(bad, match):
    with pytest.raises(MCCLError, match=match):
        load_workload(bad)
