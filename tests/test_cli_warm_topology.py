"""``mccl solve ... --warm OLD.json --warm-topology OLD``: the warm state of a schedule
read from a file is rebuilt on the fabric it was solved for, before the timed solve, so
an AllToAll warm start takes the local path (docs/alltoall.md, "third pass")."""

from __future__ import annotations

import json

import pytest

import mccl_opt as mo
from mccl_opt.cli import main
from mccl_opt.cli._inputs import load_topology

REL = 1e-6


def _json(capsys, argv: list[str]) -> dict:
    assert main([*argv, "--json"]) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def _fails(capsys, argv: list[str], *words: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and all(w in err for w in words), err
    return err


@pytest.fixture(scope="module")
def old(tmp_path_factory):
    """Healthy hpn-1x2x8 schedules of both collectives, as files."""
    folder = tmp_path_factory.mktemp("warm")
    paths = {}
    for collective, solve in (("alltoall", mo.solve_alltoall), ("allgather", mo.solve_allgather)):
        paths[collective] = folder / f"{collective}.json"
        solve(load_topology("hpn-1x2x8")).save(paths[collective])
    return paths


def _same_as_cold(info: dict, collective: str, spec: str) -> None:
    solve = mo.solve_alltoall if collective == "alltoall" else mo.solve_allgather
    cold = solve(load_topology(spec))
    assert info["lp_rate_gbps"] == pytest.approx(cold.lp_rate_gbps, rel=REL)
    assert info["rate_gbps"] == pytest.approx(cold.rate_gbps, rel=REL)


def test_alltoall_warm_from_another_fabric_is_restored_on_warm_topology(capsys, old, tmp_path):
    argv = ["solve", "alltoall", "hpn-1x2x8-fail2", "--warm", str(old["alltoall"])]
    # the schedule names a library fabric: found without the option, and said so
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    assert "rebuilt its fabric 'hpn-1x2x8' by its library name" in captured.err
    assert json.loads(captured.out)["warm"] == "warm:local"
    # a fabric no one can find by its name still needs the option
    unnamed = tmp_path / "mine.json"
    mo.solve_alltoall(load_topology("hpn-1x2x8").renamed("my-fabric")).save(unnamed)
    _fails(capsys, ["solve", "alltoall", "hpn-1x2x8-fail2", "--warm", str(unnamed)],
           "'my-fabric'", "'hpn-1x2x8-fail2'", "--warm-topology")
    out = tmp_path / "new.json"
    info = _json(capsys, [*argv, "--warm-topology", "hpn-1x2x8", "-o", str(out)])
    assert info["warm"] == "warm:local"             # a warm start without the state is "full"
    assert info["warm_restore_s"] >= 0.0 and info["seconds"] >= 0.0
    _same_as_cold(info, "alltoall", "hpn-1x2x8-fail2")
    mo.validate(load_topology("hpn-1x2x8-fail2"), mo.Schedule.load(out))


def test_the_default_warm_topology_is_the_topology_when_the_schedule_names_it(capsys, old, tmp_path):
    # a measured fabric file under the healthy fabric's name: restored on it, no option needed
    measured = load_topology("hpn-1x2x8-fail2").to_dict()
    measured["name"] = "hpn-1x2x8"
    path = tmp_path / "measured.json"
    path.write_text(json.dumps(measured))
    info = _json(capsys, ["solve", "alltoall", str(path), "--warm", str(old["alltoall"])])
    assert info["warm"].startswith("warm:") and info["warm_restore_s"] is not None
    _same_as_cold(info, "alltoall", "hpn-1x2x8-fail2")
    cold = _json(capsys, ["solve", "alltoall", "hpn-1x2x8"])
    assert cold["warm"] == "cold" and cold["warm_restore_s"] is None


def test_a_warm_topology_that_does_not_fit_the_schedule_is_refused(capsys, old):
    for collective in ("alltoall", "allgather"):
        _fails(capsys, ["solve", collective, "hpn-1x2x8-fail2", "--warm", str(old[collective]),
                        "--warm-topology", "hpn-1x2x4"], "--warm-topology hpn-1x2x4", "16 GPUs")
    _fails(capsys, ["solve", "alltoall", "hpn-1x2x8", "--warm-topology", "hpn-1x2x8"], "pass --warm too")
    _fails(capsys, ["solve", "alltoall", "hpn-1x2x8-fail2", "--warm", str(old["alltoall"]),
                    "--warm-topology", "hpn-9x9"], "hpn-9x9")


def test_a_state_that_cannot_be_rebuilt_is_a_warning_and_the_solve_goes_on(capsys, old, tmp_path):
    # the same GPUs, but switches of other names: the chunk paths are no paths of it
    renamed = json.loads(json.dumps(load_topology("hpn-1x2x8").to_dict()).replace("s0tor", "x0tor"))
    path = tmp_path / "renamed.json"
    path.write_text(json.dumps(renamed))
    assert main(["solve", "alltoall", "hpn-1x2x8-fail2", "--warm", str(old["alltoall"]),
                 "--warm-topology", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    assert "warning:" in captured.err and "could not be rebuilt" in captured.err
    info = json.loads(captured.out)
    assert info["warm"] != "warm:local"
    _same_as_cold(info, "alltoall", "hpn-1x2x8-fail2")


def test_allgather_keeps_restoring_on_the_topology(capsys, old):
    argv = ["solve", "allgather", "hpn-1x2x8-fail2", "--warm", str(old["allgather"])]
    plain = _json(capsys, argv)                    # another fabric's name: no option needed
    named = _json(capsys, [*argv, "--warm-topology", "hpn-1x2x8"])
    assert plain["warm"] == named["warm"] == "warm:rerouted"
    assert plain["warm_restore_s"] is not None
    _same_as_cold(named, "allgather", "hpn-1x2x8-fail2")
