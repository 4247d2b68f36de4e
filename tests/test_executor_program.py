"""The schedule compiler: every block delivered, in order, for any size (no processes).

An independent interpreter replays the global program round by round with the
executor's semantics (all sends of a round read the buffers as they were before the
round's receives land) and checks the AllToAll / AllGather result element by element.
"""

from __future__ import annotations

import numpy as np
import pytest

from instances import hpn
from mccl_opt.baselines import rail_allgather, rail_alltoall
from mccl_opt.errors import ScheduleError
from mccl_opt.lowering.program import (OUT, STAGE, ProgramCache, chunk_bounds, compile_schedule,
                                       direct_schedule, slice_bounds)
from mccl_opt.schedule import PathChunk, Schedule, TreeChunk


def interpret(prog, inputs: list[np.ndarray], out_len: int) -> list[np.ndarray]:
    """Replay ``prog``; unwritten elements stay -1 so a missed delivery shows."""
    n = len(prog.ranks)
    bufs = [[inputs[r].copy(), np.full(out_len, -1, dtype=np.int64),
             np.full(prog.ranks[r].stage_numel, -1, dtype=np.int64)] for r in range(n)]
    for r, rp in enumerate(prog.ranks):
        for s, d in rp.copies:
            bufs[r][d.buf][d.offset:d.offset + d.length] = bufs[r][s.buf][s.offset:s.offset + s.length]
    for t in range(prog.num_rounds):
        msgs = [m for m in prog.messages if m.round == t]
        payloads = []
        for m in msgs:
            data = np.concatenate([bufs[m.src][s.buf][s.offset:s.offset + s.length]
                                   for s in m.src_segs])
            assert (data >= 0).all(), f"round {t}: {m.src}->{m.dst} forwards data not yet received"
            payloads.append(data)
        for m, data in zip(msgs, payloads):
            assert data.size == sum(s.length for s in m.dst_segs)
            pos = 0
            for s in m.dst_segs:
                bufs[m.dst][s.buf][s.offset:s.offset + s.length] = data[pos:pos + s.length]
                pos += s.length
    return [b[OUT] for b in bufs]


def expected_alltoall(n: int, block: int) -> tuple[list, list]:
    inputs = [np.arange(n * block, dtype=np.int64) + 1_000_000 * r for r in range(n)]
    outs = [np.concatenate([inputs[s][d * block:(d + 1) * block] for s in range(n)])
            for d in range(n)]
    return inputs, outs


SCHEDULES = {
    "a2a-direct4": lambda: direct_schedule("alltoall", hpn(1, 2, 2).gpus),
    "a2a-rail4": lambda: rail_alltoall(hpn(1, 2, 2)),
    "a2a-rail8-split": lambda: rail_alltoall(hpn(1, 2, 4), split=True),
    "ag-direct4": lambda: direct_schedule("allgather", hpn(1, 2, 2).gpus),
    "ag-rail8": lambda: rail_allgather(hpn(1, 2, 4)),
    "ag-rail8-split": lambda: rail_allgather(hpn(1, 2, 4), split=True),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("block", [0, 1, 7, 64])
@pytest.mark.parametrize("pipeline", [1, 3])
def test_program_delivers_every_block(name, block, pipeline):
    sched = SCHEDULES[name]()
    n = sched.num_gpus
    prog = compile_schedule(sched, block, pipeline)
    if sched.collective == "alltoall":
        inputs, want = expected_alltoall(n, block)
        got = interpret(prog, inputs, n * block)
    else:
        inputs = [np.arange(block, dtype=np.int64) + 1_000_000 * r for r in range(n)]
        want = [np.concatenate(inputs)] * n
        got = interpret(prog, inputs, n * block)
    for r in range(n):
        np.testing.assert_array_equal(got[r], want[r], err_msg=f"rank {r}")


def test_relays_use_staging_and_pipeline_adds_rounds():
    sched = rail_alltoall(hpn(1, 2, 4), split=True)
    p1, p4 = compile_schedule(sched, 100, 1), compile_schedule(sched, 100, 4)
    assert any(s.buf == STAGE for m in p1.messages for s in m.dst_segs)
    assert p1.num_rounds == 2 and p4.num_rounds == 5   # 2 GPU hops, pipelined over 4 slices
    # coalescing: at most one message per (round, src, dst)
    keys = [(m.round, m.src, m.dst) for m in p4.messages]
    assert len(keys) == len(set(keys))
    # every sent element is received: totals match the schedule's hop volume
    assert sum(m.numel for m in p1.messages) == sum(m.numel for m in p4.messages)


def test_chunk_and_slice_bounds_partition_exactly():
    for numel in (0, 1, 5, 97, 10**6 + 3):
        for shares in ([1.0], [0.3, 0.7], [0.1] * 10, [1 / 3] * 3):
            b = chunk_bounds(shares, numel)
            assert b[0][0] == 0 and b[-1][1] == numel
            assert all(x[1] == y[0] and x[0] <= x[1] for x, y in zip(b, b[1:]))
        s = slice_bounds(numel, 4)
        assert s[0][0] == 0 and s[-1][1] == numel
    assert chunk_bounds([0.3, 0.7], 10) == [(0, 3), (3, 10)]
    assert chunk_bounds([1 / 3] * 3, 4) == [(0, 1), (1, 2), (2, 4)]   # floor(i*n/K)


def test_compile_rejects_undeliverable_schedules():
    gpus = hpn(1, 2, 2).gpus
    good = direct_schedule("alltoall", gpus)
    missing = Schedule("alltoall", "t", gpus, 1.0, 1.0, 1, good.chunks[1:])
    with pytest.raises(ScheduleError, match="has no chunk"):
        compile_schedule(missing, 8)
    half = Schedule("alltoall", "t", gpus, 1.0, 1.0, 1,
                    (PathChunk(gpus[0], gpus[1], 0.5, (gpus[0], gpus[1])),) + good.chunks[1:])
    with pytest.raises(ScheduleError, match="sum to 1"):
        compile_schedule(half, 8)
    ag = direct_schedule("allgather", gpus)
    broken = Schedule("allgather", "t", gpus, 1.0, 1.0, 1,
                      (TreeChunk(gpus[0], 1.0, ag.chunks[0].edges[:-1]),) + ag.chunks[1:])
    with pytest.raises(ScheduleError, match="spanning"):
        compile_schedule(broken, 8)


def test_program_cache_is_per_version_and_size():
    cache = ProgramCache(maxsize=2)
    s1 = rail_alltoall(hpn(1, 2, 2), version=1)
    s2 = rail_alltoall(hpn(1, 2, 2), split=True, version=2)
    a = cache.get(s1, 10, 1)
    assert cache.get(s1, 10, 1) is a
    assert cache.get(s2, 10, 1).version == 2
    assert cache.get(s1, 11, 1) is not a
    assert compile_schedule(s1, 10, 1) == a      # deterministic lowering
