"""AllToAll chunks held as arrays (``PathChunks``): the same schedule as ``PathChunk`` tuples.

The synthesizer hands its chunks over as a path table (mccl_opt/schedule_paths.py), files
are written as ``mccl-schedule/3`` columns and read back into a table, and the validator,
``share_loads`` and the warm-state restore read the arrays.  These tests check that each
of them sees exactly the schedule the tuples describe: the validator's messages are the
ones it gave for tuples before the arrays (recorded literally below), for every form a
schedule comes in.
"""

from __future__ import annotations

import dataclasses
import json
import pickle

import numpy as np
import pytest

from instances import fail2, full_mesh, hpn
from mccl_opt import PathChunk, Schedule, ScheduleError, Topology, TreeChunk, solve_alltoall, validate
from mccl_opt.schedule import PathChunks, share_loads
from mccl_opt.schedule_paths import path_table
from mccl_opt.topology import Link, Node
from tests.test_schedule_validate import direct_alltoall


def swap(sched: Schedule, i: int, **change) -> Schedule:
    chunks = list(sched.chunks)
    chunks[i] = dataclasses.replace(chunks[i], **change)
    return dataclasses.replace(sched, chunks=tuple(chunks))


def v2_dict(sched: Schedule) -> dict:
    """``sched`` as the ``mccl-schedule/2`` dictionary earlier releases wrote for AllToAll
    (``[src, dst, share, path]`` rows, each distinct path stored once)."""
    d = sched.to_dict(compact=False)
    table = list(sched.gpus)
    nodes: list[str] = []
    paths: dict[tuple, int] = {}

    def node(v: str) -> int:
        if v not in table:
            table.append(v)
            nodes.append(v)
        return table.index(v)

    rows = []
    for c in d["chunks"]:
        p = tuple(node(v) for v in c["path"])
        rows.append([node(c["src"]), node(c["dst"]), c["share"], paths.setdefault(p, len(paths))])
    return {**d, "format": "mccl-schedule/2", "nodes": nodes, "paths": [list(p) for p in paths],
            "chunks": rows}


def as_form(sched: Schedule, form: str, tmp_path) -> Schedule:
    """``sched`` as tuples, as arrays, or read back from a file of each format."""
    if form == "tuples":
        return sched
    if form == "arrays":
        return dataclasses.replace(sched, chunks=PathChunks(path_table(sched.chunks)[0]))
    if form == "v2 dict":
        return Schedule.from_dict(json.loads(json.dumps(v2_dict(sched))))
    path = tmp_path / "s.json"
    sched.save(path, compact=form == "v3 file")
    loaded = Schedule.load(path)
    assert json.loads(path.read_text())["format"] == ("mccl-schedule/3" if form == "v3 file"
                                                       else "mccl-schedule/1")
    return loaded


FORMS = ["tuples", "arrays", "v3 file", "v1 file", "v2 dict"]
MESH3, MESH4 = full_mesh(3), full_mesh(4)
GOOD3, GOOD4 = direct_alltoall(MESH3, 2), direct_alltoall(MESH4, 2)
HEAD3 = "schedule is invalid for topology 'mesh-3':\n  "
RATE = "recomputed rate 66.6666667 Gbps differs from rate_gbps 100"
PAIRS4 = [(s, d) for s in MESH4.gpus for d in MESH4.gpus if s != d]


def _not_multiples(chunks) -> str:
    lines = [f"chunk {i} ({s}->{d}): share 0.5 is not a multiple of 1/3" for i, (s, d) in enumerate(chunks)]
    return "schedule is invalid for topology 'mesh-4':\n  " + "\n  ".join(lines[:20]) + "\n  ... and 4 more"


