"""Binary telemetry (mccl_runtime.columns): the same decisions as JSON, signatures that cover
every frame, malformed frames answered with errors, and the host-side pair reduction."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import zmq

from instances import fail2, hpn

from mccl_runtime.client import ControllerClient, HoldUpdate
from mccl_runtime.columns import ColumnBatch
from mccl_runtime.host_reduce import HostReducer
from mccl_runtime.manager import Policy, ScheduleManager
from mccl_runtime.protocol import (COLUMNS_MARK, REQUESTS, ProtocolError, ReplayGuard, decode, encode,
                                   encode_frames, split_frames)
from mccl_runtime.samples import RejectedSample, Sample
from mccl_runtime.state_check import check_state
from mccl_runtime.telemetry import MeasurementStore
from tests.test_runtime_manager import TOPO, PruningSynth
from tests.test_runtime_service import KEY, Server

GPUS = TOPO.gpus
FAIL2 = ("s0h0g0", "s0tor0")


def _truth(t: float) -> dict[tuple[str, str], float]:
    """A timeline of capacities per cable direction: Fail2 over [1, 3), a milder one from 5."""
    cap = {(l.src, l.dst): l.capacity_gbps for l in TOPO.links}
    for (a, b), gbps, t0, t1 in ((FAIL2, 50.0, 1.0, 3.0), (("s0h1g1", "s0tor1"), 120.0, 5.0, 99.0)):
        if t0 <= t < t1:
            cap[(a, b)] = cap[(b, a)] = gbps
    return cap


def _samples(t: float, rng: np.random.Generator) -> list[dict]:
    """What executors would send at ``t``: link samples of the NICs, noisy pair samples of
    every GPU pair (the slowest link on the pair's path), gpu samples, one bad sample."""
    cap = _truth(t)
    out = [{"kind": "link", "src": a, "dst": b, "gbps": cap[(a, b)] * (1 + 0.02 * rng.standard_normal()), "t": t}
           for a, b in cap if "tor" in b]
    store = MeasurementStore(TOPO)
    for s in GPUS:
        for d in GPUS:
            if s != d:
                try:
                    links = store.map.resolve(_pair(s, d))[0]
                except RejectedSample:          # no switch path (another rail): rejected, unknown_link
                    links = ()
                y = min((cap[(TOPO.links[a].src, TOPO.links[a].dst)] for a in links), default=100.0)
                out.append({"kind": "pair", "src": s, "dst": d, "gbps": y * (1 + 0.05 * rng.standard_normal()),
                            "t": t - 0.001 * rng.random()})
    out += [{"kind": "gpu", "gpu": g, "dir": ("out", "in")[i % 2], "gbps": 2880.0, "t": t} for i, g in enumerate(GPUS)]
    out.append({"kind": "link", "src": "s0h0g0", "dst": "s0tor0", "gbps": -1.0, "t": t})      # rejected: negative
    return out


def _pair(s: str, d: str) -> Sample:
    return Sample("pair", s, d, 0.0, 0.0)


def _path(store: MeasurementStore, s: str, d: str) -> tuple[int, ...]:
    try:
        return store.map.resolve(_pair(s, d))[0]
    except RejectedSample:
        return ()


def _through_json(samples: list[dict], store: MeasurementStore, now: float) -> dict:
    msg = decode(encode("telemetry", {"samples": samples}, KEY), KEY, REQUESTS, ReplayGuard())
    return store.ingest(msg.body["samples"], now).to_dict()


def _through_binary(samples: list[dict], store: MeasurementStore, now: float) -> dict:
    body, frames = ColumnBatch.from_samples(TOPO, samples).to_frames()
    _, header, cols = split_frames([b"id", b"", *encode_frames("telemetry_columns", body, frames, KEY)])
    msg = decode(header, KEY, REQUESTS, ReplayGuard(), frames=cols)
    return store.ingest_columns(ColumnBatch.from_frames(msg.body, cols, TOPO), now).to_dict()


@pytest.mark.parametrize("estimator", ["ewma", "level"])
def test_json_and_binary_telemetry_give_the_same_decisions(estimator):
    """One timeline (Fail2, its clearing, a second failure; noisy pair, link and gpu samples)
    fed to two managers, one through the JSON wire format and one through the binary frames:
    every ingest report, every M and every event (published versions included) are equal."""
    runs = []
    for ingest in (_through_json, _through_binary):
        rng = np.random.default_rng(7)
        store = MeasurementStore(TOPO, alpha=0.3, estimator=estimator)
        mgr = ScheduleManager(store, PruningSynth(), Policy(gamma=0.1, min_dwell_s=0.0))
        mgr.register("world", "ag", "allgather")
        trace = []
        for step in range(80):
            now = 1000.0 + 0.1 * step
            report = ingest(_shift(_samples(0.1 * step, rng)), store, now)
            events = mgr.step(now)
            events += mgr.poll(now, wait_s=5.0)     # the job's result, whatever the thread's timing
            trace.append((report, store.measured().tobytes(),
                          [(e.comm, e.name, e.action, e.version) for e in events]))
        runs.append((trace, [(c.version, c.schedule.to_dict()) for c in mgr.collectives()]))
        mgr.close()
    assert runs[0] == runs[1]
    actions = [e[2] for _, _, evs in runs[0][0] for e in evs]
    assert actions.count("published") >= 2 and actions.count("resynthesis") >= 5


def _shift(samples: list[dict]) -> list[dict]:
    """Sample times on the controller's clock (the timeline starts at 1000 s)."""
    return [{**s, "t": s["t"] + 1000.0} for s in samples]


class _SettledTurns:
    """Counts the service loop's turns that end settled (no decision pending, no job
    running, every version published), each with the publish count it ended at; the
    wrapper runs in the service's own thread, so it reads a consistent state."""

    def __init__(self, svc) -> None:
        self.cond = threading.Condition()
        self.turns: list[int] = []
        turn = svc._turn

        def counted(pub) -> None:
            turn(pub)
            if not svc._decide and not svc.manager.busy() and all(
                    c.version <= svc._sent.get(c.key, 0) for c in svc.manager.collectives()):
                with self.cond:
                    self.turns.append(svc._pub_seq)
                    self.cond.notify_all()

        svc._turn = counted

    def after(self, seen: int, timeout_s: float = 10.0) -> int:
        """The publish count of the first settled turn after the ``seen`` ones so far."""
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.turns) > seen, timeout_s), "the service never settled"
            return self.turns[-1]


