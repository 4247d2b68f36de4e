"""Aborting a stale collective on gloo ranks (docs/executor.md, "Aborting a stale
collective"): a collective waiting on a nearly dead emulated link is given up on every
rank once the swap round decided a newer version after it, and re-run on that version,
with every output equal to the reference; while it waits, each rank reads the slow link
in windows that close on time (before the message is delivered) at the link's rate."""

from __future__ import annotations

import threading
import warnings
from collections import deque

import pytest
import torch  # noqa: F401 - imported before the ranks fork
from hypothesis import assume, given, settings, strategies as st

from executor_cuda.launch import run_ranks
from executor_cuda.pair_levels import LOW
from instances import hpn
from mccl_opt.baselines import rail_allgather, rail_alltoall
from mccl_opt.errors import InputError
from tests.test_executor_inflight import _op_exact     # one op, checked against torch's collective

DEAD_S = 20.0           # every message of version 1 from DEAD_AT on: a collective that would outlast the test
DEAD_AT = 4             # the op from which version 1 is (nearly) dead
N_OPS = 8
PROGRESS_S = 0.05


class _DeadOld:
    """Every message of version 1 takes ``DEAD_S`` once ``dead`` is set, 1 ms before."""

    dead = False

    def message_delay_s(self, prog, rnd, message, nbytes) -> float:
        if prog.version != 1:
            return 0.0
        return DEAD_S if self.dead else 0.001


