"""`mccl topo degrade` and the degrade -> warm re-solve workflow in two commands: the
degraded copy records its parent, `mccl solve --warm` rebuilds the old fabric from that
record (mccl_opt.lineage) without --warm-topology."""

from __future__ import annotations

import json

import pytest

import mccl_opt as mo
from instances import fail2, hpn
from mccl_opt.cli import main
from mccl_opt.lineage import ancestor, degrade_links


def test_degrade_by_gbps_and_fraction_both_ways_or_one():
    topo = hpn(1, 2, 4)
    both = degrade_links(topo, [("s0h0g0", "s0tor0")], gbps=50)
    assert both.link("s0h0g0", "s0tor0").capacity_gbps == 50 == both.link("s0tor0", "s0h0g0").capacity_gbps
    one = degrade_links(topo, [("s0h0g0", "s0tor0")], fraction=0.25, both_directions=False)
    assert one.link("s0h0g0", "s0tor0").capacity_gbps == 100
    assert one.link("s0tor0", "s0h0g0").capacity_gbps == 400
    # the same failure as the paper's Fail2, link for link
    assert {(l.src, l.dst): l.capacity_gbps for l in both.links} == \
        {(l.src, l.dst): l.capacity_gbps for l in fail2(topo).links}


def test_ancestor_undoes_a_chain_of_degrades():
    topo = hpn(1, 2, 4)
    first = degrade_links(topo, [("s0h0g0", "s0tor0")], gbps=50)
    second = degrade_links(first, [("s0h0g1", "s0h0nvs")], fraction=0.5, name="twice")
    assert ancestor(second, "twice") is second
    assert ancestor(second, first.name) == first
    back = ancestor(second, topo.name)
    assert back == topo and "degraded_from" not in back.extra
    assert ancestor(second, "no-such-fabric") is None


@pytest.mark.parametrize("kwargs, error", [
    ({"gbps": 0}, mo.InputError), ({"fraction": 1.5}, mo.InputError), ({}, mo.InputError),
    ({"gbps": 1, "fraction": 0.5}, mo.InputError)])
def test_bad_degrade_arguments_are_typed(kwargs, error):
    with pytest.raises(error):
        degrade_links(hpn(1, 2, 4), [("s0h0g0", "s0tor0")], **kwargs)
    with pytest.raises(mo.TopologyError, match="no link"):
        degrade_links(hpn(1, 2, 4), [("s0h0g0", "s0h1g0")], gbps=1)


def test_degrade_then_warm_resolve_is_two_commands(tmp_path, capsys):
    old, new, degraded = (str(tmp_path / n) for n in ("old.json", "new.json", "t2.json"))
    assert main(["solve", "alltoall", "hpn-1x2x4", "-o", old]) == 0
    assert main(["topo", "degrade", "hpn-1x2x4", "--link", "s0h0g0", "s0tor0", "--gbps", "50",
                 "-o", degraded]) == 0
    capsys.readouterr()
    assert main(["solve", "alltoall", degraded, "--warm", old, "-o", new, "--json"]) == 0
    captured = capsys.readouterr()
    assert "rebuilt its fabric 'hpn-1x2x4'" in captured.err
    info = json.loads(captured.out)
    assert info["warm"].startswith("warm:")
    cold = mo.solve_alltoall(mo.Topology.load(degraded))
    assert info["rate_gbps"] == pytest.approx(cold.rate_gbps, rel=1e-6)


def test_warm_from_an_unknown_fabric_still_asks_for_warm_topology(tmp_path, capsys):
    sched = tmp_path / "a.json"
    topo = hpn(1, 2, 4).renamed("my-own")
    mo.solve_alltoall(topo).save(sched)
    other = tmp_path / "t.json"
    fail2(hpn(1, 2, 4)).renamed("other").save(other)
    assert main(["solve", "alltoall", str(other), "--warm", str(sched)]) == 2
    assert "--warm-topology" in capsys.readouterr().err


def test_degrade_cli_errors(capsys):
    assert main(["topo", "degrade", "hpn-1x2x4", "--link", "s0h0g0", "--gbps", "5"]) == 2
    assert "SRC,DST" in capsys.readouterr().err
    assert main(["topo", "degrade", "hpn-1x2x4", "--link", "s0h0g0,nowhere", "--gbps", "5"]) == 2
    assert "no link" in capsys.readouterr().err
