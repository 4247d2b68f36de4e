"""The guide trees a warm start reads from a schedule without a warm state of the new
fabric's size (:func:`mccl_opt.allgather.warm.previous._guides_from`): read from the tree
table without building every chunk, they equal those of the chunks themselves."""

from __future__ import annotations

import dataclasses

import numpy as np

import mccl_opt as mo
from instances import hpn
from mccl_opt.allgather.warm.previous import _guides_from
from mccl_opt.schedule_chunks import TreeChunks


def _reference(sched: mo.Schedule, topo: mo.Topology) -> dict[int, np.ndarray]:
    """Per root rank, the parents of its first largest-share chunk, chunk by chunk."""
    rank = {g: i for i, g in enumerate(sched.gpus)}
    best: dict[int, tuple[float, object]] = {}
    for c in sched.chunks:
        r = rank[c.src]
        if r not in best or c.share > best[r][0]:
            best[r] = (c.share, c)
    out = {}
    for r, (_, c) in best.items():
        par = np.full(topo.num_gpus, -1, np.int64)
        for e in c.edges:
            par[rank[e[-1]]] = rank[e[0]]
        out[r] = par
    return out


def test_guides_from_the_tree_table_equal_the_chunks_guides():
    topo = hpn(1, 2, 4).with_capacity(src="s0h0g1", dst="s0tor1", gbps=150.0)   # one way
    sched = mo.solve_allgather(topo, max_chunks=None)
    assert isinstance(sched.chunks, TreeChunks)
    shares = sched.chunks.table.shares
    assert len(set(shares.tolist())) < shares.size          # ties: the first one counts
    want = _reference(sched, topo)
    as_tuple = dataclasses.replace(sched, chunks=tuple(sched.chunks))
    for got in (_guides_from(sched, topo), _guides_from(as_tuple, topo)):
        assert got.keys() == want.keys() == set(range(topo.num_gpus))
        for r in want:
            np.testing.assert_array_equal(got[r], want[r])
