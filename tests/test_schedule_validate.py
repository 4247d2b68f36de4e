"""Schedule model, mccl-schedule/1 round-trip and the independent validator."""

from __future__ import annotations

import dataclasses
import json

import networkx as nx
import numpy as np
import pytest

from instances import full_mesh, hpn
from mccl_opt import PathChunk, Schedule, ScheduleError, TreeChunk, validate
from mccl_opt.baselines import ring_allgather
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
        compact_tag = "mccl-schedule/3" if sched.collective == "alltoall" else "mccl-schedule/2"
        for compact, tag in ((True, compact_tag), (False, "mccl-schedule/1")):
            sched.save(path, compact=compact)
            again = Schedule.load(path)
            assert again == sched
            assert json.loads(path.read_text())["format"] == tag


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
    d = sched.to_dict(compact=False)
    d.update(changes)
    return Schedule.from_dict(d)


def test_validator_catches_alltoall_defects():
    topo = full_mesh(3)
    good = direct_alltoall(topo, 2)
    d = good.to_dict(compact=False)
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
    d = good.to_dict(compact=False)
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


def _random_trees(gpus, count, seed):
    """Random spanning trees over ``gpus``, a fifth each valid, with a head repeated,
    an edge re-pointed into a cycle, a relay through a GPU, or an edge missing."""
    n = len(gpus)
    rng = np.random.default_rng(seed)
    for _ in range(count):
        root = int(rng.integers(n))
        order = [root] + [v for v in rng.permutation(n).tolist() if v != root]
        edges = [(gpus[order[int(rng.integers(i))]], gpus[order[i]]) for i in range(1, n)]
        kind = int(rng.integers(5))
        if kind == 1:                                   # a GPU receives twice
            edges[0] = (edges[0][0], edges[1][1])
        elif kind == 2:                                 # a cycle cut off from the root
            a, b = edges[-1][1], edges[-2][1]
            if a != b:
                edges[-1], edges[-2] = (b, a), (a, b)
        elif kind == 3:                                 # relay through a GPU
            edges[0] = (edges[0][0], gpus[(root + 1) % n], edges[0][1])
        elif kind == 4:
            edges = edges[:-1]
        yield root, tuple(edges)


def test_validator_refuses_exactly_the_trees_that_are_no_arborescence():
    """``validate`` on a schedule holding one random tree (the other roots use stars)
    refuses it exactly when networkx says the tree is no spanning arborescence of
    GPU-to-GPU hops, and otherwise reports its depth."""
    topo = full_mesh(7)
    gpus = topo.gpus
    cap = dict(((link.src, link.dst), link.capacity_gbps) for link in topo.links)
    verdicts = []
    for root, edges in _random_trees(gpus, 200, seed=3):
        chunks = [TreeChunk(gpus[root], 1.0, edges)] + [
            TreeChunk(g, 1.0, tuple((g, h) for h in gpus if h != g)) for g in gpus if g != gpus[root]]
        load: dict = {}
        for c in chunks:
            for e in c.edges:
                for hop in zip(e, e[1:]):
                    load[hop] = load.get(hop, 0.0) + c.share
        rate = min(cap[h] / x for h, x in load.items() if h in cap)
        sched = Schedule("allgather", topo.name, gpus, rate, rate, 1, tuple(chunks))
        g = nx.DiGraph([(e[0], e[-1]) for e in edges])
        fine = (all(len(e) == 2 for e in edges) and len(edges) == len(gpus) - 1
                and g.number_of_nodes() == len(gpus) and nx.is_arborescence(g)
                and g.in_degree(gpus[root]) == 0)
        verdicts.append(fine)
        if fine:
            depth = max(nx.shortest_path_length(g, gpus[root]).values())
            assert validate(topo, sched).max_steps == max(depth, 1)
        else:
            with pytest.raises(ScheduleError, match=f"root {gpus[root]}"):
                validate(topo, sched)
    assert 0 < sum(verdicts) < len(verdicts)


def test_validator_does_not_use_the_synthesizers_load_helpers(monkeypatch):
    """The validator recomputes loads and the rate itself: with the schedule module's
    helpers broken it still accepts a valid schedule and refuses a wrong rate."""
    import mccl_opt.schedule as schedule_mod

    def broken(*args, **kwargs):
        raise AssertionError("the validator must not call the synthesizers' helpers")

    topo = full_mesh(5)
    sched = ring_allgather(topo)
    monkeypatch.setattr(schedule_mod, "share_loads", broken)
    monkeypatch.setattr(schedule_mod, "schedule_rate", broken)
    assert validate(topo, sched).rate_gbps == pytest.approx(sched.rate_gbps, rel=1e-12)
    with pytest.raises(ScheduleError, match="recomputed rate"):
        validate(topo, dataclasses.replace(sched, rate_gbps=sched.rate_gbps * 0.5))
