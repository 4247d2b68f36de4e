"""``mccl eval`` in nccl-tests' conventions: sizes, counts, algbw/busbw, model choice,
JSON/CSV output, early size errors, and failures that do not apply to a fabric."""

from __future__ import annotations

import csv
import json

import pytest

from instances import dgx, fail2, fail3, hpn
from mccl_opt.evaluate import NO_REOPT, REOPT, failure_cases, transplant
from mccl_opt.sim import SimulationError
from mccl_opt.sweep import (ELEMENT_BYTES, ROW_FIELDS, bus_factor, check_sizes, nccl_count,
                            nccl_size, piece_count, summary_rows, sweep_rows, sweep_sizes)
from mccl_opt.validate import validate


@pytest.fixture(scope="module")
def small_cases():
    """hpn 1x2x2 under Fail2, both collectives, synthesized once for the module."""
    topo = hpn(1, 2, 2)
    return {c: failure_cases(topo, c, {"fail2": fail2(topo)}) for c in ("allgather", "alltoall")}


def test_bus_factors_are_nccl_tests():
    assert bus_factor("allgather", 8) == 7 / 8
    assert bus_factor("alltoall", 16) == 15 / 16
    assert bus_factor("allreduce", 8) == 2 * 7 / 8
    with pytest.raises(SimulationError, match="no bus-bandwidth factor"):
        bus_factor("broadcastish", 8)


def test_sizes_step_by_the_factor_from_b_to_e():
    assert sweep_sizes(1024, 2**20, 2) == [1024 * 2**k for k in range(11)]
    assert sweep_sizes(1024, 10 * 1024, 4) == [1024, 4096]        # -e need not be hit exactly
    assert sweep_sizes(4096, 4096, 1) == [4096]                   # one size: the factor is unused
    for bad in ((2048, 1024, 2), (1024, 4096, 1), (0, 1024, 2)):
        with pytest.raises(SimulationError):
            sweep_sizes(*bad)


def test_counts_and_sizes_round_down_like_nccl_tests():
    # AllGather: count = elements each rank sends; size = receive buffer N x count
    assert nccl_count("allgather", 1024, 8) == 32 and nccl_size(32, 8) == 1024
    assert nccl_count("allgather", 1024, 6) == 42 and nccl_size(42, 6) == 1008
    # AllToAll: count per peer, a multiple of 4 elements (16 bytes)
    assert nccl_count("alltoall", 1024, 6) == 40 and nccl_size(40, 6) == 960
    with pytest.raises(SimulationError, match="smallest size is 128 bytes"):
        check_sizes(["alltoall"], 64, 1024, 2, 8)
    assert check_sizes(["allgather"], 32, 64, 2, 8) == [32, 64]


def test_rows_follow_nccl_tests_formulas_and_behave_with_size(small_cases):
    sizes = sweep_sizes(1024, 2**30, 32)                # 1K 32K 1M 32M 1G
    for coll, cases in small_cases.items():
        rows = sweep_rows(cases, coll, sizes)
        n = cases[0].topo.num_gpus
        assert [tuple(r) for r in rows] == [ROW_FIELDS] * len(rows)
        assert len(rows) == len(sizes) * len(cases[0].schedules)
        for r in rows:
            assert r["size"] == n * r["count"] * ELEMENT_BYTES
            assert r["algbw_GBps"] == pytest.approx(r["size"] / (r["time_us"] * 1e-6) / 1e9, rel=1e-12)
            assert r["busbw_GBps"] == r["algbw_GBps"] * (n - 1) / n
        for method in cases[0].schedules:
            mine = [r for r in rows if r["method"] == method]
            assert [r["size"] for r in mine] == sizes
            times = [r["time_us"] for r in mine]
            bws = [r["algbw_GBps"] for r in mine]
            assert times == sorted(times) and times[0] < times[-1]
            # latency dominates 1K: algbw there is at least 10x below algbw at 1G
            assert bws[0] < 0.1 * bws[-1], (coll, method, bws)


