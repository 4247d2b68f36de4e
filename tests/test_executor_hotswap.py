"""Online rescheduler on gloo ranks (paper §6.2.2): a version staged in the middle of
200 back-to-back collectives switches at one agreed K on every rank with every output
correct; a rank that never stages, or never arrives, keeps the old schedule everywhere."""

from __future__ import annotations

import threading
import warnings

import torch

from executor_cuda.rail_schedules import rail_alltoall
from instances import hpn
from executor_cuda.launch import run_ranks

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
