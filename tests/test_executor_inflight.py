"""In-flight switch on gloo ranks (docs/executor.md, "In-flight switch"): a collective
run in pieces takes a newer version between pieces once every rank has staged it, at
the same piece on every rank; every output equals the reference (every chunk
delivered, whatever mix of versions ran the pieces); a version that reaches the ranks at
different times, or never reaches one rank, never deadlocks; a held version is not
taken in flight."""

from __future__ import annotations

import threading
import time
import warnings

import pytest
import torch

from executor_cuda.launch import run_ranks
from instances import hpn
from mccl_opt.baselines import rail_allgather, rail_alltoall
from mccl_opt.errors import InputError

PIECES = 8
SLOW_S = 0.03           # every message of version 1 waits this long: a slow collective
N_OPS = 12
STAGE_AT = 6            # op during which the new version reaches the ranks
#: (stage_at, n_ops) where the version must never be taken: it arrives during the third
#: op (the first two connect and compile) and three more ops could take it (every op of
#: version 1 is slow: they set the test's time)
SHORT = (2, 6)


class _SlowOld:
    """Delays every message of version 1 (a collective stuck on a degraded schedule)."""

    def message_delay_s(self, prog, rnd, message, nbytes) -> float:
        return SLOW_S if prog.version == 1 else 0.0


def _data(collective: str, rank: int, world: int, block: int, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Input and the reference output (what torch's collective gives), distinct per element."""
    if collective == "allgather":
        inp = torch.arange(block, dtype=torch.int64) + 1000 * rank + 1_000_000 * i
        ref = torch.cat([torch.arange(block, dtype=torch.int64) + 1000 * s + 1_000_000 * i for s in range(world)])
    else:
        inp = torch.arange(world * block, dtype=torch.int64) + 100_000 * rank + 10_000_000 * i
        ref = torch.cat([torch.arange(block, dtype=torch.int64) + rank * block + 100_000 * s + 10_000_000 * i
                         for s in range(world)])
    return inp, ref


def _op_exact(comm, collective: str, rank: int, world: int, block: int, i: int) -> bool:
    """Run op ``i`` on ``comm``; whether its output equals torch's collective's."""
    inp, ref = _data(collective, rank, world, block, i)
    out = torch.full_like(ref, -1)
    if collective == "allgather":
        comm.all_gather_into_tensor(out, inp)
    else:
        comm.all_to_all_single(out, inp)
    return torch.equal(out, ref)


def _worker(rank: int, world: int, collective: str, mode: str, block: int, stage_at: int = STAGE_AT,
            n_ops: int = N_OPS) -> dict:
    """Run ``n_ops`` collectives in pieces; during op ``stage_at`` version 2 reaches the ranks
    (``mode``: every rank, every rank but the last, or every rank with the version held)."""
    import torch.distributed as dist

    from executor_cuda.communicator import Communicator

    warnings.simplefilter("ignore")
    topo = hpn(1, 2, world // 2)
    make = rail_allgather if collective == "allgather" else rail_alltoall
    comm = Communicator(None, make(topo, version=1), faults=_SlowOld(), stage_timeout=5.0,
                        oob_timeout=3.0, pieces=PIECES)
    new = make(topo, split=True, version=2)
    seen: list[tuple[int, int]] = []                 # (version, piece size) of every piece run
    comm.inflight.on_piece = lambda schedule, numel: seen.append((schedule.version, numel))
    timer = None
    bad = []
    for i in range(n_ops):
        if i == stage_at and not (mode == "one-rank-never" and rank == world - 1):
            # the version reaches rank r 20 r ms into this collective (a controller's publication)
            timer = threading.Timer(0.02 * rank, comm.stage, args=(new,))
            timer.start()
            if mode == "held":
                comm.hold_version(collective, 2)
        if not _op_exact(comm, collective, rank, world, block, i):
            bad.append(i)
    if timer is not None:
        timer.join()
    comm.rescheduler.wait(timeout=15)
    dist.barrier()
    res = {"bad": bad, "switches": list(comm.inflight.switches), "trace": [v for _, _, v in comm.trace],
           "checks": comm.inflight.checks, "events": [(e.outcome, e.version) for e in comm.rescheduler.events],
           "seen": seen}
    comm.close()
    return res


@pytest.mark.parametrize("collective,block", [("alltoall", 64), ("allgather", 37)])
def test_a_slow_collective_switches_between_pieces_at_one_point_on_every_rank(collective, block):
    world = 4
    res = run_ranks(_worker, world, collective, "switch", block, timeout=90)
    switches = res[0]["switches"]
    assert all(r["switches"] == switches for r in res), [r["switches"] for r in res]
    assert len(switches) == 1
    seq, piece, version = switches[0]
    # it happened inside the collective during which the version arrived, not at its end
    assert seq == STAGE_AT + 1 and 0 < piece < PIECES and version == 2
    # the version's swap round, after the in-flight switch on some ranks, decides alike everywhere
    assert all(r["events"] == res[0]["events"] for r in res), [r["events"] for r in res]
    for rank, r in enumerate(res):
        assert r["bad"] == [], f"rank {rank}: wrong outputs at ops {r['bad']}"
        assert r["trace"] == [1] * (STAGE_AT + 1) + [2] * (N_OPS - STAGE_AT - 1)
        assert r["checks"] == N_OPS * (PIECES - 1)            # one check per boundary, every op
        # the per-piece hook (telemetry per piece) saw every piece once, on the version that ran it
        assert [v for v, _ in r["seen"]] == [1] * (STAGE_AT * PIECES + piece) + [2] * ((N_OPS - STAGE_AT) * PIECES - piece)
        assert all(sum(n for _, n in r["seen"][i:i + PIECES]) == block for i in range(0, N_OPS * PIECES, PIECES))


def test_a_version_one_rank_never_gets_is_never_taken_and_nothing_hangs():
    world = 4
    t = time.monotonic()
    res = run_ranks(_worker, world, "alltoall", "one-rank-never", 5, *SHORT, timeout=90)     # block < pieces
    assert time.monotonic() - t < 60
    for rank, r in enumerate(res):
        assert r["bad"] == [] and r["switches"] == [] and set(r["trace"]) == {1}


def test_a_held_version_is_not_taken_in_flight():
    res = run_ranks(_worker, 4, "alltoall", "held", 64, *SHORT, timeout=90)
    for r in res:
        assert r["bad"] == [] and r["switches"] == [] and set(r["trace"]) == {1}
        assert r["events"] == [("held", 2)]


def test_pieces_need_hot_swap():
    def worker(rank: int, world: int) -> str:
        from executor_cuda.communicator import Communicator

        with pytest.raises(InputError, match="needs hot_swap=True"):
            Communicator(None, hot_swap=False, pieces=4)
        with pytest.raises(InputError, match="pieces and check_every must be >= 1"):
            Communicator(None, pieces=0)
        return "ok"

    assert run_ranks(worker, 2, timeout=60) == ["ok", "ok"]
