"""The round model in pieces (``mccl_opt.lowering.rounds``, docs/executor.md "The round model
in pieces"): its rounds carry the pieces the shared rule gives every relayed chunk, as the
lowering's program does, and the round-aware pick ranks candidates in that model."""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np
import pytest

import mccl_opt
from executor_cuda.faults import FabricEmulator
from instances import hpn
from mccl_opt.baselines import rail_alltoall
from mccl_opt.errors import InputError
from mccl_opt.lowering.program import chunk_bounds, compile_schedule
from mccl_opt.lowering.rounds import MODEL_BLOCK, RoundPieces, round_messages, round_time
from mccl_opt.piece_rule import PieceRule
from mccl_opt.schedule import TreeChunk
from tests.test_piece_rule import _uneven_allgather

TOPO = hpn(1, 2, 4)
NIC = ("s0h0g0", "s0tor0")
MIB = 2**20


def _nic_at(gbps: float) -> np.ndarray:
    cap = TOPO.arrays.capacity.astype(float).copy()
    for a, b in (NIC, NIC[::-1]):
        cap[TOPO.link_index(a, b)] = gbps
    return cap


def _expected_rounds(sched, block: int, rule: PieceRule) -> tuple[Counter, int]:
    """Elements per (round, src, dst) written from the rule alone: a chunk of ``L``
    elements on ``d`` GPU hops in ``n = rule`` pieces, piece ``p`` of ``floor((p+1)L/n) -
    floor(pL/n)`` elements crossing hop ``h`` in round ``h + p`` (an AllGather tree edge at
    its tail's depth); and the most pieces of a relayed chunk."""
    rank = {g: r for r, g in enumerate(sched.gpus)}
    want: Counter = Counter()
    most = 0
    groups: dict = {}
    for c in sched.chunks:
        groups.setdefault((c.src, getattr(c, "dst", None)), []).append(c)
    for chunks in groups.values():
        for c, (lo, hi) in zip(chunks, chunk_bounds([c.share for c in chunks], block)):
            span = hi - lo
            if isinstance(c, TreeChunk):
                depth = c.depths()
                hops = [(depth[e[0]], rank[e[0]], rank[e[-1]]) for e in c.edges]
            else:
                gpus = [rank[v] for v in c.path if v in rank]
                hops = [(h, gpus[h], gpus[h + 1]) for h in range(len(gpus) - 1)]
            d = max(h for h, _, _ in hops) + 1
            n = int(rule.of_elements(np.array([span]), np.array([d]))[0])
            if d > 1:
                most = max(most, n)
            for p in range(n):
                ln = (p + 1) * span // n - p * span // n
                for h, u, v in hops:
                    if ln:
                        want[h + p, u, v] += ln
    return want, most


@pytest.mark.parametrize("message", [1 * MIB, 16 * MIB])
def test_the_round_model_carries_the_pieces_the_rule_gives_every_relayed_chunk(message):
    """Per round and GPU pair, the model's elements are the rule's pieces (written here from
    the rule alone) and the lowered program's messages; relayed chunks do come in many pieces."""
    rule = PieceRule(element_bytes=message / MODEL_BLOCK)
    measured = TOPO.with_capacities(_nic_at(50.0))
    for sched in (rail_alltoall(TOPO, split=True), _uneven_allgather(),
                  mccl_opt.solve_alltoall(measured, max_chunks=10), mccl_opt.solve_allgather(measured)):
        rnd, src, dst, numel = round_messages(sched, MODEL_BLOCK, rule)
        got = Counter({(r, s, d): n for r, s, d, n in zip(*(x.tolist() for x in (rnd, src, dst, numel)))})
        want, most = _expected_rounds(sched, MODEL_BLOCK, rule)
        assert got == +want, sched.collective
        assert most >= 8                                   # pieces, not one slice per chunk
        prog = compile_schedule(sched, MODEL_BLOCK, rule)
        assert got == Counter({(m.round, m.src, m.dst): m.numel for m in prog.messages})


