"""Topology model: round-trips, array views, derived topologies and every validation error."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from instances import fail2, hpn, ring
from mccl_opt import Link, Node, Topology, TopologyError


def tiny_dict() -> dict:
    return {
        "format": "mccl-topology/1", "name": "tiny", "owner": "lab-7",
        "nodes": [{"id": "a", "kind": "gpu", "rack": 3}, {"id": "b", "kind": "gpu"},
                  {"id": "sw", "kind": "switch"}],
        "links": [
            {"src": "a", "dst": "sw", "capacity_gbps": 100.0, "latency_us": 0.5, "cable": "x1"},
            {"src": "sw", "dst": "a", "capacity_gbps": 100.0, "latency_us": 0.5},
            {"src": "b", "dst": "sw", "capacity_gbps": 50, "latency_us": 0.5},
            {"src": "sw", "dst": "b", "capacity_gbps": 50, "latency_us": 0.5},
        ],
    }


def test_round_trip_preserves_everything_including_extra_keys(tmp_path):
    topo = Topology.from_dict(tiny_dict())
    path = tmp_path / "t.json"
    topo.save(path)
    again = Topology.load(path)
    assert again == topo
    data = json.loads(path.read_text())
    assert data["owner"] == "lab-7"
    assert data["nodes"][0]["rack"] == 3
    assert data["links"][0]["cable"] == "x1"
    assert again.to_dict() == topo.to_dict()


def test_rank_order_and_lookups():
    topo = Topology.from_dict(tiny_dict())
    assert topo.gpus == ("a", "b")
    assert topo.switches == ("sw",)
    assert topo.rank("b") == 1
    assert topo.link("b", "sw").capacity_gbps == 50
    with pytest.raises(TopologyError, match="switch"):
        topo.rank("sw")
    with pytest.raises(TopologyError, match="no link"):
        topo.link_index("a", "b")
    with pytest.raises(TopologyError, match="unknown node id 'zz'"):
        topo.node_index("zz")


def test_array_views_are_consistent_and_read_only():
    topo = hpn(1, 2, 4)
    arr = topo.arrays
    assert arr is topo.arrays  # cached
    for a, link in enumerate(topo.links):
        assert topo.nodes[arr.tail[a]].id == link.src
        assert topo.nodes[arr.head[a]].id == link.dst
        assert arr.capacity[a] == link.capacity_gbps
    for v in range(topo.num_nodes):
        outs = arr.out_arcs[arr.out_start[v]:arr.out_start[v + 1]]
        ins = arr.in_arcs[arr.in_start[v]:arr.in_start[v + 1]]
        assert set(outs) == {a for a in range(topo.num_links) if arr.tail[a] == v}
        assert set(ins) == {a for a in range(topo.num_links) if arr.head[a] == v}
    assert list(arr.gpu_nodes) == [topo.node_index(g) for g in topo.gpus]
    assert arr.is_switch.sum() == len(topo.switches)
    with pytest.raises(ValueError):
        arr.capacity[0] = 1.0


def test_with_capacity_returns_new_topology_and_leaves_original():
    topo = hpn(1, 2, 4)
    degraded = topo.with_capacity(src="s0h0g0", dst="s0tor0", gbps=50.0)
    assert degraded.link("s0h0g0", "s0tor0").capacity_gbps == 50.0
    assert degraded.link("s0tor0", "s0h0g0").capacity_gbps == 50.0
    assert topo.link("s0h0g0", "s0tor0").capacity_gbps == 400.0
    several = topo.with_capacity({("s0h0g1", "s0h0nvs"): 10.0, ("s0h1g1", "s0tor1"): 20.0})
    assert several.link("s0h0g1", "s0h0nvs").capacity_gbps == 10.0
    assert several.link("s0h0nvs", "s0h0g1").capacity_gbps == 2880.0
    with pytest.raises(TopologyError, match="no link"):
        topo.with_capacity({("s0h0g0", "s0h1g0"): 1.0})
    with pytest.raises(TopologyError, match="capacity_gbps"):
        topo.with_capacity(src="s0h0g0", dst="s0tor0", gbps=float("nan"))
    caps = topo.arrays.capacity * 0.5
    assert np.allclose(topo.with_capacities(caps).arrays.capacity, caps)
    with pytest.raises(TopologyError, match="shape"):
        topo.with_capacities(caps[:-1])


def test_to_networkx():
    g = ring(4).to_networkx()
    assert g.number_of_nodes() == 4 and g.number_of_edges() == 8
    assert g.edges["g0", "g1"]["capacity"] == 100.0
    assert g.nodes["g2"]["kind"] == "gpu"


def _mutated(fn) -> dict:
    d = tiny_dict()
    fn(d)
    return d


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.update(format="mccl-topology/2"), "'format' must be"),
    (lambda d: d.pop("format"), "'format' must be"),
    (lambda d: d.update(nodes="a,b"), "'nodes' must be a list"),
    (lambda d: d["nodes"].append({"id": "a", "kind": "gpu"}), "node 'a' is defined twice"),
    (lambda d: d["nodes"].append({"kind": "gpu"}), r"nodes\[3\] lacks 'id'"),
    (lambda d: d["nodes"].append({"id": "c", "kind": "cpu"}), "kind must be one of"),
    (lambda d: d["links"].append({"src": "a", "dst": "ghost", "capacity_gbps": 1}), "unknown node id 'ghost'"),
    (lambda d: d["links"].append({"src": "a", "dst": "a", "capacity_gbps": 1}), "self-loop"),
    (lambda d: d["links"][0].update(capacity_gbps=0), "capacity_gbps must be a finite number > 0"),
    (lambda d: d["links"][0].update(capacity_gbps=-5), "capacity_gbps must be a finite number > 0"),
    (lambda d: d["links"][0].update(capacity_gbps=math.nan), "capacity_gbps must be a finite number > 0"),
    (lambda d: d["links"][0].update(capacity_gbps=math.inf), "capacity_gbps must be a finite number > 0"),
    (lambda d: d["links"][0].update(capacity_gbps="fast"), "capacity_gbps must be a finite number > 0"),
    (lambda d: d["links"][0].update(latency_us=-1), r"latency_us must be a finite number in \[0, 1e\+06\]"),
    (lambda d: d["links"][0].update(latency_us=1e300), r"latency_us must be a finite number in \[0, 1e\+06\]"),
    (lambda d: d.update(name={"a": 1}), "'name' must be a string, got dict"),
    (lambda d: d["links"][0].pop("capacity_gbps"), r"links\[0\] lacks 'capacity_gbps'"),
    (lambda d: (d["links"][0].update(id="c1"), d["links"].append(dict(d["links"][0]))),
     r"links #0 \('a' -> 'sw'\) and #4 \('a' -> 'sw'\) both carry id 'c1': the same link listed twice"),
    (lambda d: (d["links"][0].update(id="c1"), d["links"][1].update(id="c1")),
     "both carry id 'c1': link ids must be unique"),
    (lambda d: d["links"][2].update(id=["x"]), "'id' must be a string or number"),
    (lambda d: d["links"].append({"src": "a", "dst": "sw", "capacity_gbps": 0}),
     r"link #4 \('a' -> 'sw'\): capacity_gbps must be a finite number > 0"),
    (lambda d: (d.update(parallel_links={"a": 1}), d["links"].append(dict(d["links"][1]))),
     "top-level 'parallel_links' must be a list"),
    (lambda d: d.update(nodes=[n for n in d["nodes"] if n["id"] != "b"],
                        links=[l for l in d["links"] if "b" not in (l["src"], l["dst"])]),
     "1 GPU"),
    (lambda d: d.update(links=[l for l in d["links"] if l["dst"] != "b"]), "cannot reach"),
    (lambda d: d.update(links=[l for l in d["links"] if l["src"] != "b"]), "cannot be reached"),
])
def test_every_validation_error_names_the_bad_entry(mutate, message):
    with pytest.raises(TopologyError, match=message):
        Topology.from_dict(_mutated(mutate))


def test_load_reports_malformed_json_and_missing_files(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "mccl-topology/1", "nodes": [')
    with pytest.raises(TopologyError, match="malformed JSON at line 1"):
        Topology.load(bad)
    with pytest.raises(TopologyError, match="cannot read topology file"):
        Topology.load(tmp_path / "missing.json")
    not_object = tmp_path / "list.json"
    not_object.write_text("[1, 2]")
    with pytest.raises(TopologyError, match="must be a JSON object"):
        Topology.load(not_object)


def test_errors_are_value_errors_and_mccl_errors():
    from mccl_opt import MCCLError

    with pytest.raises(MCCLError):
        Topology("x", [Node("a", "gpu")], [])
    with pytest.raises(ValueError):
        Topology("x", [Node("a", "gpu"), Node("b", "gpu")], [Link("a", "b", 1.0)])


def test_equality_and_hash_follow_content():
    a, b = hpn(1, 2, 4), hpn(1, 2, 4)
    assert a == b and hash(a) == hash(b)
    assert fail2(a) != a


# ---------------------------------------------------------------- parallel links

def _pair_fabric(ab_links: list[tuple[float, float]]) -> Topology:
    """GPUs a, b on a 50 Gbps switch, with the links ``a -> b`` and ``b -> a`` listed
    as ``ab_links`` ((Gbps, µs) each, parallel when several): the a-b capacity bounds
    both collectives' rates."""
    nodes = [Node("a", "gpu"), Node("b", "gpu"), Node("sw", "switch")]
    links = [Link(g, "sw", 50.0, 0.5) for g in "ab"] + [Link("sw", g, 50.0, 0.5) for g in "ab"]
    for gbps, lat in ab_links:
        links += [Link("a", "b", gbps, lat, {"kind": "nvlink"}), Link("b", "a", gbps, lat, {"kind": "nvlink"})]
    return Topology("pair", nodes, links)


