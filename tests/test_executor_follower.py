"""The executor's version follower (docs/executor.md, "Stopping: the agreed last
version"): versions are staged in increasing order, once, for one communicator/name
only; ``finish`` makes every rank stage exactly the versions up to the newest one any
rank staged, so no swap round waits for a rank that stopped listening (paper §5), and
``agree_first`` starts every rank on the same version."""

from __future__ import annotations

import math
import queue
import time
import warnings
from types import SimpleNamespace

import pytest
import torch

from executor_cuda.follower import VersionFollower, VersionTimeoutError, agree_first
from executor_cuda.launch import run_ranks
from mccl_opt.errors import MCCLError, ScheduleError
from mccl_opt.lowering.program import direct_schedule

GPUS = ("g0", "g1", "g2")


def _sched(version: int):
    return direct_schedule("alltoall", GPUS, version=version)


class _Comm:
    """Records what is staged; ``bad`` versions raise like a schedule for another job."""

    def __init__(self, initial: int = 1, bad: tuple[int, ...] = ()) -> None:
        self.active = {"alltoall": SimpleNamespace(version=initial)}
        self.stages: list[int] = []
        self.bad = bad

    def stage(self, schedule) -> None:
        if schedule.version in self.bad:
            raise ScheduleError(f"v{schedule.version} has 4 GPUs but the process group has 3 ranks")
        self.stages.append(schedule.version)


class _Sub:
    """A subscription fed from a queue (the listener thread's side)."""

    def __init__(self) -> None:
        self.q: queue.Queue = queue.Queue()

    def recv(self, timeout_s: float):
        try:
            return self.q.get(timeout=timeout_s)
        except queue.Empty:
            return None


def _follower(comm=None, comm_name="world", calls=None):
    comm = comm or _Comm()
    cb = None if calls is None else (lambda v, s: calls.append((v, s.version)))
    return VersionFollower(comm, _Sub(), comm_name, "a2a", "alltoall", on_version=cb, poll_s=0.01), comm


def test_versions_are_staged_once_in_increasing_order_for_this_name_only():
    calls: list = []
    f, comm = _follower(calls=calls)
    for upd in [("world", "a2a", 2, _sched(2)), ("world", "ag", 3, _sched(3)),
                ("job2", "a2a", 5, _sched(5)), ("world", "a2a", 2, _sched(2)),
                ("world", "a2a", 4, _sched(4)), ("world", "a2a", 3, _sched(3)),
                ("world", "a2a", 1, _sched(1))]:
        f.offer(upd)
    f.close()
    assert comm.stages == [2, 4] and f.staged == [2, 4] and f.last == 4
    assert calls == [(2, 2), (4, 4)]             # once per staged version, with its schedule


def test_any_communicator_name_when_none_is_given():
    f, comm = _follower(comm_name=None)
    f.offer(("job2", "a2a", 2, _sched(2)))
    f.offer(("world", "a2a", 3, _sched(3)))
    f.offer(("world", "ag", 4, _sched(4)))
    f.close()
    assert comm.stages == [2, 3]


def test_hold_then_release_stages_exactly_up_to_the_agreed_version():
    calls: list = []
    f, comm = _follower(calls=calls)
    f.offer(("world", "a2a", 2, _sched(2)))
    assert f.hold() == 2
    f.offer(("world", "a2a", 3, _sched(3)))      # arrives while the ranks agree: waits
    f.offer(("world", "a2a", 4, _sched(4)))
    assert comm.stages == [2]
    f.release(3, timeout_s=5)
    assert comm.stages == [2, 3] and calls == [(2, 2), (3, 3)]     # 4 is past the limit
    assert not f._thread.is_alive()


def test_release_waits_for_the_agreed_version_from_the_listener():
    f, comm = _follower()
    assert f.hold() == 1
    f.sub.q.put(("world", "a2a", 2, _sched(2)))
    f.sub.q.put(("world", "a2a", 3, _sched(3)))
    f.release(3, timeout_s=30)
    assert comm.stages == [2, 3] and f.limit == 3


def test_agreed_version_that_never_arrives_is_a_typed_error():
    f, comm = _follower()
    f.offer(("world", "a2a", 2, _sched(2)))
    f.hold()
    with pytest.raises(VersionTimeoutError, match="up to version 5, but this rank received only up to version 2"):
        f.release(5, timeout_s=0.05)
    assert issubclass(VersionTimeoutError, MCCLError) and comm.stages == [2]
    assert not f._thread.is_alive()


def test_a_staging_error_on_the_listener_thread_is_raised_by_release():
    f, comm = _follower(comm=_Comm(bad=(3,)))
    f.hold()
    f.sub.q.put(("world", "a2a", 3, _sched(3)))
    with pytest.raises(ScheduleError, match="process group has 3 ranks"):
        f.release(3, timeout_s=30)


# ---------------------------------------------------------------- gloo ranks
class _GatedSub:
    """Delivers ``before`` at once and ``during`` only once the follower holds (its
    limit is set by ``finish``): versions that reach a rank while the ranks agree."""

    def __init__(self, before: list[int], during: list[int]) -> None:
        self.before, self.during = list(before), list(during)
        self.follower: VersionFollower | None = None

    def recv(self, timeout_s: float):
        f = self.follower
        if self.before:
            v = self.before.pop(0)
        elif self.during and f is not None and f.limit != math.inf:
            v = self.during.pop(0)
        else:
            time.sleep(min(timeout_s, 0.01))
            return None
        return ("world", "a2a", v, _sched(v))


