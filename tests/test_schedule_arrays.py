"""AllGather trees held as arrays (``TreeChunks``): the same schedule as per-edge tuples.

A synthesized AllGather schedule keeps its trees as a path table and a row of path
indices per tree (mccl_opt/schedule_chunks.py); these tests check that every reader
(the sequence itself, the file writer, ``share_loads``, the validator) sees exactly the
schedule the per-edge ``TreeChunk`` tuples describe.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from instances import fail1, fail2, fail3, hpn
from mccl_opt import Schedule, ScheduleError, TreeChunk, validate
from mccl_opt.allgather import solve_allgather
from mccl_opt.allgather.forestcoll.mapping import map_classes, tree_chunks
from mccl_opt.allgather.forestcoll.packing.repair import repair_pack
from mccl_opt.schedule import TreeChunks, TreeTable, share_loads
from mccl_opt.schedule_chunks import FlatPaths, path_nodes
from mccl_opt.schedule_format import pack_v2
from tests.oracle_allgather import check_schedule

FABRICS = [hpn(1, 2, 8), fail2(hpn(1, 2, 8)), fail3(hpn(1, 4, 8)), fail1(hpn(2, 2, 8)),
           fail2(hpn(2, 4, 8))]


def per_edge(chunks) -> tuple[TreeChunk, ...]:
    """The same chunks as plain per-edge tuples."""
    return tuple(TreeChunk(c.src, c.share, tuple(tuple(e) for e in c.edges)) for c in chunks)


def as_tuples(sched: Schedule) -> Schedule:
    """``sched`` with its chunks spelled out (what every schedule was before arrays)."""
    return Schedule(sched.collective, sched.topology, sched.gpus, sched.rate_gbps,
                    sched.lp_rate_gbps, sched.max_chunks, per_edge(sched.chunks),
                    sched.bottleneck, sched.version, sched.solver, sched.stats,
                    report=sched.report)


@pytest.fixture(scope="module", params=FABRICS, ids=lambda t: t.name)
def solved(request):
    topo = request.param
    return topo, solve_allgather(topo)


@pytest.mark.parametrize("topo", [fail2(hpn(1, 2, 8)), fail3(hpn(1, 4, 8)), hpn(1, 8, 8)],
                         ids=lambda t: t.name)
def test_mapped_arrays_are_the_per_edge_trees(topo):
    """Same roots, shares, edges (in order) and node paths as the per-edge construction
    (each edge the node ids of its mapped path)."""
    from tests.test_allgather import logical_graph
    lg, k = logical_graph(topo)
    classes, _ = repair_pack(lg.num_gpus, lg.tail, lg.head, lg.units, k)
    mapped, _ = map_classes(classes, lg)
    ids = [n.id for n in topo.nodes]
    chunks = tree_chunks(mapped, k, ids, topo.arrays.gpu_nodes)
    ref = [TreeChunk(topo.gpus[r], m / k, tuple(tuple(ids[v] for v in mapped.paths[j]) for j in row))
           for r, m, row in zip(mapped.roots, mapped.mults, mapped.edges)]
    assert isinstance(chunks, TreeChunks) and len(chunks) == len(ref)
    assert list(chunks) == ref
    assert [chunks[i] for i in range(len(ref))] == ref and chunks[-1] == ref[-1]
    assert chunks == tuple(ref) and tuple(ref) == chunks
    assert chunks[1:3] == tuple(ref[1:3])
    with pytest.raises(IndexError):
        chunks[len(ref)]
    first, again = chunks[0], chunks[0]
    assert first.edges[0] is again.edges[0]         # one name tuple per path, shared


def test_solved_schedule_validates_and_matches_per_edge(solved):
    topo, sched = solved
    assert isinstance(sched.chunks, TreeChunks)         # Phase 3's trees stay arrays
    plain = as_tuples(sched)
    report = validate(topo, sched)
    assert report.rate_gbps == pytest.approx(sched.rate_gbps, rel=1e-9)
    assert np.allclose(report.loads, validate(topo, plain).loads, rtol=1e-12, atol=0)
    assert np.allclose(share_loads(topo, sched.chunks), share_loads(topo, plain.chunks),
                       rtol=1e-12, atol=0)
    assert sched == plain


def test_file_from_arrays_is_the_per_edge_file(solved, tmp_path):
    """The writer reads the arrays and writes the very dictionary the per-edge chunks
    give (``mccl-schedule/2``; ``/1`` too); both read back to the same schedule."""
    topo, sched = solved
    plain = as_tuples(sched)
    assert sched.to_dict() == plain.to_dict()
    assert sched.to_dict(compact=False) == plain.to_dict(compact=False)
    for name, compact in (("s.json", True), ("s1.json.gz", False)):
        sched.save(tmp_path / name, compact=compact)
        back = Schedule.load(tmp_path / name)
        assert back == plain and back.chunks == sched.chunks
        validate(topo, back)


def test_pickled_array_chunks_keep_their_trees(solved):
    _, sched = solved
    back = pickle.loads(pickle.dumps(sched))
    assert back.chunks == sched.chunks and type(back.chunks) is type(sched.chunks)


def _table(edges, src=(0, 1), shares=(1.0, 1.0)) -> TreeChunks:
    """Trees over GPUs a, b, c (nodes 0-2) and switch s (3); paths 0-5 are
    a-s-b, a-s-c, b-s-a, b-s-c, c-s-a and a duplicate of a-s-b."""
    ids = ("a", "b", "c", "s")
    paths = [(0, 3, 1), (0, 3, 2), (1, 3, 0), (1, 3, 2), (2, 3, 0), (0, 3, 1)]
    return TreeChunks(TreeTable(ids, paths, np.array(src), np.array(shares, float),
                                np.array(edges, np.int64)))


def _star():
    from mccl_opt.topology import Link, Node, Topology
    nodes = [Node("a", "gpu"), Node("b", "gpu"), Node("c", "gpu"), Node("s", "switch")]
    links = [Link(g, "s", 100.0) for g in "abc"] + [Link("s", g, 100.0) for g in "abc"]
    return Topology("star3", nodes, links)


def test_writer_merges_equal_paths_and_trees_like_the_per_edge_writer():
    """Two table paths with the same nodes are one file path, two equal trees one file
    tree, in first-use order, as when the chunks are written edge by edge."""
    chunks = _table([[5, 1], [2, 3], [0, 1]], src=(0, 1, 0), shares=(0.5, 1.0, 0.5))
    plain = per_edge(chunks)
    sched = Schedule("allgather", "star3", ("a", "b", "c"), 50.0, 50.0, 2, chunks)
    want = pack_v2(("a", "b", "c"), [(c.src, c.share, c.edges) for c in plain])
    got = sched.to_dict()
    assert {k: got[k] for k in want} == want
    assert len(got["paths"]) == 4 and len(got["trees"]) == 2


def test_validator_reads_array_trees_and_finds_their_faults():
    topo = _star()
    # link a -> s carries a's two edges and c's edge a-s-b (path 5, listed twice in the
    # table as path 0 too): three shares, 100/3 Gbps (the oracle's count below)
    good = Schedule("allgather", "star3", ("a", "b", "c"), 100 / 3, 100 / 3, 1,
                    _table([[0, 1], [2, 3], [4, 5]], src=(0, 1, 2), shares=(1.0, 1.0, 1.0)))
    assert validate(topo, good).rate_gbps == pytest.approx(100 / 3)
    assert check_schedule(topo, good).rate_gbps == pytest.approx(100 / 3)
    twice = Schedule("allgather", "star3", ("a", "b", "c"), 50.0, 50.0, 1,
                     _table([[0, 5], [2, 3], [4, 5]], src=(0, 1, 2), shares=(1.0, 1.0, 1.0)))
    with pytest.raises(ScheduleError, match="tree 0 .*receives the shard twice"):
        validate(topo, twice)
    rooted = Schedule("allgather", "star3", ("a", "b", "c"), 50.0, 50.0, 1,
                      _table([[0, 1], [2, 3], [0, 1]], src=(0, 1, 2), shares=(1.0, 1.0, 1.0)))
    with pytest.raises(ScheduleError, match="root c: tree shares sum to 0|tree 2"):
        validate(topo, rooted)


def test_array_loads_count_every_hop_and_name_a_missing_link():
    """``share_loads`` of a tree table maps its paths' node indices to the fabric's
    (docs/allgather_history.md "Fuzz seeds 3418/3419"): each used path's shares on each hop,
    the fabric's own node order, and a hop that is no link named by its node ids."""
    from mccl_opt import TopologyError
    from mccl_opt.topology import Link, Node, Topology
    topo = _star()
    chunks = _table([[0, 1], [2, 3], [4, 5]], src=(0, 1, 2), shares=(0.5, 1.0, 0.25))
    loads = dict(zip(((l.src, l.dst) for l in topo.links), share_loads(topo, chunks)))
    assert loads == {("a", "s"): 1.25, ("b", "s"): 2.0, ("c", "s"): 0.25,
                     ("s", "a"): 1.25, ("s", "b"): 0.75, ("s", "c"): 1.5}
    relisted = Topology("star3", list(reversed(topo.nodes)), list(reversed(topo.links)))
    assert np.array_equal(share_loads(relisted, chunks), share_loads(relisted, per_edge(chunks)))
    cut = Topology("star3", list(topo.nodes) + [Node("t", "switch")],  # s -> c only via t
                   [l for l in topo.links if (l.src, l.dst) != ("s", "c")]
                   + [Link("s", "t", 100.0), Link("t", "c", 100.0)])
    with pytest.raises(TopologyError, match="s.*c"):
        share_loads(cut, chunks)


