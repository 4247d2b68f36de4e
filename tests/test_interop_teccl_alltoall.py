"""TE-CCL AllToAll output (mccl_opt.interop.teccl_alltoall): an MCCL schedule written in
TE-CCL's format reads back with the same paths, shares and rate; a TE-CCL output written by
hand reads at its hand-computed rate; ``mccl check`` and ``mccl export teccl-flows`` handle
both; malformed entries are ScheduleErrors."""

from __future__ import annotations

import json

import pytest

import mccl_opt as mo
from instances import fail2, hpn
from mccl_opt.cli import main
from mccl_opt.interop.capacity_matrix import from_teccl
from mccl_opt.interop.teccl_alltoall import from_teccl_alltoall, is_teccl_alltoall, to_teccl_alltoall


def _shares(sched):
    out = {}
    for c in sched.chunks:
        out[(c.src, c.dst, tuple(c.path))] = out.get((c.src, c.dst, tuple(c.path)), 0.0) + c.share
    return out


def test_round_trip_keeps_paths_shares_and_rate(tmp_path, capsys):
    topo = fail2(hpn(1, 2, 4))                      # cross-rail blocks relay through a GPU
    sched = mo.solve_alltoall(topo)
    data = json.loads(json.dumps(to_teccl_alltoall(sched, topo)))
    assert is_teccl_alltoall(data) and not is_teccl_alltoall({"7-Flows": ["Chunk 0 from 1 traveled over 1->2 in epoch 0"]})
    back = from_teccl_alltoall(data, topo)
    assert _shares(back) == pytest.approx(_shares(sched))
    assert back.rate_gbps == pytest.approx(sched.rate_gbps)
    mo.validate(topo, back)                         # the project's validator, strict
    topo.save(tmp_path / "t.json")
    sched.save(tmp_path / "a2a.json")
    assert main(["export", "teccl-flows", str(tmp_path / "a2a.json"), "--topology", str(tmp_path / "t.json"),
                 "-o", str(tmp_path / "out.json")]) == 0
    capsys.readouterr()
    assert main(["check", str(tmp_path / "t.json"), str(tmp_path / "out.json"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["valid"] and info["rate_gbps"] == pytest.approx(sched.rate_gbps)


def test_hand_written_teccl_output_reads_at_its_rate():
    """Three GPUs n0..n2 on a one-way ring of 100 Gbps links (12.5 GB/s) plus a switch n3
    joined to every GPU both ways at 100 Gbps.  Blocks 0->1 and 1->2 take the ring link (two
    chunks each, TE-CCL style); block 0->2 is half the ring relay n0->n1->n2, half the switch;
    the other blocks take the switch.  Share loads per link: n0->n1 and n1->n2 1.5, n2->n3
    2 (blocks 2->0, 2->1), n3->n0 2 (1->0, 2->0), the rest at most 1: rate 100 / 2 = 50."""
    cap = [[0, 12.5, 0, 12.5], [0, 0, 12.5, 12.5], [12.5, 0, 0, 12.5], [12.5, 12.5, 12.5, 0]]
    topo = from_teccl({"capacity": cap, "switch_indices": [3]})

    def path(d, s, c, *hops):
        return {f"Demand at {d} for chunk {c} from {s} met by epoch {len(hops) - 1}": [
            [[e, h] for e, h in enumerate(hops)]]}

    paths = {}
    paths.update(path(1, 0, 0, "0->1 with volume 1.0 in epoch 0"))
    paths.update(path(1, 0, 1, "0->1 with volume 1.0 in epoch 1"))
    paths.update(path(2, 1, 0, "1->2 with volume 1.0 in epoch 0"))
    paths.update(path(2, 1, 1, "1->2 with volume 1.0 in epoch 1"))
    paths.update(path(2, 0, 0, "0->1 with volume 1.0 in epoch 2", "1->2 with volume 1.0 in epoch 3"))
    paths.update(path(2, 0, 1, "0->2 with volume 1.0 in epoch 0 via switches 3"))
    for s, d in ((1, 0), (2, 0), (2, 1)):
        paths.update(path(d, s, 0, f"{s}->{d} with volume 0.5 in epoch 0 via switches 3"))
        paths.update(path(d, s, 1, f"{s}->{d} with volume 0.5 in epoch 1 via switches 3"))
    sched = from_teccl_alltoall({"8-Chunk paths": paths}, topo)
    assert sched.rate_gbps == pytest.approx(50.0)
    assert mo.check(topo, sched).valid
    shares = _shares(sched)
    assert shares[("n0", "n2", ("n0", "n1", "n2"))] == pytest.approx(0.5)
    assert shares[("n0", "n2", ("n0", "n3", "n2"))] == pytest.approx(0.5)


@pytest.mark.parametrize("paths, words", [
    ({"Demand at two": []}, "Demand at D"),
    ({"Demand at 1 for chunk 0 from 0 met by epoch 0": [[[0, "0->1 in epoch 0"]]]}, "with volume"),
    ({"Demand at 1 for chunk 0 from 0 met by epoch 0": [[[0, "0->2 with volume 1 in epoch 0"]]]}, "no hop|not once"),
    ({"Demand at 1 for chunk 0 from 0 met by epoch 0": [[[0, "0->9 with volume 1 in epoch 0"]]]}, "not a node"),
    ({"Demand at 1 for chunk 0 from 0 met by epoch 0": [[[0, "0->1 with volume -1 in epoch 0"]]]}, ">= 0"),
    ({"Demand at 1 for chunk 0 from 0 met by epoch 0": [[[0, "0->1 with volume 1 in epoch 0"]]]}, "every ordered GPU pair"),
])
def test_malformed_output_is_a_schedule_error(paths, words):
    topo = from_teccl({"capacity": [[0, 12.5, 12.5], [12.5, 0, 12.5], [12.5, 12.5, 0]]})
    with pytest.raises(mo.ScheduleError, match=words):
        from_teccl_alltoall({"8-Chunk paths": paths}, topo)
    with pytest.raises(mo.ScheduleError, match="Chunk paths"):
        from_teccl_alltoall({"7-Flows": []}, topo)


def test_paths_through_two_switches_in_teccls_notation():
    """TE-CCL joins the switches of a hop with '->' (AllToAll) or ' -> ' (AllGather):
    two GPUs n0, n1 joined through switches n2, n3 in series at 100 Gbps give rate 100."""
    from mccl_opt.interop.teccl_flows import from_teccl_flows

    cap = [[0, 0, 12.5, 0], [0, 0, 0, 12.5], [12.5, 0, 0, 12.5], [0, 12.5, 12.5, 0]]
    topo = from_teccl({"capacity": cap, "switch_indices": [2, 3]})
    paths = {"Demand at 1 for chunk 0 from 0 met by epoch 0": [[[0, "0->1 with volume 1.0 in epoch 0 via switches 2->3"]]],
             "Demand at 0 for chunk 0 from 1 met by epoch 0": [[[0, "1->0 with volume 1.0 in epoch 0 via switches 3->2"]]]}
    sched = from_teccl_alltoall({"8-Chunk paths": paths}, topo)
    assert sched.rate_gbps == pytest.approx(100.0)
    assert {tuple(c.path) for c in sched.chunks} == {("n0", "n2", "n3", "n1"), ("n1", "n3", "n2", "n0")}
    flows = ["Chunk 0 from 0 traveled over 0->1 in epoch 0 via switches 2 -> 3",
             "Chunk 0 from 1 traveled over 1->0 in epoch 0 via switches 3 -> 2"]
    assert from_teccl_flows({"7-Flows": flows}, topo).rate_gbps == pytest.approx(100.0)
