"""The store-and-forward round model (``mccl_opt.lowering.rounds.round_time``) and the
round-aware AllToAll re-synthesis of ``solver_synthesizer(shallow=True)``
(docs/executor.md, "AllToAll on gloo ranks")."""

from __future__ import annotations

import numpy as np
import pytest

import mccl_opt
from executor_cuda.faults import FabricEmulator
from instances import hpn
from mccl_opt.baselines import rail_alltoall
from mccl_opt.lowering.program import compile_schedule
from mccl_opt.lowering.rounds import MODEL_BLOCK, round_time
from mccl_opt.validate import validate
from mccl_runtime.synthesizer import _round_aware_alltoall

TOPO = hpn(1, 2, 4)
NIC = ("s0h0g0", "s0tor0")


def _nic_at(gbps: float, noise_seed: int | None = None) -> np.ndarray:
    cap = TOPO.arrays.capacity.astype(float).copy()
    for a, b in (NIC, NIC[::-1], ("s0tor0", "s0h1g0"), ("s0h1g0", "s0tor0")):
        cap[TOPO.link_index(a, b)] = gbps
    if noise_seed is not None:                    # healthy links read a little low, as on gloo ranks
        rng = np.random.default_rng(noise_seed)
        hit = (rng.random(cap.size) < 0.1) & (cap == TOPO.arrays.capacity)
        cap = np.where(hit, cap * rng.uniform(0.85, 1.0, cap.size), cap)
    return cap


@pytest.mark.parametrize("split", [False, True])
def test_round_time_is_the_emulators_lock_step_time(split):
    sched = rail_alltoall(TOPO, split=split)
    cap = _nic_at(50.0)
    emu = FabricEmulator(TOPO, sched.gpus)
    want = emu.program_time_s(compile_schedule(sched, MODEL_BLOCK), 1, cap) / MODEL_BLOCK
    assert round_time(sched, TOPO, cap) == pytest.approx(want, rel=1e-12)
    # a slower NIC never makes it faster; the healthy fabric is the fastest
    assert round_time(sched, TOPO, _nic_at(25.0)) >= round_time(sched, TOPO, cap) >= round_time(sched, TOPO)


@pytest.mark.parametrize("collective", ["alltoall", "allgather"])
def test_round_time_of_solved_schedules_is_the_emulators_time_of_their_program(collective):
    """Many chunks per pair or root, multi-hop paths, trees: the hop-level model counts
    exactly the lowered program's messages (no program is built for it)."""
    measured = TOPO.with_capacities(_nic_at(50.0, noise_seed=5))
    sched = getattr(mccl_opt, f"solve_{collective}")(measured, backend="highs", max_chunks=10)
    assert len(sched.chunks) > len(sched.gpus) * (len(sched.gpus) - 1 if collective == "alltoall" else 1)
    emu = FabricEmulator(TOPO, sched.gpus)
    cap = measured.arrays.capacity.astype(float)
    want = emu.program_time_s(compile_schedule(sched, MODEL_BLOCK), 1, cap) / MODEL_BLOCK
    assert round_time(sched, measured) == pytest.approx(want, rel=1e-12)


def test_the_round_aware_resynthesis_keeps_the_warm_rate_and_never_a_slower_round_model():
    healthy = mccl_opt.solve_alltoall(TOPO, backend="highs", max_chunks=10)
    better = 0
    # which equal-rate optimum the warm solve lands on moves with the solver (the local
    # master's warm re-solves made seeds 5 and 13 at 50 Gbps round-neutral); on 2026-12-07's
    # code the NIC at 25 Gbps with seed 23 gives a warm optimum 1.44x slower in rounds (full
    # path), at 100 Gbps with seed 15 1.07x (local path)
    for base, seed in ((50.0, 4), (50.0, 5), (50.0, 6), (50.0, 7), (25.0, 23), (100.0, 15)):
        measured = TOPO.with_capacities(_nic_at(base + 0.25 * seed, noise_seed=seed))
        warm = mccl_opt.solve_alltoall(measured, warm=healthy, backend="highs", max_chunks=10)
        got = _round_aware_alltoall(measured, healthy, "highs", 10, None)
        validate(measured, got)                   # every block delivered, capacities respected
        assert got.rate_gbps >= warm.rate_gbps * (1 - 1e-9)
        assert round_time(got, measured) <= round_time(warm, measured) * (1 + 1e-9)
        better += round_time(got, measured) < round_time(warm, measured) * 0.95
    assert better >= 1                            # the warm optimum alone is not the best for the executor