def test_auto_model_switches_to_fluid_above_the_event_limit(small_cases):
    cases = small_cases["alltoall"]
    sizes = sweep_sizes(1024, 2**26, 64)                # 1K 64K 4M
    pieces = {s: max(piece_count(cases[0].topo, sched, nccl_count("alltoall", s, 4) * ELEMENT_BYTES)
                     for sched in cases[0].schedules.values()) for s in sizes}
    assert pieces[sizes[0]] < pieces[sizes[-1]]
    limit = pieces[sizes[0]]
    rows = sweep_rows(cases, "alltoall", sizes, event_limit=limit)
    for r in rows:
        assert r["model"] == ("event" if pieces[r["size"]] <= limit else "fluid")
    assert {r["model"] for r in rows} == {"event", "fluid"}
    assert {r["model"] for r in sweep_rows(cases, "alltoall", sizes[:1], model="fluid")} == {"fluid"}
    with pytest.raises(SimulationError, match="model must be one of"):
        sweep_rows(cases, "alltoall", sizes, model="packet")


def test_fluid_and_event_level_agree_at_large_sizes(small_cases):
    """At 64 MiB on 4 GPUs every chunk is cut into >= 16 pieces of 512 KiB: pipeline fill
    and latency are small and the two models agree within 1% (docs/sim.md states the
    tolerances measured on larger fabrics)."""
    for coll, cases in small_cases.items():
        ev = sweep_rows(cases, coll, [2**26], model="event")
        fl = sweep_rows(cases, coll, [2**26], model="fluid")
        assert [r["model"] for r in ev + fl] == ["event"] * len(ev) + ["fluid"] * len(fl)
        for a, b in zip(ev, fl):
            assert a["method"] == b["method"]
            assert a["algbw_GBps"] == pytest.approx(b["algbw_GBps"], rel=0.01), (coll, a["method"])


def test_summary_is_figure9_at_the_largest_size(small_cases):
    cases = small_cases["alltoall"]
    rows = sweep_rows(cases, "alltoall", [4096, 2**20])
    (s,) = summary_rows(cases, "alltoall", rows)
    at = {r["method"]: r["algbw_GBps"] for r in rows if r["size"] == 2**20}
    assert s["size"] == 2**20 and s["baseline"] == "nccl-pxn"
    assert s["reopt_speedup"] == at[REOPT] / at["nccl-pxn"]
    assert s["no_reopt_speedup"] == at[NO_REOPT] / at["nccl-pxn"]


def test_fail3_on_a_dgx_keeps_every_nvswitch_plane_reachable():
    topo = dgx(4)
    bad = fail3(topo)
    planes = [l for l in bad.links if l.src == "g0-bk" and l.dst.startswith("nvs")]
    assert sorted(l.dst for l in planes) == ["nvs0", "nvs1", "nvs2", "nvs3"]
    assert sum(l.capacity_gbps for l in planes) == pytest.approx(50.0)
    from mccl_opt.baselines import direct_alltoall, ring_allgather

    for sched in (direct_alltoall(topo), ring_allgather(topo)):
        moved = transplant(sched, bad)
        assert validate(bad, moved).rate_gbps == pytest.approx(moved.rate_gbps)


# ---------------------------------------------------------------------- the command
def _no_synthesis(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("synthesis started before the sizes were checked")

    monkeypatch.setattr("mccl_opt.evaluate._solve", refuse)


@pytest.mark.parametrize("flags, message", [
    (["-b", "0"], "positive whole number"),
    (["-b", "1G", "-e", "1K"], "-b <= -e"),
    (["-b", "1K", "-e", "1M", "-f", "1"], "-f must be"),
    (["-b", "8", "--collective", "alltoall"], "too small for alltoall"),
    (["-e", "lots"], "byte count"),
    (["--event-limit", "-1"], "--event-limit must be >= 0"),
    (["--failures", "fail1,failX"], "unknown failX"),
])
def test_bad_arguments_exit_2_before_synthesis(flags, message, monkeypatch, capsys, tmp_path):
    from mccl_opt.cli import main

    _no_synthesis(monkeypatch)
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "hpn-1x2x2", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err
    assert not list(tmp_path.iterdir())


def test_json_and_csv_carry_the_same_rows(tmp_path, capsys, monkeypatch):
    from mccl_opt.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["eval", "hpn", "1x2x2", "--collective", "alltoall", "--failures", "fail2",
                 "-b", "1K", "-e", "64K", "-f", "8", "--json", "--csv", "rows.csv"]) == 0
    out = json.loads(capsys.readouterr().out)
    with open(tmp_path / "rows.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    assert len(out["rows"]) == len(table) == 3 * 4      # 3 sizes x (pxn, direct, no-reopt, reopt)
    for js, cs in zip(out["rows"], table):
        assert list(cs) == list(js) == list(ROW_FIELDS)
        assert {k: str(v) for k, v in js.items()} == cs
    assert out["sizes"] == [1024, 8192, 65536] and out["skipped"] == []
    assert [s["failure"] for s in out["summary"]] == ["fail2"]
    assert not list(tmp_path.glob("*.png"))           # no plot unless --png asks for one


def test_help_states_the_event_limit_in_force(capsys):
    from mccl_opt.cli import main
    from mccl_opt.sweep import DEFAULT_EVENT_LIMIT

    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert f"default {DEFAULT_EVENT_LIMIT}:" in " ".join(capsys.readouterr().out.split())


def test_table_prints_nccl_tests_blocks_and_the_summary(tmp_path, capsys, monkeypatch):
    from mccl_opt.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["eval", "hpn-1x2x2", "--collective", "allgather", "--failures", "fail1,none",
                 "-b", "4K", "-e", "4K"]) == 0
    text = capsys.readouterr().out
    assert "# allgather on hpn-1x2x2 (4 GPUs), fail1" in text and ", none" in text
    assert "(elements)" in text and "busbw" in text and "nccl-ring" in text
    assert "reopt x" in text and "at size 4096 B" in text


