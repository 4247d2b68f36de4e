"""Issue 27, eighth hostile pass: the seventh pass's remainders (a sub-fabric of a large
generated fabric, a key-less controller's shard list), what a key holder can grow (channels
keyed by reporter ids and GPU pairs), and cases of our own as an attacker and as a failing
machine.  Each test failed on the code before its fix unless its docstring says it guards
a case that already held (docs/runtime.md, "Hostile-input audit, eighth pass")."""

from __future__ import annotations

import json
import random
import time

import numpy as np
import pytest

from tests.test_hostile_third import _cli


# ------------------------------------------------------------------ sub-fabrics of generated fabrics
def test_hpn_part_induces_the_same_sub_fabric_as_the_whole_fabric():
    """``hpn_part`` keeps only what a member set can use; the sub-fabric ``induced``
    gives on it must be the one it gives on the whole fabric (nodes, links in order,
    name), with each paper failure, or fail the same way."""
    from instances.failures import apply_failure
    from instances.hpn import hpn, hpn_part
    from mccl_opt.errors import TopologyError
    from mccl_opt.subfabric import induced

    rng = random.Random(8)
    compared = 0
    for shape in ((1, 3, 4), (3, 3, 2), (2, 2, 4)):
        for failure in (None, "fail1", "fail3"):
            full = apply_failure(hpn(*shape), failure)
            for _ in range(8):
                members = rng.sample(list(full.gpus), rng.randint(2, 6))
                part = apply_failure(hpn_part(*shape, members), failure)
                assert part.num_links < full.num_links or len(members) >= shape[2]
                try:
                    want = induced(full, members).topology
                except TopologyError:
                    with pytest.raises(TopologyError):
                        induced(part, members)
                    continue
                got = induced(part, members).topology
                assert (got.name, got.gpus, [n.id for n in got.nodes], got.links) == \
                    (want.name, want.gpus, [n.id for n in want.nodes], want.links)
                compared += 1
    assert compared > 25


def test_export_of_a_sub_fabric_does_not_generate_its_large_parent(tmp_path, monkeypatch, capsys):
    """A schedule of 4 GPUs of ``hpn-960x64x8`` (1.97 million links) built the whole
    parent to induce its sub-fabric (seventh pass remainder); now only the part its GPUs
    use is generated, and a hop that is no link of the sub-fabric is still refused."""
    import importlib

    from instances.hpn import hpn_part
    from mccl_opt import solve_allgather
    from mccl_opt.subfabric import induced

    members = [f"s{s}h{h}g{g}" for s, h in ((900, 10), (5, 63)) for g in range(2)]
    sub = induced(hpn_part(960, 64, 8, members), members).topology
    sched = solve_allgather(sub).to_dict()
    path = tmp_path / "s.json"
    path.write_text(json.dumps(sched))
    module = importlib.import_module("instances.hpn")
    monkeypatch.setattr(module, "hpn", lambda *a, **k: pytest.fail("the whole parent was generated"))
    assert _cli(capsys, "export", "msccl", str(path), "-o", str(tmp_path / "s.xml"))[0] == 0
    names = sched["gpus"] + sched["nodes"]
    other = names.index("s5h63nvs")
    hop = next(i for i, p in enumerate(sched["paths"]) if names[p[1]] == "s900h10nvs")
    sched["paths"][hop][1] = other                # s900h10gX -> s5h63nvs: another host's switch
    path.write_text(json.dumps(sched))
    rc, err = _cli(capsys, "export", "msccl", str(path), "-o", str(tmp_path / "t.xml"))
    assert rc == 2 and "checked on 'hpn-960x64x8/group-4-" in err