@pytest.mark.parametrize("collective", ["alltoall", "allgather"])
def test_round_time_in_pieces_is_the_emulators_lock_step_time_of_the_program_in_pieces(collective):
    """The model's seconds equal the fabric emulator's lock-step time of the program the
    executor runs (the same pieces), and a larger block of the same schedule never takes less."""
    measured = TOPO.with_capacities(_nic_at(50.0))
    sched = getattr(mccl_opt, f"solve_{collective}")(measured, max_chunks=10)
    cap = measured.arrays.capacity.astype(float)
    emu = FabricEmulator(TOPO, sched.gpus)
    last = 0.0
    for message in (1 * MIB, 16 * MIB):
        pieces = RoundPieces(message)
        elem = message / MODEL_BLOCK
        prog = compile_schedule(sched, MODEL_BLOCK, PieceRule(element_bytes=elem))
        want = emu.program_time_s(prog, elem, cap)
        assert round_time(sched, measured, pieces=pieces) == pytest.approx(want, rel=1e-9)
        assert round_time(sched, measured, pieces=pieces) > last
        last = want
    # one piece per chunk is the model of a one-slice program, in seconds per byte
    one = emu.program_time_s(compile_schedule(sched, MODEL_BLOCK), 1, cap) / MODEL_BLOCK
    assert round_time(sched, measured) == pytest.approx(one, rel=1e-12)


def test_the_pick_in_pieces_is_the_fastest_candidate_in_pieces():
    """``_round_aware_alltoall(pieces=...)`` keeps the warm rate, validates, and its pick is
    no slower in the model in pieces than the warm solve alone."""
    from mccl_opt.validate import validate
    from mccl_runtime.synthesizer import _round_aware_alltoall

    healthy = mccl_opt.solve_alltoall(TOPO, max_chunks=10)
    pieces = RoundPieces(16 * MIB)
    for gbps in (4.0, 50.0):
        measured = TOPO.with_capacities(_nic_at(gbps))
        warm = mccl_opt.solve_alltoall(measured, warm=healthy, max_chunks=10)
        got = _round_aware_alltoall(measured, healthy, "highs", 10, None, pieces)
        validate(measured, got)
        assert got.rate_gbps >= warm.rate_gbps * (1 - 1e-9)
        assert round_time(got, measured, pieces=pieces) <= round_time(warm, measured, pieces=pieces) * (1 + 1e-9)


def test_round_pieces_refuse_a_bad_size_with_a_message():
    for bad in (0, -1.0, float("nan"), float("inf"), True, "16"):
        with pytest.raises(InputError, match="message size"):
            RoundPieces(bad)
    from mccl_runtime.cli import _round_pieces

    assert _round_pieces("1048576").rule == PieceRule()
    gloo = _round_pieces("16777216,4e6").rule
    assert gloo.max_bytes == float("inf") and gloo.floor_bytes == 4e6
    for bad in ("0", "1,2,3", "1,-5", "x"):
        with pytest.raises(argparse.ArgumentTypeError):
            _round_pieces(bad)


def test_real_rank_runs_give_the_controller_the_ranks_own_cut():
    """The controller's ``--round-pieces`` of a real-rank run is the ranks' piece rule
    (``rank_pipeline``); a forced slice count passes none."""
    from executor_cuda.scenario_run import GlooLoopConfig, rank_pipeline, round_pieces_args

    cfg = GlooLoopConfig()
    args = round_pieces_args(cfg, 16 * MIB)
    assert args[0] == "--round-pieces"
    got, ranks = RoundPieces.parse(args[1]), rank_pipeline(cfg, 16 * MIB, 4.0)
    assert got.message_bytes == 16 * MIB
    assert (got.rule.max_bytes, got.rule.floor_bytes, got.rule.per_hop) == \
        (ranks.max_bytes, ranks.floor_bytes, ranks.per_hop)
    assert round_pieces_args(GlooLoopConfig(pipeline=2), 16 * MIB) == []
