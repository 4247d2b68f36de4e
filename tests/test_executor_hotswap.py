"""Online rescheduler on gloo ranks (paper §6.2.2): a version staged in the middle of
200 back-to-back collectives switches at one agreed K on every rank with every output
correct; a rank that never stages, or never arrives, keeps the old schedule everywhere;
the paused OOB exchange is one fixed-size int64 collective per round (no pickling)."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch

from executor_cuda.launch import run_ranks
from executor_cuda.rescheduler import MAX_ADVERTISED, ROW_LEN, decide, encode_row
from instances import hpn
from mccl_opt.baselines import rail_alltoall

N_OPS = 200


def _expected(rank: int, world: int, i: int) -> torch.Tensor:
    return torch.cat([torch.arange(world * 3, dtype=torch.int64)[rank * 3:(rank + 1) * 3]
                      + 10_000 * s + 1_000_000 * i for s in range(world)])


def _loop(rank: int, world: int, comm, stage_at: int | None, new) -> list[int]:
    """Run N_OPS AllToAlls, staging ``new`` at op ``stage_at``; return wrong op indices."""
    bad = []
    for i in range(N_OPS):
        if i == stage_at:
            comm.stage(new)
        inp = torch.arange(world * 3, dtype=torch.int64) + 10_000 * rank + 1_000_000 * i
        out = torch.empty_like(inp)
        comm.all_to_all_single(out, inp)
        if not torch.equal(out, _expected(rank, world, i)):
            bad.append(i)
    return bad


def _swap_worker(rank: int, world: int, mode: str) -> dict:
    import torch.distributed as dist

    from executor_cuda.communicator import Communicator

    warnings.simplefilter("ignore")
    topo = hpn(1, 2, world // 2)
    old, new = rail_alltoall(topo, version=1), rail_alltoall(topo, split=True, version=2)
    comm = Communicator(None, old, pipeline=2, stage_timeout=0.5, oob_timeout=2.0)
    release = threading.Event()
    if mode == "never-stages" and rank == 2:
        comm.rescheduler.stage_hook = lambda s: release.wait(30)
    # ranks learn about the new version at different points, as from a real controller
    stage_at = None if (mode == "never-arrives" and rank == world - 1) else 90 + 7 * rank
    bad = _loop(rank, world, comm, stage_at, new)
    if stage_at is not None:
        assert comm.rescheduler.wait(timeout=20), "swap round did not finish"
    release.set()
    dist.barrier()
    events = [(e.outcome, e.k, e.version, e.ranks_missing) for e in comm.rescheduler.events]
    result = {"bad": bad, "trace": list(comm.trace), "events": events,
              "active": comm.active["alltoall"].version, "seq": comm.seq,
              "oob_s": [e.oob_s for e in comm.rescheduler.events]}
    comm.close()
    return result


def test_hot_swap_mid_run_agrees_on_k():
    res = run_ranks(_swap_worker, 4, "swap", timeout=90)
    ks = {r["events"][0][1] for r in res}
    assert len(ks) == 1, f"ranks disagree on K: {ks}"
    k = ks.pop()
    for rank, r in enumerate(res):
        assert r["bad"] == [], f"rank {rank}: wrong outputs at ops {r['bad']}"
        assert r["events"][0][0] == "switch" and r["events"][0][2] == 2
        assert r["seq"] == N_OPS and [t[0] for t in r["trace"]] == list(range(1, N_OPS + 1))
        # every collective up to K ran the old schedule, every later one the new
        assert all(v == (1 if seq <= k else 2) for seq, _, v in r["trace"])
        assert r["active"] == 2
    # the last rank stages at op 90 + 7*3 = 111, so K cannot be earlier
    assert 111 <= k < N_OPS


def test_rank_that_never_stages_keeps_old_schedule_everywhere():
    res = run_ranks(_swap_worker, 4, "never-stages", timeout=90)
    for rank, r in enumerate(res):
        assert r["bad"] == []
        outcome, k, version, missing = r["events"][0]
        assert outcome == "keep-old" and missing == [2]
        assert r["active"] == 1 and all(v == 1 for _, _, v in r["trace"])


def test_rank_that_never_arrives_aborts_the_round_everywhere():
    res = run_ranks(_swap_worker, 4, "never-arrives", timeout=90)
    for rank, r in enumerate(res[:-1]):
        assert r["bad"] == []
        outcome, k, version, missing = r["events"][0]
        assert outcome == "abort" and missing == [3]
        assert r["active"] == 1 and all(v == 1 for _, _, v in r["trace"])
    assert res[-1]["events"] == [] and res[-1]["bad"] == []


# ---------------------------------------------------------------- the OOB rows, offline
def _rows(*ranks: tuple[int, list[int]], rnd: int = 3, version: int = 5) -> torch.Tensor:
    return torch.stack([encode_row(rnd, "alltoall", version, seq, staged)
                        for seq, staged in ranks])


def test_decide_takes_newest_common_version_and_max_seq():
    dec = decide(_rows((40, [3, 4, 5]), (47, [5, 4]), (41, [4, 5, 2])), 3, "alltoall", 5)
    assert (dec.best, dec.k, dec.missing) == (5, 47, [])
    # rank 1 failed to stage 5: the newest version every rank has is 4
    dec = decide(_rows((40, [3, 4, 5]), (39, [4]), (41, [4, 5])), 3, "alltoall", 5)
    assert (dec.best, dec.k, dec.missing) == (4, 41, [1])


def test_decide_keeps_old_when_nothing_is_common():
    dec = decide(_rows((7, [5]), (9, []), (8, [5])), 3, "alltoall", 5)
    assert dec.best is None and dec.k == 9 and dec.missing == [1]


def test_version_zero_and_negative_are_not_confused_with_padding():
    dec = decide(_rows((1, [0, -3]), (2, [-3, 0]), rnd=1, version=0), 1, "alltoall", 0)
    assert dec.best == 0 and dec.k == 2


def test_rows_are_fixed_size_and_advertise_the_newest_versions():
    assert encode_row(1, "allgather", 2, 3, []).shape == (ROW_LEN,)
    row = encode_row(1, "allgather", 30, 3, range(30, 0, -1))
    assert row.shape == (ROW_LEN,) and row.dtype == torch.int64
    assert row[-MAX_ADVERTISED:].tolist() == list(range(30, 30 - MAX_ADVERTISED, -1))


@pytest.mark.parametrize("field", ["round", "collective", "version"])
def test_ranks_in_different_rounds_are_rejected(field):
    other = {"round": (4, "alltoall", 5), "collective": (3, "allgather", 5),
             "version": (3, "alltoall", 6)}[field]
    rows = torch.stack([encode_row(3, "alltoall", 5, 1, [5]), encode_row(*other, 1, [5])])
    with pytest.raises(RuntimeError, match=r"ranks \[1\] are in a different swap round"):
        decide(rows, 3, "alltoall", 5)


# ---------------------------------------------------------------- successive swaps
def _counting_worker(rank: int, world: int) -> dict:
    """Three successive swaps; pickled/ring all-gathers are forbidden, side-group
    collectives are counted."""
    import torch.distributed as dist

    from executor_cuda.communicator import Communicator

    warnings.simplefilter("ignore")

    def forbidden(*args, **kwargs):
        raise AssertionError("the OOB exchange must not use all_gather(_object)")

    for name in ("all_gather_object", "all_gather", "all_gather_into_tensor"):
        setattr(dist, name, forbidden)
    calls = []
    real_a2a = dist.all_to_all_single

    def counting(out, inp, *args, group=None, **kwargs):
        calls.append((tuple(out.shape), tuple(inp.shape), out.dtype))
        return real_a2a(out, inp, *args, group=group, **kwargs)

    dist.all_to_all_single = counting
    topo = hpn(1, 2, world // 2)
    comm = Communicator(None, rail_alltoall(topo, version=1), pipeline=2,
                        stage_timeout=2.0, oob_timeout=5.0)
    bad = []
    for i in range(N_OPS):
        if i in (20 + rank, 80 + 3 * rank, 140 + 5 * rank):
            comm.stage(rail_alltoall(topo, split=i < 80 or i >= 140, version=2 + i // 60))
        inp = torch.arange(world * 3, dtype=torch.int64) + 10_000 * rank + 1_000_000 * i
        out = torch.empty_like(inp)
        comm.all_to_all_single(out, inp)
        if not torch.equal(out, _expected(rank, world, i)):
            bad.append(i)
    assert comm.rescheduler.wait(timeout=20), "swap rounds did not finish"
    dist.barrier()
    res = {"bad": bad, "calls": calls, "trace": list(comm.trace),
           "events": [(e.outcome, e.k, e.version) for e in comm.rescheduler.events]}
    comm.close()
    return res


def test_successive_swaps_use_one_fixed_size_collective_each():
    world = 4
    res = run_ranks(_counting_worker, world, timeout=90)
    assert all(r["events"] == res[0]["events"] for r in res), [r["events"] for r in res]
    assert [e[0] for e in res[0]["events"]] == ["switch"] * 3
    assert [e[2] for e in res[0]["events"]] == [2, 3, 4]
    ks = [e[1] for e in res[0]["events"]]      # a late last round may switch after op N_OPS
    assert ks == sorted(ks) and ks[0] >= 20 + world - 1
    for rank, r in enumerate(res):
        assert r["bad"] == []
        assert r["calls"] == [((world * ROW_LEN,), (world * ROW_LEN,), torch.int64)] * 3
        expect = [1 if s <= ks[0] else 2 if s <= ks[1] else 3 if s <= ks[2] else 4
                  for s in range(1, N_OPS + 1)]
        assert [v for _, _, v in r["trace"]] == expect