def test_json_and_binary_through_the_service_publish_the_same_versions():
    """Two controllers, one fed by a JSON client and one by a binary client, the same samples:
    the same versions with the same chunks are published.  Each push is followed by a wait
    for the service to settle (its decision taken, the job collected, the versions sent)
    and for every publication up to then to arrive."""
    results = []
    for binary in (False, True):
        with Server(key=KEY) as svc, ControllerClient(svc.endpoint, key=KEY, timeout_s=5.0) as cli:
            settled = _SettledTurns(svc)
            sub = cli.subscribe()
            assert sub.wait_connected(5.0)
            cli.register("world", "ag", "allgather")
            got, read = [], 0
            rng = np.random.default_rng(3)
            t0 = time.time() - 5.0
            for step in range(41):
                if step:
                    samples = [{**s, "t": s["t"] + t0} for s in _samples(0.1 * (step - 1), rng)]
                    rep = cli.push_columns(ColumnBatch.from_samples(TOPO, samples)) if binary \
                        else cli.push_telemetry(samples)
                    assert rep["rejected"]["negative"] == 1 and rep["rejected"]["unknown_link"] > 0
                with settled.cond:
                    seen = len(settled.turns)
                published = settled.after(seen)
                while read < published:
                    upd = sub.recv_any(5.0)
                    assert upd is not None, f"publication {read + 1} of {published} never arrived"
                    read += 1
                    if not isinstance(upd, HoldUpdate):
                        got.append(upd)
            results.append([(c, n, v, s.to_dict()["chunks"]) for c, n, v, s in got])
            sub.close()
    assert results[0] == results[1] and len(results[0]) >= 3


def test_signature_covers_every_frame_and_replays_are_refused():
    body, frames = ColumnBatch.from_samples(TOPO, _shift(_samples(0.0, np.random.default_rng(0)))).to_frames()
    msg = encode_frames("telemetry_columns", body, frames, KEY, epoch="0" * 32, client="1" * 32, seq=1)
    header, cols = msg[1], tuple(msg[2:])
    assert decode(header, KEY, REQUESTS, frames=cols).type == "telemetry_columns"
    flipped = bytearray(cols[3])
    flipped[5] ^= 1
    for bad in (cols[:4], (cols[1], cols[0], *cols[2:]), (*cols[:3], bytes(flipped), cols[4]), cols + (b"",)):
        with pytest.raises(ProtocolError) as exc:
            decode(header, KEY, REQUESTS, frames=bad)
        assert exc.value.reason == "bad_signature"
    guard = ReplayGuard()
    decode(header, KEY, REQUESTS, guard, frames=cols)
    with pytest.raises(ProtocolError, match="received before"):
        decode(header, KEY, REQUESTS, guard, frames=cols)


