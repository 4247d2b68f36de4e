"""Progress on long solves (mccl_opt.progress): silent unless installed, one updating
line on a terminal, plain lines when forced, phases and rounds from both synthesizers,
``mccl solve --progress/--no-progress`` and the step-aware verdict."""

from __future__ import annotations

import io

import pytest

from instances import fail1, fail2, hpn
from mccl_opt import progress
from mccl_opt.allgather import solve_allgather
from mccl_opt.alltoall import solve_alltoall
from mccl_opt.cli import main


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _no_reporter_left():
    yield
    progress.stop()


def test_update_without_reporter_does_no_formatting(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("formatted although no reporter is installed")

    monkeypatch.setattr(progress, "format_line", boom)
    assert not progress.active()
    progress.update("phase", 3, 1.0, 2.0, "Gbps")
    solve_allgather(fail2(hpn(1, 2, 4)))        # every hook of a real solve: no output


def test_auto_mode_is_silent_off_a_terminal():
    stream = io.StringIO()
    assert progress.start(None, stream=stream) is None
    assert progress.start(False, stream=_Terminal()) is None
    solve_alltoall(fail2(hpn(1, 2, 4)))
    assert stream.getvalue() == ""
    assert progress.start(None, stream=_Terminal()) is not None


def test_forced_plain_lines_name_the_allgather_phases():
    stream = io.StringIO()
    progress.start(True, label="t", stream=stream)
    solve_allgather(fail2(hpn(1, 2, 4)))
    progress.stop()
    lines = stream.getvalue().splitlines()
    assert lines and all(line.startswith("t: ") and line.endswith(" s") for line in lines)
    text = stream.getvalue()
    for phase in ("phase 1", "chunk budget", "phase 2", "phase 3"):
        assert phase in text
    assert "\r" not in text


def test_alltoall_rounds_show_rate_bound_and_gap():
    stream = io.StringIO()
    reporter = progress.start(True, stream=stream)
    reporter.interval = 0.0                     # every round (forced lines: 1 s apart)
    solve_alltoall(fail2(hpn(1, 2, 8)))
    progress.stop()
    rounds = [line for line in stream.getvalue().splitlines() if "column generation" in line]
    assert len(rounds) >= 2 and "round 1" in rounds[0]
    last = rounds[-1]                           # the certified round: gap below 1e-7
    assert "rate 44.53 Gbps" in last and "bound 44.53 Gbps" in last and "gap 0.000%" in last


def test_terminal_line_is_redrawn_in_place_and_cleared():
    stream = _Terminal()
    reporter = progress.start(None, label="x", stream=stream)
    reporter.update("a", None, None, None, None)
    reporter.update("a", 2, None, None, None)   # same phase within the interval: skipped
    reporter.update("b", 1, None, None, None)
    progress.stop()
    text = stream.getvalue()
    assert "\n" not in text
    assert text.count("\r\x1b[K") == 3         # two draws and the clearing
    assert "x: b  round 1" in text and "round 2" not in text
    assert text.endswith("\r\x1b[K")
    assert not progress.active()


def test_format_line_gap_and_units():
    line = progress.format_line("", "cg", 4, 40.0, 50.0, "Gbps", 1.25)
    assert line == "cg  round 4  rate 40 Gbps  bound 50 Gbps  gap 20.000%  1.2 s"
    scaled = progress.format_line("L", "cg", None, 0.9, 1.0, None, 0.0)
    assert scaled == "L: cg  gap 10.000%  0.0 s"           # no unit: the gap only
    assert "gap" not in progress.format_line("", "cg", 1, 40.0, float("inf"), "Gbps", 0.0)


def test_a_broken_stream_stops_drawing_without_raising():
    stream = io.StringIO()
    reporter = progress.start(True, stream=stream)
    stream.close()
    reporter.update("a", None, None, None, None)    # ValueError on a closed stream
    reporter.update("b", None, None, None, None)
    progress.stop()


def test_cli_progress_flag(tmp_path, capsys):
    assert main(["solve", "allgather", "hpn-1x2x4-fail2", "--json"]) == 0
    assert "phase 1" not in capsys.readouterr().err     # captured stderr: not a terminal
    assert main(["solve", "alltoall", "hpn-1x2x4-fail2", "--json", "--progress"]) == 0
    err = capsys.readouterr().err
    assert "hpn-1x2x4-fail2: AllToAll: building the master" in err
    assert "column generation  round 1" in err
    assert main(["solve", "alltoall", "hpn-1x2x4", "--no-progress", "--json"]) == 0
    assert "column generation" not in capsys.readouterr().err
    assert not progress.active()


def test_cli_error_clears_the_reporter(monkeypatch, capsys):
    import mccl_opt
    from mccl_opt.errors import SolveError

    def fails(*args, **kwargs):
        progress.update("column generation", 1)
        raise SolveError("numerical trouble")

    monkeypatch.setattr(mccl_opt, "solve_alltoall", fails)
    assert main(["solve", "alltoall", "hpn-1x2x4", "--progress"]) == 2
    err = capsys.readouterr().err
    assert "column generation" in err and "error: numerical trouble" in err
    assert not progress.active()


def test_step_aware_says_when_it_found_nothing_shallower(capsys):
    """HPN 2x2x4: the default trees already have depth 2, the smallest possible (no GPU
    shares a switch with every other), so step-aware says it found nothing shallower;
    HPN 1x2x8 Fail1: the hop LP's depth-2 trees beat the default ones."""
    assert main(["solve", "allgather", "hpn-2x2x4", "--step-aware", "--json"]) == 0
    err = capsys.readouterr().err
    assert "step-aware: nothing shallower than the default trees (max depth 2)" in err
    sa = solve_allgather(fail1(hpn(1, 2, 8)), step_aware=True)
    assert sa.stats["step_aware"].startswith("shallower trees: max depth 2")
    assert "step_aware" not in solve_allgather(fail1(hpn(1, 2, 8))).stats
