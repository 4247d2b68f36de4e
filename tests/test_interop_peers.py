"""Peers' formats: networkx both ways, TE-CCL / TACCL matrices both ways, ForestColl tree
XML both ways, nvidia-smi against NCCL XML for the same host; typed errors on malformed
input."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import pytest

import mccl_opt as mo
from instances import dgx, fail2, hpn, irregular, ring
from mccl_opt.cli import main
from mccl_opt.interop.capacity_matrix import from_taccl, from_teccl, to_taccl, to_teccl
from mccl_opt.interop.forestcoll import from_forestcoll_xml, to_forestcoll_xml

HOSTS = Path(__file__).resolve().parents[1] / "instances" / "data" / "hosts"


def _links(topo):
    return {(l.src, l.dst): (pytest.approx(l.capacity_gbps), pytest.approx(l.latency_us)) for l in topo.links}


@pytest.mark.parametrize("topo", [hpn(1, 2, 4), fail2(hpn(1, 2, 4)), irregular(3), dgx(4, 2)],
                         ids=lambda t: t.name)
def test_networkx_round_trip(topo):
    back = mo.Topology.from_networkx(topo.to_networkx())
    assert back == topo


def test_from_networkx_reads_either_capacity_name_and_undirected_cables():
    g = nx.Graph()
    g.add_edge("a", "sw", capacity=12.5)               # GB/s, as ForestColl's graphs
    g.add_edge("b", "sw", capacity=25.0, capacity_gbps=100.0)
    topo = mo.Topology.from_networkx(g, "t", gpus=["a", "b"], gbps_per_unit=8)
    assert topo.gpus == ("a", "b") and topo.switches == ("sw",)
    assert topo.link("a", "sw").capacity_gbps == 100.0 == topo.link("sw", "a").capacity_gbps
    assert topo.link("b", "sw").capacity_gbps == 800.0   # capacity_gbps wins, times the unit
    g.add_edge("a", "b")
    with pytest.raises(mo.TopologyError, match="neither 'capacity_gbps' nor 'capacity'"):
        mo.Topology.from_networkx(g)


@pytest.mark.parametrize("topo", [hpn(1, 2, 4), irregular(5)], ids=lambda t: t.name)
def test_teccl_round_trip_and_solve_agrees(topo):
    back = from_teccl(json.loads(json.dumps(to_teccl(topo))), name=topo.name)
    ids = dict(zip((f"n{i}" for i in range(topo.num_nodes)), (n.id for n in topo.nodes)))
    assert {(ids[s], ids[d]): v for (s, d), v in _links(back).items()} == _links(topo)
    assert mo.solve_alltoall(back).rate_gbps == pytest.approx(mo.solve_alltoall(topo).rate_gbps)


def test_taccl_matrices_are_dst_major_and_beta_is_inverse_bandwidth():
    # TACCL's NDv2-like pair: 23 us/MB one way (~43.5 GB/s), two links of 46 us/MB back
    topo = from_taccl({"links": [[0, 2], [1, 0]], "invbws": [[0, 46], [23, 0]], "alpha": 0.7})
    assert topo.link("n0", "n1").capacity_gbps == pytest.approx(8000 / 23)       # links[1][0]
    assert topo.link("n1", "n0").capacity_gbps == pytest.approx(2 * 8000 / 46)
    assert topo.link("n0", "n1").latency_us == 0.7
    back = from_taccl(to_taccl(ring(5, 40.0)))
    assert sorted(l.capacity_gbps for l in back.links) == pytest.approx([40.0] * 10)
    with pytest.raises(mo.TopologyError, match="switches"):
        to_taccl(hpn(1, 2, 2))


@pytest.mark.parametrize("data, words", [
    ({"capacity": [[0, 1], [1]]}, "row 1"), ({"capacity": [[0, -1], [1, 0]]}, "negative"),
    ({"capacity": [[0, "x"], [1, 0]]}, "not a number"), ({"capacity": [[0, 1], [1, 0]], "switch_indices": [5]}, "[0, 2)"),
    ({}, "capacity"), ([1, 2], "object")])
def test_malformed_teccl_is_a_topology_error(data, words):
    with pytest.raises(mo.TopologyError, match=words.replace("[", r"\[").replace(")", r"\)")):
        from_teccl(data)


def test_forestcoll_trees_round_trip(tmp_path, capsys):
    topo = fail2(hpn(1, 2, 4))
    sched = mo.solve_allgather(topo)
    xml = to_forestcoll_xml(sched)
    back = from_forestcoll_xml(xml, topo)
    def trees(s):
        return sorted((c.src, round(c.share, 9), c.edges) for c in s.chunks)
    assert trees(back) == trees(sched)
    assert back.rate_gbps == pytest.approx(sched.rate_gbps) and mo.check(topo, back).valid
    # ForestColl prints bare <tree> elements: read them too, k from a root's chunk total
    bare = "".join(xml.split("\n", 1)[1].rsplit("</trees>", 1)[0])
    assert from_forestcoll_xml(bare, topo).rate_gbps == pytest.approx(sched.rate_gbps)
    sched.save(tmp_path / "ag.json")
    assert main(["export", "forestcoll", str(tmp_path / "ag.json"), "-o", str(tmp_path / "t.xml")]) == 0
    assert from_forestcoll_xml((tmp_path / "t.xml").read_text(), topo).rate_gbps == pytest.approx(sched.rate_gbps)


def test_forestcoll_tuple_names_are_renamed():
    topo = hpn(1, 1, 2)
    names = {"(0, 'GPU', 0)": "s0h0g0", "(0, 'GPU', 1)": "s0h0g1", "(0, 'NVS', 0)": "s0h0nvs"}
    xml = "".join(f"<tree root=\"(0, 'GPU', {g})\" nchunks=\"1\"><send src=\"\" dst=\"\" "
                  f"path=\"(0, 'GPU', {g}),(0, 'NVS', 0),(0, 'GPU', {1 - g})\"/></tree>" for g in (0, 1))
    sched = from_forestcoll_xml(xml, topo, rename=names)
    assert mo.check(topo, sched).valid and sched.rate_gbps == pytest.approx(2880.0)


@pytest.mark.parametrize("xml, words", [
    ("<trees><tree/></trees>", "root"), ("<oops", "well-formed"), ("<trees/>", "no <tree>"),
    ('<tree root="s0h0g0" nchunks="1"><send path="s0h0g0,s0h0g1"/></tree>', "every GPU")])
def test_malformed_forestcoll_is_a_schedule_error(xml, words):
    with pytest.raises(mo.ScheduleError, match=words):
        from_forestcoll_xml(xml, hpn(1, 1, 2))


def test_nvidia_smi_reads_the_same_host_as_nccl_xml():
    smi = mo.Topology.from_nvidia_smi(HOSTS / "dgx-h100.smi.txt", hosts=2)
    xml = mo.Topology.from_nccl_xml(HOSTS / "dgx-h100.xml", hosts=2)
    assert smi.gpus == xml.gpus and _links(smi) == _links(xml)


def test_nvidia_smi_direct_nvlinks_and_errors(tmp_path):
    text = ("\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity\n"
            "GPU0\tX\tNV4\tNV2\t0-7\t0\nGPU1\tNV4\tX\tSYS\t0-7\t0\nGPU2\tNV2\tSYS\tX\t8-15\t1\n")
    path = tmp_path / "smi.txt"
    path.write_text(text)
    topo = mo.Topology.from_nvidia_smi(path, nvlink_gbps=100.0, cpu_paths=True)
    assert topo.link("h0g0", "h0g1").capacity_gbps == 400.0 and topo.link("h0g2", "h0g0").capacity_gbps == 200.0
    assert not topo.has_link("h0g1", "h0g2") and topo.has_link("h0cpu0", "h0cpu1")
    assert mo.Topology.from_nvidia_smi(path).switches == ()       # NVLink joins them: CPUs left out
    path.write_text(text.replace("NV2\tSYS\tX", "NV2\tWAT\tX"))
    with pytest.raises(mo.TopologyError, match="unknown"):
        mo.Topology.from_nvidia_smi(path)
    path.write_text("nothing here\n")
    with pytest.raises(mo.TopologyError, match="GPU0"):
        mo.Topology.from_nvidia_smi(path)


def test_cli_peers_round_trip(tmp_path, capsys):
    m = tmp_path / "m.json"
    assert main(["export", "teccl", "hpn-1x2x4", "-o", str(m)]) == 0
    assert main(["topo", "teccl", str(m), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["links"] == hpn(1, 2, 4).num_links
    g = tmp_path / "g.json"
    g.write_text(json.dumps(nx.node_link_data(hpn(1, 2, 4).to_networkx(), edges="links")))
    assert main(["topo", "networkx", str(g), "-o", str(tmp_path / "t.json")]) == 0
    assert mo.Topology.load(tmp_path / "t.json") == hpn(1, 2, 4)
    capsys.readouterr()
    (tmp_path / "bad.json").write_text('{"capacity": 3}')
    assert main(["topo", "teccl", str(tmp_path / "bad.json")]) == 2
    assert capsys.readouterr().err.startswith("error:")


def test_forestcoll_trees_off_the_fabric_are_a_schedule_error():
    xml = "".join(f'<tree root="s0h0g{g}" nchunks="1"><send path="s0h0g{g},s0h0g{1 - g}"/></tree>' for g in (0, 1))
    with pytest.raises(mo.ScheduleError, match="do not fit"):
        from_forestcoll_xml(xml, hpn(1, 1, 2))


@pytest.mark.parametrize("doc", [{"nodes": [{"x": 1}], "links": [{"source": 0}]}, {"nodes": 3},
                                 {"nodes": [{"id": "a"}, {"id": "b"}], "links": [{"source": "a", "target": "b"}]}])
def test_malformed_node_link_graphs_exit_2(tmp_path, capsys, doc):
    path = tmp_path / "g.json"
    path.write_text(json.dumps(doc))
    assert main(["topo", "networkx", str(path)]) == 2
    assert capsys.readouterr().err.startswith("error:")


def test_teccl_flows_round_trip_and_check_reads_peers(tmp_path, capsys):
    from mccl_opt.interop.teccl_flows import from_teccl_flows, to_teccl_flows

    topo = fail2(hpn(1, 2, 4))
    sched = mo.solve_allgather(topo)
    data = json.loads(json.dumps(to_teccl_flows(sched, topo)))
    back = from_teccl_flows(data, topo)
    share = {}
    for c in back.chunks:                                   # m chunks of 1/k make one tree of m/k back
        share[(c.src, c.edges)] = share.get((c.src, c.edges), 0.0) + c.share
    assert share == pytest.approx({(c.src, c.edges): c.share for c in sched.chunks})
    assert back.rate_gbps == pytest.approx(sched.rate_gbps)
    topo.save(tmp_path / "t.json")
    sched.save(tmp_path / "ag.json")
    assert main(["export", "teccl-flows", str(tmp_path / "ag.json"), "--topology", str(tmp_path / "t.json"),
                 "-o", str(tmp_path / "flows.json")]) == 0
    assert main(["export", "forestcoll", str(tmp_path / "ag.json"), "-o", str(tmp_path / "trees.xml")]) == 0
    capsys.readouterr()
    for peer in ("flows.json", "trees.xml"):               # mccl check reads both, on the fabric given
        assert main(["check", str(tmp_path / "t.json"), str(tmp_path / peer), "--json"]) == 0
        info = json.loads(capsys.readouterr().out)
        assert info["valid"] and info["rate_gbps"] == pytest.approx(sched.rate_gbps)


def test_teccl_flows_by_hand_on_a_ring():
    """Four GPUs in a one-way ring of 100 Gbps links (TE-CCL numbering n0..n3): each
    source's one chunk goes around; every link carries 3 trees, so x = 100 / 3."""
    from mccl_opt.interop.teccl_flows import from_teccl_flows

    topo = from_teccl({"capacity": [[0, 12.5, 0, 0], [0, 0, 12.5, 0], [0, 0, 0, 12.5], [12.5, 0, 0, 0]]})
    lines = [f"Chunk 0 from {s} traveled over {(s + h) % 4}->{(s + h + 1) % 4} in epoch {h}"
             for s in range(4) for h in range(3)]
    lines.append("Chunk 0 from 0 traveled over 3->0 in epoch 3")      # a delivery back to the source: no edge
    sched = from_teccl_flows({"7-Flows": lines}, topo)
    assert sched.rate_gbps == pytest.approx(100 / 3) and mo.check(topo, sched).valid
    with pytest.raises(mo.ScheduleError, match="7-Flows"):
        from_teccl_flows({"7-Flows": ["Chunk zero from 1"]}, topo)
    with pytest.raises(mo.ScheduleError, match="not a node"):
        from_teccl_flows({"7-Flows": ["Chunk 0 from 9 traveled over 9->1 in epoch 0"]}, topo)