def test_parallel_links_merge_into_one_link_of_summed_capacity_and_smallest_latency():
    topo = _pair_fabric([(100.0, 0.05), (100.0, 0.025)])
    assert topo.num_links == 6
    merged = topo.link("a", "b")
    assert (merged.capacity_gbps, merged.latency_us) == (200.0, 0.025)
    assert merged.extra == {"kind": "nvlink"}                  # keys every part agrees on
    assert topo.link_index("a", "b") == 4 and topo.link_index("b", "a") == 5   # first members' slots
    assert topo.arrays.capacity[4] == 200.0
    assert topo.parallel_links == [
        {"src": s, "dst": d, "links": 2, "capacity_gbps": 200.0, "latency_us": 0.025,
         "parts": [{"kind": "nvlink", "capacity_gbps": 100.0, "latency_us": 0.05},
                   {"kind": "nvlink", "capacity_gbps": 100.0, "latency_us": 0.025}]}
        for s, d in (("a", "b"), ("b", "a"))]
    assert topo == _pair_fabric([(200.0, 0.025)])
    assert _pair_fabric([(200.0, 0.025)]).parallel_links == []


def test_parallel_links_give_the_rates_of_the_merged_fabric():
    """Two 100 Gbps NVLinks are one 200 Gbps link to both synthesizers (one 100 Gbps
    link is not: the a-b capacity sets the rate)."""
    from mccl_opt import solve_allgather, solve_alltoall

    two, one_fat, one_thin = (_pair_fabric(x) for x in ([(100.0, 0.025), (100.0, 0.025)],
                                                         [(200.0, 0.025)], [(100.0, 0.025)]))
    rates = {}
    for name, topo in (("two", two), ("fat", one_fat), ("thin", one_thin)):
        rates[name] = (solve_alltoall(topo, max_chunks=None).lp_rate_gbps,
                       solve_allgather(topo, max_chunks=None).lp_rate_gbps)
    assert rates["two"] == pytest.approx(rates["fat"], rel=1e-9)
    assert rates["thin"][0] < rates["fat"][0] * (1 - 1e-3)
    assert rates["thin"][1] < rates["fat"][1] * (1 - 1e-3)


