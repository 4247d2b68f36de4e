"""Swap holds on gloo ranks (docs/executor.md, "Swap holds from the controller"): a
version the controller holds is not swapped in by any rank while one rank knows of the
hold; its release runs one more swap round, at one agreed K on every rank; a newer
version supersedes a held one, which then never runs.  The OOB rows carry each rank's
knowledge of the hold; ``decide`` takes the furthest state over the ranks."""

from __future__ import annotations

import warnings

import pytest
import torch

from executor_cuda.launch import run_ranks
from executor_cuda.rescheduler import HELD, RELEASED, UNHELD, decide, encode_row
from instances import hpn
from mccl_opt.baselines import rail_alltoall

N_OPS = 160
HOLD_LATE = 40          # ranks other than 0 learn of the hold only here (after its round)
RELEASE = 80            # rank r is released at op RELEASE + 5 r


def _expected(rank: int, world: int, i: int) -> torch.Tensor:
    return torch.cat([torch.arange(world * 3, dtype=torch.int64)[rank * 3:(rank + 1) * 3]
                      + 10_000 * s + 1_000_000 * i for s in range(world)])


def _worker(rank: int, world: int, mode: str) -> dict:
    import torch.distributed as dist

    from executor_cuda.communicator import Communicator

    warnings.simplefilter("ignore")
    topo = hpn(1, 2, world // 2)
    comm = Communicator(None, rail_alltoall(topo, version=1), pipeline=2, stage_timeout=2.0, oob_timeout=10.0)
    bad = []
    for i in range(N_OPS):
        if i == 20 + 3 * rank:                       # the version reaches the ranks at different times
            comm.stage(rail_alltoall(topo, split=True, version=2))
            if rank == 0:                            # rank 0 hears of the hold before any exchange
                comm.hold_version("alltoall", 2)
        if i == HOLD_LATE + rank and rank:
            comm.hold_version("alltoall", 2)
        if i == 60:                                  # the held round is over on every rank
            assert comm.rescheduler.wait(rounds=1, timeout=30), "the held round did not finish"
        if i == RELEASE + 5 * rank:
            if mode == "release":
                comm.release_version("alltoall", 2)
            else:                                    # superseded: a newer version, never a release
                comm.stage(rail_alltoall(topo, version=3))
        inp = torch.arange(world * 3, dtype=torch.int64) + 10_000 * rank + 1_000_000 * i
        out = torch.empty_like(inp)
        comm.all_to_all_single(out, inp)
        if not torch.equal(out, _expected(rank, world, i)):
            bad.append(i)
    assert comm.rescheduler.wait(timeout=30), "swap rounds did not finish"
    dist.barrier()
    res = {"bad": bad, "trace": [v for _, _, v in comm.trace],
           "events": [(e.outcome, e.version, e.k) for e in comm.rescheduler.events]}
    comm.close()
    return res


@pytest.mark.parametrize("mode", ["release", "supersede"])
def test_a_held_version_waits_for_its_release_and_all_ranks_swap_at_one_k(mode):
    world = 4
    res = run_ranks(_worker, world, mode, timeout=90)
    events = res[0]["events"]
    assert all(r["events"] == events for r in res), [r["events"] for r in res]
    assert [(o, v) for o, v, _ in events] == [("held", 2), ("switch", 2 if mode == "release" else 3)]
    k = events[1][2]
    # the switch comes after the last rank heard of the release (or of version 3)
    assert RELEASE + 5 * (world - 1) <= k < N_OPS
    for rank, r in enumerate(res):
        assert r["bad"] == [], f"rank {rank}: wrong outputs at ops {r['bad']}"
        new = 2 if mode == "release" else 3
        assert r["trace"] == [1] * k + [new] * (N_OPS - k)      # version 2 never ran while held


# ---------------------------------------------------------------- the rows, offline
def _rows(*ranks: tuple[list[int], dict[int, int]]) -> torch.Tensor:
    return torch.stack([encode_row(1, "alltoall", 2, 7, staged, states) for staged, states in ranks])


def test_one_rank_that_knows_of_the_hold_holds_every_rank():
    dec = decide(_rows(([2], {2: HELD}), ([2], {}), ([2], {2: UNHELD})), 1, "alltoall", 2)
    assert dec.best is None and dec.held == [2]


def test_a_release_seen_by_one_rank_releases_the_version():
    dec = decide(_rows(([2], {2: HELD}), ([2], {2: RELEASED}), ([2], {})), 1, "alltoall", 2)
    assert dec.best == 2 and dec.held == []


def test_a_held_version_leaves_an_older_common_one_swappable():
    dec = decide(_rows(([3, 2], {3: HELD}), ([3, 2], {})), 1, "alltoall", 2)
    assert dec.best == 2 and dec.held == [3]
