"""Pieces per chunk: one rule for the simulator and the executor's lowering
(mccl_opt.piece_rule; docs/executor.md "Pieces per chunk")."""

from __future__ import annotations

import numpy as np
import pytest

from instances import hpn
from mccl_opt.baselines import rail_allgather, rail_alltoall
from mccl_opt.errors import InputError
from mccl_opt.lowering.hops import INP, OUT, allgather_hops, alltoall_hops, rank_index
from mccl_opt.lowering.program import chunk_bounds, compile_schedule
from mccl_opt.piece_rule import MAX_PIECE_BYTES, PIECE_FLOOR_BYTES, PIECE_RULE, PIECES_PER_HOP, PieceRule
from mccl_opt.schedule import Schedule, TreeChunk
from mccl_opt.sim.model import compile_streams
from tests.test_executor_program import expected_alltoall, interpret

KIB = 1024


def test_rule_bounds_every_piece():
    """Pieces at most 512 KiB; a one-hop chunk in 512 KiB pieces (no fill to pay); a
    relayed one in at least 16 per relay hop unless they would fall under 64 KiB; the count
    never falls as the chunk grows or deepens."""
    b = np.unique(np.r_[np.arange(1, 40) * 16 * KIB, np.geomspace(1, 64 * 2**20, 300)])
    cap = np.maximum(1, np.ceil(b / MAX_PIECE_BYTES - 1e-9))
    prev = None
    for d in range(1, 6):
        n = PIECE_RULE.counts(b, np.full(b.size, d))
        assert (n >= 1).all() and (np.diff(n) >= 0).all()
        assert (b / n <= MAX_PIECE_BYTES * (1 + 1e-12)).all()
        if d == 1:
            np.testing.assert_array_equal(n, cap)
        else:
            assert ((b / n >= PIECE_FLOOR_BYTES * (1 - 1e-12)) | (n == cap)).all()
            assert (n >= np.minimum(PIECES_PER_HOP * (d - 1), b // PIECE_FLOOR_BYTES)).all()
        if prev is not None:
            assert (n >= prev).all()
        prev = n
    # the documented figures: seed 2 #17's 1/9 shards (1.86 MB, 3 hops) in 28, 16 MiB in 32
    assert [PIECE_RULE.count(x, d) for x, d in ((100 * KIB, 3), (256 * KIB, 2), (1.86e6, 3), (1.86e6, 1),
                                                (1.86e6, 2), (16 * 2**20, 2))] == [1, 4, 28, 4, 16, 32]
    with pytest.raises(InputError):
        PieceRule(floor_bytes=0)


def _hops(chunk, rank: dict) -> int:
    """GPU hops of a chunk: its path's GPUs less one, its tree's depth."""
    if isinstance(chunk, TreeChunk):
        return max(chunk.depths().values())
    return sum(v in rank for v in chunk.path) - 1


def _uneven_allgather() -> Schedule:
    """HPN 1x2x4 rail trees with GPU 0's shard in 3 unequal chunks (small ones relayed)."""
    base = rail_allgather(hpn(1, 2, 4))
    g0 = base.gpus[0]
    tree = next(c for c in base.chunks if c.src == g0)
    chunks = [c for c in base.chunks if c.src != g0] + [TreeChunk(g0, s, tree.edges) for s in (0.125, 0.25, 0.625)]
    return Schedule(collective="allgather", topology=base.topology, gpus=base.gpus, rate_gbps=base.rate_gbps,
                    lp_rate_gbps=base.lp_rate_gbps, max_chunks=8, chunks=tuple(chunks))


@pytest.mark.parametrize("element_bytes", [64.0, 4096.0])
def test_lowering_cuts_chunks_as_the_rule_and_delivers_once(element_bytes):
    """Every chunk's pieces leave its root as the rule says for its bytes, partition the
    chunk exactly, and every element reaches every GPU once with the right value."""
    rule = PieceRule(element_bytes=element_bytes)
    block = 2048
    for sched in (_uneven_allgather(), rail_alltoall(hpn(1, 2, 4), split=True)):
        n, rank = sched.num_gpus, rank_index(sched)
        hops = (allgather_hops if sched.collective == "allgather" else alltoall_hops)(
            sched, rank, block, rule, chunk_bounds)
        first = hops.sbuf == INP                   # the hops that leave a chunk's source
        got: dict[int, set[tuple[int, int]]] = {r: set() for r in range(n)}
        for src, off, ln in zip(hops.src[first], hops.soff[first], hops.length[first]):
            got[int(src)].add((int(off), int(ln)))
        want: dict[int, set[tuple[int, int]]] = {r: set() for r in range(n)}
        groups: dict = {}
        for c in sched.chunks:
            groups.setdefault((c.src, getattr(c, "dst", None)), []).append(c)
        for (src, dst), chunks in groups.items():
            base = 0 if dst is None else rank[dst] * block     # where the block sits in the input
            for c, (lo, hi) in zip(chunks, chunk_bounds([c.share for c in chunks], block)):
                p = rule.count((hi - lo) * element_bytes, _hops(c, rank))
                cuts = [lo + i * (hi - lo) // p for i in range(p + 1)]
                want[rank[src]] |= {(base + a, z - a) for a, z in zip(cuts, cuts[1:]) if z > a}
        assert got == want, sched.collective
        prog = compile_schedule(sched, block, rule)
        if sched.collective == "alltoall":
            inputs, want_out = expected_alltoall(n, block)
        else:
            inputs = [np.arange(block, dtype=np.int64) + 1_000_000 * r for r in range(n)]
            want_out = [np.concatenate(inputs)] * n
        got_out = interpret(prog, inputs, n * block)
        for r in range(n):
            np.testing.assert_array_equal(got_out[r], want_out[r])
            received = sum(s.length for m in prog.messages if m.dst == r for s in m.dst_segs if s.buf == OUT)
            assert received == (n - 1) * block        # into the output: each element once


def test_simulator_and_lowering_cut_alike():
    """The simulator's pieces per chunk equal the lowering's slices for the same bytes."""
    sched = _uneven_allgather()
    topo = hpn(1, 2, 4)
    block, message = 4096, 2**20                      # 256 fabric bytes per element
    streams = compile_streams(topo, sched, message)
    rule = PieceRule(element_bytes=message / block)
    rank = {g: r for r, g in enumerate(sched.gpus)}
    want = []
    for src in sched.gpus:
        chunks = [c for c in sched.chunks if c.src == src]
        spans = [hi - lo for lo, hi in chunk_bounds([c.share for c in chunks], block)]
        want += [(c.share, rule.count(x * rule.element_bytes, _hops(c, rank))) for c, x in zip(chunks, spans)]
    got = sorted(set(zip(np.round(streams.npieces * streams.piece_bytes / message, 9), streams.npieces.tolist())))
    assert got == sorted(set((round(s, 9), p) for s, p in want))
    assert sorted(set(p for _, p in want)) == [2, 4, 10, 16]   # 128, 256, 640 KiB, 1 MiB chunks
