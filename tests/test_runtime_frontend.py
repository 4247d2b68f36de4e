"""Telemetry front ends (mccl_runtime.frontend, frontend_service): folding an interval at the
front end leaves the controller's state and decisions as if the hosts had sent directly;
bad and replayed messages stop at the front end; a dead front end is a clear error for its
hosts and nothing for the controller."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zmq

from mccl_opt.errors import InputError, TelemetryError
from mccl_runtime.client import ControllerClient
from mccl_runtime.columns import ColumnBatch
from mccl_runtime.frontend import FrontEndFold
from mccl_runtime.frontend_service import FrontEndService
from mccl_runtime.manager import Policy, ScheduleManager
from mccl_runtime.protocol import ProtocolError, encode, encode_frames
from mccl_runtime.telemetry import MeasurementStore
from tests.test_runtime_columns import _samples
from tests.test_runtime_manager import TOPO, PruningSynth
from tests.test_runtime_service import KEY, Server

ALPHA = 0.5


def _stream(rng: np.random.Generator):
    """Per interval (0.1 s), the hosts' requests: two flushes of JSON and binary samples
    (link, pair, gpu, one negative), one request sent twice, times jittered backwards."""
    for step in range(60):
        now = 1000.0 + 0.1 * step
        requests = []
        for flush in range(2):
            samples = [{**s, "t": s["t"] + 1000.0 - 0.05 * (1 - flush)} for s in _samples(0.1 * step, rng)]
            half = len(samples) // 2
            requests.append(("json", samples[:half]))
            requests.append(("columns", ColumnBatch.from_samples(TOPO, samples[half:])))
        requests.append(requests[1])                           # a request sent twice: its samples are stale
        yield now, requests


def _ingest(store, kind, payload, now):
    return store.ingest(payload, now) if kind == "json" else store.ingest_columns(payload, now)


@pytest.mark.parametrize("maxima", [False, True], ids=["folded", "link-maxima"])
def test_folding_at_the_front_end_gives_the_controllers_state_and_decisions(maxima):
    """One timeline (Fail2 from 1 s, cleared at 3 s, a second failure from 5 s) to a
    controller directly and through a front end forwarding one folded batch per interval:
    every report at the host, every channel (value and time), M, the counters and every
    manager event (the versions published) are the same.  Forwarding pair channels as link
    maxima: M exactly and every event the same, with fewer rows than pairs."""
    runs, rows = [], []
    for via_front_end in (False, True):
        rng = np.random.default_rng(11)
        store = MeasurementStore(TOPO, alpha=ALPHA)
        fe = FrontEndFold(TOPO, ALPHA, reporter=5 if maxima else None) if via_front_end else None
        mgr = ScheduleManager(store, PruningSynth(), Policy(gamma=0.1, min_dwell_s=0.0))
        mgr.register("world", "ag", "allgather")
        reports, events, ms = [], [], []
        for now, requests in _stream(rng):
            for kind, payload in requests:
                reports.append(_ingest(fe or store, kind, payload, now).to_dict())
            if fe:
                folded = fe.interval()
                assert len(np.unique(np.c_[folded.kind, folded.a, folded.b], axis=0)) == len(folded)  # a row per channel
                rows.append((int((folded.kind == 1).sum()), int((folded.kind == 4).sum())))
                store.ingest_columns(folded, now)
            ms.append(store.measured().copy())
            evs = mgr.step(now) + mgr.poll(now, wait_s=5.0)
            events.append([(e.comm, e.name, e.action, e.version) for e in evs])
        chan = store.chan
        runs.append({"reports": reports, "events": events, "m": np.array(ms), "accepted": store.accepted,
                     "value": chan.value[:chan.count].copy(), "t": chan.t[:chan.count].copy(),
                     "keys": list(chan.pair_key), "counters": (fe.store if fe else store).counters(),
                     "schedules": [(c.version, c.schedule.to_dict()) for c in mgr.collectives()], "store": store})
        mgr.close()
    direct, via = runs
    assert direct["reports"] == via["reports"] and direct["counters"] == via["counters"]
    assert direct["events"] == via["events"] and direct["schedules"] == via["schedules"]
    if maxima:                                     # links measured by pairs only: M exactly
        pairs_only = ~np.isfinite(direct["t"][:TOPO.num_links])
        assert pairs_only.any() and np.array_equal(via["m"][:, pairs_only], direct["m"][:, pairs_only])
        np.testing.assert_allclose(via["m"], direct["m"], rtol=1e-12)
        restored = MeasurementStore(TOPO, alpha=ALPHA)                 # the front ends' channels in the state file
        restored.restore(via["store"].to_dict())
        assert np.array_equal(restored.measured(), via["store"].measured())
        assert {h["kind"] for h in via["store"].to_dict()["hosts"]} == {"max"}
        assert all(n_pair == 0 and 0 < n_max <= TOPO.num_links for n_pair, n_max in rows)   # a row per link
        return
    assert direct["keys"] == via["keys"] and np.array_equal(direct["t"], via["t"])
    np.testing.assert_allclose(via["value"], direct["value"], rtol=1e-12)
    np.testing.assert_allclose(via["m"], direct["m"], rtol=1e-12)
    assert via["accepted"] == direct["accepted"]
    assert direct["counters"]["rejected"]["stale"] > 0 and direct["counters"]["rejected"]["negative"] > 0
    actions = [e[2] for evs in direct["events"] for e in evs]
    assert actions.count("published") >= 2


def test_a_folded_row_is_the_ewma_of_its_samples_not_the_last_one():
    """Two samples of one link in an interval: the controller's value is the two-step EWMA
    (a front end forwarding the last sample, or the mean, would be wrong)."""
    fe, store = FrontEndFold(TOPO, ALPHA), MeasurementStore(TOPO, alpha=ALPHA)
    a, nominal = 0, float(TOPO.arrays.capacity[0])
    src, dst = TOPO.links[a].src, TOPO.links[a].dst
    fe.ingest([{"kind": "link", "src": src, "dst": dst, "gbps": 10.0, "t": 1.0},
               {"kind": "link", "src": src, "dst": dst, "gbps": 30.0, "t": 2.0}], now=2.0)
    batch = fe.interval()
    assert len(batch) == 1 and batch.count.tolist() == [2]
    store.ingest_columns(batch, now=2.0)
    expected = (1 - ALPHA) * ((1 - ALPHA) * nominal + ALPHA * 10.0) + ALPHA * 30.0
    assert store.measured()[a] == pytest.approx(expected, rel=1e-12)
    assert store.chan.t[a] == 2.0 and store.accepted == 2 and not len(fe.interval())
    with pytest.raises(InputError, match="max rows"):                 # another front end's rows
        fe.ingest_columns(ColumnBatch.build(TOPO, [4], [a], [3], [100.0], [3.0]))
    with pytest.raises(TelemetryError, match="alpha"):               # another alpha: refused, not misread
        MeasurementStore(TOPO, alpha=0.25).ingest_columns(batch, now=2.0)


def _folded(rows: list[tuple[int, float, int]]) -> ColumnBatch:
    """A folded batch of link rows ``(link, t, count)`` at 10 Gbps."""
    links, ts, counts = zip(*rows)
    b = ColumnBatch.build(TOPO, [0] * len(rows), list(links), [0] * len(rows), [10.0] * len(rows), list(ts))
    return ColumnBatch(b.kind, b.a, b.b, b.gbps, b.t, links=b.links, gpus=b.gpus,
                       count=np.array(counts, dtype=np.uint32), alpha=ALPHA)


def test_a_folded_row_cannot_stand_for_more_samples_than_its_time_allows():
    """Issue 27: a row's ``count`` is at most 1 + 1e6 x the seconds since its channel's
    previous sample (a first row: since the oldest time accepted, 60 s before now; a
    second row of the channel in the batch: since the first).  One message claiming 2^32-1
    samples would otherwise wipe out the channel's history; it is refused whole, naming
    the bound, and nothing is applied."""
    store, now = MeasurementStore(TOPO, alpha=ALPHA), 1000.0
    before = store.measured().copy()
    for rows, words in (([(0, now, (1 << 32) - 1)], r"4294967295 samples.*60 s.*at most 60000001"),
                        ([(1, now - 1.0, 10), (1, now - 0.5, 500_002)], r"500002 samples.*0\.5 s"),
                        ([(2, now, 2), (3, now, 60_000_002)], r"60000002 samples")):
        with pytest.raises(TelemetryError, match=words):
            store.ingest_columns(_folded(rows), now=now)
        assert (store.measured() == before).all() and store.accepted == 0
    assert store.ingest_columns(_folded([(0, now - 1.0, 1000)]), now=now).accepted == 1000
    with pytest.raises(TelemetryError, match=r"0\.5 s.*at most 500001"):   # since that row, not the window
        store.ingest_columns(_folded([(0, now - 0.5, 500_002)]), now=now)
    assert store.ingest_columns(_folded([(0, now - 0.5, 500_001), (5, now, 7)]), now=now).accepted == 500_008


class FrontEnd:
    """A front end serving in a thread, forwarding to ``upstream``."""

    def __init__(self, upstream: str, **kw):
        self.fe = FrontEndService(TOPO, upstream, **kw)
        self.thread = threading.Thread(target=self.fe.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        assert self.fe.ready.wait(5.0)
        return self.fe

    def __exit__(self, *exc):
        self.fe.stop()
        self.thread.join(5.0)
        assert not self.thread.is_alive()


def _fail2(t: float, gpu: str = "s0h0g0", tor: str = "s0tor0") -> list[dict]:
    """A NIC cable at 50 of its 400 Gbps, both directions."""
    return [{"kind": "link", "src": a, "dst": b, "gbps": 50.0, "t": t} for a, b in ((gpu, tor), (tor, gpu))]


def test_through_a_front_end_the_controller_publishes_the_same_versions():
    """Fail2 sent by a host to the controller and, to a second controller, through a
    front end: the same versions with the same chunks."""
    results = []
    for via in (False, True):
        with Server(key=KEY) as svc, ControllerClient(svc.endpoint, key=KEY, timeout_s=5.0) as admin:
            sub = admin.subscribe()
            assert sub.wait_connected(5.0)
            admin.register("world", "ag", "allgather")
            got = [sub.recv(5.0)]
            with FrontEnd(svc.endpoint, key=KEY, interval_s=0.05) as fe, \
                    ControllerClient(fe.endpoint if via else svc.endpoint, key=KEY, timeout_s=5.0) as host:
                assert host.push_telemetry(_fail2(time.time()))["accepted"] == 2
                got.append(sub.recv(5.0))
                assert sub.recv(0.5) is None
                if via:
                    assert fe.forwarded["samples"] == 2 and svc.requests["telemetry_columns"] == 1
                    assert not svc.requests["telemetry"]
            results.append([(c, n, v, s.to_dict()["chunks"]) for c, n, v, s in got])
            sub.close()
    assert results[0] == results[1] and [r[2] for r in results[0]] == [1, 2]


def test_bad_and_replayed_messages_stop_at_the_front_end():
    with Server(key=KEY) as svc, FrontEnd(svc.endpoint, key=KEY) as fe, \
            ControllerClient(fe.endpoint, key=KEY, timeout_s=5.0) as host:
        assert host.ping()["frontend"] is True
        raw = zmq.Context.instance().socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(fe.endpoint)

        def send(frames):
            raw.send_multipart([b"", *frames])
            assert raw.poll(5000)
            return raw.recv_multipart()[-1]

        fields = {"epoch": fe.gate.epoch, "client": "a" * 32, "seq": 1}
        body, frames = ColumnBatch.from_samples(TOPO, _fail2(time.time())).to_frames()
        msg = encode_frames("telemetry_columns", body, frames, KEY, **fields)
        assert b'"accepted":2' in send(msg)
        assert b"replayed" in send(msg)                                           # the same nonce again
        assert b"bad_signature" in send([msg[0], msg[1], *frames[:-1], frames[-1][:-8] + bytes(8)])
        assert b"unsigned" in send([encode("telemetry", {"samples": _fail2(time.time())})])
        assert b"wrong_epoch" in send([encode("telemetry", {"samples": []}, KEY, **{**fields, "epoch": "b" * 32})])
        with pytest.raises(ProtocolError) as err:
            host.register("world", "ag", "allgather")
        assert err.value.reason == "unsupported" and svc.endpoint in str(err.value)
        folded = FrontEndFold(TOPO, 1.0)
        folded.ingest(_fail2(time.time()))
        with pytest.raises(ProtocolError, match="folded"):
            host.push_columns(folded.interval())
        time.sleep(0.2)
        stats = host.stats()
        assert stats["protocol_errors"] == {"replayed": 1, "bad_signature": 1, "unsigned": 1, "wrong_epoch": 1,
                                            "unsupported": 1, "rejected": 1}
        assert stats["forwarded"]["samples"] == 2 == svc.store.accepted       # only the good batch got through
        assert not svc.protocol_errors
        raw.close(0)


def test_a_dead_front_end_is_a_clear_error_for_hosts_and_nothing_for_the_controller(tmp_path):
    """SIGKILL the front end process: its hosts get a ``timeout`` naming its endpoint; the
    controller keeps answering and takes telemetry sent to it directly."""
    with Server() as svc:
        proc = subprocess.Popen([sys.executable, "-m", "mccl_opt.cli", "controller", "frontend", "--topology",
                                 TOPO.name, "--upstream", svc.endpoint], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "PYTHONPATH": os.getcwd()})
        try:
            line = proc.stdout.readline()
            assert line.startswith("frontend on tcp://"), line
            endpoint = line.split()[2].rstrip(",")
            with ControllerClient(endpoint, timeout_s=1.0) as host:
                assert host.push_telemetry(_fail2(time.time()))["accepted"] == 2
                deadline = time.monotonic() + 5.0
                while svc.store.accepted < 2 and time.monotonic() < deadline:
                    time.sleep(0.02)
                assert svc.store.accepted == 2
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10.0)
                with pytest.raises(ProtocolError) as err:
                    host.push_telemetry(_fail2(time.time(), "s0h1g1", "s0tor1"))
                assert err.value.reason == "timeout" and endpoint in str(err.value)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10.0)
            proc.stdout.close()
        with ControllerClient(svc.endpoint, timeout_s=5.0) as direct:
            assert direct.ping()["topology"] == TOPO.name
            assert direct.push_telemetry(_fail2(time.time(), "s0h1g1", "s0tor1"))["accepted"] == 2
        assert svc.store.accepted == 4 and not svc.protocol_errors and not svc.internal_errors


def test_emulator_processes_through_front_ends_reach_the_controller():
    """The load generator's hosts in two pods, each sending to its pod's front end: the
    controller receives folded requests only, takes every sample, and acts on the failure."""
    from mccl_runtime.loadgen import Failure, run_emulators

    fail = Failure(0.3, (TOPO.link_index("s0h0g0", "s0tor0"), TOPO.link_index("s0tor0", "s0h0g0")), 50.0)
    with Server() as svc, FrontEnd(svc.endpoint) as fe0, FrontEnd(svc.endpoint) as fe1:
        svc.register("world", "ag", "allgather", now=0.0)
        sent, accepted = run_emulators(TOPO, [fe0.endpoint, fe1.endpoint], pods=True, duration_s=1.5,
                                       failures=[fail], noise=0.0)
        deadline = time.monotonic() + 10.0
        while svc.manager.get("world", "ag").version < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert svc.manager.get("world", "ag").version == 2
        time.sleep(0.2)                                   # the last interval forwarded
    assert accepted == sent and fe0.forwarded["samples"] > 0 and fe1.forwarded["samples"] > 0
    assert svc.requests["telemetry_columns"] >= 2 and not svc.requests["telemetry"]
    assert fe0.forwarded["samples"] + fe1.forwarded["samples"] == svc.store.accepted == sent
    assert svc.store.measured()[list(fail.links)].tolist() == [50.0, 50.0]


def test_serve_starts_its_front_ends_and_stops_them():
    """`mccl controller serve --frontends 2`: two front end processes announced, each takes
    a host's telemetry and forwards it to the controller; SIGTERM stops all three."""
    proc = subprocess.Popen([sys.executable, "-m", "mccl_opt.cli", "controller", "serve", "--kernels", "lazy", "--topology", TOPO.name,
                             "--bind", "tcp://127.0.0.1:0", "--alpha", "1", "--estimator", "ewma",
                             "--frontends", "2"],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        lines = [proc.stdout.readline() for _ in range(3)]
        assert lines[0].startswith("controller on tcp://"), lines
        controller = lines[0].split()[2]
        ends = [line.split()[3] for line in lines[1:]]
        assert [line.split()[:2] for line in lines[1:]] == [["frontend", "0"], ["frontend", "1"]]
        for i, ep in enumerate(ends):
            with ControllerClient(ep, timeout_s=10.0) as host:
                assert host.ping()["upstream"] == [controller]
                gpu, tor = (("s0h0g0", "s0tor0"), ("s0h1g1", "s0tor1"))[i]
                assert host.push_telemetry(_fail2(time.time(), gpu, tor))["accepted"] == 2
        with ControllerClient(controller, timeout_s=10.0) as admin:
            deadline = time.monotonic() + 10.0
            while admin.stats()["telemetry"]["accepted"] < 4 and time.monotonic() < deadline:
                time.sleep(0.05)
            stats = admin.stats()
        assert stats["telemetry"]["accepted"] == 4 and stats["requests"]["telemetry_columns"] == 2
        children = [int(line) for line in subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True,
                                                         text=True).stdout.split()]
        assert len(children) == 2
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30.0) == 0
        for pid in children:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10.0)
        proc.stdout.close()


def test_at_alpha_1_a_front_ends_rows_feed_the_rise_tracker_as_direct_samples_do():
    """Real ranks (alpha 1): a pair across the NIC read at 400, 50, then recovering in steps
    (120, 124, 400).  Through a front end the controller's links still moving after the
    rise (``moving_links``, what holds a job for a partial recovery) are those of a
    controller taking the samples directly; the folded rows skipped the rise tracker."""
    direct, ctl, fold = MeasurementStore(TOPO, alpha=1.0), MeasurementStore(TOPO, alpha=1.0), FrontEndFold(TOPO, 1.0)
    seen = []
    for step, gbps in enumerate((400.0, 50.0, 120.0, 124.0, 400.0)):
        t = 1.0 + 0.1 * step
        sample = [{"kind": "pair", "src": "s0h0g0", "dst": "s0h1g0", "gbps": gbps, "t": t}]
        direct.ingest(sample, now=t)
        fold.ingest(sample, now=t)
        ctl.ingest_columns(ColumnBatch.from_frames(*fold.interval().to_frames(), TOPO), now=t)
        assert ctl.moving_links().tolist() == direct.moving_links().tolist()
        seen.append(direct.moving_links().size > 0)
    assert seen == [False, False, True, True, False]
