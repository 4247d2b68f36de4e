"""MSCCL XML export: every schedule's XML passes the symbolic replay checker (delivery,
FIFO per peer and channel, dependencies, no deadlock); corrupted XML fails it."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from instances import hpn
from mccl_opt.allgather import solve_allgather
from mccl_opt.alltoall import solve_alltoall
from mccl_opt.baselines import rail_allgather, rail_alltoall
from mccl_opt.cli import main
from mccl_opt.lowering.msccl import check_msccl_xml, to_msccl_xml
from mccl_opt.lowering.program import direct_schedule
from mccl_opt.errors import ScheduleError
from mccl_opt.schedule import PathChunk, Schedule

T4, T8 = hpn(1, 2, 2), hpn(1, 2, 4)
SCHEDULES = {
    "a2a-rail8": lambda: rail_alltoall(T8),
    "a2a-rail8-split": lambda: rail_alltoall(T8, split=True),
    "ag-rail8": lambda: rail_allgather(T8),
    "ag-rail8-split": lambda: rail_allgather(T8, split=True),
    "a2a-direct4": lambda: direct_schedule("alltoall", T4.gpus),
    "ag-direct4": lambda: direct_schedule("allgather", T4.gpus),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("channels", [1, 3])
def test_exported_xml_passes_checker(name, channels):
    sched = SCHEDULES[name]()
    xml = to_msccl_xml(sched, nchannels=channels)
    report = check_msccl_xml(xml)
    assert report.collective == sched.collective and report.ngpus == sched.num_gpus
    algo = re.match(r"<algo ([^>]*)>", xml).group(1)
    for attr in ("name", "proto", "nchannels", "nchunksperloop", "ngpus", "coll", "inplace",
                 "outofplace", "minBytes", "maxBytes"):
        assert f' {attr}="' in " " + algo
    assert "\t" not in xml and not xml.startswith("<?xml")    # MSCCL's hand-written parser


def test_split_shares_use_least_common_chunking():
    xml = to_msccl_xml(rail_alltoall(T8, split=True))   # 0.3 / 0.7 -> 10 chunks per block
    assert 'nchunksperloop="80"' in xml and 'i_chunks="80"' in xml
    assert re.search(r'type="s" srcbuf="i" srcoff="\d+" dstbuf="i" dstoff="\d+" cnt="7"', xml)


def test_solver_schedules_export():
    for sched in (solve_alltoall(T8), solve_allgather(T8)):
        check_msccl_xml(to_msccl_xml(sched, nchannels=2))


def _xml():
    return to_msccl_xml(rail_allgather(T8, split=True))


def test_missing_attribute_fails():
    with pytest.raises(ScheduleError, match="missing attribute 'outofplace'"):
        check_msccl_xml(_xml().replace(' outofplace="1"', "", 1))
    with pytest.raises(ScheduleError, match="missing attribute 'cnt'"):
        check_msccl_xml(re.sub(r' cnt="\d+"', "", _xml(), count=1))


def _mutate(xml: str, fn) -> str:
    root = ET.fromstring(xml)
    fn(root)
    return ET.tostring(root, encoding="unicode")


def _renumber(tb: ET.Element) -> None:
    for i, step in enumerate(tb.findall("step")):
        step.set("s", str(i))


def test_recv_without_matching_send_fails():
    def drop_first_send(root):
        tb = next(t for t in root.find("gpu").findall("tb") if t.get("send") != "-1")
        tb.remove(tb.find("step"))
        _renumber(tb)

    with pytest.raises(ScheduleError, match="deadlock"):
        check_msccl_xml(_mutate(_xml(), drop_first_send))


def test_send_without_matching_recv_fails():
    def drop_first_recv(root):
        tb = next(t for t in root.find("gpu").findall("tb") if t.get("recv") != "-1")
        tb.remove(tb.find("step"))
        _renumber(tb)

    with pytest.raises(ScheduleError, match="deadlock|without a matching receive"):
        check_msccl_xml(_mutate(_xml(), drop_first_recv))


def test_dependency_cycle_fails():
    def cycle(root):
        # a forwarding send depends on the receive that brought its data; make that
        # receive also wait for the send: a two-step cycle
        for gpu in root.findall("gpu"):
            tbs = gpu.findall("tb")
            for tb in tbs:
                for step in tb.findall("step"):
                    if step.get("type") == "s" and step.get("depid") != "-1":
                        recv = tbs[int(step.get("depid"))].findall("step")[int(step.get("deps"))]
                        recv.set("depid", tb.get("id"))
                        recv.set("deps", step.get("s"))
                        step.set("hasdep", "1")
                        return
        raise AssertionError("no forwarding send found")

    with pytest.raises(ScheduleError, match="deadlock"):
        check_msccl_xml(_mutate(_xml(), cycle))


def test_dependency_on_missing_step_fails():
    def dangling(root):
        root.find("gpu").find("tb").find("step").set("depid", "999")

    with pytest.raises(ScheduleError, match="missing step"):
        check_msccl_xml(_mutate(_xml(), dangling))


def test_wrong_destination_fails():
    xml = to_msccl_xml(direct_schedule("alltoall", T4.gpus))
    bad = xml.replace('type="r" srcbuf="o" srcoff="0" dstbuf="o" dstoff="0"',
                      'type="r" srcbuf="o" srcoff="0" dstbuf="o" dstoff="2"', 1)
    assert bad != xml
    with pytest.raises(ScheduleError, match="output chunk|holds"):
        check_msccl_xml(bad)


def test_unrounded_shares_are_rejected():
    gpus = T4.gpus
    base = direct_schedule("alltoall", gpus)
    odd = [PathChunk(gpus[0], gpus[1], 0.123, (gpus[0], gpus[1])),
           PathChunk(gpus[0], gpus[1], 0.877, (gpus[0], gpus[1]))]
    sched = Schedule("alltoall", "t", gpus, 1.0, 1.0, None, tuple(odd) + base.chunks[1:])
    with pytest.raises(ScheduleError, match="rounded schedule"):
        to_msccl_xml(sched)


def test_cli_export_msccl(tmp_path, capsys):
    src = tmp_path / "s.json"
    rail_alltoall(T8, split=True).save(src)
    out = tmp_path / "algo.xml"
    assert main(["export", "msccl", str(src), "-o", str(out), "--channels", "2", "--json"]) == 0
    assert '"checked": true' in capsys.readouterr().out
    assert check_msccl_xml(out.read_text()).collective == "alltoall"
    assert main(["export", "msccl", str(tmp_path / "missing.json"), "-o", str(out)]) == 2