def test_a_table_needs_one_root_share_and_row_per_tree():
    with pytest.raises(ScheduleError, match="one src, share and row"):
        _table([[0, 1]], src=(0, 1))


def test_compact_files_load_as_arrays_and_others_as_tuples(solved, tmp_path):
    """A ``mccl-schedule/2`` AllGather file reads into a tree table (the same chunks);
    ``mccl-schedule/1`` and trees of different sizes read as tuples."""
    topo, sched = solved
    sched.save(tmp_path / "s.json")
    sched.save(tmp_path / "s1.json", compact=False)
    v2, v1 = Schedule.load(tmp_path / "s.json"), Schedule.load(tmp_path / "s1.json")
    assert isinstance(v2.chunks, TreeChunks) and isinstance(v1.chunks, tuple)
    assert v2 == v1 == sched and v2.to_dict() == sched.to_dict()
    ragged = {"format": "mccl-schedule/2", "collective": "allgather", "gpus": ["a", "b", "c"],
              "rate_gbps": 1.0, "nodes": ["s"], "paths": [[0, 3, 1], [0, 3, 2], [1, 3, 0]],
              "trees": [[0, 1], [2]], "chunks": [[0, 1.0, 0], [1, 1.0, 1]]}
    loaded = Schedule.from_dict(ragged)
    assert isinstance(loaded.chunks, tuple) and loaded.chunks[1].edges == (("b", "s", "a"),)
    with pytest.raises(ScheduleError, match=r"chunks\[1\] tree' must be an integer index in 0..1"):
        Schedule.from_dict({**ragged, "trees": [[0, 1], [2, 0]], "chunks": [[0, 1.0, 0], [1, 1.0, 2]]})