def _worker(rank: int, world: int, collective: str, block: int, pieces: int) -> dict:
    import torch.distributed as dist

    from executor_cuda.communicator import Communicator
    from executor_cuda.telemetry import Telemetry

    warnings.simplefilter("ignore")
    topo = hpn(1, 2, world // 2)
    make = rail_allgather if collective == "allgather" else rail_alltoall
    faults = _DeadOld()
    tel = Telemetry(flush_interval=None)
    comm = Communicator(None, make(topo, version=1), faults=faults, telemetry=tel, stage_timeout=5.0,
                        oob_timeout=30.0, timeout_s=60.0, pieces=pieces, abort=True)
    comm.aborter.progress_s = PROGRESS_S
    readings: list[tuple[int, int, int, float, float]] = []   # (seq, src, bytes, delivered, seconds)
    comm.aborter.on_progress = lambda prog, rnd, got: readings.extend((comm.seq, *r) for r in got)
    seen: list[tuple[int, int]] = []
    if comm.inflight is not None:
        comm.inflight.on_piece = lambda schedule, numel: seen.append((schedule.version, numel))
    new = make(topo, split=True, version=2)
    timer, bad = None, []
    for i in range(N_OPS):
        if i == DEAD_AT:
            faults.dead = True
            # the version reaches rank r 0.3 + 0.1 r s into this collective (a controller's publication)
            timer = threading.Timer(0.3 + 0.1 * rank, comm.stage, args=(new,))
            timer.start()
        if not _op_exact(comm, collective, rank, world, block, i):
            bad.append(i)
        tel.drain()
    timer.join()
    comm.rescheduler.wait(timeout=15)
    dist.barrier()
    res = {"bad": bad, "aborts": [(a.seq, a.from_version, a.to_version) for a in comm.aborter.aborts],
           "trace": list(comm.trace), "checks": comm.aborter.checks, "readings": readings, "seen": seen,
           "events": [(e.outcome, e.version, e.k) for e in comm.rescheduler.events]}
    comm.close()
    return res


@pytest.mark.parametrize("collective,block,pieces", [("alltoall", 64, 1), ("allgather", 37, 1),
                                                     ("alltoall", 64, 4)])
def test_a_collective_stuck_on_a_dead_link_is_aborted_and_rerun_on_the_new_version(collective, block, pieces):
    world = 4
    res = run_ranks(_worker, world, collective, block, pieces, timeout=120)
    stale = DEAD_AT + 1                                   # the sequence number of the stuck collective
    for rank, r in enumerate(res):
        assert r["bad"] == [], f"rank {rank}: wrong outputs at ops {r['bad']}"
        # one abort, of the stuck collective, on every rank; re-run on version 2
        assert r["aborts"] == [(stale, 1, 2)], (rank, r["aborts"])
        # the swap round decided version 2 after the stuck collective, alike everywhere
        assert r["events"] == [("switch", 2, stale)]
        # one agreement per attempt: every op once (every piece with pieces), the aborted attempt once more
        assert r["checks"] == N_OPS * pieces + 1
        # the stuck collective appears twice in the trace: issued on v1, re-run on v2; later ones run v2
        assert [(s, v) for s, _, v in r["trace"]] == ([(k, 1) for k in range(1, stale + 1)] + [(stale, 2)]
                                                      + [(k, 2) for k in range(stale + 1, N_OPS + 1)])
    if pieces > 1:   # the abort hit the same piece on every rank: every rank ran the same versions per piece
        assert all(r["seen"] == res[0]["seen"] for r in res), [r["seen"] for r in res]
        flips = [k for k in range(1, len(res[0]["seen"])) if res[0]["seen"][k][0] != res[0]["seen"][k - 1][0]]
        assert len(flips) == 1 and DEAD_AT * pieces <= flips[0] < (DEAD_AT + 1) * pieces


def test_windows_close_on_time_on_a_slow_link_and_read_its_rate():
    res = run_ranks(_worker, 4, "alltoall", 64, 1, timeout=120)
    stale = DEAD_AT + 1
    got = [x for r in res for x in r["readings"]]
    # the receivers of the dead link read it while the message was still in flight: the
    # window closed on time, not on the message's completion (it never completed)
    assert got, "no reading of the slow link before the abort"
    for seq, src, nbytes, delivered, seconds in got:
        assert seq == stale
        assert seconds >= PROGRESS_S and 0 < delivered < nbytes
        # bytes delivered so far over the seconds since sent: the emulated link's own rate
        assert delivered / seconds == pytest.approx(nbytes / DEAD_S, rel=1e-9)


def test_abort_needs_hot_swap_and_cpu_tensors():
    def worker(rank: int, world: int) -> str:
        from executor_cuda.abort import StaleAbort
        from executor_cuda.communicator import Communicator

        with pytest.raises(InputError, match="needs hot_swap=True"):
            Communicator(None, hot_swap=False, abort=True)
        with pytest.raises(InputError, match="progress_s must be > 0"):
            StaleAbort([0, 1], progress_s=0)
        return "ok"

    assert run_ranks(worker, 2, timeout=60) == ["ok", "ok"]


@settings(max_examples=60, deadline=None)
@given(level=st.floats(0.005, 1.0), frac=st.floats(0.01, 0.99), start=st.floats(0.3, 1.0))
def test_a_message_in_flight_reads_its_link_at_the_rate_delivered_and_only_lowers_a_level(level, frac, start):
    """``ModelReporter.progress``: bytes delivered so far over the seconds since sent, against
    the message's nominal time, is the link's level; it is folded into the pair's median
    (two readings move it, one does not), and a reading at or above the level reports nothing."""
    from executor_cuda.faults import FabricEmulator
    from executor_cuda.pair_levels import ModelReporter
    from executor_cuda.reporting import pair_nominal
    from mccl_opt.lowering.program import compile_schedule, direct_schedule

    assume(abs(level - start) > 1e-6)                            # not the float tie
    assume(abs(level - LOW) > 1e-9)                              # nor the low mark's (hypothesis drew 0.95)
    topo = hpn(1, 1, 4)
    g = topo.gpus
    emu = FabricEmulator(topo, g, time_scale=1.0, byte_scale=1.0)
    prog = compile_schedule(direct_schedule("allgather", g), 1000)
    rep = ModelReporter(emu, pair_nominal(topo))
    rnd, nbytes = next((m.round, m.numel * 4) for m in prog.messages if (m.src, m.dst) == (0, 1))
    nominal_s = emu.program_delays(prog, 4)[(rnd, 0, 1)]
    delay = nominal_s / level                                    # the emulated link at ``level``
    seconds = frac * delay                                       # still in flight
    read = (lambda: rep.progress(prog, 4, rnd, 0, 1, nbytes, nbytes * seconds / delay, seconds, 0.0))
    assert read() is None                                        # calibrating
    rep.calibrating = False
    rep.recent[(g[0], g[1])] = deque([start] * 3, maxlen=3)
    if level >= start:
        assert read() is None                                    # not below the level: no news
        return
    first = read()
    assert first["gbps"] == pytest.approx(2880 * start)          # one reading: the median holds
    assert read()["gbps"] == pytest.approx(2880 * level)         # two: the link's level
    # the message still in flight keeps the low pair reported, at its level, not folded in again
    before = list(rep.recent[(g[0], g[1])])
    again = read()
    assert list(rep.recent[(g[0], g[1])]) == before
    if level < LOW:
        assert again["gbps"] == pytest.approx(2880 * level)
    else:
        assert again is None
