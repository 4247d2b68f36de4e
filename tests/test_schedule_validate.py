"""Schedule model, mccl-schedule/1 round-trip and the independent validator."""

from __future__ import annotations

import json

import numpy as np
import pytest

from instances import full_mesh, hpn
from mccl_opt import PathChunk, Schedule, ScheduleError, TreeChunk, validate
from mccl_opt.schedule import bottleneck_links, chunk_counts, schedule_rate, share_loads


def direct_alltoall(topo, share_split=1) -> Schedule:
    chunks = [PathChunk(s, d, 1.0 / share_split, (s, d))
              for s in topo.gpus for d in topo.gpus if s != d for _ in range(share_split)]
    loads = share_loads(topo, chunks)
    rate = schedule_rate(topo, loads)
    return Schedule("alltoall", topo.name, topo.gpus, rate, rate, share_split, tuple(chunks),
                    bottleneck_links(topo, loads, rate, share_split))


def star_allgather(topo) -> Schedule:
    chunks = [TreeChunk(r, 1.0, tuple((r, g) for g in topo.gpus if g != r)) for r in topo.gpus]
    loads = share_loads(topo, chunks)
    rate = schedule_rate(topo, loads)
    return Schedule("allgather", topo.name, topo.gpus, rate, rate, 1, tuple(chunks))


def test_valid_alltoall_and_allgather_pass_with_recomputed_rate():
    topo = full_mesh(3)
    rep = validate(topo, direct_alltoall(topo, 2))
    assert rep.rate_gbps == pytest.approx(100.0)
    assert rep.max_utilisation == pytest.approx(1.0)
    assert rep.num_chunks == 12
    rep = validate(topo, star_allgather(topo))
    assert rep.rate_gbps == pytest.approx(100.0) and rep.max_steps == 1


def test_round_trip_through_json(tmp_path):
    topo = full_mesh(3)
    for sched in (direct_alltoall(topo, 2), star_allgather(topo)):
        path = tmp_path / "s.json"
        sched.save(path)
        again = Schedule.load(path)
        assert again == sched
        assert json.loads(path.read_text())["format"] == "mccl-schedule/1"


def test_bottleneck_counts_and_slack():
    topo = full_mesh(3).with_capacity({("g0", "g1"): 50.0})
    sched = direct_alltoall(topo, 2)
    assert sched.rate_gbps == pytest.approx(50.0)
    assert [(b.src, b.dst, b.chunks, b.base_slack) for b in sched.bottleneck] == [("g0", "g1", 2.0, 0.0)]
    loads = share_loads(topo, sched.chunks)
    assert list(chunk_counts(loads, 2)) == [2.0] * 6
    # a mask of "optimal" saturated links is respected and gets the rounded slack
    mask = np.zeros(topo.num_links, dtype=bool)
    mask[topo.link_index("g1", "g2")] = True
    (b,) = bottleneck_links(topo, loads, sched.rate_gbps, 2, saturated=mask)
    assert (b.src, b.dst, b.base_slack) == ("g1", "g2", pytest.approx(0.5))


def _broken(sched: Schedule, **changes) -> Schedule:
    d = sched.to_dict()
    d.update(changes)
    return Schedule.from_dict(d)


def test_validator_catches_alltoall_defects():
    topo = full_mesh(3)
    good = direct_alltoall(topo, 2)
    d = good.to_dict()
    cases = {
        "missing block": dict(chunks=d["chunks"][2:]),
        "hop is not a link": dict(chunks=[{**d["chunks"][0], "path": ["g0", "g9"]}] + d["chunks"][1:]),
        "wrong endpoint": dict(chunks=[{**d["chunks"][0], "path": ["g0", "g2"]}] + d["chunks"][1:]),
        "revisits": dict(chunks=[{**d["chunks"][0], "path": ["g0", "g2", "g0", "g1"]}] + d["chunks"][1:]),
        "rate claim": dict(rate_gbps=120.0, lp_rate_gbps=130.0),
        "rate above lp": dict(lp_rate_gbps=90.0),
        "not multiple": dict(max_chunks=3),
    }
    for label, change in cases.items():
        with pytest.raises(ScheduleError):
            validate(topo, _broken(good, **change))
        assert label  # each case must raise on its own


