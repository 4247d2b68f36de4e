"""Communicators over sub-fabrics through the service: ``mccl controller serve`` in its
own process with ``--members``, a client registering a group with its member list, bad
lists answered with errors that name the problem, a failure republishing only the
affected group, and a restart resuming every group with its members."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import mccl_opt as mo
from mccl_opt.errors import MCCLError
from mccl_opt.subfabric import induced
from mccl_runtime.client import ControllerClient
from mccl_runtime.protocol import ProtocolError
from tests.test_manager_groups import GROUPS, TOPO

ROOT = Path(__file__).resolve().parents[1]


def _serve(topo_file: Path, state: Path) -> tuple[subprocess.Popen, str]:
    tp0, dp1 = GROUPS["tp0"][1], GROUPS["dp1"][1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "mccl_opt.cli", "controller", "serve", "--kernels", "lazy", "--estimator", "ewma", "--topology", str(topo_file),
         "--bind", "tcp://127.0.0.1:0", "--state", str(state), "--dwell", "0", "--alpha", "1",
         "--collective", "tp0/ag:allgather", "--members", "tp0=" + ",".join(tp0),
         "--collective", "dp1/ag:allgather", "--members", "dp1=" + ",".join(dp1)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    line = proc.stdout.readline()
    assert line.startswith("controller on tcp://127.0.0.1:"), line + proc.stderr.read()
    return proc, line.split()[2]


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def _versions(cli: ControllerClient) -> dict[str, tuple[int, list[str] | None]]:
    return {c["comm"]: (c["version"], c["gpus"]) for c in cli.request("list")[1]["collectives"]}


def _wait_versions(cli: ControllerClient, want: dict[str, int], limit_s: float = 60.0) -> dict:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        got = _versions(cli)
        if all(got.get(c, (0,))[0] >= v for c, v in want.items()):
            return got
        time.sleep(0.1)
    raise AssertionError(f"versions {want} not reached: {_versions(cli)}")


def test_groups_through_the_service_and_a_restart(tmp_path):
    topo_file, state = tmp_path / "t.json", tmp_path / "state.json"
    TOPO.save(topo_file)
    ep0 = GROUPS["ep0"][1]
    proc, endpoint = _serve(topo_file, state)
    try:
        with ControllerClient(endpoint, timeout_s=10.0) as cli:
            assert cli.register("ep0", "a2a", "alltoall", gpus=ep0) == ["a2a"]
            for bad, reason, match in ((["s0h0g0", "s0h0g0"], "rejected", "listed twice"),
                                       (["s0h0g0", "s0h1g1"], "rejected", "connected sub-fabric"),
                                       (["s0h0g0", "s0tor0"], "rejected", "is a switch"),
                                       ("s0h0g0", "bad_body", "list of GPU ids"),
                                       ([f"g{i}" for i in range(17)], "bad_body", "the fabric has 16 GPUs")):
                with pytest.raises(ProtocolError, match=match) as err:
                    cli.request("register", {"comm": "bad", "name": "x", "kind": "allgather", "gpus": bad})
                assert err.value.reason == reason
            with pytest.raises(MCCLError, match="one string"):
                cli.register("bad", "x", "allgather", gpus="s0h0g0")
            with pytest.raises(ProtocolError, match="registered over 4 GPUs"):
                cli.register("tp0", "other", "allgather", gpus=GROUPS["tp1"][1])
            got = _wait_versions(cli, {"tp0": 1, "dp1": 1, "ep0": 1})
            assert got["tp0"][1] == GROUPS["tp0"][1] and got["ep0"][1] == ep0
            assert set(got) == {"tp0", "dp1", "ep0"}
            # Fail2 on s0h0g0's NIC: in ep0's sub-fabric only (of these three)
            t = time.time()
            cli.push_telemetry([{"kind": "link", "src": a, "dst": b, "gbps": 50.0, "t": t}
                                for a, b in (("s0h0g0", "s0tor0"), ("s0tor0", "s0h0g0"))])
            got = _wait_versions(cli, {"ep0": 2})
            assert got["tp0"][0] == 1 and got["dp1"][0] == 1
            version, sched = cli.get_schedule("ep0", "a2a")
            degraded = induced(TOPO.with_capacity(src="s0h0g0", dst="s0tor0", gbps=50.0), ep0).topology
            mo.validate(degraded, sched)
            assert sched.gpus == tuple(ep0)
    finally:
        _stop(proc)
    proc, endpoint = _serve(topo_file, state)
    try:
        with ControllerClient(endpoint, timeout_s=10.0) as cli:
            assert cli.ping()["resumed"] is True
            got = _versions(cli)
            assert got == {"tp0": (1, GROUPS["tp0"][1]), "dp1": (1, GROUPS["dp1"][1]), "ep0": (2, ep0)}
    finally:
        _stop(proc)


@pytest.mark.parametrize("extra, message", [
    (["--members", "tp9=s0h0g0,s0h0g1"], "--members 'tp9': no --collective of that communicator"),
    (["--collective", "tp0/ag:allgather", "--members", "tp0="], "--members must look like COMM=GPU,GPU"),
    (["--collective", "tp0/ag:allgather", "--members", "tp0=s0h0g0", "--members", "tp0=s0h0g1"],
     "names communicator 'tp0' twice"),
    (["--collective", "tp0/ag:allgather", "--members", "tp0=s0h0g0,s0h0g0"], "'s0h0g0' is listed twice"),
])
def test_serve_refuses_bad_members_with_exit_status_2(tmp_path, capsys, extra, message):
    from mccl_opt.cli import main

    TOPO.save(tmp_path / "t.json")
    assert main(["controller", "serve", "--topology", str(tmp_path / "t.json"), "--bind", "tcp://127.0.0.1:0",
                 *extra]) == 2
    assert message in capsys.readouterr().err
