"""The Figure 9 experiment: transplanting, the cut check, the table and ``mccl eval``."""

from __future__ import annotations

import json

import pytest

from instances import fail1, fail2, fail3, hpn
from mccl_opt.baselines import pxn_alltoall, ring_allgather
from mccl_opt.evaluate import cut_check, run_failure_experiment, transplant
from mccl_opt.validate import validate


def test_transplant_onto_fail3_reroutes_through_the_backup():
    topo = hpn(1, 2, 4)
    bad = fail3(topo)
    for sched in (pxn_alltoall(topo), ring_allgather(topo)):
        moved = transplant(sched, bad)
        report = validate(bad, moved)
        assert moved.rate_gbps == pytest.approx(report.rate_gbps)
        assert "s0h0g0" not in moved.gpus and moved.gpus[0] == "s0h0g0-bk"


def test_cut_check_keeps_a_schedule_whose_cut_is_untouched():
    topo = hpn(1, 2, 4)
    sched = pxn_alltoall(topo)          # NIC-bound: fail1 (NVSwitch) is outside the cut
    needed, dev = cut_check(sched, transplant(sched, fail1(topo)), fail1(topo))
    assert not needed and dev == pytest.approx(0.0, abs=1e-9)
    needed, dev = cut_check(sched, transplant(sched, fail3(topo)), fail3(topo))
    assert needed and dev > 0.05


def test_experiment_rows_on_small_hpn():
    topo = hpn(1, 2, 4)
    failures = {f.__name__: f(topo) for f in (fail1, fail2, fail3)}
    rows = run_failure_experiment(topo, "alltoall", failures, 32 * 2**20)
    assert [r["failure"] for r in rows] == ["fail1", "fail2", "fail3"]
    by = {r["failure"]: r for r in rows}
    # fail1 hits the NVSwitch, outside the NIC cut: the old schedule stays optimal
    assert not by["fail1"]["reopt_needed"] and by["fail1"]["stale_still_optimal"]
    assert by["fail1"]["no_reopt_speedup"] == pytest.approx(by["fail1"]["reopt_speedup"], rel=1e-3)
    # fail2 cuts the NIC: re-synthesis must win clearly and never lose to the stale schedule
    assert by["fail2"]["reopt_needed"] and by["fail2"]["reopt_speedup"] > 2
    for r in rows:
        assert r["reopt_algbw"] >= r["no_reopt_algbw"] * (1 - 1e-6)
        assert r["reopt_rate_gbps"] >= r["no_reopt_rate_gbps"] * (1 - 1e-6)


def test_cli_eval_writes_table_json_and_png(tmp_path, capsys, monkeypatch):
    from mccl_opt.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["eval", "hpn", "1x2x2", "--collective", "allgather", "--json", "-b", "1M", "-e", "1M"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["failure"] for r in out["summary"]] == ["fail1", "fail2", "fail3"]
    assert len(out["rows"]) == 3 * 3                    # failures x (nccl-ring, no-reopt, reopt)
    assert not list(tmp_path.glob("*.png"))           # no plot unless --png asks for one
    assert main(["eval", "hpn", "1x2x2", "--collective", "alltoall", "--failures", "fail2",
                 "-b", "1M", "-e", "1M", "--png", "x.png"]) == 0
    text = capsys.readouterr().out
    assert "fail2" in text and "reopt x" in text and (tmp_path / "x.png").exists()


def test_cli_eval_bad_target(capsys):
    from mccl_opt.cli import main

    assert main(["eval", "hpn"]) == 2
    assert "hpn SxHxN" in capsys.readouterr().err