def test_validator_catches_allgather_defects():
    topo = full_mesh(4)
    good = star_allgather(topo)
    d = good.to_dict()
    t0 = d["chunks"][0]
    chain = {**t0, "edges": [{"path": ["g0", "g1"]}, {"path": ["g1", "g2"]}, {"path": ["g2", "g1"]},
                             {"path": ["g2", "g3"]}]}
    cycle = {**t0, "edges": [{"path": ["g0", "g1"]}, {"path": ["g2", "g3"]}, {"path": ["g3", "g2"]}]}
    relay = {**t0, "edges": [{"path": ["g0", "g1", "g2"]}, {"path": ["g0", "g1"]}, {"path": ["g0", "g3"]}]}
    for chunk in (chain, cycle, relay, {**t0, "edges": t0["edges"][:-1]}):
        with pytest.raises(ScheduleError):
            validate(topo, _broken(good, chunks=[chunk] + d["chunks"][1:]))
    half = [{**c, "share": 0.5} for c in d["chunks"]]
    with pytest.raises(ScheduleError, match="sum to 0.5"):
        validate(topo, _broken(good, chunks=half))


def test_schedule_for_another_topology_is_rejected():
    with pytest.raises(ScheduleError, match="do not match"):
        validate(hpn(1, 2, 4), direct_alltoall(full_mesh(3)))


@pytest.mark.parametrize("data, message", [
    ([], "JSON object"),
    ({"format": "x"}, "'format' must be"),
    ({"format": "mccl-schedule/1", "collective": "allreduce", "gpus": [], "rate_gbps": 1, "chunks": []}, "collective"),
    ({"format": "mccl-schedule/1", "collective": "alltoall", "gpus": [], "chunks": []}, "lacks 'rate_gbps'"),
    ({"format": "mccl-schedule/1", "collective": "alltoall", "gpus": [], "rate_gbps": "x", "chunks": []}, "finite number"),
    ({"format": "mccl-schedule/1", "collective": "alltoall", "gpus": [], "rate_gbps": 1,
      "chunks": [{"share": 1, "path": ["a"]}]}, "at least two node ids"),
    ({"format": "mccl-schedule/1", "collective": "allgather", "gpus": [], "rate_gbps": 1,
      "chunks": [{"share": 1, "edges": [{"path": ["a", "b"]}]}]}, "lacks 'src'"),
    ({"format": "mccl-schedule/1", "collective": "alltoall", "gpus": [], "rate_gbps": 1, "chunks": [],
      "max_chunks": 0}, "max_chunks"),
])
def test_malformed_schedule_files(data, message):
    with pytest.raises(ScheduleError, match=message):
        Schedule.from_dict(data)


def test_load_errors(tmp_path):
    p = tmp_path / "s.json"
    p.write_text("{not json")
    with pytest.raises(ScheduleError, match="malformed JSON"):
        Schedule.load(p)
    with pytest.raises(ScheduleError, match="cannot read"):
        Schedule.load(tmp_path / "none.json")


def test_bulk_tree_check_agrees_with_the_per_tree_check():
    """The validator checks all AllGather trees at once; on random trees (valid, and with
    a head repeated, an edge re-pointed into a cycle, a GPU relay, a missing edge) it
    flags exactly the trees the per-tree check finds a problem in, and reports their
    depths."""
    from mccl_opt.validate import _check_tree, _well_formed_trees

    topo = full_mesh(7)
    gpus = topo.gpus
    rng = np.random.default_rng(3)
    trees = []
    for _ in range(400):
        root = int(rng.integers(7))
        order = [root] + [v for v in rng.permutation(7).tolist() if v != root]
        edges = [(gpus[order[int(rng.integers(i))]], gpus[order[i]]) for i in range(1, 7)]
        kind = int(rng.integers(5))
        if kind == 1:                                   # a GPU receives twice
            edges[0] = (edges[0][0], edges[1][1])
        elif kind == 2:                                 # a cycle cut off from the root
            a, b = edges[-1][1], edges[-2][1]
            if a != b:
                edges[-1], edges[-2] = (b, a), (a, b)
        elif kind == 3:                                 # relay through a GPU
            edges[0] = (edges[0][0], gpus[(root + 1) % 7], edges[0][1])
        elif kind == 4:
            edges = edges[:-1]
        trees.append(TreeChunk(gpus[root], 1.0, tuple(edges)))
    ok, depth = _well_formed_trees(topo, trees)
    for t, c in enumerate(trees):
        problems: list[str] = []
        d = _check_tree(topo, c, "t", problems)
        assert ok[t] == (not problems)
        if ok[t]:
            assert depth[t] == d == max(c.depths().values())
    assert 0 < ok.sum() < len(trees)