def test_no_further_attempt_starts_without_room_for_it():
    """Less left of the job's limit than the last attempt took: no attempt starts."""
    import time

    from mccl_runtime.synthesizer import _left_for_another

    now = time.perf_counter()
    assert _left_for_another(None, now, 5.0) is None
    assert _left_for_another(10.0, now - 6.0, 5.0) == 0.0        # 4 s left, 5 s needed
    assert 3.0 < _left_for_another(10.0, now - 6.0, 1.0) <= 4.0


def test_a_job_whose_first_solve_used_its_limit_makes_no_other(monkeypatch):
    calls = []
    real = mccl_opt.solve_alltoall

    def counted(*args, **kwargs):
        calls.append(kwargs.get("max_steps"))
        return real(*args, **kwargs)

    monkeypatch.setattr(mccl_opt, "solve_alltoall", counted)
    topo = TOPO.with_capacity({NIC: 50.0})
    warm = real(TOPO)
    best = _round_aware_alltoall(topo, warm, "highs", 10, 1e-6)
    assert calls == [None]                     # the warm solve only
    assert validate(topo, best).rate_gbps > 0


def test_after_a_version_built_on_a_stalled_reading_the_pick_is_never_slower_than_the_cold_solve():
    """A version built while other GPUs' ToR cables read low (stalls of a busy core on gloo
    ranks) keeps its round structure in warm starts: once the readings are back, the warm
    and step-bounded candidates ran 0.89-0.92 of the cold solve's round time here, so the
    plain cold solve is a candidate too (docs/executor.md, "All seven classes on real ranks")."""
    healthy = mccl_opt.solve_alltoall(TOPO, backend="highs", max_chunks=10)
    for base, stalled in ((225.0, (("s0h0g1", "s0tor1"), ("s0tor1", "s0h1g1"))),
                          (225.0, (("s0h0g2", "s0tor2"), ("s0h1g3", "s0tor3")))):
        cap = _nic_at(base)
        read = cap.copy()
        for a, b in stalled:
            read[TOPO.link_index(a, b)] *= 0.5
        built = _round_aware_alltoall(TOPO.with_capacities(read), healthy, "highs", 10, None)
        true = TOPO.with_capacities(cap)
        got = _round_aware_alltoall(true, built, "highs", 10, None)
        cold = mccl_opt.solve_alltoall(true, backend="highs", max_chunks=10)
        validate(true, got)
        assert got.rate_gbps >= cold.rate_gbps * (1 - 1e-9)
        assert round_time(got, true) <= round_time(cold, true) * (1 + 1e-9)



@pytest.mark.parametrize("case", ["repair", "dead"])
def test_the_pick_solves_no_cold_candidate_after_a_cold_solve_or_a_sharp_fall(monkeypatch, case):
    """``repair``: a NIC repaired from 4 Gbps, whose cold routing is certified optimal:
    the warm solve takes the cold path (it *is* the cold solve).  ``dead``: the NIC falls
    to 4 Gbps, a sharp fall: the warm solve carries the columns that avoid it
    (docs/alltoall.md, *A sharp fall under a time limit*).  Either way the cold
    candidates are skipped (two solves, not four) and the pick is the better of the
    warm two."""
    from mccl_opt.report import WarmUse

    real = mccl_opt.solve_alltoall
    dead = TOPO.with_capacities(_nic_at(4.0, noise_seed=5))
    start, measured = (real(dead, backend="highs", max_chunks=10), TOPO) if case == "repair" \
        else (real(TOPO, backend="highs", max_chunks=10), dead)
    both = [real(measured, warm=start, backend="highs", max_chunks=10, max_steps=s, time_limit=60)
            for s in (None, "min")]
    assert (both[0].report.warm is WarmUse.COLD) == (case == "repair")
    if case == "repair":
        cold = real(measured, backend="highs", max_chunks=10, time_limit=60)
        assert round_time(cold, measured) == round_time(both[0], measured)   # the same solve
    calls = []

    def counted(*args, **kwargs):
        calls.append((kwargs.get("warm") is not None, kwargs.get("max_steps")))
        return real(*args, **kwargs)

    monkeypatch.setattr(mccl_opt, "solve_alltoall", counted)
    got = _round_aware_alltoall(measured, start, "highs", 10, 60.0)
    assert calls == [(True, None), (True, "min")]
    assert round_time(got, measured) == pytest.approx(min(round_time(s, measured) for s in both), rel=1e-9)
    validate(measured, got)
