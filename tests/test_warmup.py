"""Compile cost: ``mccl warmup`` compiles/loads the kernels once, ``mccl solve`` keeps
kernel loading out of its ``seconds`` and reports it apart (``kernel_load_s``), ``make
demo`` runs the warm-up, and the README says where the cache goes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from instances import fail2, hpn
from mccl_opt.cli import main
from mccl_runtime import warmup

ROOT = Path(__file__).resolve().parents[1]


def test_warmup_command_reports_each_collective_once(capsys):
    assert main(["warmup", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert set(info) >= {"allgather_s", "alltoall_s", "total_s", "cache"}
    assert info["total_s"] == info["allgather_s"] + info["alltoall_s"]
    assert main(["warmup", "--json"]) == 0               # loaded in this process: nothing to do
    again = json.loads(capsys.readouterr().out)
    assert again["allgather_s"] == again["alltoall_s"] == 0.0
    assert warmup.load_kernels(collectives=("alltoall",)) == {"alltoall": 0.0}


def test_solve_loads_kernels_outside_its_seconds(tmp_path):
    """In a new process the load is reported apart; the schedule file records it too;
    the command runs no extra warm-up solves (the second solve loads nothing)."""
    topo, out = tmp_path / "t.json", tmp_path / "s.json"
    fail2(hpn(1, 2, 4)).save(topo)
    code = ("import json, sys; from mccl_opt.cli import main; "
            f"main(['solve', 'alltoall', {str(topo)!r}, '-o', {str(out)!r}, '--json']); "
            f"main(['solve', 'alltoall', {str(topo)!r}, '--json'])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    first, second = (json.loads(block) for block in done.stdout.replace("}\n{", "}\n\x00{").split("\x00"))
    assert first["kernel_load_s"] > 0 and second["kernel_load_s"] == 0.0
    assert json.loads(out.read_text())["stats"]["kernel_load_s"] == first["kernel_load_s"]


def test_cache_location_follows_numba_rules(monkeypatch, tmp_path):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    assert warmup.cache_location().startswith(str(tmp_path))
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    monkeypatch.setattr(warmup.os, "access", lambda path, mode: False)
    where = warmup.cache_location()
    assert ".cache/numba" in where and "NUMBA_CACHE_DIR" in where


def test_make_demo_warms_up_and_the_readme_says_so():
    recipe = (ROOT / "Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert recipe.index("mccl warmup") < recipe.index("mccl demo")
    readme = (ROOT / "README.md").read_text()
    assert "mccl warmup" in readme and "NUMBA_CACHE_DIR" in readme
