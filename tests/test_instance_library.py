"""Instance library (docs/benchmarks.md): manifest optima vs recomputation and independent bounds."""

from __future__ import annotations

import json

import numpy as np
import pytest

from instances import library
from instances.library import CATALOG, REL_TOL, check, instance, load_manifest
from mccl_opt import MCCLError

SMALL = 16  # GPUs: instances recomputed in full by the test


@pytest.fixture(scope="module")
def manifest():
    return load_manifest()["instances"]


def test_manifest_covers_catalogue_with_every_family(manifest):
    assert [i.name for i in CATALOG] == list(manifest)
    assert {i.family for i in CATALOG} >= {"hpn", "dgx", "irregular"}
    failures = {i.params.get("failure") for i in CATALOG if i.family == "hpn"}
    assert failures == {None, "fail1", "fail2", "fail3"}
    assert sum(p.stat().st_size for p in library.DATA_DIR.glob("*.json")) < 2_000_000


def test_records_are_self_consistent(manifest):
    for inst in CATALOG:
        rec = manifest[inst.name]
        topo = inst.load()
        assert (rec["gpus"], rec["switches"], rec["links"]) == (
            topo.num_gpus, len(topo.switches), topo.num_links)
        z = rec["alltoall"]["methods"]
        assert abs(z["column_generation"] - z["compact_lp_highs"]) <= REL_TOL * z["compact_lp_highs"]
        cert = rec["allgather"]["methods"]["networkx_maxflow"]
        assert cert["feasible_at_rate"] and cert["infeasible_above"]
        zr = rec["alltoall"]["rate_gbps"]
        assert rec["models"]["compact"]["optimum"] == pytest.approx(zr, rel=REL_TOL)
        assert rec["models"]["master"]["optimum"] == pytest.approx(1 / zr, rel=REL_TOL)
        assert set(rec["models"]) == set(library.exported_models(topo))
        sr = rec["models"].get("switch-removal")
        if sr is not None:      # a utility of logical capacities, not a rate
            assert (sr["sense"], sr["objective"]) == ("max", "utility") and sr["optimum"] > 0
            assert topo.num_gpus <= library.SWITCH_REMOVAL_MAX_GPUS and topo.switches


def test_optima_respect_independent_cut_bounds(manifest):
    """A GPU sends N-1 blocks through its egress links and receives N-1 blocks
    (AllToAll) / N-1 shards (AllGather) through its ingress links."""
    for inst in CATALOG:
        topo, rec = inst.load(), manifest[inst.name]
        ar, n = topo.arrays, topo.num_gpus
        out_cap = np.bincount(ar.tail, weights=ar.capacity, minlength=topo.num_nodes)[ar.gpu_nodes]
        in_cap = np.bincount(ar.head, weights=ar.capacity, minlength=topo.num_nodes)[ar.gpu_nodes]
        bound = min(out_cap.min(), in_cap.min()) / (n - 1)
        assert 0 < rec["alltoall"]["rate_gbps"] <= bound * (1 + 1e-9)
        assert 0 < rec["allgather"]["rate_gbps"] <= in_cap.min() / (n - 1) * (1 + 1e-9)
        # AllToAll moves a block per pair; AllGather may share one shard: x* >= z*
        assert rec["allgather"]["rate_gbps"] >= rec["alltoall"]["rate_gbps"] * (1 - 1e-9)


def test_manifest_agrees_with_recomputation_on_small_instances():
    checked = check(max_gpus=SMALL)
    assert len(checked) >= 15
    assert "hpn-1x2x8-fail3" in checked and "irregular-4" in checked


def test_check_detects_a_wrong_optimum(tmp_path, monkeypatch):
    data = json.loads(library.MANIFEST.read_text())
    rec = next(r for r in data["instances"] if r["name"] == "ring-8")
    rec["alltoall"]["rate_gbps"] *= 1.001
    bad = tmp_path / "manifest.json"
    bad.write_text(json.dumps(data))
    monkeypatch.setattr(library, "MANIFEST", bad)
    with pytest.raises(MCCLError, match="ring-8: manifest alltoall rate"):
        check(names=["ring-8"])


def test_check_detects_a_switch_removal_optimum_above_any_utility(tmp_path, monkeypatch):
    """The stored switch-removal optimum records the pipeline's model (not compared with a
    recomputation); it must stay within the bound of the model's definition."""
    data = json.loads(library.MANIFEST.read_text())
    rec = next(r for r in data["instances"] if r["name"] == "dgx-8")
    rec["models"]["switch-removal"]["optimum"] = library.utility_bound(8) * 1.001
    bad = tmp_path / "manifest.json"
    bad.write_text(json.dumps(data))
    monkeypatch.setattr(library, "MANIFEST", bad)
    with pytest.raises(MCCLError, match="dgx-8: manifest switch-removal optimum .* outside"):
        check(names=["dgx-8"])


def test_check_detects_a_switch_removal_loop_that_misses_a_cut(monkeypatch):
    """A separation that finds no violated cut (the loop stops at the degree cuts) keeps
    the exported LP and the loop in agreement, but on irregular-1 (whose loop separates
    one cut) the optimum's logical graph fails the independent max-flow certificate."""
    from mccl_opt.allgather.forestcoll import step_aware

    monkeypatch.setattr(step_aware, "_violated_cuts", lambda cap, k: [])
    assert not library.switch_removal_certificate(instance("irregular-1").load())["keeps_rooted_cuts"]
    with pytest.raises(MCCLError, match="irregular-1: the switch-removal model's optimum fails"):
        check(names=["irregular-1"])


def test_maxflow_certificate_rejects_a_wrong_rate():
    topo = instance("hpn-1x2x4-fail2").load()
    x = library.allgather_rate(topo)
    assert library.allgather_maxflow_certificate(topo, x)["infeasible_above"]
    low = library.allgather_maxflow_certificate(topo, 0.9 * x)
    assert low["feasible_at_rate"] and not low["infeasible_above"]


def test_unknown_instance_names_the_catalogue():
    with pytest.raises(MCCLError, match="hpn-1x2x8-fail2"):
        instance("nope")


def test_module_entry_point_checks(capsys):
    assert library.main(["check", "--max-gpus", "6"]) == 0
    assert "agree" in capsys.readouterr().out
