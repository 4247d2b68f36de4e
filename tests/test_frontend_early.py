"""Early estimates through telemetry front ends (issue 26; docs/executor.md, "Speculation on
real ranks"): a host's drop still being confirmed (``early``, JSON or a binary header's
``early`` rows) reaches the controller's store apart from ``M``, beside the folded row or
the link maximum it lowers; a malformed ``early`` field is a typed error (binary header) or
a rejected sample counted under its reason (JSON), and the service goes on."""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from mccl_runtime.client import ControllerClient
from mccl_runtime.columns import ColumnBatch
from mccl_runtime.frontend import FrontEndFold
from mccl_runtime.manager import Policy
from mccl_runtime.protocol import ProtocolError, encode_frames
from mccl_runtime.samples import Early, EarlyColumn, early_column
from mccl_runtime.telemetry import MeasurementStore, RejectedSample
from tests.test_runtime_frontend import FrontEnd
from tests.test_runtime_manager import TOPO
from tests.test_runtime_service import KEY, Server
from tests.test_speculate_real_ranks import BACK, NIC, PAIR, _pair

OTHER = ("s0h0g0", "s0h0g1")            # a pair over the NVSwitch, no early value


def _wire(batch: ColumnBatch) -> ColumnBatch:
    """``batch`` as the controller reads it off the wire."""
    return ColumnBatch.from_frames(*batch.to_frames(), TOPO)


@pytest.mark.parametrize("reporter", [None, 7], ids=["folded", "link-maxima"])
@pytest.mark.parametrize("path", ["json", "columns"])
def test_a_front_end_forwards_an_early_drop_apart_from_m(reporter, path):
    """Interval 1: a pair across the NIC cable at 300 Gbps (and one over the NVSwitch at 200); interval
    2: the pair still at 300 with ``early`` 150.  The controller's ``M`` stays at 300 on
    the pair's links, its ``early()`` reads 150 there (the link maximum with the early
    value in place of the pair's); interval 3 without ``early`` clears it."""
    fold = FrontEndFold(TOPO, 1.0, reporter)
    store = MeasurementStore(TOPO, alpha=1.0)
    store.watch_early = True
    nic = TOPO.link_index(*NIC)
    for step, early in enumerate((None, 150.0, None)):
        t = 1.0 + step
        samples = [_pair(PAIR, 300.0, t, early), _pair(OTHER, 200.0, t)]
        report = fold.ingest(samples, now=t) if path == "json" \
            else fold.ingest_columns(_wire(ColumnBatch.from_samples(TOPO, samples)), now=t)
        assert report.accepted == 2
        batch = _wire(fold.interval())
        assert (batch.early is not None) == (early is not None)
        store.ingest_columns(batch, now=t)
        assert store.measured()[nic] == pytest.approx(300.0)
        if early is None:
            assert store.early() is None and not store.pending_links().size
        else:
            assert store.early()[nic] == pytest.approx(150.0) and nic in store.pending_links()


@pytest.mark.parametrize("early", [{"not": "a list"}, [[1, 0, 1, 100.0]], [[0, 0, 0, 100.0, 1.0]],
                                   [[1, True, 1, 100.0, 1.0]], [[1, 0, 1, -1.0, 1.0]], [[1, 0, 1, 1e400, 1.0]],
                                   [[1, 0, 1, 100.0, 1.0]] * 3, [[4, 0, 1 << 30, 100.0, 1.0]], [[1, 2, 0, 100.0, 1.0]]])
def test_a_malformed_early_field_is_a_bad_body(early):
    body, frames = ColumnBatch.from_samples(TOPO, [_pair(PAIR, 300.0, 1.0), _pair(OTHER, 300.0, 1.0)]).to_frames()
    with pytest.raises(ProtocolError) as err:
        ColumnBatch.from_frames({**body, "early": early}, frames, TOPO)
    assert err.value.reason == "bad_body"


def test_an_early_row_without_its_channels_row_is_refused_and_a_split_batch_keeps_each_beside_its_row():
    """Off the wire, an ``early`` row naming a channel the batch has no row of is a
    ``bad_body``; built in process, it is skipped and registers no channel.  A batch split
    into requests sends each early row with the part holding its channel's row."""
    store = MeasurementStore(TOPO, alpha=1.0)
    store.watch_early = True
    batch = ColumnBatch.from_samples(TOPO, [_pair(PAIR, 300.0, 1.0)])
    stray = ColumnBatch.from_samples(TOPO, [_pair(OTHER, 300.0, 1.0, early=100.0)]).early
    with pytest.raises(ProtocolError, match="names no row") as err:
        _wire(batch.with_early(stray))
    assert err.value.reason == "bad_body"
    channels = store.chan.count
    store.ingest_columns(batch.with_early(stray), now=1.0)
    assert store.early() is None and store.chan.count == channels + 1

    both = ColumnBatch.from_samples(TOPO, [_pair(PAIR, 300.0, 1.0, early=150.0), _pair(OTHER, 300.0, 1.0)])
    first, second = _wire(both.rows(0, 1)), _wire(both.rows(1, 2))
    assert len(first.early) == 1 and second.early is None
    split = MeasurementStore(TOPO, alpha=1.0)
    split.watch_early = True
    for part in (first, second):
        split.ingest_columns(part, now=1.0)
    assert split.early()[TOPO.link_index(*NIC)] == pytest.approx(150.0)