@pytest.mark.parametrize("collective", ["allgather", "alltoall"])
def test_msccl_xml_reads_back_as_the_schedule_it_was_written_from(collective, tmp_path, capsys):
    from mccl_opt.interop.msccl_xml import from_msccl_xml
    from mccl_opt.lowering.msccl import to_msccl_xml

    topo = fail2(hpn(1, 2, 4))
    sched = (mo.solve_allgather if collective == "allgather" else mo.solve_alltoall)(topo)
    back = from_msccl_xml(to_msccl_xml(sched), topo)
    assert back.collective == collective and mo.check(topo, back).valid
    assert back.rate_gbps == pytest.approx(sched.rate_gbps)
    # the loads per link are the schedule's (the XML splits shares into equal chunks)
    from mccl_opt.schedule import share_loads
    assert share_loads(topo, back.chunks) == pytest.approx(share_loads(topo, sched.chunks))
    topo.save(tmp_path / "t.json")
    (tmp_path / "algo.xml").write_text(to_msccl_xml(sched))
    assert main(["check", str(tmp_path / "t.json"), str(tmp_path / "algo.xml"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rate_gbps"] == pytest.approx(sched.rate_gbps)


def test_msccl_xml_for_another_fabric_is_refused():
    from mccl_opt.interop.msccl_xml import from_msccl_xml
    from mccl_opt.lowering.msccl import to_msccl_xml

    xml = to_msccl_xml(mo.solve_allgather(hpn(1, 2, 2)))
    with pytest.raises(mo.ScheduleError, match="4 GPUs"):
        from_msccl_xml(xml, hpn(1, 2, 4))
    with pytest.raises(mo.ScheduleError, match="only through another GPU"):
        from_msccl_xml(xml, ring(4, bidirectional=False))     # ring: rank 0 -> 2 needs a relay
    with pytest.raises(mo.ScheduleError):
        from_msccl_xml("<algo/>", hpn(1, 2, 2))