#: the validator's messages for tuple chunks before the arrays (recorded at dfce2c9)
DEFECTS = {
    "corrupted hop": (MESH3, swap(GOOD3, 0, path=("g0", "g9", "g1")),
                      HEAD3 + "hop g0 -> g9 is not a link of the topology\n  "
                      "hop g9 -> g1 is not a link of the topology"),
    "ends at the wrong GPU": (MESH3, swap(GOOD3, 0, path=("g0", "g2")),
                              HEAD3 + "chunk 0 (g0->g1): path must start at src and end at dst\n  " + RATE),
    "revisit": (MESH3, swap(GOOD3, 1, path=("g0", "g2", "g0", "g1")),
                HEAD3 + "chunk 1 (g0->g1): path visits a node twice\n  " + RATE),
    "shares not summing to 1": (MESH3, dataclasses.replace(GOOD3, chunks=GOOD3.chunks[1:]),
                                HEAD3 + "block g0->g1: shares sum to 0.5, not 1"),
    "share not a multiple of 1/k": (MESH3, swap(GOOD3, 3, share=0.3),
                                    HEAD3 + "chunk 3 (g0->g2): share 0.3 is not a multiple of 1/2\n  "
                                    "block g0->g2: shares sum to 0.8, not 1"),
    "share not positive": (MESH3, swap(GOOD3, 2, share=-0.5),
                           HEAD3 + "chunk 2 (g0->g2): share must be > 0\n  block g0->g2: shares sum to 0, not 1"),
    "src is dst": (MESH3, swap(GOOD3, 5, dst="g1"),
                   HEAD3 + "chunk 5 (g1->g1): src and dst must be two different GPUs of the topology\n  "
                   "block g1->g0: shares sum to 0.5, not 1"),
    "src no GPU": (MESH3, swap(GOOD3, 4, src="x9", path=("x9", "g2")),
                   HEAD3 + "chunk 4 (x9->g0): src and dst must be two different GPUs of the topology\n  "
                   "block g1->g0: shares sum to 0.5, not 1\n  hop x9 -> g2 is not a link of the topology"),
    "more than 20": (MESH4, dataclasses.replace(GOOD4, max_chunks=3),
                     _not_multiples([p for p in PAIRS4 for _ in range(2)])),
    "more than 20 and a block": (MESH4, dataclasses.replace(GOOD4, max_chunks=3, chunks=GOOD4.chunks[1:]),
                                 _not_multiples([p for p in PAIRS4 for _ in range(2)][1:])),
}


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("defect", list(DEFECTS))
def test_each_defect_is_reported_as_before(defect, form, tmp_path):
    topo, sched, message = DEFECTS[defect]
    bad = as_form(sched, form, tmp_path)
    assert isinstance(bad.chunks, PathChunks) == (form in ("arrays", "v3 file", "v2 dict"))
    with pytest.raises(ScheduleError) as err:
        validate(topo, bad)
    assert str(err.value) == message


@pytest.mark.parametrize("form", FORMS)
def test_a_valid_schedule_passes_in_every_form(form, tmp_path):
    rep = validate(MESH3, as_form(GOOD3, form, tmp_path))
    assert rep.rate_gbps == pytest.approx(100.0) and rep.num_chunks == 12 and rep.max_steps == 1
    assert np.allclose(rep.loads, 1.0)


def test_a_tree_in_an_alltoall_schedule_is_named():
    sched = dataclasses.replace(GOOD3, chunks=(TreeChunk("g0", 1.0, (("g0", "g1"),)),) + GOOD3.chunks[1:])
    with pytest.raises(ScheduleError, match=r"chunk 0: an AllToAll chunk must be a path"):
        validate(MESH3, sched)
    with pytest.raises(ScheduleError, match=r"chunk 0: an AllToAll chunk must be a path"):
        sched.to_dict()


def random_fabric(seed: int) -> Topology:
    """2-13 GPUs and 0-3 switches joined by one-way links of random capacity: a one-way
    ring through every node (so every GPU reaches every other), plus random extras."""
    rng = np.random.default_rng(seed)
    n_gpu, n_sw = int(rng.integers(2, 14)), int(rng.integers(0, 4))
    ids = [f"g{i}" for i in range(n_gpu)] + [f"s{i}" for i in range(n_sw)]
    order = [ids[i] for i in rng.permutation(len(ids))]
    pairs = {(a, b) for a, b in zip(order, order[1:] + order[:1])}
    for _ in range(int(rng.integers(0, 2 * len(ids)))):
        a, b = rng.choice(len(ids), 2, replace=False)
        pairs.add((ids[a], ids[b]))
    nodes = [Node(v, "gpu" if v[0] == "g" else "switch") for v in ids]
    links = [Link(a, b, float(rng.choice([25.0, 50.0, 100.0, 400.0])), 1.0) for a, b in sorted(pairs)]
    return Topology(f"oneway-{seed}", nodes, links)


@pytest.mark.parametrize("seed", range(8))
def test_round_trip_on_random_one_way_fabrics(seed, tmp_path):
    topo = random_fabric(seed)
    for max_chunks in (10, None):
        sched = solve_alltoall(topo, max_chunks=max_chunks)
        assert isinstance(sched.chunks, PathChunks)
        objects = tuple(sched.chunks)
        assert all(c.path[0] == c.src and c.path[-1] == c.dst for c in objects)
        for name, compact in (("s.json", True), ("s.json.gz", True), ("v1.json", False)):
            sched.save(tmp_path / name, compact=compact)
            again = Schedule.load(tmp_path / name)
            assert again == sched and sched == again and tuple(again.chunks) == objects
            assert again.rate_gbps == sched.rate_gbps and again.stats == sched.stats
            validate(topo, again)
        assert Schedule.from_dict(v2_dict(sched)) == sched
        assert np.allclose(share_loads(topo, sched.chunks), share_loads(topo, objects), rtol=1e-12)


