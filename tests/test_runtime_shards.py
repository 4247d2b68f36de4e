"""A controller sharded by communicator (mccl controller serve --shards N): each shard serves the
communicators hashed to it, a client finds its shard from any one, a wrong-shard registration is
refused, and a restart of the shards loses nothing published."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from instances import hpn
from mccl_runtime.client import ControllerClient, ShardedClient
from mccl_runtime.protocol import ProtocolError
from mccl_runtime.shards import shard_endpoint, shard_of
from tests.procs import ROOT, stop
from tests.test_runtime_service import Server

COMMS = [f"c{i}" for i in range(6)]


def test_shard_of_is_stable_and_spreads():
    assert [shard_of(c, 2) for c in COMMS] == [shard_of(c, 2) for c in COMMS]
    assert {shard_of(f"comm{i}", 4) for i in range(64)} == {0, 1, 2, 3}
    assert shard_endpoint("tcp://127.0.0.1:5555", 2) == "tcp://127.0.0.1:5557"
    assert shard_endpoint("tcp://127.0.0.1:0", 2) == "tcp://127.0.0.1:0"


def _start(topo: Path, state: Path) -> tuple[subprocess.Popen, list[str]]:
    cmd = [sys.executable, "-m", "mccl_opt.cli", "controller", "serve", "--kernels", "lazy", "--estimator", "ewma", "--topology", str(topo),
           "--bind", "tcp://127.0.0.1:0", "--state", str(state), "--shards", "2", "--alpha", "1",
           *[f"--collective={c}/ag:allgather" for c in COMMS]]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [proc.stdout.readline() for _ in range(3)]
    assert lines[-1].startswith("controller on"), (lines, proc.stderr.read() if proc.poll() is not None else "")
    endpoints = [line.split()[-1] for line in lines[:2]]
    for ep in endpoints:                  # announced: every shard already lists its peers
        with ControllerClient(ep, timeout_s=30.0) as one:
            assert one.ping()["shards"] == endpoints
    return proc, endpoints


def test_a_client_waits_for_a_shard_that_does_not_list_its_peers_yet():
    """A shard that answers before it knows the other shards' endpoints is not taken for
    the whole controller (that client would list one shard's collectives only): the
    client asks again, and says so when the list never comes."""
    with Server() as svc:
        svc.shard = (0, 2)
        with pytest.raises(ProtocolError) as exc:
            ShardedClient(svc.endpoint, timeout_s=0.3)
        assert exc.value.reason == "not_ready" and "shard 0" in str(exc.value)
        peers = [svc.endpoint, "tcp://127.0.0.1:1"]
        threading.Timer(0.2, lambda: setattr(svc, "shard_endpoints", peers)).start()
        client = ShardedClient(svc.endpoint, timeout_s=5.0)
        try:
            assert client.endpoints == peers and len(client.clients) == 2
        finally:
            client.close()


def _degraded(t: float) -> list[dict]:
    return [{"kind": "link", "src": a, "dst": b, "gbps": 50.0, "t": t}
            for a, b in (("s0h0g0", "s0tor0"), ("s0tor0", "s0h0g0"))]


def test_two_shards_serve_their_communicators_and_survive_a_restart(tmp_path: Path):
    topo = tmp_path / "t.json"
    hpn(1, 2, 4).save(topo)
    state = tmp_path / "state.json"
    proc, endpoints = _start(topo, state)
    try:
        with ShardedClient(endpoints[1], timeout_s=30.0) as cli:
            assert cli.endpoints == endpoints
            for i, ep in enumerate(endpoints):               # each shard holds exactly its communicators
                with ControllerClient(ep, timeout_s=30.0) as one:
                    assert sorted(c["comm"] for c in one.list()) == [c for c in COMMS if shard_of(c, 2) == i]
            wrong = next(c for c in COMMS if shard_of(c, 2) == 1)
            with ControllerClient(endpoints[0], timeout_s=30.0) as one, pytest.raises(ProtocolError) as exc:
                one.register(wrong, "other", "allgather")
            assert exc.value.reason == "wrong_shard" and endpoints[1] in str(exc.value)
            deadline = time.monotonic() + 60.0
            while any(c["version"] < 1 for c in cli.list()) and time.monotonic() < deadline:
                time.sleep(0.1)                                 # the first schedules
            while any(c["version"] < 2 for c in cli.list()) and time.monotonic() < deadline:
                assert cli.push_telemetry(_degraded(time.time()))["accepted"] == 4   # 2 samples x 2 shards
                time.sleep(0.2)                                 # executors flush continually
            before = {c["comm"]: c["version"] for c in cli.list()}
            schedules = {c: cli.get_schedule(c, "ag")[1].to_dict()["chunks"] for c in COMMS}
        assert before == dict.fromkeys(COMMS, 2)
    finally:
        assert stop(proc, 30.0) == 0
    assert all(Path(f"{state}.shard{i}").exists() for i in range(2))
    proc, endpoints = _start(topo, state)
    try:
        with ShardedClient(endpoints[0], timeout_s=30.0) as cli:
            assert {c["comm"]: c["version"] for c in cli.list()} == before
            assert {c: cli.get_schedule(c, "ag")[1].to_dict()["chunks"] for c in COMMS} == schedules
    finally:
        assert stop(proc, 30.0) == 0