@pytest.mark.parametrize("command", ["show", "solve"])
def test_a_generated_shape_of_5000_digits_is_refused_in_one_line(capsys, command):
    """``hpn-1000...0x1x1`` (5000 digits) ended in a ``ValueError`` traceback (Python's
    4300-digit limit on ``int()``); a shape of up to 18 digits a dimension is sized and
    refused, a longer one is no fabric name."""
    spec = "hpn-1" + "0" * 5000 + "x1x1"
    argv = ("topo", "show", spec) if command == "show" else ("solve", "allgather", spec)
    rc, err = _cli(capsys, *argv)
    assert rc == 2 and "neither a topology file nor an instance name" in err
    rc, err = _cli(capsys, "topo", "show", "hpn-1000000000x1x1")
    assert rc == 2 and "would have 6,000,000,000 links" in err


# ------------------------------------------------------------------ a key-less controller's shard list
@pytest.mark.parametrize("peers, shard", [
    (["tcp://127.0.0.1:" + "5" * 300], 0),                       # an endpoint of 300 characters
    (["tcp://127.0.0.1:1", "tcp://127.0.0.1:1"], 0),              # listed twice
    (["tcp://127.0.0.1:1", "tcp://10.0.0.9:2"], 0),               # two hosts
    (["tcp://10.0.0.9:1", "tcp://10.0.0.9:2"], 0),                # off the loopback host asked
    (["inproc://x", "tcp://127.0.0.1:2"], 0),                     # a transport no shard binds
    (["tcp://127.0.0.1:1\n", "tcp://127.0.0.1:2"], 0),            # a control character
    (["tcp://127.0.\x1b[31m0.1:1", "tcp://127.0.0.1:2"], 0),      # a terminal escape in the host
    (["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"], 5),              # its own number out of range
    (["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"], True),
])
def test_sharded_client_checks_what_a_keyless_controller_lists(peers, shard):
    """The seventh pass bounded the list's length only: a key-less controller (its reply
    is not authenticated) could send the client's registrations and telemetry anywhere,
    through endpoints of any length or form."""
    from mccl_runtime.protocol import ProtocolError
    from mccl_runtime.shards import _checked_peers

    with pytest.raises(ProtocolError) as exc:
        _checked_peers(peers, shard, "tcp://127.0.0.1:7000")
    assert exc.value.reason == "bad_reply"
    ok = ["tcp://127.0.0.1:7000", "tcp://127.0.0.1:7001"]
    assert _checked_peers(ok, 0, "tcp://127.0.0.1:7000") == ok
    wildcard = ["tcp://0.0.0.0:7000", "tcp://0.0.0.0:7001"]              # --bind tcp://*:7000
    assert _checked_peers(wildcard, 1, "tcp://127.0.0.1:7001") == wildcard
    with pytest.raises(ProtocolError):                     # the shard asked is listed elsewhere
        _checked_peers(ok, 1, "tcp://127.0.0.1:7000")


# ------------------------------------------------------------------ what a key holder can grow
def _store():
    from mccl_runtime.telemetry import MeasurementStore
    from tests.test_runtime_manager import TOPO

    return TOPO, MeasurementStore(TOPO)


def test_reporter_ids_cannot_open_channels_without_bound():
    """A key holder sending ``host``/``max`` rows under fresh reporter ids (2^30 per
    link) opened one channel per row: memory and the state file grew without bound.
    Now at most ``max_keyed`` keyed channels; beyond, new keys are refused as
    ``too_many_channels``, not remembered, and known channels still take samples."""
    from mccl_runtime.columns import ColumnBatch

    topo, store = _store()
    store.chan.max_keyed = 50
    t = time.time()
    for start in (0, 40, 80):
        rows = [(3, 0, r, 100.0, t + start * 1e-3) for r in range(start, start + 40)]
        report = store.ingest_columns(ColumnBatch.build(topo, *zip(*rows)), t + 0.1)
    assert store.chan.count - store.chan.num_links == 50
    assert report.accepted == 0 and report.rejected == {"too_many_channels": 40}
    assert len(store.keyed._keys) == 50
    again = ColumnBatch.build(topo, *zip(*[(3, 0, r, 90.0, t + 0.05) for r in range(5)]))
    assert store.ingest_columns(again, t + 0.1).accepted == 5
    assert len(store.to_dict()["hosts"]) == 50


