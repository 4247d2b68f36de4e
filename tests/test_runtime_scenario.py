"""Scenario files mccl-scenario/1: parsing, the capacity timeline, and bad files ending
in a clear error (exit status 2 from the CLI)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from instances import hpn
from mccl_runtime.scenario import ScenarioError, load_scenario, parse_scenario

NIC = {"src": "s0h0g0", "dst": "s0tor0", "capacity_gbps": 50, "both_directions": True}


def base(**over):
    d = {"format": "mccl-scenario/1", "topology": "hpn 1x2x4", "collective": "allgather",
         "message_bytes": 2**24, "duration_ms": 100,
         "events": [{"t_ms": 20, "links": [NIC]},
                    {"t_ms": 40, "links": [{"src": "s0h0g1", "dst": "s0tor1", "capacity_gbps": 40,
                                            "both_directions": False}], "duration_ms": 5},
                    {"t_ms": 70, "clear": True}]}
    d.update(over)
    return d


def test_timeline_follows_events_dips_and_clear():
    scn = parse_scenario(base())
    topo = scn.topology
    assert [e.kind for e in scn.events] == ["degrade", "dip", "clear"]
    tl = scn.timeline()
    assert [round(t * 1e3, 6) for t, _, _ in tl] == [0, 20, 40, 45, 70]
    assert [i for _, _, i in tl] == [-1, 0, 1, 1, 2]
    nic, back = topo.link_index("s0h0g0", "s0tor0"), topo.link_index("s0tor0", "s0h0g0")
    g1, g1_back = topo.link_index("s0h0g1", "s0tor1"), topo.link_index("s0tor1", "s0h0g1")
    assert tl[1][1][nic] == tl[1][1][back] == 50
    assert tl[2][1][g1] == 40 and tl[2][1][g1_back] == 400 and tl[2][1][nic] == 50   # one direction, on top
    assert tl[3][1][g1] == 400 and tl[3][1][nic] == 50                               # the dip ends by itself
    np.testing.assert_array_equal(tl[4][1], topo.arrays.capacity)                    # clear


def test_topology_inline_or_from_a_file(tmp_path):
    topo = hpn(1, 2, 2)
    inline = parse_scenario(base(topology=topo.to_dict(), events=[]))
    assert inline.topology.gpus == topo.gpus
    (tmp_path / "t.json").write_text(json.dumps(topo.to_dict()))
    (tmp_path / "s.json").write_text(json.dumps(base(topology="t.json", events=[])))
    assert load_scenario(tmp_path / "s.json").topology.gpus == topo.gpus          # relative to the file


@pytest.mark.parametrize("change, match", [
    ({"format": None}, "format"),
    ({"events": [{"t_ms": 10, "links": [dict(NIC, src="s0h0g9")]}]}, "no link 's0h0g9' -> 's0tor0'"),
    ({"events": [{"t_ms": -1, "links": [NIC]}]}, "t_ms.*>= 0"),
    ({"events": [{"t_ms": 30, "links": [NIC]}, {"t_ms": 10, "clear": True}]}, "not after the previous"),
    ({"events": [{"t_ms": 30, "links": [NIC], "duration_ms": 20}, {"t_ms": 40, "clear": True}]}, "dip"),
    ({"events": [{"t_ms": 200, "clear": True}]}, "before the end"),
    ({"events": [{"t_ms": 10, "links": [dict(NIC, capacity_gbps=0)]}]}, "capacity_gbps"),
    ({"events": [{"t_ms": 10}]}, "links"),
    ({"collective": "allreduce"}, "collective"),
    ({"topology": "hpn 1x2"}, "SxHxN"),
    ({"message_bytes": "big"}, "message_bytes"),
])
def test_bad_scenarios_name_the_problem(change, match):
    d = base(**change)
    if change.get("format", 1) is None:
        del d["format"]
    with pytest.raises(Exception, match=match) as exc:
        parse_scenario(d)
    from mccl_opt.errors import MCCLError

    assert isinstance(exc.value, MCCLError)


@pytest.mark.parametrize("content, match", [
    (json.dumps(base(events=[{"t_ms": 10, "links": [dict(NIC, dst="nowhere")]}])), "no link"),
    ("{not json", "malformed JSON"),
])
def test_cli_reports_bad_scenario_files_with_exit_2(tmp_path, capsys, content, match):
    from mccl_opt.cli import main

    path = tmp_path / "bad.json"
    path.write_text(content)
    assert main(["loop", "--scenario", str(path), "--json"]) == 2
    err = capsys.readouterr().err
    assert "error:" in err and match in err and "Traceback" not in err


def test_missing_file_is_a_scenario_error(tmp_path):
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "nope.json")