def test_the_sequence_reads_like_a_tuple():
    sched = solve_alltoall(fail2(hpn(1, 2, 4)))
    view = PathChunks(sched.chunks.table)                             # no objects: built per read
    objects = tuple(sched.chunks)
    assert len(view) == len(objects) and view[0] == objects[0] and view[-1] == objects[-1]
    assert view[1:4] == objects[1:4] and list(view) == list(objects) and view == objects
    with pytest.raises(IndexError):
        view[len(view)]
    other = swap(sched, 3, share=objects[3].share / 2).chunks
    assert view != other and PathChunks(path_table(other)[0]) != view
    fresh = solve_alltoall(fail2(hpn(1, 2, 4)))           # its table not made yet
    back = pickle.loads(pickle.dumps(fresh))            # the table is made to travel
    assert isinstance(back.chunks, PathChunks) and back.chunks.objects is None
    assert back == fresh and back.chunks.table.same_chunks(fresh.chunks.table)
    built = PathChunks(view.table, objects)             # built objects travel with the table
    again = pickle.loads(pickle.dumps(built))
    assert again.objects == objects and again.table.same_chunks(view.table) and again == view


@pytest.mark.parametrize("change, message", [
    ({"src": [0, 9]}, r"'chunks.src\[1\]' must be an integer index in 0..3, got 9"),
    ({"dst": [1, True]}, r"'chunks.dst\[1\]' must be an integer index in 0..3"),
    ({"share": [1.0, "x"]}, r"'chunks.share\[1\]' must be a finite number, got x"),
    ({"share": [1.0]}, r"'chunks.share' has 1 entries, 'chunks.src' 2"),
    ({"path_length": [1, 3]}, r"'chunks.path_length\[0\]' must be an integer >= 2, got 1"),
    ({"path_length": [3, 3]}, r"'chunks.path_nodes' has 5 entries, the path lengths add up to 6"),
    ({"path_nodes": [0, 2, 1, 1, -1]}, r"'chunks.path_nodes\[4\]' must be an integer index in 0..3"),
    ({"path_nodes": [0, 2, 1, 1, 2 ** 70]}, r"'chunks.path_nodes\[4\]' must be an integer index"),
])
def test_malformed_columns_name_the_entry(change, message):
    good = {"format": "mccl-schedule/3", "collective": "alltoall", "gpus": ["a", "b"], "rate_gbps": 1.0,
            "nodes": ["sw", "a"],                       # a GPU listed again: one node
            "chunks": {"src": [0, 1], "dst": [1, 0], "share": [1.0, 1.0], "path_length": [3, 2],
                       "path_nodes": [0, 2, 1, 1, 3]}}
    sched = Schedule.from_dict(good)
    assert tuple(sched.chunks) == (PathChunk("a", "b", 1.0, ("a", "sw", "b")), PathChunk("b", "a", 1.0, ("b", "a")))
    with pytest.raises(ScheduleError, match=message):
        Schedule.from_dict({**good, "chunks": {**good["chunks"], **change}})
    with pytest.raises(ScheduleError, match="holds AllToAll schedules"):
        Schedule.from_dict({**good, "collective": "allgather"})
    with pytest.raises(ScheduleError, match="must be an object with the lists"):
        Schedule.from_dict({**good, "chunks": [[0, 1, 1.0, 0]]})


def test_the_synthesizer_restore_and_file_agree_on_a_fabric_change(tmp_path):
    """A loaded schedule restored as a warm start keeps its arrays (no chunk objects
    built) and warm-starts to the schedule the in-memory one gives."""
    from mccl_opt import restore_warm_state

    base = hpn(1, 4, 4)
    healthy = solve_alltoall(base)
    healthy.save(tmp_path / "h.json")
    loaded = Schedule.load(tmp_path / "h.json")
    restored = restore_warm_state(loaded, base)
    assert restored.chunks is loaded.chunks and restored.chunks.objects is None
    assert loaded.chunks == healthy.chunks
    warm_file = solve_alltoall(fail2(base), warm=restored)
    warm_mem = solve_alltoall(fail2(base), warm=healthy)
    assert warm_file.rate_gbps == pytest.approx(warm_mem.rate_gbps, rel=1e-9)
    validate(fail2(base), warm_file)