def test_json_pairs_cannot_open_channels_beyond_the_bound():
    """The same bound on pair channels sent as JSON (one per ordered GPU pair: 4 million
    at 2048 GPUs), through the vectorised path and sample by sample."""
    from instances import hpn
    from mccl_runtime.telemetry import MeasurementStore

    store = MeasurementStore(hpn(1, 2, 4))
    store.chan.max_keyed = 3
    t = time.time()
    samples = [{"kind": "pair", "src": "s0h0g0", "dst": d, "gbps": 10.0, "t": t}
               for d in ("s0h0g1", "s0h0g2", "s0h0g3", "s0h1g0", "s0h1g1")]   # the last: no switch path
    report = store.ingest(samples, t)
    assert report.accepted == 3 and report.rejected == {"too_many_channels": 1, "unknown_link": 1}
    for s in samples:
        s["t"] = t + 0.01
    report = store.ingest(samples + [{"kind": "link"}], t + 0.01)     # sample by sample
    assert report.accepted == 3 and report.rejected["too_many_channels"] == 1


def test_a_state_with_more_channels_than_the_bound_is_refused():
    """A state file listing more keyed channels than a controller registers was loaded
    (after the bound, the channel id would have written into another channel)."""
    from mccl_opt.errors import TelemetryError

    from instances import hpn
    from mccl_runtime.telemetry import MeasurementStore

    store, t = MeasurementStore(hpn(1, 2, 4)), time.time()
    store.ingest([{"kind": "pair", "src": "s0h0g0", "dst": f"s0h0g{g}", "gbps": 10.0, "t": t} for g in (1, 2, 3)], t)
    state = store.to_dict()
    assert len(state["pairs"]) == 3
    small = MeasurementStore(hpn(1, 2, 4))
    small.chan.max_keyed = 2
    with pytest.raises(TelemetryError, match="more than"):
        small.restore(state)


# ------------------------------------------------------------------ mccl loop --executor gloo
def _scenario(**over) -> dict:
    base = {"format": "mccl-scenario/1", "topology": "hpn 1x2x2", "collective": "allgather",
            "message_bytes": 2 ** 24, "duration_ms": 40,
            "events": [{"t_ms": 10, "links": [{"src": "s0h0g0", "dst": "s0tor0", "capacity_gbps": 4}]}]}
    return base | over


@pytest.mark.parametrize("over, words", [
    ({"topology": "hpn 960x64x8"}, "491,520 GPUs; real ranks run at most 64"),        # was generated first
    ({"events": [{"t_ms": 10 + i * 1e-3, "links": [{"src": "s0h0g0", "dst": "s0tor0", "capacity_gbps": 4 + i % 7}]}
                 for i in range(1025)]}, "at most 1024 events"),                    # 20,000: minutes of synthesis
    ({"events": [{"t_ms": 10, "links": [{"src": "s0h0g0", "dst": "s0tor0", "capacity_gbps": 1e-300}]}]},
     r"events\[0\].links\[0\]: 'capacity_gbps' must be in"),                        # failed later, unplaced
])
def test_gloo_scenarios_are_bounded_before_any_work(over, words):
    """Scenario inputs that cost minutes or failed late without a place (gloo loop)."""
    from mccl_runtime.scenario import ScenarioError, parse_scenario

    with pytest.raises(ScenarioError, match=words):
        parse_scenario(_scenario(**over), max_gpus=64)


@pytest.mark.parametrize("field, value, words", [
    ("collective_ms", 1e-9, r"--collective-ms must be in \[1, "),      # a run of no collective, exit 0
    ("alpha", 2.0, "--alpha must be in"),                             # refused by the controller after 25 s
    ("gamma", -1.0, "--gamma > 0"),
    ("kernels", "later", "kernels mode must be one of eager, background, lazy"),   # not the controller's usage line
    ("cable_wait_s", float("nan"), "the cable wait and the early hold must be in"),  # the controller would refuse it
])
def test_gloo_options_are_checked_before_the_controller_starts(field, value, words):
    from executor_cuda.scenario_run import GlooLoopConfig, _check
    from mccl_opt.errors import MCCLError
    from mccl_runtime.scenario import parse_scenario

    with pytest.raises(MCCLError, match=words):
        _check(parse_scenario(_scenario()), GlooLoopConfig(world=4, **{field: value}))