def test_a_failure_that_does_not_apply_is_skipped_with_its_reason(tmp_path, capsys, monkeypatch):
    from mccl_opt.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["eval", "ring-8", "--failures", "fail1,none", "--collective", "alltoall",
                 "-b", "1M", "-e", "1M", "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert [s["failure"] for s in out["skipped"]] == ["fail1"]
    assert "no link to a switch" in out["skipped"][0]["reason"] and "fail1" in captured.err
    assert {r["failure"] for r in out["rows"]} == {"none"}
    assert main(["eval", "ring-8", "-b", "1M", "-e", "1M"]) == 2
    assert "--failures none" in capsys.readouterr().err
    assert main(["eval", "ring-8", "--failures", "fail9"]) == 2
    assert "unknown fail9" in capsys.readouterr().err


def test_dgx8_eval_with_every_failure_exits_0(tmp_path, capsys, monkeypatch):
    from mccl_opt.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["eval", "dgx-8", "-b", "64M", "-e", "64M", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["skipped"] == []
    for coll in ("allgather", "alltoall"):
        for failure in ("fail1", "fail2", "fail3"):
            methods = {r["method"] for r in out["rows"] if (r["collective"], r["failure"]) == (coll, failure)}
            assert {NO_REOPT, REOPT} <= methods
    # the synthesizer's claim, model-free: re-optimizing never loses rate to the stale schedule
    assert all(r["reopt_rate_gbps"] >= r["no_reopt_rate_gbps"] * (1 - 1e-6) for r in out["summary"])
    assert {r["failure"] for r in out["summary"]} == {"fail1", "fail2", "fail3"}


def test_a_baseline_that_cannot_be_built_is_skipped_and_figure9_says_na(tmp_path, capsys, monkeypatch):
    """irregular-4's rank-order ring has a hop with no switch-only path: no nccl-ring."""
    from mccl_opt.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["eval", "irregular-4", "--failures", "none", "--collective", "allgather",
                 "-b", "1M", "-e", "1M", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    (skip,) = out["skipped"]
    assert skip["method"] == "nccl-ring" and "no switch-only path" in skip["reason"]
    assert {r["method"] for r in out["rows"]} == {NO_REOPT, REOPT}
    (summary,) = out["summary"]
    assert summary["baseline"] is None and summary["reopt_speedup"] is None


def test_a_healthy_schedule_that_cannot_run_after_fail3_is_left_out():
    """irregular-5: the failed GPU's direct GPU link carried a hop that no switch route
    replaces, so the stale schedule cannot run; re-opt is needed by definition."""
    from instances import load_instance
    from mccl_opt.evaluate import figure9_row

    topo = load_instance("irregular-5")
    (case,) = failure_cases(topo, "alltoall", {"fail3": fail3(topo)})
    assert NO_REOPT not in case.schedules and "cannot run" in case.unavailable[NO_REOPT]
    assert case.reopt_needed and case.cut_deviation == 1.0
    row = figure9_row(case, "alltoall", 1024.0, {"nccl-direct": 1.0, REOPT: 4.0})
    assert row["no_reopt_algbw"] is None and row["no_reopt_speedup"] is None
    assert row["reopt_speedup"] == 4.0 and row["stale_still_optimal"] is False
