"""Passive telemetry and fault injection on gloo ranks: an emulated slow link shows up
in the per-link samples of exactly that link; a full buffer drops and counts samples
without affecting results; flushing is asynchronous and a failing callback is contained."""

from __future__ import annotations

import statistics
import threading
import time
import warnings

import pytest
import torch

from executor_cuda.faults import FaultInjector
from executor_cuda.telemetry import LinkSample, Telemetry, aggregate
from mccl_opt.errors import TelemetryError
from executor_cuda.launch import run_ranks


def _measure(rank: int, world: int, capacity: int) -> dict:
    from executor_cuda.communicator import Communicator

    warnings.simplefilter("ignore")
    faults = FaultInjector()
    faults.slow_link(0, 1, gbps=0.001, bidirectional=False)   # 8 KiB -> 65 ms
    tel = Telemetry(capacity=capacity, flush_interval=None)
    comm = Communicator(None, telemetry=tel, faults=faults, hot_swap=False)
    block = 2048
    wrong = 0
    for i in range(8):
        inp = torch.arange(world * block, dtype=torch.float32) + 1e5 * rank + i
        out = torch.empty_like(inp)
        comm.all_to_all_single(out, inp)
        want = torch.cat([torch.arange(world * block, dtype=torch.float32)
                          [rank * block:(rank + 1) * block] + 1e5 * s + i for s in range(world)])
        wrong += not torch.equal(out, want)
    samples = tel.drain()
    return {"wrong": wrong, "dropped": tel.dropped, "recorded": tel.recorded,
            "samples": [(s.src, s.dst, s.bytes, s.count, s.gbps) for s in samples]}


def test_slow_link_is_visible_in_its_own_samples():
    res = run_ranks(_measure, 4, 4096, timeout=60)
    assert all(r["wrong"] == 0 and r["dropped"] == 0 for r in res)
    samples = {(s, d): (b, c, g) for r in res for s, d, b, c, g in r["samples"]}
    assert len(samples) == 12                                  # every ordered pair measured
    assert all(b == 8 * 2048 * 4 and c == 8 for b, c, _ in samples.values())
    slow = samples[("rank0", "rank1")][2]
    healthy = [g for k, (_, _, g) in samples.items() if k != ("rank0", "rank1")]
    assert slow < 0.0011 and slow < statistics.median(healthy) / 3


LATE_S, LINK_S = 0.6, 0.15      # how late a rank enters the collective; the slow link's emulated time


def _late(rank: int, world: int, block: int) -> list[float]:
    """Two collectives on ``rank0 -> rank1`` emulated at ``LINK_S``: in the first the
    receiver (rank 1) enters ``LATE_S`` late, in the second the sender; rank 1's samples."""
    from executor_cuda.communicator import Communicator

    warnings.simplefilter("ignore")
    faults = FaultInjector()
    faults.slow_link(0, 1, gbps=8 * 4 * block / LINK_S / 1e9, bidirectional=False)
    tel = Telemetry(flush_interval=None)
    comm = Communicator(None, telemetry=tel, faults=faults, hot_swap=False)
    seconds = []
    for late in (1, 0):
        inp = torch.full((world * block,), float(rank))
        out = torch.empty_like(inp)
        if rank == late:
            time.sleep(LATE_S)
        comm.all_to_all_single(out, inp)
        assert torch.equal(out, torch.arange(world).repeat_interleave(block).float())
        seconds += [s.seconds for s in tel.drain() if (s.src, s.dst) == ("rank0", "rank1")]
    comm.close()
    return seconds


def test_a_late_receiver_does_not_make_the_link_look_slow():
    """The emulated link is timed from the sender's round start to its emulated delivery
    (the receiver holds the message until then): a receiver that posts its receive 0.6 s
    late reads the link at its emulated 0.15 s, not 0.6 s (slow) nor ~0 (the data was
    already there: fast), and so does a receiver waiting for a late sender."""
    late_receiver, late_sender = run_ranks(_late, 2, 2048, timeout=60)[1]
    for seconds in (late_receiver, late_sender):
        assert LINK_S <= seconds < LATE_S


def test_full_buffer_drops_and_counts_without_blocking():
    res = run_ranks(_measure, 4, 5, timeout=60)
    for r in res:
        assert r["wrong"] == 0
        assert r["recorded"] == 5 and r["dropped"] == 8 * 3 - 5


def test_async_flush_and_contained_callback_errors():
    got, calls = [], threading.Event()

    def on_flush(samples):
        got.extend(samples)
        calls.set()
        raise RuntimeError("controller unreachable")     # must not propagate

    tel = Telemetry(capacity=16, on_flush=on_flush, flush_interval=0.01)
    assert tel.record("a", "b", 1000, 1e-6, 1) and tel.record("a", "b", 3000, 1e-6, 2)
    assert calls.wait(5)
    tel.close()
    assert got == [LinkSample("a", "b", 4000, 2e-6, 2, 1, 2)]
    assert got[0].gbps == pytest.approx(16.0)
    wire = got[0].to_controller(t=time.time())
    assert wire["kind"] == "pair" and wire["gbps"] == pytest.approx(16.0)


def test_aggregate_and_bad_capacity():
    agg = aggregate([("x", "y", 10, 1.0, 3), ("a", "b", 5, 0.5, 1), ("x", "y", 30, 1.0, 7)])
    assert [(s.src, s.dst, s.bytes, s.count, s.first_seq, s.last_seq) for s in agg] == \
        [("a", "b", 5, 1, 1, 1), ("x", "y", 40, 2, 3, 7)]
    with pytest.raises(TelemetryError):
        Telemetry(capacity=0, flush_interval=None)
    with pytest.raises(ValueError):
        FaultInjector().slow_link(0, 1, gbps=0)