def test_a_rank_failure_is_one_line_naming_the_rank_that_caused_it_and_the_collective():
    """A killed rank was reported as ``rank 1 CollectiveTimeoutError: ... rank 2 got no
    abort agreement`` (the first rank named, another rank's error), a stopped one as
    ``rank 1 RuntimeError: [gloo] Timed out ...`` (no collective)."""
    from executor_cuda.launch import RankFailure
    from executor_cuda.scenario_run import rank_failure_line

    peer = ("executor_cuda.timeouts.CollectiveTimeoutError: allgather #20: rank 2 got no abort agreement "
            "from its peers [0, 1, 2, 3] after 0.1 s (timeout 20 s: Connection closed by peer)")
    exc = RankFailure("...", [(1, "RankDied: killed by SIGKILL before returning a result"), (2, peer)])
    line = rank_failure_line(exc, "allgather")
    assert line.startswith("rank 1 failed in the allgather #20: killed by SIGKILL") and "rank 2: " in line
    assert "\n" not in line and "Traceback" not in line
    exc = RankFailure("...", [(3, "RankStopped: stopped (SIGSTOP) for 10 s, no progress; killed")])
    assert rank_failure_line(exc, "alltoall") == \
        "rank 3 failed in the alltoall collective: stopped (SIGSTOP) for 10 s, no progress; killed"


def _stop_rank_1(rank: int, world: int) -> int:
    import os
    import signal

    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    import torch.distributed as dist

    dist.barrier()              # blocks on the stopped rank (gloo's own timeout: 30 min)
    return rank


@pytest.mark.slow
def test_a_stopped_rank_fails_the_run_after_the_collective_timeout():
    """A stopped rank was found only when its peers' 20 s agreement timed out, plus the
    5 s grace: 27 s after the stop in a gloo loop with a 10 s collective timeout.  With
    ``stopped_s`` it is killed after that long stopped, and its peers, whose sockets close,
    report at once."""
    pytest.importorskip("torch")
    from executor_cuda.launch import RankFailure, run_ranks

    t0 = time.monotonic()
    with pytest.raises(RankFailure) as err:
        run_ranks(_stop_rank_1, 3, timeout=120.0, grace_s=30.0, stopped_s=1.0)
    assert time.monotonic() - t0 < 60                    # not the grace after a 30 min barrier
    assert err.value.ranks[0][0] == 1 and err.value.ranks[0][1].startswith("RankStopped")
    assert {r for r, _ in err.value.ranks} == {0, 1, 2}


# ------------------------------------------------------------------ a failing machine: clock steps
def test_a_clock_stepped_back_does_not_blind_the_telemetry():
    """After the wall clock stepped back an hour (an NTP correction), every channel's last
    time was ahead of now: each new sample was ``stale`` for an hour."""
    from tests.test_runtime_manager import TOPO

    topo, store = _store()
    link, t = TOPO.links[0], time.time()
    sample = {"kind": "link", "src": link.src, "dst": link.dst, "gbps": 50.0, "t": t}
    assert store.ingest([sample], t).accepted == 1
    back = t - 3600
    assert store.ingest([sample | {"gbps": 60.0, "t": back + 1}], back + 1).accepted == 1
    assert store.ingest([sample | {"gbps": 70.0, "t": back + 1}], back + 1.5).rejected == {"stale": 1}  # a repeat