#: malformed ``early`` values of a JSON pair sample and the reason each is rejected under
BAD_EARLY = [("x", "malformed"), (True, "malformed"), ([150.0] * 100_000, "malformed"), ({"gbps": 1.0}, "malformed"),
             (float("nan"), "nan"), (float("inf"), "nan"), (10**400, "nan"), (-1.0, "negative")]


@pytest.mark.parametrize("where", ["controller", "front end"])
@pytest.mark.parametrize("early, reason", BAD_EARLY, ids=[r + str(i) for i, (_, r) in enumerate(BAD_EARLY)])
def test_a_json_sample_with_a_malformed_early_is_rejected_with_its_reason(early, reason, where):
    """A pair sample whose ``early`` is not a finite number >= 0 is rejected whole, counted
    under the reason its ``gbps`` would be; the batch's other samples (and their early
    values) are applied, in the controller's store and in a front end's alike, and a
    front end forwards what the controller would have taken directly."""
    direct = MeasurementStore(TOPO, alpha=1.0)
    direct.watch_early = True
    fold = FrontEndFold(TOPO, 1.0)
    store = direct if where == "controller" else fold.store
    samples = [_pair(PAIR, 300.0, 1.0, early=150.0), _pair(BACK, 300.0, 1.0, early=early), _pair(OTHER, 200.0, 1.0)]
    report = (direct if where == "controller" else fold).ingest(samples, now=1.0)
    assert (report.accepted, report.rejected) == (2, {reason: 1})
    assert not np.isfinite(store.chan.t[store.chan.pair_id[BACK]]) and store.rejected[reason] == 1
    if where == "front end":
        direct.ingest_columns(_wire(fold.interval()), now=1.0)
    nic, back = TOPO.link_index(*NIC), TOPO.link_index(*NIC[::-1])
    assert direct.measured()[nic] == pytest.approx(300.0) and direct.early()[nic] == pytest.approx(150.0)
    assert back not in direct.pending_links()
    with pytest.raises(RejectedSample, match="early") as err:
        MeasurementStore(TOPO, alpha=1.0).ingest_strict(samples, now=1.0)
    assert err.value.reason == reason
    with pytest.raises(ProtocolError) as sent:
        ColumnBatch.from_samples(TOPO, samples)                  # a sender cannot encode it either
    assert sent.value.reason == "bad_body"


def test_the_early_column_says_absent_values_or_malformed_apart():
    """:func:`~mccl_runtime.samples.early_column` (the vectorised ingest's reading): a
    batch with no ``early`` is ``ABSENT`` (no values), one with well-formed values is
    ``VALUES`` (NaN where a sample has none), and one bad value anywhere makes it
    ``MALFORMED`` with no values, so it can never pass for a batch without early values."""
    plain = [_pair(PAIR, 300.0, 1.0), _pair(OTHER, 200.0, 1.0)]
    assert early_column(plain) == EarlyColumn(Early.ABSENT)
    col = early_column([_pair(PAIR, 300.0, 1.0, early=150.0), _pair(OTHER, 200.0, 1.0)])
    assert col.state is Early.VALUES and col.values[0] == 150.0 and np.isnan(col.values[1])
    link = {"kind": "link", "src": NIC[0], "dst": NIC[1], "gbps": 300.0, "t": 1.0, "early": 100.0}
    for bad in [_pair(BACK, 300.0, 1.0, early=e) for e, _ in BAD_EARLY] + [link]:
        col = early_column([_pair(PAIR, 300.0, 1.0, early=150.0), bad])
        assert col.state is Early.MALFORMED and col.values is None


def test_early_only_rides_a_pair_sample_and_only_an_accepted_one_is_kept():
    """``early`` on a ``link`` sample is ``malformed``; the early value of a pair sample
    refused for its time (``future``, ``stale``) is not kept (it would never be overtaken)."""
    store = MeasurementStore(TOPO, alpha=1.0)
    store.watch_early = True
    link = {"kind": "link", "src": NIC[0], "dst": NIC[1], "gbps": 300.0, "t": 1.0, "early": 100.0}
    assert store.ingest([link], now=1.0).rejected == {"malformed": 1}
    assert store.ingest([_pair(PAIR, 300.0, 2.0)], now=2.0).accepted == 1
    report = store.ingest([_pair(PAIR, 300.0, 30.0, early=100.0), _pair(PAIR, 300.0, 1.5, early=100.0)], now=2.0)
    assert report.rejected == {"future": 1, "stale": 1} and store.early() is None


