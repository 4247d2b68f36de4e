"""Bad input to the ``mccl`` CLI: exit status 2 and one ``error:`` line, never a
traceback, never silent acceptance; paths are checked before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from instances import hpn
from mccl_opt import Schedule, validate
from mccl_opt.cli import main
from mccl_opt.files import MAX_INT_DIGITS
from tests.test_runtime_manager import bfs_allgather

TOPO = hpn(1, 2, 2)


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cli")
    topo = d / "t.json"
    TOPO.save(topo)
    a2a = d / "a2a.json"
    assert main(["solve", "alltoall", str(topo), "-o", str(a2a), "--json"]) == 0
    ag = d / "ag.json"
    bfs_allgather(TOPO).save(ag)
    s = Schedule.load(a2a).to_dict(compact=False)
    t = json.loads(topo.read_text())
    out = {"topo": topo, "a2a": a2a, "ag": ag}

    def put(name: str, data) -> None:
        out[name] = d / f"{name}.json"
        out[name].write_bytes(data if isinstance(data, bytes) else json.dumps(data).encode())

    put("not_utf8", b'\xff\xfe{"format": 1}')
    put("deep", b"[" * 100_000 + b"]" * 100_000)
    put("big_capacity", {**t, "links": [{**t["links"][0], "capacity_gbps": 10 ** 400}] + t["links"][1:]})
    put("big_share", {**s, "chunks": [{**s["chunks"][0], "share": 10 ** 400}] + s["chunks"][1:]})
    put("version_abc", {**s, "version": "abc"})
    put("solver_list", {**s, "solver": [1, 2]})
    put("shares_09", {**s, "chunks": [{**c, "share": c["share"] * 0.9} for c in s["chunks"]]})
    put("shares_neg", {**s, "chunks": [{**c, "share": -c["share"]} for c in s["chunks"]]})
    c0 = s["chunks"][0]
    put("missing_link", {**s, "chunks": [{**c0, "path": [c0["src"], "nowhere", c0["dst"]]}] + s["chunks"][1:]})
    put("few_gpus", {**s, "gpus": s["gpus"][:-1]})
    return out


def _fails(capsys, argv: list[str], *words: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(w in err for w in words), err
    return err


@pytest.mark.parametrize("name, words", [
    ("not_utf8", ["not UTF-8"]), ("deep", ["nested deeper"]),
    ("big_capacity", [f"at most {MAX_INT_DIGITS}"])])
def test_unreadable_topology_files(capsys, files, name, words):
    _fails(capsys, ["topo", "show", str(files[name])], name, *words)


@pytest.mark.parametrize("name, words", [
    ("big_share", ["401 digits"]), ("version_abc", ["'version'"]), ("solver_list", ["'solver'"]),
    ("not_utf8", ["not UTF-8"]), ("deep", ["nested deeper"])])
def test_unreadable_schedule_files(capsys, files, name, words):
    _fails(capsys, ["check", str(files["topo"]), str(files[name])], name, *words)


def test_output_paths_are_checked_before_the_work(capsys, files, tmp_path):
    bad = str(tmp_path / "missing" / "x.out")
    t, s = str(files["topo"]), str(files["a2a"])
    for argv in (["solve", "alltoall", t, "-o", bad], ["export", "msccl", s, "-o", bad],
                 ["export", "mps", t, "-o", bad], ["eval", "hpn", "1x2x2", "--png", bad],
                 ["bench", "--sizes", "1x2x2", "--out", bad], ["topo", "hpn", "1x2x2", "-o", bad]):
        _fails(capsys, argv, f"{argv[-2]} {bad!r}: the folder", "does not exist")
    _fails(capsys, ["solve", "allgather", t, "-o", str(tmp_path)], "is a folder")


@pytest.mark.parametrize("argv", [["--max-steps", "0"], ["--max-steps", "foo"], ["--time-limit", "-1"],
                                  ["--time-limit", "nan"], ["--max-chunks", "x"]])
def test_bad_solve_options_are_usage_errors(capsys, files, argv):
    with pytest.raises(SystemExit) as ex:
        main(["solve", "alltoall", str(files["topo"]), *argv])
    assert ex.value.code == 2
    err = capsys.readouterr().err
    assert "error: argument" in err and "Traceback" not in err


def test_warm_schedule_of_another_collective_is_refused(capsys, files):
    _fails(capsys, ["solve", "allgather", str(files["topo"]), "--warm", str(files["a2a"])],
           "alltoall schedule")


@pytest.mark.parametrize("name, words", [("shares_09", ["sum to 0.9"]), ("shares_neg", ["share"]),
                                         ("missing_link", ["nowhere"]), ("few_gpus", ["GPUs"])])
def test_an_invalid_warm_schedule_is_reported_and_the_solve_runs_cold(capsys, files, tmp_path, name, words):
    out = tmp_path / "s.json"
    assert main(["solve", "alltoall", str(files["topo"]), "--warm", str(files[name]), "-o", str(out),
                 "--json"]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "solving cold" in err and all(w in err for w in words), err
    validate(TOPO, Schedule.load(out))


def test_a_valid_warm_schedule_is_used_without_warning(capsys, files, tmp_path):
    assert main(["solve", "alltoall", str(files["topo"]), "--warm", str(files["a2a"]), "--json"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_export_msccl_refuses_what_it_can_check(capsys, files, tmp_path):
    out = str(tmp_path / "x.xml")
    _fails(capsys, ["export", "msccl", str(files["few_gpus"]), "-o", out], "few_gpus")
    _fails(capsys, ["export", "msccl", str(files["missing_link"]), "-o", out, "--topology",
                    str(files["topo"])], "nowhere")
    _fails(capsys, ["export", "msccl", str(files["a2a"]), "-o", out, "--min-bytes", "100",
                    "--max-bytes", "10"], "--min-bytes")
    _fails(capsys, ["export", "msccl", str(files["a2a"]), "-o", out, "--min-bytes", "2X"],
           "--min-bytes")
    assert not Path(out).exists()
    for sched in ("a2a", "ag"):
        assert main(["export", "msccl", str(files[sched]), "-o", out, "--topology", str(files["topo"]),
                     "--json"]) == 0
    assert main(["export", "msccl", str(files["a2a"]), "-o", out, "--min-bytes", "64K",
                 "--max-bytes", "1G"]) == 0
    text = Path(out).read_text()
    assert f'minBytes="{64 << 10}"' in text and f'maxBytes="{1 << 30}"' in text


def test_topo_gpu_without_a_failure_is_refused(capsys):
    _fails(capsys, ["topo", "hpn", "1x2x2", "--gpu", "3"], "--fail")


@pytest.mark.parametrize("argv, words", [
    (["--duration-ms", "0"], ["--duration-ms"]), (["--noise", "-1"], ["--noise"]),
    (["--t0-ms", "500"], ["--t0-ms"]), (["--size-mib", "-1"], ["--size-mib"]),   # nan: refused by argparse
    (["--png", "/nonexistent-folder/x.png"], ["does not exist"]), (["--cold-gpus", "-1"], ["--cold-gpus"])])
def test_loop_flags_are_checked_before_the_simulation(capsys, argv, words):
    _fails(capsys, ["loop", *argv], *words)
