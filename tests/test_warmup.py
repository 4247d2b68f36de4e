"""Compile cost: ``mccl warmup`` compiles/loads every path's kernels once, saying what it
does (and no solve compiles after it), ``mccl solve`` keeps kernel loading out of its
``seconds`` and reports it apart (``kernel_load_s``), ``make demo`` runs the warm-up,
and the README says where the cache goes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from instances import fail2, hpn
from mccl_opt.cli import main
from mccl_runtime import warmup

ROOT = Path(__file__).resolve().parents[1]


def test_warmup_command_reports_each_group_once(capsys):
    assert main(["warmup", "--json"]) == 0
    captured = capsys.readouterr()
    info = json.loads(captured.out)
    keys = {f"{g.key}_s" for g in warmup.GROUPS}
    assert set(info) >= keys | {"total_s", "cache"}
    assert info["total_s"] == pytest.approx(sum(info[k] for k in keys))
    assert main(["warmup", "--json"]) == 0               # loaded in this process: nothing to do
    again = json.loads(capsys.readouterr().out)
    assert all(again[k] == 0.0 for k in keys)
    assert warmup.load_kernels(collectives=("alltoall",)) == {"alltoall": 0.0, "validate_simulate": 0.0}


def test_warmup_says_what_it_is_doing(capsys, monkeypatch):
    """One progress line per group that runs, in order, naming the group."""
    ran = []
    monkeypatch.setattr(warmup, "_loaded", set())
    monkeypatch.setattr(warmup, "GROUPS", tuple(
        warmup.KernelGroup(g.key, g.label, g.collective, lambda backend, key=g.key: ran.append(key))
        for g in warmup.GROUPS))
    assert main(["warmup"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("  [")]
    assert ran == [g.key for g in warmup.GROUPS]
    assert lines == [f"  [{i}/{len(ran)}] {g.label}" for i, g in enumerate(warmup.GROUPS, 1)]


def test_no_solve_compiles_after_the_warm_up():
    """A fresh process runs the warm-up, then solves on every path (AllToAll and AllGather
    cold, warm in memory / from a file / restored / from a warm result, K=10 and None,
    time-limited, unbalanced switches, the general method, step-aware, step bounds,
    validator, simulator, closed loop) on fabrics the warm-up does not use (HPN, shared
    aggregation, leaf-spine, irregular, DGX, rings): no kernel gets a signature the
    warm-up did not give it (a dispatcher hook: compiled *or loaded from the cache*, so
    the check holds with the suite's populated cache and stays fast) and nothing compiles
    (numba's events).  Before the warm-up covered every path, 47 compilations of 35
    kernels happened here; the chain of warm solves (the closed loop's second event)
    still loaded two AllToAll kernels."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "tests.warmup_paths"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["paths"] >= 110
    assert report["misses"] == [], "\n".join(report["misses"])
    assert report["compiles"] == []


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


def test_kernels_modes_of_the_product_synthesizer(monkeypatch):
    """``solver_synthesizer(kernels=...)`` (``controller serve --kernels``): ``lazy`` runs no
    group, ``background`` runs them all in the ``mccl-kernels`` thread, ``eager`` before it
    returns; another mode is a typed error."""
    import threading

    from mccl_opt.errors import MCCLError
    from mccl_runtime.synthesizer import solver_synthesizer

    ran: list[str] = []
    monkeypatch.setattr(warmup, "_loaded", set())
    monkeypatch.setattr(warmup, "GROUPS", tuple(
        warmup.KernelGroup(g.key, g.label, g.collective, lambda backend, key=g.key: ran.append(key))
        for g in warmup.GROUPS))
    solver_synthesizer(kernels="lazy")
    assert ran == []
    solver_synthesizer(kernels="background")
    for thread in [t for t in threading.enumerate() if t.name == "mccl-kernels"]:
        thread.join(30.0)
    assert ran == [g.key for g in warmup.GROUPS]
    monkeypatch.setattr(warmup, "_loaded", set())
    solver_synthesizer(kernels="eager")
    assert ran == [g.key for g in warmup.GROUPS] * 2
    with pytest.raises(MCCLError, match="eager, background, lazy"):
        solver_synthesizer(kernels="later")


def test_the_round_aware_synthesizer_imports_its_round_model_before_the_first_job():
    """``solver_synthesizer(shallow=True)`` (real-rank controllers) imports the round model
    of its AllToAll pick (:mod:`mccl_opt.lowering`) when it is built, whatever ``kernels``
    says (``controller serve`` builds it ``lazy``, on its first schedule): inside the first
    re-synthesis the import cost ~30 ms of CPU, 0.1 s of wall time on the loaded loop
    (docs/executor.md, "Synthesis inside the loop").  A fresh process; the plain
    synthesizer does not import it."""
    code = ("import sys; from mccl_runtime.synthesizer import solver_synthesizer; "
            "solver_synthesizer(kernels='lazy'); print('mccl_opt.lowering.rounds' in sys.modules); "
            "solver_synthesizer(shallow=True, kernels='lazy'); print('mccl_opt.lowering.rounds' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.split() == ["False", "True"]


def test_a_controller_loads_the_kernels_of_its_collectives_kinds():
    """``controller serve``'s eager/background load: AllToAll's kernels for ``alltoall``,
    AllGather's for every other kind (a reduce-scatter is an AllGather), all with none."""
    from mccl_runtime.warmup import COLLECTIVES, kernel_collectives

    assert kernel_collectives([]) == COLLECTIVES
    assert kernel_collectives(["allgather", "reducescatter"]) == ("allgather",)
    assert kernel_collectives(["alltoall"]) == ("alltoall",)
    assert kernel_collectives(["allreduce", "alltoall"]) == ("allgather", "alltoall")