def test_through_a_front_end_service_early_reaches_the_controller_and_bad_early_is_refused():
    """Sockets, HMAC keys: a host's JSON ``early`` through a front end lands in the
    controller's store apart from ``M``; a signed binary request with a malformed
    ``early`` is refused as ``bad_body`` and the front end still takes the next one."""
    with Server(key=KEY) as svc, FrontEnd(svc.endpoint, key=KEY, interval_s=0.05) as fe, \
            ControllerClient(fe.endpoint, key=KEY, timeout_s=5.0) as host:
        svc.store.watch_early = True
        nic = TOPO.link_index(*NIC)
        now = time.time()
        assert host.push_telemetry([_pair(PAIR, 300.0, now)])["accepted"] == 1
        assert host.push_telemetry([_pair(PAIR, 300.0, now + 0.01, early=150.0)])["accepted"] == 1
        deadline = time.monotonic() + 5.0
        while not svc.store.early_estimates() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert svc.store.early()[nic] == pytest.approx(150.0) and svc.store.measured()[nic] == pytest.approx(300.0)

        raw = zmq.Context.instance().socket(zmq.DEALER)
        raw.setsockopt(zmq.LINGER, 0)
        raw.connect(fe.endpoint)
        body, frames = ColumnBatch.from_samples(TOPO, [_pair(PAIR, 300.0, time.time())]).to_frames()
        for seq, early in ((1, [[1, 0, 1, "x", 0.0]]), (2, None)):
            msg = encode_frames("telemetry_columns", body if early is None else {**body, "early": early}, frames,
                                KEY, epoch=fe.gate.epoch, client="a" * 32, seq=seq)
            raw.send_multipart([b"", *msg])
            assert raw.poll(5000)
            reply = raw.recv_multipart()[-1]
            assert (b"bad_body" in reply) == (early is not None) and (b'"accepted":1' in reply) == (early is None)
        raw.close(0)
        assert host.stats()["protocol_errors"] == {"bad_body": 1}


@pytest.mark.parametrize("reporter", [None, 0], ids=["folded", "link-maxima"])
def test_front_ends_and_speculation_end_to_end(reporter):
    """``serve --frontends N --speculate --early-hold 1`` on sockets (a controller and a
    front end serving in threads, HMAC keys): a host reports a drop across the NIC cable
    through the front end as an early value, the controller starts a speculative job on it
    and publishes nothing until the host reports the drop, then publishes that job's
    version (built on the early value, one job).  Meanwhile a sample with a malformed
    ``early`` is rejected under its reason at the front end and at the controller, and
    nothing else changes."""
    policy = Policy(gamma=0.3, min_dwell_s=0.0, speculate=True, early_hold_s=1.0)
    with Server(key=KEY, policy=policy) as svc, \
            FrontEnd(svc.endpoint, key=KEY, interval_s=0.02, reporter=reporter) as fe, \
            ControllerClient(svc.endpoint, key=KEY, timeout_s=5.0) as admin, \
            ControllerClient(fe.endpoint, key=KEY, timeout_s=5.0) as host:
        assert svc.store.watch_early
        sub = admin.subscribe()
        assert sub.wait_connected(5.0)
        admin.register("world", "ag", "allgather")
        assert sub.recv(5.0)[2] == 1
        synth, jobs = svc.manager.synthesize, svc.manager.counters["resyntheses"]

        def wait_for(test):
            deadline = time.monotonic() + 5.0
            while not test() and time.monotonic() < deadline:
                time.sleep(0.01)
            return test()

        now = time.time()
        assert host.push_telemetry([_pair(PAIR, 400.0, now), _pair(BACK, 400.0, now)])["accepted"] == 2
        now = time.time()
        bad = _pair(OTHER, 2000.0, now, early="50")
        assert host.push_telemetry([_pair(PAIR, 400.0, now, 50.0), _pair(BACK, 400.0, now, 52.0), bad]) \
            == {"accepted": 2, "rejected": {"malformed": 1}}
        assert wait_for(lambda: svc.manager.counters["resyntheses"] == jobs + 1)     # speculative, on early
        assert wait_for(lambda: svc.manager.get("world", "ag").job.future.done())
        assert sub.recv(0.3) is None and svc.manager.get("world", "ag").version == 1   # held: only early
        assert admin.push_telemetry([_pair(OTHER, 2000.0, time.time(), early=-1.0)]) \
            == {"accepted": 0, "rejected": {"negative": 1}}

        now = time.time()
        assert host.push_telemetry([_pair(PAIR, 50.0, now), _pair(BACK, 52.0, now)])["accepted"] == 2
        update = sub.recv(5.0)
        assert update is not None and update[2] == 2
        assert svc.manager.counters["resyntheses"] == jobs + 1                         # that one job
        assert synth.capacities[-1][TOPO.link_index(*NIC)] == pytest.approx(50.0)
        stats = admin.stats()
        assert stats["requests"]["telemetry"] == 1 and not stats["protocol_errors"]  # the malformed one only
        assert stats["telemetry"]["rejected"]["negative"] == 1 and stats["telemetry"]["rejected"]["malformed"] == 0
        assert host.stats()["telemetry"]["rejected"]["malformed"] == 1
        sub.close()
