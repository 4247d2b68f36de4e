"""The library and the command line agree (issue: one result contract): Schedule's typed
status / bound / gap / seconds for both collectives, ``mccl_opt.check`` is ``mccl check``,
the compile notice and progress reach library users through ``logging``; and the small
frictions: ``--version``, ``python -m mccl_opt``, ``py.typed``, no silent discard, eval
PNG only when asked, failures named by their link."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

import mccl_opt as mo
from instances import fail2, hpn
from mccl_opt.cli import main


@pytest.fixture(scope="module")
def solved():
    topo = hpn(1, 2, 4)
    return topo, {"alltoall": mo.solve_alltoall(topo), "allgather": mo.solve_allgather(topo)}


@pytest.mark.parametrize("collective", ["alltoall", "allgather"])
def test_both_collectives_carry_status_bound_gap_seconds_in_one_place(solved, collective):
    _, scheds = solved
    s = scheds[collective]
    assert s.status == "optimal" == s.report.termination.value == s.stats["status"]
    assert s.bound_gbps == s.report.bound_gbps and s.bound_gbps >= s.rate_gbps * (1 - 1e-9)
    assert s.certified_gap == pytest.approx(1 - s.rate_gbps / s.bound_gbps, abs=1e-12)
    assert s.seconds == s.report.seconds == s.stats["seconds"] and s.seconds >= 0
    back = mo.Schedule.from_dict(json.loads(json.dumps(s.to_dict())))
    assert (back.status, back.bound_gbps, back.seconds) == (s.status, s.bound_gbps, s.seconds)
    bare = dataclasses.replace(s, report=None)            # a file from an older mccl
    assert (bare.status, bare.bound_gbps, bare.certified_gap, bare.seconds) == ("unknown", None, None, None)


@pytest.mark.parametrize("collective", ["alltoall", "allgather"])
def test_check_in_the_library_is_mccl_check(solved, collective, tmp_path, capsys):
    healthy, scheds = solved
    degraded = fail2(healthy)
    stale = scheds[collective]
    result = mo.check(degraded, stale)
    assert result.valid and result.problems == () and result.rate_as_stated is False
    # independent oracle: the stale schedule's load on GPU 0's NIC, at 50 of 400 Gbps, bounds its rate
    assert result.rate_gbps < stale.rate_gbps
    with pytest.raises(mo.ScheduleError, match="differs from rate_gbps"):
        mo.validate(degraded, stale)                       # strict by default, as before
    assert mo.validate(degraded, stale, strict=False).rate_gbps == pytest.approx(result.rate_gbps)
    strict = mo.check(degraded, stale, strict=True)
    assert not strict.valid and "differs from rate_gbps" in strict.problems[0]
    degraded.save(tmp_path / "t.json")
    stale.save(tmp_path / "s.json")
    assert main(["check", str(tmp_path / "t.json"), str(tmp_path / "s.json"), "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    lib = result.to_dict()
    assert {k: cli[k] for k in ("rate_gbps", "rate_as_stated", "max_steps", "chunks")} == \
        {k: lib[k] for k in ("rate_gbps", "rate_as_stated", "max_steps", "chunks")}
    assert main(["check", str(tmp_path / "t.json"), str(tmp_path / "s.json"), "--strict"]) == 2


def test_check_reports_an_invalid_schedule_without_raising(solved):
    topo, scheds = solved
    s = scheds["alltoall"]
    broken = mo.Schedule.from_dict({**s.to_dict(compact=False), "chunks": s.to_dict(compact=False)["chunks"][1:]})
    result = mo.check(topo, broken)
    assert not result.valid and result.rate_gbps is None and any("sum" in p for p in result.problems)


def test_compile_notice_reaches_library_users_once(caplog, monkeypatch):
    from numba.core import event

    from mccl_opt import kernel_time

    monkeypatch.setattr(kernel_time, "_announced", False)
    with caplog.at_level(logging.WARNING, logger="mccl"):
        with kernel_time.kernel_seconds():                 # a library call: no on_compile callback
            for _ in range(2):
                event.start_event("numba:compile")
                event.end_event("numba:compile")
    notices = [r for r in caplog.records if r.name == "mccl" and "compiling" in r.getMessage()]
    assert len(notices) == 1 and "mccl warmup" in notices[0].getMessage()
    caplog.clear()
    said = []
    with kernel_time.kernel_seconds(on_compile=lambda: said.append(1)):   # the CLI's callback instead
        event.start_event("numba:compile")
        event.end_event("numba:compile")
    assert said == [1] and not caplog.records


def test_progress_reaches_the_mccl_progress_logger(caplog):
    with caplog.at_level(logging.DEBUG, logger="mccl.progress"):
        mo.solve_alltoall(hpn(1, 2, 2))
    assert any(r.name == "mccl.progress" for r in caplog.records)


def test_version_module_entry_and_py_typed(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.strip() == f"mccl {mo.__version__}"
    out = subprocess.run([sys.executable, "-m", "mccl_opt", "--version"], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip() == f"mccl {mo.__version__}"
    assert (Path(mo.__file__).parent / "py.typed").is_file()


def test_solve_without_output_says_the_schedule_was_not_saved(capsys):
    assert main(["solve", "allgather", "hpn-1x2x2", "--json"]) == 0
    assert "not saved" in capsys.readouterr().err


def test_eval_names_the_failed_link_and_writes_no_png_unless_asked(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "hpn 1x2x2", "--collective", "allgather", "--failures", "fail2",
                 "-b", "1M", "-e", "1M", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["failures"] == {"fail2": "s0h0g0 <-> s0tor0: 400 -> 50 Gbps"} and out["png"] is None
    assert not list(tmp_path.iterdir())
    assert main(["eval", "hpn-1x2x2", "--collective", "allgather", "--failures", "fail2",
                 "-b", "1M", "-e", "1M", "--png", "e.png"]) == 0
    captured = capsys.readouterr()
    assert "fail2: s0h0g0 <-> s0tor0" in captured.out and "wrote e.png" in captured.err
    assert (tmp_path / "e.png").stat().st_size > 1000


def test_every_option_has_help_that_states_its_default():
    import argparse

    from mccl_opt.cli import build_parser

    missing = []

    def walk(parser, path):
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, child in a.choices.items():
                    walk(child, f"{path} {name}")
            elif not isinstance(a, (argparse._HelpAction, argparse._VersionAction)):
                if not a.help:
                    missing.append(f"{path} {a.option_strings or a.dest}: no help")
                elif a.default not in (None, False, True, []) and "default" not in a.help.lower():
                    missing.append(f"{path} {a.option_strings or a.dest}: default {a.default!r} not stated")
    walk(build_parser(), "mccl")
    assert missing == []


def test_every_command_names_topologies_the_same_way(capsys):
    from instances.names import resolve_topology

    assert resolve_topology("hpn 1x2x4") == resolve_topology("hpn-1x2x4") == hpn(1, 2, 4)
    # the controller reads --topology like every other command (before binding anything)
    assert main(["controller", "serve", "--topology", "no-such-fabric", "--bind", "tcp://127.0.0.1:0"]) == 2
    assert "neither a topology file nor an instance name" in capsys.readouterr().err


def test_old_and_new_flag_spellings_agree(tmp_path, capsys):
    assert main(["topo", "hpn", "--shape", "1x2x2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpus"] == 4
    assert main(["topo", "hpn"]) == 2 and "give the shape once" in capsys.readouterr().err
    from mccl_opt.cli import build_parser

    bench = build_parser().parse_args(["bench", "-o", "b.json", "--backend", "highs", "--shape", "1x2x2"])
    old = build_parser().parse_args(["bench", "--out", "b.json", "--backends", "highs", "--sizes", "1x2x2"])
    assert (bench.out, bench.backends, bench.sizes) == (old.out, old.backends, old.sizes)


def test_loop_and_controller_default_to_the_same_estimator():
    """``mccl loop`` and ``mccl controller serve`` parse ``--estimator`` to one default (the
    change-point level, docs/runtime.md "Which estimator"), and the loop's library config
    agrees; an explicit ``--estimator ewma`` still reaches both."""
    from mccl_opt.cli import build_parser
    from mccl_runtime.loop import LoopConfig
    from mccl_runtime.telemetry import CLI_ESTIMATOR

    parser = build_parser()
    loop = parser.parse_args(["loop"])
    serve = parser.parse_args(["controller", "serve", "--topology", "hpn-1x2x4"])
    assert loop.estimator == serve.estimator == LoopConfig().estimator == CLI_ESTIMATOR == "level"
    assert parser.parse_args(["loop", "--estimator", "ewma"]).estimator == "ewma"
    assert parser.parse_args(["controller", "serve", "--topology", "t", "--estimator", "ewma"]).estimator == "ewma"
