"""NCCL topology XML import (mccl_opt.interop.nccl_xml, `mccl topo nccl`): capacities
against hand-computed values, a two-host cluster against the same fabric written by
hand, and typed errors on malformed files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import mccl_opt as mo
from mccl_opt.cli import main
from mccl_opt.interop.cluster import join_hosts
from mccl_opt.interop.nccl_xml import parse_nccl_xml, pcie_gbps
from mccl_opt.report import Method

DATA = Path(__file__).resolve().parents[1] / "instances" / "data" / "hosts"
DGX = DATA / "dgx-h100.xml"
CLOUD = DATA / "cloud-a100x8.xml"
GEN5_X16 = 32 * 16 * 128 / 130          # 504.12 Gbps after 128b/130b encoding
GEN4_X16 = 16 * 16 * 128 / 130


def test_pcie_capacity_by_generation():
    assert pcie_gbps("2.5 GT/s PCIe", "16", "x") == (pytest.approx(2.5 * 16 * 0.8), False)
    assert pcie_gbps("16.0 GT/s PCIe", "16", "x") == (pytest.approx(GEN4_X16), False)
    assert pcie_gbps("32.0 GT/s PCIe", "8", "x") == (pytest.approx(GEN5_X16 / 2), False)
    assert pcie_gbps("16 GT/s", "4", "x")[0] == pytest.approx(GEN4_X16 / 4)      # kernel <= 5.6 spelling
    # unknown speed or width: 8 GT/s x 16, as NCCL assumes
    assert pcie_gbps("Unknown", "16", "x") == (pytest.approx(8 * 16 * 128 / 130), True)
    assert pcie_gbps(None, None, "x") == (pytest.approx(8 * 16 * 128 / 130), True)


def test_unknown_pcie_speed_is_assumed_like_nccl_and_logged(caplog):
    xml = DGX.read_text().replace('link_speed="32.0 GT/s PCIe" link_width="16">\n        <gpu',
                                  'link_speed="Unknown" link_width="16">\n        <gpu', 1)
    with caplog.at_level("WARNING", logger="mccl"):
        spec = parse_nccl_xml(xml, "odd.xml")
    assert ("g0", "pcisw0", pytest.approx(8 * 16 * 128 / 130), 0.1, "pcie") in spec.links
    assert any("odd.xml: 1 PCIe link" in r.getMessage() for r in caplog.records)


def test_dgx_h100_host_capacities():
    topo = mo.Topology.from_nccl_xml(DGX, cpu_paths=True)
    assert topo.num_gpus == 8 and topo.gpus[0] == "h0g0"
    for g in topo.gpus:
        assert topo.link(g, "h0nvs").capacity_gbps == pytest.approx(18 * 200.0)   # NVLink4: 25 GB/s x 18
        assert topo.link("h0nvs", g).capacity_gbps == pytest.approx(3600.0)
    # GPU 0 and GPU 1 under PCIe switch 0, with NICs 0 and 1; the storage device left out
    assert topo.link("h0g0", "h0pcisw0").capacity_gbps == pytest.approx(GEN5_X16)
    assert topo.link("h0nic1", "h0pcisw0").capacity_gbps == pytest.approx(GEN5_X16)
    assert topo.link("h0pcisw0", "h0cpu0").capacity_gbps == pytest.approx(GEN5_X16)
    assert topo.link("h0cpu0", "h0cpu1").capacity_gbps == 320.0
    assert len(topo.switches) == 2 + 4 + 8 + 1          # CPUs, PCIe switches, NICs, NVSwitch
    assert topo.node("h0g3").extra["busid"] == "0000:3d:00.0"
    # by default the CPUs are left out: NVLink joins the GPUs, each NIC shares a switch with two
    lean = mo.Topology.from_nccl_xml(DGX)
    assert len(lean.switches) == 4 + 8 + 1 and not lean.has_node("h0cpu0")
    assert {(l.src, l.dst) for l in lean.links} == {(l.src, l.dst) for l in topo.links
                                                     if "cpu" not in l.src + l.dst}


def test_cpus_stay_when_the_host_needs_them():
    # no NVLink: the GPUs meet only through the CPUs, so they are kept
    xml = DGX.read_text().replace('<nvlink target="fffffff:ffff:ff" count="18" tclass="0x068000"/>', "")
    kept = mo.Topology.from_dict(join_hosts([parse_nccl_xml(xml)], "none"))
    assert kept.has_link("h0cpu0", "h0cpu1") and kept.has_link("h0pcisw0", "h0cpu0")


def test_cloud_instance_merges_nvswitches_and_reads_nic_speed():
    topo = mo.Topology.from_nccl_xml([CLOUD, CLOUD], "switch")
    assert topo.num_gpus == 16
    # six NVSwitches x 2 NVLink3 links (25 GB/s) merged into one plane per host
    assert topo.link("h1g5", "h1nvs").capacity_gbps == pytest.approx(6 * 2 * 200.0)
    assert topo.link("h0g0", "h0pcisw0").capacity_gbps == pytest.approx(GEN4_X16)
    assert topo.link("h0nic3", "net").capacity_gbps == 100.0      # speed="100000" Mb/s
    assert sum(1 for l in topo.links if l.dst == "net") == 8


def _hand_written_two_dgx() -> dict:
    """The fabric of two DGX H100 hosts on 8 rails, spelled out link by link."""
    nodes, links = [], []

    def cable(a, b, gbps, lat):
        links.extend([{"src": a, "dst": b, "capacity_gbps": gbps, "latency_us": lat},
                      {"src": b, "dst": a, "capacity_gbps": gbps, "latency_us": lat}])
    for h in range(2):
        nodes += [{"id": f"h{h}g{g}", "kind": "gpu"} for g in range(8)]
    for h in range(2):
        p = f"h{h}"
        nodes += [{"id": p + s, "kind": "switch"} for s in
                  ["nvs", "cpu0", "cpu1"] + [f"pcisw{i}" for i in range(4)] + [f"nic{i}" for i in range(8)]]
        cable(p + "cpu0", p + "cpu1", 320.0, 0.1)
        for g in range(8):
            cable(f"{p}g{g}", p + "nvs", 3600.0, 0.025)
            cable(f"{p}g{g}", f"{p}pcisw{g // 2}", GEN5_X16, 0.1)
            cable(f"{p}nic{g}", f"{p}pcisw{g // 2}", GEN5_X16, 0.1)
            cable(f"{p}nic{g}", f"rail{g}", 400.0, 0.5)
        for i in range(4):
            cable(f"{p}pcisw{i}", f"{p}cpu{i // 2}", GEN5_X16, 0.1)
    nodes += [{"id": f"rail{k}", "kind": "switch"} for k in range(8)]
    return {"format": "mccl-topology/1", "name": "two-dgx-by-hand", "nodes": nodes, "links": links}


def test_two_host_cluster_is_the_hand_written_fabric_and_solves_to_its_rate(tmp_path, capsys):
    out = tmp_path / "c.json"
    assert main(["topo", "nccl", str(DGX), "--hosts", "2", "--network", "rail", "--cpu-paths", "-o", str(out)]) == 0
    imported = mo.Topology.load(out)
    by_hand = mo.Topology.from_dict(_hand_written_two_dgx())
    assert imported.gpus == by_hand.gpus
    assert {(l.src, l.dst): l.capacity_gbps for l in imported.links} == pytest.approx(
        {(l.src, l.dst): l.capacity_gbps for l in by_hand.links})
    a, b = mo.solve_alltoall(imported), mo.solve_alltoall(by_hand)
    assert a.rate_gbps == pytest.approx(b.rate_gbps)
    # every GPU sends 8 blocks across hosts through the 8 x 400 Gbps NICs: z <= 3200 / 64
    assert a.lp_rate_gbps == pytest.approx(3200 / 64)
    # without the CPUs (the default) the same optimum: NCCL's routes carry it.  The
    # rounded rates (10 chunks per pair) may differ a little: the deep dive starts from
    # whichever optimal vertex each LP ends at (49.91 with the CPUs, 50.0 without)
    lean = mo.Topology.from_nccl_xml(DGX, hosts=2)
    lean_a2a = mo.solve_alltoall(lean)
    assert lean_a2a.lp_rate_gbps == pytest.approx(a.lp_rate_gbps)
    assert min(a.rate_gbps, lean_a2a.rate_gbps) >= 0.99 * a.lp_rate_gbps
    # AllGather: the one-GPU cut, NVLink 3600 + PCIe 504.12 into each GPU, shared by 15 shards
    assert mo.solve_allgather(lean).lp_rate_gbps == pytest.approx((3600 + GEN5_X16) / 15)


def test_gpu_order_follows_the_rank_attribute():
    xml = DGX.read_text().replace('rank="0"', 'rank="9"')
    spec = parse_nccl_xml(xml)
    assert dict((i, e["busid"]) for i, _, e in spec.nodes if i.startswith("g"))["g7"] == "0000:19:00.0"


@pytest.mark.parametrize("edit, words", [
    (lambda t: t[:50], "not well-formed"),
    (lambda t: t.replace("<system", "<sys").replace("</system>", "</sys>"), "<system>"),
    (lambda t: t.replace('tclass="0x068000"', 'tclass="0x0b4000"', 1), "tclass"),
    (lambda t: t.replace('speed="400000"', 'speed="fast"', 1), "speed"),
    (lambda t: t.replace('rank="1"', 'rank="0"'), "share a rank"),
    (lambda t: t.replace('link_speed="32.0 GT/s PCIe" link_width="16">\n        <gpu',
                         'link_speed="32.0 GT/s PCIe" link_width="many">\n        <gpu', 1), "link_width"),
    (lambda t: t.replace('sm="90"', 'sm="x"', 1), "sm"),
])
def test_malformed_files_are_typed_errors_naming_the_entry(tmp_path, capsys, edit, words):
    bad = tmp_path / "bad.xml"
    bad.write_text(edit(DGX.read_text()))
    with pytest.raises(mo.TopologyError, match=words):
        mo.Topology.from_nccl_xml(bad)
    assert main(["topo", "nccl", str(bad)]) == 2
    assert capsys.readouterr().err.startswith("error:")


def test_several_hosts_need_a_network(capsys):
    assert main(["topo", "nccl", str(DGX), str(DGX), "--network", "none"]) == 2
    assert "cannot reach each other" in capsys.readouterr().err
    assert main(["topo", "nccl", str(CLOUD), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpus"] == 8


def test_cloud_cluster_rates_are_the_nic_cut():
    """Two cloud hosts, 4 x 100 Gb/s NICs each, on one switch: the host cut bounds both
    collectives (AllToAll: 8 GPUs x 8 remote blocks through 400 Gbps; AllGather: 8
    shards through 400 Gbps) and the solvers reach it."""
    topo = mo.Topology.from_nccl_xml([CLOUD, CLOUD], "switch")
    assert mo.solve_alltoall(topo).lp_rate_gbps == pytest.approx(400 / 64)
    assert mo.solve_allgather(topo).rate_gbps == pytest.approx(400 / 8)


def test_direct_nvlinks_between_gpus_and_to_the_cpu():
    """A workstation: two sm 86 GPUs joined by 4 bridge NVLinks (14.0625 GB/s each), the
    second listing its direction only; a POWER9-like GPU with NVLinks to its CPU."""
    xml = """<system version="1"><cpu numaid="0">
      <pci busid="0000:01:00.0" class="0x030000" link_speed="16.0 GT/s PCIe" link_width="16">
        <gpu dev="0" sm="86"><nvlink target="0000:02:00.0" count="4" tclass="0x030000"/></gpu></pci>
      <pci busid="0000:02:00.0" class="0x030000" link_speed="16.0 GT/s PCIe" link_width="8">
        <gpu dev="1" sm="70"><nvlink target="0000:00:00.0" count="3" tclass="0x068001"/></gpu></pci>
    </cpu></system>"""
    spec = parse_nccl_xml(xml)
    nvlinks = {(s, d): g for s, d, g, _, medium in spec.links if medium == "nvlink"}
    assert nvlinks[("g0", "g1")] == 4 * 112.5 == nvlinks[("g1", "g0")]      # mirrored
    assert nvlinks[("g1", "cpu0")] == 3 * 200.0 == nvlinks[("cpu0", "g1")]
    # the NVLink and the PCIe x8 cable of GPU 1 and its CPU are parallel: merged on loading
    topo = mo.Topology.from_dict(join_hosts([spec], "none", cpu_paths=True))
    assert topo.link("h0g1", "h0cpu0").capacity_gbps == pytest.approx(600.0 + 16 * 8 * 128 / 130)


def test_hostile_xml_is_a_typed_error():
    n = 5000
    deep = ("<system><cpu>" + '<pci class="0x060400" link_speed="8 GT/s" link_width="16">' * n
            + '<pci busid="a" class="0x030200"><gpu dev="0" sm="90"/></pci>' + "</pci>" * n + "</cpu></system>")
    with pytest.raises(mo.TopologyError, match="nested more than"):
        parse_nccl_xml(deep)
    laughs = "".join(f'<!ENTITY e{i} "{f"&e{i - 1};" * 10 if i else "x" * 10}">' for i in range(9))
    bomb = f'<?xml version="1.0"?><!DOCTYPE s [{laughs}]><system name="&e8;"></system>'
    with pytest.raises(mo.TopologyError, match="not well-formed|<!DOCTYPE> declaration"):
        parse_nccl_xml(bomb)


def test_eight_dgx_with_cpu_paths_stays_in_forestcoll_at_the_rounded_optimum():
    """64 GPUs imported with their CPU paths: the default switch order's guarded spread
    finds no exchange at a PCIe switch split after the rails; retried with the fewest-links
    switches first it passes, so ForestColl keeps the fabric (it went to the general
    method before: 54.79 Gbps in seconds instead of 57.14 in a fraction of one)."""
    from tests.oracle_allgather import check_schedule, cut_bound

    topo = mo.Topology.from_nccl_xml(DGX, hosts=8, cpu_paths=True)
    sched = mo.solve_allgather(topo, max_chunks=10)
    assert sched.report.method == Method.FORESTCOLL
    assert sched.stats["split"] == "guarded"
    checked = check_schedule(topo, sched, max_chunks=10)
    bound = cut_bound(topo)
    assert sched.lp_rate_gbps == pytest.approx(bound, rel=1e-6)
    # the rail cut: 8 NICs x 400 Gbps into a host, shared by the 56 GPUs outside it
    assert bound == pytest.approx(8 * 400 / 56)
    assert checked.rate_gbps == pytest.approx(bound, rel=1e-6)
