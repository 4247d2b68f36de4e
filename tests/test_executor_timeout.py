"""Per-collective deadline of the Communicator: with one rank stopped (SIGSTOP) every
live rank raises CollectiveTimeoutError naming it, instead of waiting for the process
group's timeout (30 min by default)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch

from executor_cuda.communicator import CollectiveTimeoutError, Communicator
from executor_cuda.launch import run_ranks
from executor_cuda.telemetry import Telemetry


def _stop_one(rank: int, world: int, pid_dir: str, stamped: bool):
    comm = Communicator(hot_swap=False, timeout_s=1.0, telemetry=Telemetry() if stamped else None)
    inp = torch.full((4,), float(rank))
    out = torch.empty(4 * world)
    comm.all_gather_into_tensor(out, inp)                  # healthy: every rank takes part
    healthy = torch.equal(out, torch.arange(world, dtype=torch.float32).repeat_interleave(4))
    if rank == world - 1:
        Path(pid_dir, "stopped").write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGSTOP)               # resumed by rank 0 once it timed out
        return healthy, "resumed"
    try:
        comm.all_gather_into_tensor(out, inp)
    except CollectiveTimeoutError as exc:
        outcome = str(exc)
    else:
        outcome = "no error"
    if rank == 0:
        while not Path(pid_dir, "stopped").exists():
            time.sleep(0.01)
        os.kill(int(Path(pid_dir, "stopped").read_text()), signal.SIGCONT)
    return healthy, outcome


@pytest.mark.parametrize("stamped", [False, True], ids=["plain", "telemetry"])
def test_a_stopped_rank_makes_every_live_rank_raise(tmp_path, stamped):
    results = run_ranks(_stop_one, 3, str(tmp_path), stamped, timeout=60)
    assert all(healthy for healthy, _ in results)
    assert results[2][1] == "resumed"
    for rank in (0, 1):
        message = results[rank][1]
        assert f"allgather #2 (schedule v0) on rank {rank}: no progress with rank(s) [2]" in message
        assert "cannot be used again" in message


def test_timeout_must_be_positive():
    with pytest.raises(AssertionError, match="timeout_s must be > 0"):
        run_ranks(lambda rank, world: Communicator(hot_swap=False, timeout_s=0.0), 1, timeout=30)
