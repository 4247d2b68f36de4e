"""Schedule files: ``mccl-schedule/2`` (paths and trees stored once), ``mccl-schedule/1``
files still read, gzip-compressed files read and written transparently."""

from __future__ import annotations

import gzip
import json

import pytest

from instances import fail2, hpn
from mccl_opt import Schedule, ScheduleError, Topology, TopologyError, solve_allgather, solve_alltoall, validate
from mccl_opt.cli import main

TOPO = fail2(hpn(1, 2, 4))


@pytest.fixture(scope="module")
def schedules() -> dict[str, Schedule]:
    return {"alltoall": solve_alltoall(TOPO), "allgather": solve_allgather(TOPO)}


@pytest.mark.parametrize("collective", ["alltoall", "allgather"])
def test_both_formats_round_trip_exactly(schedules, collective, tmp_path):
    sched = schedules[collective]
    for compact in (True, False):
        assert Schedule.from_dict(json.loads(json.dumps(sched.to_dict(compact)))) == sched
    for name in ("s.json", "s.json.gz"):
        sched.save(tmp_path / name)
        again = Schedule.load(tmp_path / name)
        assert again == sched and again.stats == sched.stats and again.solver == sched.solver
        validate(TOPO, again)


def test_compact_format_stores_each_path_and_tree_once(schedules):
    sched = schedules["allgather"]
    d = sched.to_dict()
    assert d["format"] == "mccl-schedule/2"
    edges = [e for c in sched.chunks for e in c.edges]
    assert len(d["paths"]) == len(set(edges)) < len(edges)
    assert len(d["trees"]) == len({c.edges for c in sched.chunks})
    table = list(d["gpus"]) + d["nodes"]
    assert d["gpus"] == list(sched.gpus) and not set(d["nodes"]) & set(sched.gpus)
    first = sched.chunks[0]
    src, share, tree = d["chunks"][0]
    assert (table[src], share) == (first.src, first.share)
    assert [tuple(table[v] for v in d["paths"][p]) for p in d["trees"][tree]] == list(first.edges)
    v1 = json.dumps(sched.to_dict(compact=False), separators=(",", ":"))
    assert len(json.dumps(d, separators=(",", ":"))) < len(v1) / 2


def test_loaded_paths_are_shared_between_trees(schedules, tmp_path):
    """A path used by several trees is one tuple after loading (memory at 512 GPUs)."""
    path = tmp_path / "ag.json"
    schedules["allgather"].save(path)
    loaded = Schedule.load(path)
    by_value: dict[tuple, int] = {}
    for c in loaded.chunks:
        for e in c.edges:
            by_value.setdefault(e, id(e))
            assert by_value[e] == id(e)


def test_files_written_by_the_first_format_still_load(tmp_path):
    """An indented ``mccl-schedule/1`` file as the earlier releases wrote it."""
    old = {"format": "mccl-schedule/1", "collective": "allgather", "topology": "mesh-3",
           "gpus": ["g0", "g1", "g2"], "rate_gbps": 50.0, "lp_rate_gbps": 50.0, "max_chunks": 1,
           "chunks": [{"src": r, "share": 1.0,
                       "edges": [{"path": [r, "sw", g]} for g in ("g0", "g1", "g2") if g != r]}
                      for r in ("g0", "g1", "g2")],
           "bottleneck": [{"src": "sw", "dst": "g0", "chunks": 2, "base_slack": 0.0}],
           "version": 3, "solver": {"backend": "highs", "seconds": 0.1}}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old, indent=1) + "\n")
    sched = Schedule.load(path)
    assert sched.version == 3 and sched.rate_gbps == 50.0 and len(sched.chunks) == 3
    assert sched.chunks[1].src == "g1" and sched.chunks[1].edges == (("g1", "sw", "g0"), ("g1", "sw", "g2"))
    assert sched.to_dict(compact=False) == old
    assert Schedule.from_dict(sched.to_dict()) == sched


def test_gzip_is_recognised_by_content_and_damage_is_an_error(schedules, tmp_path):
    sched = schedules["alltoall"]
    gz = tmp_path / "s.json.gz"
    sched.save(gz)
    raw = gz.read_bytes()
    assert raw[:2] == b"\x1f\x8b" and json.loads(gzip.decompress(raw))["format"] == "mccl-schedule/3"
    renamed = tmp_path / "s.json"
    renamed.write_bytes(raw)
    assert Schedule.load(renamed) == sched
    renamed.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ScheduleError, match="damaged gzip"):
        Schedule.load(renamed)
    topo_gz = tmp_path / "t.json.gz"
    topo_gz.write_bytes(gzip.compress(json.dumps(TOPO.to_dict()).encode()))
    assert Topology.load(topo_gz).to_dict() == TOPO.to_dict()
    topo_gz.write_bytes(b"\x1f\x8b garbage")
    with pytest.raises(TopologyError, match="damaged gzip"):
        Topology.load(topo_gz)


def _ag_v2() -> dict:
    return {"format": "mccl-schedule/2", "collective": "allgather", "gpus": ["g0", "g1"],
            "rate_gbps": 1.0, "nodes": ["sw"], "paths": [[0, 2, 1], [1, 2, 0]],
            "trees": [[0], [1]], "chunks": [[0, 1.0, 0], [1, 1.0, 1]]}


@pytest.mark.parametrize("change, message", [
    ({"paths": [[0, 2, 7], [1, 2, 0]]}, r"paths\[0\]' must hold integer indices in 0..2"),
    ({"paths": [[0, -1], [1, 2, 0]]}, r"paths\[0\]' must hold integer indices"),
    ({"paths": [[0, 1.0], [1, 2, 0]]}, r"paths\[0\]' must hold integer indices"),
    ({"paths": [[0], [1, 2, 0]]}, r"paths\[0\]' must be a list of at least 2"),
    ({"trees": [[0], [5]]}, r"trees\[1\]' must hold integer indices in 0..1"),
    ({"chunks": [[0, 1.0, 2], [1, 1.0, 1]]}, r"chunks\[0\] tree' must be an integer index in 0..1"),
    ({"chunks": [[0, 1.0], [1, 1.0, 1]]}, r"chunks\[0\]' must be a list \[src, share, tree\]"),
    ({"chunks": [[9, 1.0, 0], [1, 1.0, 1]]}, r"chunks\[0\] src'"),
    ({"chunks": [[0, "x", 0], [1, 1.0, 1]]}, r"chunks\[0\] share' must be a finite number"),
    ({"nodes": [3]}, "'nodes' must be a list of node ids"),
    ({"paths": None}, "'paths' must be a list"),
])
def test_malformed_compact_schedules_name_the_entry(change, message):
    assert Schedule.from_dict(_ag_v2()).chunks[0].edges == (("g0", "sw", "g1"),)
    with pytest.raises(ScheduleError, match=message):
        Schedule.from_dict({**_ag_v2(), **change})


def test_cli_writes_and_checks_compressed_schedules(tmp_path, capsys):
    topo, sched = tmp_path / "t.json", tmp_path / "s.json.gz"
    TOPO.save(topo)
    assert main(["solve", "alltoall", str(topo), "-o", str(sched)]) == 0
    assert sched.read_bytes()[:2] == b"\x1f\x8b"
    capsys.readouterr()
    assert main(["check", str(topo), str(sched), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["valid"] is True
