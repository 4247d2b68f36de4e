"""Executor on real gloo ranks (4 and 8 processes): bit-exact results against torch's
own collectives and against an independent expectation, for every dtype gloo moves and
block sizes the chunking does not divide; relays, multi-chunk blocks, pipelining."""

from __future__ import annotations

import warnings

import pytest
import torch

from executor_cuda.launch import run_ranks
from instances import hpn
from mccl_opt.allgather import solve_allgather
from mccl_opt.alltoall import solve_alltoall
from mccl_opt.baselines import rail_allgather, rail_alltoall
from mccl_opt.lowering.program import direct_schedule

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
          torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool]
TORCH_GLOO_COLLECTIVE = set(DTYPES) - {torch.int16}   # gloo has no int16 collectives
SIZES = [1, 13]


def rank_input(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    """Random bit patterns (NaNs included) that every rank can regenerate for any rank."""
    g = torch.Generator().manual_seed(1000 * rank + numel)
    if dtype == torch.bool:
        return torch.randint(0, 2, (numel,), generator=g, dtype=torch.uint8).bool()
    size = torch.empty(0, dtype=dtype).element_size()
    return torch.randint(0, 256, (numel * size,), generator=g, dtype=torch.uint8).view(dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def exercise(rank: int, world: int, schedules: list, pipelines: list[int]) -> list[str]:
    """Run every schedule x dtype x size x pipeline; return the failures seen here."""
    import torch.distributed as dist

    from executor_cuda.communicator import Communicator

    warnings.simplefilter("ignore")
    failures = []
    for pipeline in pipelines:
        for sched in schedules:
            comm = Communicator(None, sched, pipeline=pipeline, hot_swap=False)
            for dtype in DTYPES:
                for block in SIZES:
                    tag = f"{sched.solver.get('backend')} {sched.collective} {dtype} {block} p{pipeline}"
                    if sched.collective == "alltoall":
                        inp = rank_input(rank, world * block, dtype)
                        out = torch.empty_like(inp)
                        comm.all_to_all_single(out, inp)
                        want = torch.cat([rank_input(s, world * block, dtype)
                                          [rank * block:(rank + 1) * block] for s in range(world)])
                        ref_fn = dist.all_to_all_single
                    else:
                        inp = rank_input(rank, block, dtype)
                        out = torch.empty(world * block, dtype=dtype)
                        comm.all_gather_into_tensor(out, inp)
                        want = torch.cat([rank_input(s, block, dtype) for s in range(world)])
                        ref_fn = dist.all_gather_into_tensor
                    if not same_bits(out, want):
                        failures.append(f"{tag}: differs from the expected blocks")
                    if dtype in TORCH_GLOO_COLLECTIVE:
                        ref = torch.empty_like(out)
                        ref_fn(ref, inp)
                        if not same_bits(out, ref):
                            failures.append(f"{tag}: differs from torch")
    return failures


@pytest.mark.parametrize("world", [4, 8])
def test_bit_exact_against_torch(world):
    topo = hpn(1, 2, world // 2)
    schedules = [rail_alltoall(topo, split=True), rail_allgather(topo, split=True),
                 direct_schedule("alltoall", topo.gpus), direct_schedule("allgather", topo.gpus)]
    results = run_ranks(exercise, world, schedules, [1, 3], timeout=90)
    assert results == [[]] * world


@pytest.mark.parametrize("world", [4, 8])
def test_bit_exact_solver_schedules(world):
    topo = hpn(1, 2, world // 2)
    schedules = [solve_alltoall(topo), solve_allgather(topo)]
    results = run_ranks(exercise, world, schedules, [2], timeout=90)
    assert results == [[]] * world


def _bad_inputs(rank: int, world: int) -> list[str]:
    from executor_cuda.communicator import Communicator
    from mccl_opt.errors import ScheduleError

    comm = Communicator(None, hot_swap=False)
    msgs = []
    for call, out, inp in ((comm.all_to_all_single, torch.empty(world + 1), torch.empty(world + 1)),
                           (comm.all_gather_into_tensor, torch.empty(3), torch.empty(2)),
                           (comm.all_to_all_single, torch.empty(world, dtype=torch.int32),
                            torch.empty(world))):
        try:
            call(out, inp)
        except ValueError as exc:
            msgs.append(str(exc))
    try:
        comm.check_schedule(rail_alltoall(hpn(1, 2, 4)))
    except ScheduleError as exc:
        msgs.append(str(exc))
    return msgs


def test_bad_inputs_raise_clear_errors():
    msgs = run_ranks(_bad_inputs, 4, timeout=30)[0]
    assert len(msgs) == 4
    assert "divisible by the world size" in msgs[0]
    assert "expected world_size * input" in msgs[1]
    assert "same dtype" in msgs[2]
    assert "has 8 GPUs but the process group has 4 ranks" in msgs[3]