def test_a_state_written_before_a_clock_step_back_resumes():
    """The controller's own state, written an hour before the clock stepped back, was
    refused ("t must be at most now"): no restart until the state was deleted.  Its
    times are taken as now; a time beyond a day ahead is still refused."""
    from mccl_opt.errors import MCCLError
    from mccl_runtime.state_check import check_state
    from tests.test_runtime_manager import TOPO

    topo, store = _store()
    link, t = TOPO.links[0], time.time()
    store.ingest([{"kind": "link", "src": link.src, "dst": link.dst, "gbps": 50.0, "t": t}], t)
    state = {"topology": TOPO.to_dict(), "telemetry": store.to_dict()}
    checked = check_state(state, TOPO, now=t - 3600)
    assert checked["telemetry"]["direct"][0]["t"] <= t - 3600 + 0.5          # now, within the skew tolerance
    with pytest.raises(MCCLError, match="direct"):
        check_state(state, TOPO, now=t - 2 * 86400)


def test_a_clock_stepped_back_does_not_hold_every_decision():
    """Algorithm 1's dwell compared now with a decision time an hour ahead: no collective
    was flagged for an hour after the step (now: at most the dwell, 1 s)."""
    from tests.test_runtime_manager import PruningSynth, _cable, _manager

    store, mgr = _manager(PruningSynth(), min_dwell_s=1.0)
    t = time.time()
    mgr.get("world", "ag").last_decision_t = t          # decided just before the clock went back an hour
    back = t - 3600
    store.ingest(_cable("s0h0g0", "s0tor0", 50.0, back), now=back)   # the NIC cut degraded
    try:
        mgr.check(back + 2.0)                            # the dwell restarts at the step: one more second
        assert [c.name for c, _ in mgr.check(back + 3.5)] == ["ag"]
    finally:
        mgr.close()


# ------------------------------------------------------------------ concurrent controllers, outputs
def _hold_state(path: str, ready, done) -> None:
    from mccl_runtime.state_folder import StateFolder

    folder = StateFolder(path)
    folder.lock()
    ready.set()
    done.wait(30)


def test_two_controllers_cannot_serve_one_state_file(tmp_path):
    """Two ``controller serve --state S`` at once each acknowledged registrations the
    other's next write replaced (acknowledged, then lost after a restart).  A second
    process is refused before it reads or cleans anything; once the first is gone (here:
    its lock released) a restart serves the state, and another state in the same folder
    is never refused."""
    import multiprocessing

    from mccl_opt.errors import MCCLError
    from mccl_runtime.service import ControllerService
    from tests.test_runtime_manager import TOPO, PruningSynth

    state = tmp_path / "state.json"
    ctx = multiprocessing.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()
    other = ctx.Process(target=_hold_state, args=(str(state), ready, done))
    other.start()
    try:
        assert ready.wait(20)
        with pytest.raises(MCCLError, match="another process serves the controller state"):
            ControllerService(TOPO, "tcp://127.0.0.1:0", synthesize=PruningSynth(), state_path=state)
        ControllerService(TOPO, "tcp://127.0.0.1:0", synthesize=PruningSynth(),
                          state_path=tmp_path / "other.json").manager.close()
    finally:
        done.set()
        other.join(10)
    ControllerService(TOPO, "tcp://127.0.0.1:0", synthesize=PruningSynth(), state_path=state).manager.close()


def test_an_output_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """``-o`` files were written in place: a full disk mid-write left a truncated file
    where the previous one was (``solve --warm S -o S`` lost S).  Now the previous file
    stays whole and no temporary is left; a symlink's target is replaced, not the link,
    and ``/dev/null`` is still written."""
    import os

    from mccl_opt import files

    out = tmp_path / "s.json"
    files.write_json(out, {"v": 1})
    real = os.fsync

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(OSError):
        files.write_json(out, {"v": 2, "pad": "x" * 100_000})
    monkeypatch.setattr(files.os, "fsync", real)
    assert json.loads(out.read_text()) == {"v": 1} and sorted(p.name for p in tmp_path.iterdir()) == ["s.json"]
    link = tmp_path / "link.json"
    link.symlink_to(out)
    files.write_json(link, {"v": 3})
    assert link.is_symlink() and json.loads(out.read_text()) == {"v": 3}
    files.write_output("/dev/null", "x")
