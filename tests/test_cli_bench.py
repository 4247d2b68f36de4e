"""``mccl bench`` (docs/benchmarks.md): warm-up and repeats, medians, tables within 100
columns with their notes, mccl-bench/2 JSON on stdout and in a file, skipped points with
their reasons, the PNG, and a run outside the repository with its bench/ folder not
importable."""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest

from instances.benchmarks import registry, repeat
from instances.benchmarks.registry import Case, CaseResult
from mccl_opt.cli import main

TINY = ["--sizes", "1x2x4", "--repeat", "2"]


def _bench(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["bench", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def _result(doc: dict, method: str, backend: str | None = None) -> dict:
    return next(r for r in doc["results"]
                if r["method"] == method and (backend is None or r["backend"] == backend))


def test_table_fits_100_columns_and_names_skipped_backends(tmp_path, capsys, monkeypatch):
    """A backend that is not installed gives skipped rows whose reason is a note below the
    table, in full; every line fits 100 columns; --out holds the same points."""
    from mccl_opt.backends.scip import ScipBackend

    monkeypatch.setattr(ScipBackend, "module_name", "pyscipopt_missing_for_this_test")
    out_file = tmp_path / "b.json"
    code, out, err = _bench(capsys, "--suite", "alltoall", "--backends", "highs,scip",
                            "--out", str(out_file), "--progress", *TINY)
    assert code == 0, err
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert lines[0].startswith("HPN fabrics, Fail2: GPU 0's NIC link 400 -> 50 Gbps")
    scip_rows = [line for line in lines if "  scip  " in line]
    assert len(scip_rows) == 3 and all("skipped [1]" in line for line in scip_rows)
    notes = " ".join(lines[lines.index(next(ln for ln in lines if ln.startswith("[1]"))):])
    assert "skipped: backend 'scip' needs the Python package 'pyscipopt'" in notes
    assert "pip install pyscipopt" in notes            # the reason is not cut
    assert "median of 2 timed run" in out and "Load average" in out
    assert "18/18" in err                      # 6 cases x (warm-up + 2 rounds), on stderr
    doc = json.loads(out_file.read_text())
    skipped = [r for r in doc["results"] if r["backend"] == "scip"]
    assert {r["status"] for r in skipped} == {"skipped"}
    assert all("pyscipopt" in r["reason"] and r["total_s"] is None for r in skipped)
    assert {r["status"] for r in doc["results"] if r["backend"] == "highs"} == {"ok"}


def test_default_sweep_names_the_backends_it_leaves_out(capsys, monkeypatch):
    from mccl_opt.backends.scip import ScipBackend

    monkeypatch.setattr(ScipBackend, "module_name", "pyscipopt_missing_for_this_test")
    code, out, err = _bench(capsys, "--suite", "allgather", "--sizes", "1x2x4", "--repeat", "1")
    assert code == 0, err
    assert "Backends not run: scip: not installed: pip install pyscipopt" in " ".join(out.split())
    code, out, err = _bench(capsys, "--suite", "allgather", "--sizes", "1x2x4", "--repeat", "1",
                            "--json")
    assert json.loads(out)["backends_not_run"] == {"scip": "not installed: pip install pyscipopt"}


def test_json_on_stdout_holds_medians_and_every_repeat(tmp_path, capsys):
    out_file = tmp_path / "b.json"
    code, out, err = _bench(capsys, "--suite", "allgather", "--json", "--out", str(out_file),
                            *TINY)
    assert code == 0, err
    assert err.strip() == f"wrote {out_file}"         # no progress off a terminal by default
    doc = json.loads(out)                                # nothing but JSON on stdout
    assert doc == json.loads(out_file.read_text())
    assert doc["format"] == "mccl-bench/2" and doc["protocol"]["repeat"] == 2
    assert doc["protocol"]["warmup_runs"] == 1
    for r in doc["results"]:
        assert r["status"] == "ok" and r["warmup_total_s"] > 0
        runs = r["repeats"]
        assert all(len(runs[f]) == 2 for f in ("build_s", "solve_s", "round_s", "total_s"))
        for k in range(2):
            assert runs["total_s"][k] == pytest.approx(
                runs["build_s"][k] + runs["solve_s"][k] + runs["round_s"][k])
        assert all(c > 0 for c in runs["cpu_s"])
        for f in ("build_s", "solve_s", "round_s", "validate_s", "total_s", "cpu_s"):
            s = r[f]
            assert s["min"] <= s["median"] <= s["max"]
            assert s["min"] == min(runs[f]) and s["max"] == max(runs[f])
        assert 0 < r["rate_gbps"] <= r["lp_gbps"] * (1 + 1e-9)
    cold, warm = _result(doc, "forestcoll_cold"), _result(doc, "forestcoll_warm")
    assert cold["vs_ref"] == 1.0 and cold["bound_gbps"] == warm["bound_gbps"]
    assert warm["vs_ref"] == pytest.approx(cold["total_s"]["median"] / warm["total_s"]["median"])


def test_png_is_written(tmp_path, capsys):
    png = tmp_path / "b.png"
    code, _, err = _bench(capsys, "--suite", "allgather", "--sizes", "1x2x4,1x2x8",
                          "--failures", "fail1,fail2", "--repeat", "1", "--png", str(png))
    assert code == 0, err
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 10_000 < len(data) < 2_000_000
    width, height = struct.unpack(">II", data[16:24])     # IHDR
    assert 600 < width < 4000 and 300 < height < 2000 and width > height


def test_bad_arguments_fail_before_any_run(capsys):
    code, _, err = _bench(capsys, "--backends", "cplex")
    assert code == 2 and "unknown backend(s) cplex" in err
    code, _, err = _bench(capsys, "--repeat", "0")
    assert code == 2 and "--repeat must be in [1, 1000]" in err
    code, _, err = _bench(capsys, "--sizes", "1x2")
    assert code == 2 and "SxHxN" in err
    code, _, err = _bench(capsys, "--failures", "fail9")
    assert code == 2 and "unknown failure(s) fail9" in err
    code, _, err = _bench(capsys, "--sizes", ",")
    assert code == 2 and "no case to run" in err
    code, _, err = _bench(capsys, "--suite", "lp", "--png", "x.png")
    assert code == 2 and "--png" in err


def test_size_limited_licence_is_a_skipped_point():
    pytest.importorskip("gurobipy")
    res = registry.run_case(Case("alltoall", "compact_lp", "gurobi", "1x4x8", "fail2"))
    if res.status == "ok":
        pytest.skip("this Gurobi licence is not size-limited")
    assert res.status == "skipped" and "licence" in res.reason


def test_rounds_warm_up_then_alternate(monkeypatch):
    """Round 0 runs each case untimed; timed rounds alternate forward and reversed; a
    skipped case is not run again and keeps its reason; medians over the timed runs."""
    todo = [Case("alltoall", m, "highs", "1x2x4", "fail2") for m in ("cold_cg", "warm_cg")]
    todo.append(Case("alltoall", "compact_lp", "gurobi", "1x2x4", "fail2"))
    calls: list[str] = []

    def fake_run(case: Case) -> CaseResult:
        calls.append(case.method)
        res = CaseResult(case, 8, build_s=0.001, solve_s=len(calls) / 100)
        if case.backend == "gurobi":
            res.status, res.reason = "skipped", "licence"
        return res

    monkeypatch.setattr(repeat, "run_case", fake_run)
    seen = []
    out = repeat.measure(todo, 3, lambda done, total, case, rnd: seen.append((rnd, case.method)))
    assert calls == ["cold_cg", "warm_cg", "compact_lp",   # warm-up
                     "cold_cg", "warm_cg", "warm_cg", "cold_cg", "cold_cg", "warm_cg"]
    assert len(seen) == 12 and [r for r, _ in seen] == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    cold, warm, gurobi = out
    assert cold.warmup_total_s == pytest.approx(0.011) and len(cold.runs) == 3
    assert cold.values("solve_s") == pytest.approx([0.04, 0.07, 0.08])
    assert cold.stat("solve_s") == pytest.approx({"median": 0.07, "min": 0.04, "max": 0.08})
    assert gurobi.status == "skipped" and gurobi.reason == "licence" and gurobi.runs == []
    with pytest.raises(Exception, match="repeat"):
        repeat.measure(todo, 0)


def test_runs_outside_the_repository(tmp_path):
    """From another directory with the repository's bench/ folder not importable
    (isolated mode: no cwd or script folder on sys.path), as from a wheel install."""
    code = ("import importlib.util, sys\n"
            "assert importlib.util.find_spec('bench') is None, 'bench/ is importable'\n"
            "from mccl_opt.cli import main\n"
            "sys.exit(main(['bench', '--suite', 'allgather', '--sizes', '1x2x4', "
            "'--repeat', '1', '--json']))\n")
    run = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert [r["method"] for r in doc["results"]] == ["forestcoll_cold", "forestcoll_warm"]
