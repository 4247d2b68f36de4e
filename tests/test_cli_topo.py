"""``mccl topo``: every generator from the command line, degraded links and merged
parallel links in ``topo show``; the ``mccl solve`` result table and JSON fields."""

from __future__ import annotations

import json

import pytest

import mccl_opt as mo
from instances import dgx, fail1, fail2, fail3, full_mesh, hpn, irregular, ring
from mccl_opt.cli import main
from mccl_opt.cli._inputs import load_topology
from mccl_opt.link_classes import DEGRADED_BELOW, degraded_links, nominal_capacities


def _json(capsys, argv: list[str]) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("argv, expected", [
    (["hpn", "1x2x4", "--fail", "fail2"], fail2(hpn(1, 2, 4))),
    (["dgx", "--gpus", "4", "--nvswitches", "2", "--nic-gbps", "200"], dgx(4, 2, nic_gbps=200.0)),
    (["dgx", "--fail", "fail1", "--gpu", "3"], fail1(dgx(), 3)),
    (["ring", "5", "--gbps", "50", "--latency-us", "2"], ring(5, 50.0, latency_us=2.0)),
    (["ring", "4", "--one-way"], ring(4, bidirectional=False)),
    (["mesh", "4"], full_mesh(4)),
    (["irregular", "--seed", "3", "--max-hosts", "2", "--degrade-prob", "0"],
     irregular(3, max_hosts=2, degrade_prob=0.0)),
], ids=lambda v: "-".join(v) if isinstance(v, list) else "")
def test_each_generator_writes_what_topo_show_reads_back(tmp_path, capsys, argv, expected):
    out = tmp_path / "t.json"
    built = _json(capsys, ["topo", *argv, "-o", str(out)])
    assert mo.Topology.load(out) == expected
    shown = _json(capsys, ["topo", "show", str(out)])
    assert shown == built
    assert (shown["name"], shown["gpus"], shown["links"]) == (expected.name, expected.num_gpus,
                                                              expected.num_links)
    assert main(["topo", *argv]) == 0                      # the table form
    assert f"topology {expected.name}: {expected.num_gpus} GPUs" in capsys.readouterr().out