def _raw(sock, frames):
    sock.send_multipart([b"", *frames])
    assert sock.poll(5000)
    return decode(sock.recv_multipart()[-1])


def test_malformed_binary_frames_get_an_error_reply_never_a_crash():
    good = ColumnBatch.from_samples(TOPO, _samples(time.time(), np.random.default_rng(1)))
    body, frames = good.to_frames()
    cases = {
        "too few frames": (body, frames[:3]),
        "short column": (body, (frames[0][:-1], *frames[1:])),
        "n not a number": ({**body, "n": "x"}, frames),
        "n too large": ({**body, "n": 1 << 20}, frames),
        "other fabric": ({**body, "links": 7}, frames),
        "negative n": ({**body, "n": -1}, frames),
    }
    with Server() as svc:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(svc.endpoint)
        for label, (b, f) in cases.items():
            reply = _raw(sock, encode_frames("telemetry_columns", b, f))
            assert reply.type == "error", label
        assert _raw(sock, [COLUMNS_MARK]).body["reason"] == "bad_envelope"
        assert _raw(sock, [COLUMNS_MARK, b"\xff not json", *frames]).body["reason"] == "malformed_json"
        assert _raw(sock, encode_frames("ping", {}, frames)).body["reason"] == "bad_body"
        assert _raw(sock, [encode("telemetry_columns", body)]).body["reason"] == "bad_body"
        # wrong kinds and indices outside the fabric are counted per sample, not fatal
        kind = np.frombuffer(frames[0], dtype="u1").copy()
        a = np.frombuffer(frames[1], dtype="<i4").copy()
        kind[0], a[1], a[2] = 9, -5, 1 << 30
        reply = _raw(sock, encode_frames("telemetry_columns", body, (kind.tobytes(), a.tobytes(), *frames[2:])))
        assert reply.type == "ok" and reply.body["rejected"]["malformed"] == 1
        base = MeasurementStore(TOPO).ingest_columns(good)          # the unchanged batch
        assert reply.body["rejected"]["unknown_link"] == base.rejected["unknown_link"] + 2
        assert reply.body["accepted"] == base.accepted - 3
        assert _raw(sock, [encode("ping")]).type == "ok"
        sock.close(0)
        ctx.term()
        assert svc.internal_errors == 0 and svc.protocol_errors["internal"] == 0


def _pair_batch(topo, t: float) -> ColumnBatch:
    """Every GPU pair's sample under Fail2 (the slowest link of its path), all at ``t``."""
    store = MeasurementStore(topo)
    cap = fail2(topo).arrays.capacity
    rows = [(1, i, j, float(cap[list(links)].min()), t) for i, s in enumerate(topo.gpus)
            for j, d in enumerate(topo.gpus) if i != j and (links := _path(store, s, d))]
    return ColumnBatch.build(topo, *zip(*rows))


def test_host_reduction_gives_the_same_m_with_fewer_samples():
    """Each host reduces the pair samples it received (destination on the host) to one sample
    per link: with alpha = 1, M is equal to the unreduced M, and fewer samples are sent; the
    reduced channels survive a state write and restore."""
    topo, t = hpn(1, 4, 8), time.time()
    batch = _pair_batch(topo, t)
    plain = MeasurementStore(topo, alpha=1.0)
    plain.ingest_columns(batch, t)
    reduced = MeasurementStore(topo, alpha=1.0)
    host_of = np.array([g.split("g")[0] for g in topo.gpus])
    sent = 0
    for r, host in enumerate(sorted(set(host_of))):
        mine = np.flatnonzero(host_of[batch.b] == host)
        part = ColumnBatch(*(getattr(batch, c)[mine] for c in ("kind", "a", "b", "gbps", "t")),
                           links=batch.links, gpus=batch.gpus)
        out = HostReducer(topo, r).reduce(part)
        sent += len(out)
        assert reduced.ingest_columns(out, t).accepted == len(out)
    assert np.array_equal(plain.measured(), reduced.measured())
    assert plain.measured().min() == 50.0
    assert sent < len(batch)
    restored = MeasurementStore(topo, alpha=1.0)
    state = reduced.to_dict()
    checked = check_state({"topology": topo.to_dict(), "telemetry": state}, topo)["telemetry"]
    assert checked["hosts"] == state["hosts"]
    restored.restore(checked)
    assert np.array_equal(restored.measured(), reduced.measured()) and state["hosts"]