def test_a_merged_topology_saves_the_merged_link_and_its_record(tmp_path):
    d = tiny_dict()
    d["links"].append({"src": "a", "dst": "sw", "capacity_gbps": 25.0, "latency_us": 0.1, "id": "x2"})
    topo = Topology.from_dict(d)
    assert topo.link("a", "sw").capacity_gbps == 125.0 and topo.link("a", "sw").latency_us == 0.1
    assert topo.link("a", "sw").extra == {}                   # 'cable' is on one part only
    path = tmp_path / "t.json"
    topo.save(path)
    data = json.loads(path.read_text())
    assert [(l["src"], l["dst"], l["capacity_gbps"]) for l in data["links"]][0] == ("a", "sw", 125.0)
    assert len(data["links"]) == 4
    assert data["parallel_links"][0]["parts"][1] == {"id": "x2", "capacity_gbps": 25.0, "latency_us": 0.1}
    again = Topology.load(path)
    assert again == topo and again.parallel_links == topo.parallel_links
    data["links"].append({"src": "sw", "dst": "b", "capacity_gbps": 10.0})   # one more merge
    later = Topology.from_dict(data)
    assert [(r["src"], r["dst"]) for r in later.parallel_links] == [("a", "sw"), ("sw", "b")]
    assert later.link("sw", "b").capacity_gbps == 60.0
    assert topo.with_capacity(src="a", dst="sw", gbps=7.0).parallel_links == topo.parallel_links


def test_relisted_is_the_same_fabric_its_link_index_built_when_used():
    """A relisted topology (AllGather's canonical listing) names the same links at their
    new positions, keeps its GPU list when the GPUs keep their order, and refuses an
    order that is no permutation."""
    topo = hpn(1, 2, 4)
    topo.arrays, topo.gpus                                 # built, as a solve has them
    nodes = list(range(topo.num_nodes))[::-1]
    gpus_first = [i for i in range(topo.num_nodes) if topo.nodes[i].is_gpu] + \
        [i for i in nodes if not topo.nodes[i].is_gpu]
    links = list(range(topo.num_links))[::-1]
    for order in (nodes, gpus_first):
        out = topo.relisted(order, links)
        assert "_link_index" not in out.__dict__
        assert [out.link_index(l.src, l.dst) for l in topo.links] == np.argsort(links).tolist()
        assert out.gpus == tuple(topo.nodes[i].id for i in order if topo.nodes[i].is_gpu)
        assert out.arrays.rank_of.max() == topo.num_gpus - 1
    assert topo.relisted(gpus_first, links).gpus is topo.gpus
    with pytest.raises(TopologyError, match="permutations"):
        topo.relisted(nodes[:-1] + nodes[:1], links)
    with pytest.raises(TopologyError, match="permutations"):
        topo.relisted(nodes, links[:-1])