@pytest.mark.parametrize("argv, words", [
    (["dgx", "--gpu", "2"], ["--fail"]),
    (["irregular", "--seed", "-1"], ["seed must be an integer >= 0"]),
    (["dgx", "--gpus", "1"], ["gpus must be an integer >= 2"]),
    (["ring", "1"], ["gpus must be an integer >= 2"]),
])
def test_generator_errors_are_one_line(capsys, argv, words):
    assert main(["topo", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and all(w in err for w in words), err


@pytest.mark.parametrize("argv", [["ring", "0"], ["mesh", "3", "--gbps", "0"], ["ring", "3", "--fail", "fail1"],
                                  ["irregular", "--seed", "1", "--degrade-prob", "1.5"],
                                  ["dgx", "--nvswitches", "0"], ["irregular"]])
def test_bad_generator_options_are_usage_errors(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(["topo", *argv])
    assert exc.value.code == 2


def _degraded(capsys, spec: str) -> list[dict]:
    return _json(capsys, ["topo", "show", spec])["degraded_links"]


@pytest.mark.parametrize("spec, pair, gbps, nominal, link_class", [
    ("hpn-1x2x8-fail1", ("s0h0g0", "s0h0nvs"), 800.0, 2880.0, "gpu@s0h0nvs"),
    ("hpn-1x2x8-fail2", ("s0h0g0", "s0tor0"), 50.0, 400.0, "gpu@s0tor0"),
    ("hpn-1x2x8-fail3", ("s0h0g0-bk", "s0h0nvs"), 50.0, 2880.0, "gpu@s0h0nvs"),
    ("hpn-2x2x4-fail2", ("s0h0g0", "s0tor0"), 50.0, 400.0, "gpu@s0tor0"),
])
def test_paper_failures_show_as_degraded_cables(capsys, spec, pair, gbps, nominal, link_class):
    listed = _degraded(capsys, spec)
    u, v = pair
    assert [(d["src"], d["dst"]) for d in listed] == [(u, v), (v, u)]
    for d in listed:
        assert (d["capacity_gbps"], d["nominal_gbps"], d["link_class"]) == (gbps, nominal, link_class)
        assert d["reverse_gbps"] == gbps and d["one_direction"] is False
    assert main(["topo", "show", spec]) == 0
    text = capsys.readouterr().out
    assert "degraded links (below 0.95 x nominal): 2" in text
    assert text.count("both ways") == 2


@pytest.mark.parametrize("spec", ["hpn-1x2x8", "hpn-2x2x4", "dgx-8"])
def test_healthy_library_fabrics_list_no_degraded_link(capsys, spec):
    assert _degraded(capsys, spec) == []
    assert main(["topo", "show", spec]) == 0
    assert "degraded links (below 0.95 x nominal): none" in capsys.readouterr().out


@pytest.mark.parametrize("topo", [hpn(2, 2, 8), dgx(), ring(5), ring(4, bidirectional=False), full_mesh(5)],
                         ids=lambda t: t.name)
def test_healthy_generated_fabrics_list_no_degraded_link(topo):
    assert degraded_links(topo) == []


def test_a_one_direction_degradation_of_an_irregular_fabric(tmp_path, capsys):
    base = irregular(5, degrade_prob=0.0)
    link = next(l for l in base.links if l.dst.endswith("sw"))          # a GPU's host-switch port
    bad = base.with_capacity({(link.src, link.dst): link.capacity_gbps / 4})
    path = tmp_path / "bad.json"
    bad.save(path)
    before = {(d.src, d.dst) for d in degraded_links(base)}
    listed = _degraded(capsys, str(path))
    assert {(d["src"], d["dst"]) for d in listed} - before == {(link.src, link.dst)}
    mine = next(d for d in listed if (d["src"], d["dst"]) == (link.src, link.dst))
    assert mine == {"src": link.src, "dst": link.dst, "capacity_gbps": link.capacity_gbps / 4,
                    "nominal_gbps": link.capacity_gbps, "link_class": f"gpu@{link.dst}",
                    "reverse_gbps": link.capacity_gbps, "one_direction": True}
    assert main(["topo", "show", str(path)]) == 0
    row = next(r for r in capsys.readouterr().out.splitlines() if r.split()[:2] == [link.src, link.dst])
    assert row.rstrip().endswith("one way")


@pytest.mark.parametrize("seed", range(8))
def test_the_generators_own_degradations_are_found(seed):
    """irregular() degrades random links by 1/8..1/2 (the same fabric with
    ``degrade_prob=0`` is the healthy one): each link degraded while its reverse is not
    is listed, as one way unless its reverse is slower than its class (a NIC drawn at
    50 Gbps among 200 Gbps ones)."""
    topo, healthy = irregular(seed), irregular(seed, degrade_prob=0.0)
    hit = {(a.src, a.dst) for a, b in zip(topo.links, healthy.links) if a.capacity_gbps < b.capacity_gbps}
    one_way = {(u, v) for u, v in hit if (v, u) not in hit}
    assert one_way
    listed = {(d.src, d.dst): d for d in degraded_links(topo)}
    assert one_way <= set(listed)
    for u, v in one_way:
        assert listed[(u, v)].nominal_gbps >= healthy.link(u, v).capacity_gbps
        assert listed[(u, v)].reverse_gbps == topo.link(v, u).capacity_gbps
        assert listed[(u, v)].one_direction == ((v, u) not in listed)


def test_nominal_is_the_common_speed_within_tolerance():
    topo = hpn(1, 2, 4)
    measured = topo.with_capacity({("s0h0g1", "s0tor1"): 392.0, ("s0h1g1", "s0tor1"): 401.0,
                                   ("s0h0g2", "s0h0nvs"): 2880 * DEGRADED_BELOW * 0.999})
    assert [(d.src, d.dst) for d in degraded_links(measured)] == [("s0h0g2", "s0h0nvs")]
    assert nominal_capacities(measured)["gpu@s0tor1"] == 401.0        # 4 links within 5 %
    fast = full_mesh(4).with_capacity(src="g0", dst="g1", gbps=200.0)  # a double link by design
    assert degraded_links(fast) == []
    half = fast.with_capacity(src="g1", dst="g0", gbps=100.0, both_directions=False)
    assert [(d.src, d.dst, d.nominal_gbps, d.one_direction) for d in degraded_links(half)] == \
        [("g1", "g0", 200.0, True)]                             # caught by its reverse link
    slow = full_mesh(4).with_capacity(src="g0", dst="g1", gbps=50.0, both_directions=False)
    assert [(d.src, d.dst, d.link_class, d.one_direction) for d in degraded_links(slow)] == \
        [("g0", "g1", "gpu-gpu", True)]


def test_switch_tiers_classify_uplinks_and_same_tier_cables():
    topo = fail3(hpn(2, 2, 4))
    nominal = nominal_capacities(topo)
    assert nominal["tier1@agg0"] == 800.0 and nominal["cable:bk-tor|s0tor0"] == 400.0
    uplink = topo.with_capacity({("s1tor2", "agg2"): 100.0})
    assert [(d.src, d.dst, d.link_class, d.one_direction) for d in degraded_links(uplink)
            if d.link_class.startswith("tier")] == [("s1tor2", "agg2", "tier1@agg2", True)]


def test_parallel_links_are_listed_by_topo_show(tmp_path, capsys):
    d = ring(3).to_dict()
    d["links"] += [{"src": u, "dst": v, "capacity_gbps": 100.0, "latency_us": 0.5}
                   for u, v in (("g0", "g1"), ("g1", "g0"))]          # a second cable g0-g1
    path = tmp_path / "par.json"
    path.write_text(json.dumps(d))
    info = _json(capsys, ["topo", "show", str(path)])
    assert info["links"] == 6
    assert info["parallel_links"] == [{
        "src": u, "dst": v, "links": 2, "capacity_gbps": 200.0, "latency_us": 0.5,
        "parts": [{"capacity_gbps": 100.0, "latency_us": 1.0}, {"capacity_gbps": 100.0, "latency_us": 0.5}]}
        for u, v in (("g0", "g1"), ("g1", "g0"))]
    assert info["degraded_links"] == []         # the most common speed stays nominal
    assert main(["topo", "show", str(path)]) == 0
    text = capsys.readouterr().out
    assert "parallel links merged (summed capacity, smallest latency): 2 node pair(s)" in text
    assert text.count("100+100") == 2


# ---------------------------------------------------------------- the solve report

def _path_steps(topo: mo.Topology, sched: mo.Schedule) -> int:
    """Independent step count: a hop into a GPU advances a step (docs/modelling.md)."""
    if sched.collective == "alltoall":
        return max(sum(topo.is_gpu(v) for v in c.path[1:]) for c in sched.chunks)
    return max(max(c.depths().values()) for c in sched.chunks)


@pytest.mark.parametrize("collective, warm_label", [("alltoall", "warm:"), ("allgather", "warm:")])
def test_solve_reports_steps_warm_mode_status_and_backend(tmp_path, capsys, collective, warm_label):
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    cold = _json(capsys, ["solve", collective, "hpn-1x2x4-fail2", "-o", str(old)])
    warm = _json(capsys, ["solve", collective, "hpn-1x2x4", "--warm", str(old), "--warm-topology",
                          "hpn-1x2x4-fail2", "-o", str(new)])
    for info, spec, path in ((cold, "hpn-1x2x4-fail2", old), (warm, "hpn-1x2x4", new)):
        topo, sched = load_topology(spec), mo.Schedule.load(path)
        assert info["steps"] == _path_steps(topo, sched) >= 1
        assert info["backend"] == sched.solver["backend"] == ("highs" if collective == "alltoall" else "maxflow")
        assert info["status"] == "optimal" and info["certified_gap"] is not None
    assert cold["warm"] == "cold"
    assert warm["warm"].startswith(warm_label) and warm["warm"] != "warm:"
    if collective == "alltoall":
        assert warm["warm"] == "warm:" + mo.Schedule.load(new).report.warm.value
    assert main(["solve", collective, "hpn-1x2x4", "--warm", str(old), "--warm-topology", "hpn-1x2x4-fail2"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in table) <= 100
    values = dict(zip(table[0].split() + table[3].split(), table[2].split() + table[5].split()))
    # the warm use can differ between two runs: a warm start past its time budget is declined
    assert values["warm"].startswith("warm:") and values["status"] == "optimal"
    assert values["backend"] == warm["backend"]
    if values["warm"] == warm["warm"]:                # the same trees: the same depth
        assert values["steps"] == str(warm["steps"])


def test_warm_mode_names_how_the_warm_start_was_used(monkeypatch):
    from mccl_opt.allgather import chain
    from mccl_opt.allgather.general import restriction_seed
    from mccl_opt.cli.solve import warm_mode

    topo = fail2(hpn(1, 2, 4))
    ag, a2a = mo.solve_allgather(topo), mo.solve_alltoall(topo)
    assert (warm_mode(ag), warm_mode(a2a)) == ("cold", "cold")
    assert warm_mode(mo.solve_allgather(topo, warm=ag)) == "warm:kept"
    assert warm_mode(mo.solve_alltoall(topo, warm=a2a)) == "warm:basis"
    # an NVLink at 400 of 2880 Gbps: moved, but above the 10 % at which a warm AllToAll
    # skips the local path (docs/alltoall.md, "Warm is never the slow path")
    nearby = topo.with_capacity(src="s0h1g0", dst="s0h1nvs", gbps=400.0)
    assert warm_mode(mo.solve_alltoall(nearby, warm=a2a)) == "warm:local"
    # the general method: the balanced restriction (which now rounds this fabric best)
    # is switched off, so that the warm start reuses the general method's columns
    monkeypatch.setattr(chain, "solve_by_restriction", lambda *args, **kwargs: None)
    # ... and the weaker-direction seed kept at 10 chunks per root: at 16 (the default up
    # to 128 GPUs) it certifies this fabric at once and the warm columns are not needed
    monkeypatch.setattr(restriction_seed, "SMALL_SEED_GPUS", 0)
    one_way = hpn(1, 2, 8).with_capacity({("s0h0g1", "s0h0nvs"): 360.0})
    general = mo.solve_allgather(one_way)
    again = mo.solve_allgather(one_way.with_capacity({("s0h0g2", "s0h0nvs"): 300.0}), warm=general)
    assert (warm_mode(general), warm_mode(again)) == ("cold", "warm:columns")


def test_topo_show_lists_the_link_classes_with_their_nominal(capsys):
    info = _json(capsys, ["topo", "show", "hpn-2x2x4-fail1"])
    classes = {c["class"]: (c["links"], c["nominal_gbps"]) for c in info["link_classes"]}
    assert classes["gpu@s0h0nvs"] == (8, 2880.0) and classes["gpu@s1tor3"] == (4, 400.0)
    assert classes["tier1@agg0"] == (4, 800.0)
    assert sum(n for n, _ in classes.values()) == info["links"]
    assert sum(c["count"] for c in info["link_speeds"]) == info["links"]
