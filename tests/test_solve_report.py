"""``mccl solve`` says how every solve ended: status, certified bound and gap, in the
table and in ``--json`` (a time-limited result is never shown as if it were optimal)."""

from __future__ import annotations

import dataclasses
import json

import pytest

import mccl_opt as mo
from mccl_opt.report import Termination
from instances import fail2, hpn
from mccl_opt.cli import main
from mccl_opt.cli.solve import certificate


def _solve(tmp_path, capsys, topo: mo.Topology, *args: str) -> tuple[dict, str, str]:
    path = tmp_path / "t.json"
    topo.save(path)
    assert main(["solve", *args[:1], str(path), *args[1:], "--json"]) == 0
    out, err = capsys.readouterr()
    info = json.loads(out)
    assert main(["solve", *args[:1], str(path), *args[1:]]) == 0
    table, _ = capsys.readouterr()
    return info, table, err


def test_time_limited_alltoall_says_so(tmp_path, capsys):
    info, table, err = _solve(tmp_path, capsys, fail2(hpn(1, 2, 8)), "alltoall", "--time-limit", "0.001")
    assert info["status"] == "time_limit"
    # stopped before column generation priced a bound: the node-set cut bound certifies one
    assert info["bound_gbps"] >= info["rate_gbps"] * (1 - 1e-9)
    assert info["certified_gap"] == pytest.approx(1 - info["rate_gbps"] / info["bound_gbps"], abs=1e-12)
    header, _, row = table.splitlines()[3:]             # the table's second row
    assert "status" in header.split() and "time_limit" in row.split() and "certified_gap" in header
    assert "stopped early (time_limit)" in err and "not proven optimal" in err


def test_optimal_alltoall_reports_its_bound_and_gap(tmp_path, capsys):
    info, table, err = _solve(tmp_path, capsys, fail2(hpn(1, 2, 4)), "alltoall")
    assert info["status"] == "optimal" and "warning" not in err
    assert info["bound_gbps"] >= info["lp_rate_gbps"] * (1 - 1e-9)
    assert info["certified_gap"] == pytest.approx(1 - info["rate_gbps"] / info["bound_gbps"], abs=1e-12)
    assert info["certified_gap"] >= info["rounding_gap"] - 1e-12
    assert "optimal" in table.splitlines()[5].split()


def test_allgather_reports_the_method_it_ran(tmp_path, capsys, monkeypatch):
    from mccl_opt.allgather import chain

    forest, _, _ = _solve(tmp_path, capsys, fail2(hpn(1, 2, 4)), "allgather")
    assert forest["status"] == "optimal" and forest["bound_gbps"] == pytest.approx(forest["lp_rate_gbps"])
    # the general method: the balanced restriction (which now rounds this fabric best) off
    monkeypatch.setattr(chain, "solve_by_restriction", lambda *args, **kwargs: None)
    one_way = hpn(1, 2, 8).with_capacity({("s0h0g1", "s0h0nvs"): 360.0})
    general, _, _ = _solve(tmp_path, capsys, one_way, "allgather")
    sched = mo.solve_allgather(one_way)
    assert sched.stats["method"] == "general"
    assert general["status"] == sched.stats["cg_status"]
    assert general["bound_gbps"] == pytest.approx(sched.stats["bound_gbps"], rel=1e-9)


def test_certificate_of_a_stopped_tree_master():
    """The certificate is read from the typed report, not from ``stats``."""
    sched = mo.solve_allgather(hpn(1, 2, 2))
    report = dataclasses.replace(sched.report, termination=Termination.TIME_LIMIT,
                                 bound_gbps=2 * sched.rate_gbps)
    stopped = dataclasses.replace(sched, report=report, stats={**sched.stats, "cg_status": "optimal"})
    assert certificate(stopped) == {"status": "time_limit", "bound_gbps": 2 * sched.rate_gbps,
                                    "certified_gap": pytest.approx(0.5)}
    unbounded = dataclasses.replace(stopped, report=dataclasses.replace(report, bound_gbps=None))
    assert certificate(unbounded)["bound_gbps"] is None and certificate(unbounded)["certified_gap"] is None