def _alltoall_ok(comm, rank: int, world: int, i: int) -> bool:
    inp = torch.arange(world * 2, dtype=torch.int64) + 100 * rank + 10_000 * i
    out = torch.empty_like(inp)
    comm.all_to_all_single(out, inp)
    want = torch.cat([torch.arange(world * 2, dtype=torch.int64)[2 * rank:2 * rank + 2]
                      + 100 * s + 10_000 * i for s in range(world)])
    return torch.equal(out, want)


def _fetcher(versions: list[int]):
    """``fetch`` for :func:`agree_first`: the controller's current version, as it changes."""
    fetched: list[int] = []

    def fetch():
        fetched.append(versions[min(len(fetched), len(versions) - 1)])
        return _sched(fetched[-1])
    return fetch, fetched


def _follow_worker(rank: int, world: int) -> dict:
    from executor_cuda.communicator import Communicator

    warnings.simplefilter("ignore")
    # v2 is published while the ranks fetch their first schedule: ranks 0 and 2 saw v1
    stuck, _ = _fetcher([1] if rank == 1 else [2])
    try:
        agree_first(stuck, attempts=2)
        gave_up = ""
    except VersionTimeoutError as exc:
        gave_up = str(exc)
    fetch, fetched = _fetcher([2] if rank == 1 else [1, 2])
    first = agree_first(fetch)
    comm = Communicator(None, first, stage_timeout=10, oob_timeout=30)
    # every rank receives v2 again (the version it started on); rank 0 has v3 before the
    # stop, ranks 1 and 2 receive it only while the ranks agree, and rank 1 also v4,
    # which no rank had staged: it must not be staged
    before = [2, 3] if rank == 0 else [2]
    sub = _GatedSub(before, {0: [], 1: [3, 4], 2: [3]}[rank])
    f = VersionFollower(comm, sub, "world", "a2a", "alltoall", poll_s=0.02)
    sub.follower = f
    wrong = sum(not _alltoall_ok(comm, rank, world, i) for i in range(3))
    deadline = time.monotonic() + 30
    while (sub.before or f.last < before[-1]) and time.monotonic() < deadline:
        time.sleep(0.01)
    staged_before = list(f.staged)
    agreed = f.finish(timeout_s=30)
    assert comm.rescheduler.wait(timeout=60), "a swap round did not finish"
    wrong += sum(not _alltoall_ok(comm, rank, world, i) for i in range(3, 6))
    events = [(e.outcome, e.version, e.k) for e in comm.rescheduler.events]
    result = {"gave_up": gave_up, "fetched": fetched, "first": first.version, "before": staged_before,
              "agreed": agreed, "staged": f.staged, "events": events, "last": comm.trace[-1][2],
              "wrong": wrong}
    comm.close()
    return result


def test_ranks_start_on_one_version_and_stage_the_same_versions_after_finish():
    res = run_ranks(_follow_worker, 3, timeout=120)
    assert all("different first schedule versions 2 times" in r["gave_up"] for r in res)
    assert [r["fetched"] for r in res] == [[1, 2], [2], [1, 2]]    # ranks behind fetched again
    assert [r["first"] for r in res] == [2, 2, 2]
    assert [r["before"] for r in res] == [[3], [], []]
    for r in res:
        assert r["agreed"] == 3 and r["staged"] == [3] and r["wrong"] == 0
        assert r["last"] == 3                       # every rank runs the agreed version
        assert all(outcome != "abort" for outcome, _, _ in r["events"]), r["events"]
    assert all(r["events"] == res[0]["events"] for r in res), [r["events"] for r in res]


# ---------------------------------------------------------------- swap holds
class _HoldComm(_Comm):
    """Records stages, holds and releases in the order the follower passes them on."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, int]] = []

    def stage(self, schedule) -> None:
        self.calls.append(("stage", schedule.version))

    def hold_version(self, collective: str, version: int) -> None:
        assert collective == "alltoall"
        self.calls.append(("hold", version))

    def release_version(self, collective: str, version: int) -> None:
        self.calls.append(("release", version))


def _hold(version: int, held: bool = True, name: str = "a2a"):
    from mccl_runtime.client import HoldUpdate

    return HoldUpdate("world", name, version, (("g0", "g1"),) if held else ())


def test_holds_and_releases_are_passed_on_in_order_for_this_name_and_newer_versions_only():
    comm = _HoldComm()
    f, _ = _follower(comm=comm)
    for upd in [("world", "a2a", 2, _sched(2)), _hold(2), _hold(1), _hold(2, name="ag"),
                _hold(2, held=False), ("world", "a2a", 3, _sched(3))]:
        f.offer(upd)
    f.close()
    assert comm.calls == [("stage", 2), ("hold", 2), ("release", 2), ("stage", 3)]
    assert f.releases == 1


def test_finish_passes_on_exactly_the_agreed_number_of_releases():
    comm = _HoldComm()
    f, _ = _follower(comm=comm)
    f.offer(("world", "a2a", 2, _sched(2)))
    f.offer(_hold(2))
    assert f.hold() == 2 and f.releases == 0
    f.offer(_hold(2, held=False))                # arrives while the ranks agree: waits
    f.offer(("world", "a2a", 3, _sched(3)))
    f.offer(_hold(3))
    f.offer(_hold(3, held=False))
    assert comm.calls == [("stage", 2), ("hold", 2)]
    f.release(3, timeout_s=5, releases=1)        # another rank had passed on the release of 2
    assert comm.calls == [("stage", 2), ("hold", 2), ("release", 2), ("stage", 3), ("hold", 3)]


def test_an_agreed_release_that_never_arrives_is_a_typed_error():
    f, _ = _follower(comm=_HoldComm())
    f.hold()
    with pytest.raises(VersionTimeoutError, match="agreed on 1 swap releases"):
        f.release(1, timeout_s=0.05, releases=1)