def test_flat_paths_read_as_the_tuples_they_store():
    tuples = [(0, 3, 1), (2,), (4, 5, 6, 7), (1, 3, 0)]
    first = np.cumsum([0] + [len(p) for p in tuples])
    flat = FlatPaths(np.array([v for p in tuples for v in p]), first)
    assert list(flat) == tuples and [flat[j] for j in range(4)] == tuples and flat[-1] == tuples[-1]
    assert flat[1:3] == tuples[1:3] and len(flat) == 4
    with pytest.raises(IndexError):
        flat[4]
    which = np.array([3, 0, 2])
    for paths in (flat, tuples):
        lens, nodes = path_nodes(paths, which)
        assert lens.tolist() == [3, 3, 4] and nodes.tolist() == [1, 3, 0, 0, 3, 1, 4, 5, 6, 7]


@pytest.mark.parametrize("shape", [(0, 4), (1, 1), (7, 3), (300, 17)])
def test_table_path_shares_are_numpys_weighted_count(shape):
    """A tree table's per-path shares (compiled, mccl_opt/row_bincount.py) equal the
    weighted ``np.bincount`` of its edges bit for bit, paths no tree rides included."""
    rng = np.random.default_rng(sum(shape))
    paths = [(i,) for i in range(shape[1] * 2 + 5)]
    edges = rng.integers(0, len(paths) - 3, shape).astype(np.int32)
    shares = rng.random(shape[0]) / rng.integers(1, 1000, shape[0])
    table = TreeTable(["a"], paths, np.zeros(shape[0], np.int64), shares, edges)
    want = np.bincount(edges.ravel(), weights=np.repeat(shares, shape[1]), minlength=len(paths))
    got = table.path_shares()
    assert got.shape == want.shape and (got == want).all()
