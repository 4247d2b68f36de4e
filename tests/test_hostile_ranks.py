"""Hostile environment, ranks: a rank killed or stopped in the middle of a run is
reported as one :class:`~executor_cuda.launch.RankFailure` naming it, soon after the
failure (the other ranks get ``grace_s`` to report), never as an ``EOFError`` from the
launcher or a hang until the overall timeout."""

from __future__ import annotations

import os
import signal
import time

import pytest

pytest.importorskip("torch")

from executor_cuda.launch import RankFailure, run_ranks  # noqa: E402
from mccl_opt.errors import MCCLError  # noqa: E402


def _killed(rank: int, world: int) -> int:
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    import torch.distributed as dist

    dist.barrier()              # waits for rank 1, which is gone: gloo raises or blocks
    return rank


def _stopped(rank: int, world: int) -> int:
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(1.0)             # the live ranks' own collective timeout, shortened
    raise TimeoutError(f"rank {rank}: allgather step 0 timed out waiting for rank 1")


def test_a_killed_rank_is_named_at_once():
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as err:
        run_ranks(_killed, 3, timeout=60.0, grace_s=2.0)
    assert time.monotonic() - t0 < 15
    text = str(err.value)
    assert text.startswith("rank 1:\nRankDied: killed by SIGKILL") and isinstance(err.value, MCCLError)


def test_a_stopped_rank_is_named_within_the_grace_after_the_others_fail():
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as err:
        run_ranks(_stopped, 3, timeout=120.0, grace_s=2.0)
    took = time.monotonic() - t0
    text = str(err.value)
    assert took < 15, took                        # not the 120 s timeout
    assert text.startswith("rank 1:\nRankHung") and "rank 0:" in text and "rank 2:" in text
    assert "timed out waiting for rank 1" in text  # the live ranks' errors are kept
