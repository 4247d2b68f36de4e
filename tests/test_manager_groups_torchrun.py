"""A torchrun job over part of the controller's fabric: ``mccl controller serve`` on a
5-GPU mesh and a 3-rank gloo job (``executor_cuda.torchrun --members``) whose ranks are
3 of those GPUs in another order.  The job registers its communicator with its members,
runs the controller's current schedule of their sub-fabric (version 2, published for a
degraded cable before the job starts, not the stale version 1) with every result checked,
and its telemetry lands on the fabric's links.  The job's telemetry goes to a front end
(`serve --frontends 1`, ``--telemetry``): it reaches the controller only as the front end's
folded ``telemetry_columns`` requests, while the ranks fetch and subscribe at the
controller.  (One job serves the sub-fabric, the current-version and the front-end checks:
a torchrun job costs seconds; tests/test_torchrun.py runs a job over a whole fabric.)"""

from __future__ import annotations

import json
import subprocess
import sys
import time

from instances import full_mesh
from mccl_runtime.client import ControllerClient
from tests.procs import stop
from tests.test_torchrun import ENV, _job

MEMBERS = ["g3", "g1", "g4"]


def test_torchrun_job_over_a_sub_fabric(tmp_path):
    full_mesh(5).save(tmp_path / "t5.json")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mccl_opt.cli", "controller", "serve", "--kernels", "lazy", "--estimator", "ewma", "--topology", str(tmp_path / "t5.json"),
         "--bind", "tcp://127.0.0.1:0", "--alpha", "1", "--dwell", "0", "--frontends", "1"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        line, front = proc.stdout.readline(), proc.stdout.readline()
        assert line.startswith("controller on tcp://127.0.0.1:"), line + proc.stderr.read()
        assert front.split()[:3] == ["frontend", "0", "on"], front
        endpoint, frontend = line.split()[2], front.split()[3]
        with ControllerClient(endpoint, timeout_s=10.0) as cli:
            assert cli.register("grp", "ag", "allgather", gpus=MEMBERS) == ["ag"]
            deadline = time.monotonic() + 30
            while cli.get_schedule("grp", "ag")[0] < 1:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            # the g3-g1 cable (ranks 0 and 1) at 12.5 of 100 Gbps: the controller publishes
            # version 2 (relaying through g4) before the job starts
            now = time.time()            # distinct times: an equal-t repeat is not applied twice
            cli.push_telemetry([{"kind": "link", "src": a, "dst": b, "gbps": 12.5, "t": now - 1e-3 * i}
                                for i in range(200) for a, b in (("g3", "g1"), ("g1", "g3"))])
            while cli.get_schedule("grp", "ag")[0] < 2:
                assert time.monotonic() < deadline, "no version 2 after the degradation"
                time.sleep(0.05)
            before = cli.stats()
            accepted = before["telemetry"]["accepted"]
        done = _job(endpoint, tmp_path, "--comm", "grp", "--members", ",".join(MEMBERS), "--telemetry", frontend)
        assert done.returncode == 0, done.stdout + done.stderr
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        assert summary["ranks"] == 3 and summary["backend"] == "gloo"
        assert summary["wrong"] == 0 and summary["iters"] == 8
        assert summary["versions"][0] >= 2                      # not the stale version 1
        assert summary["telemetry_sent"] > 0
        with ControllerClient(endpoint, timeout_s=10.0) as cli:
            [coll] = cli.request("list")[1]["collectives"]
            assert (coll["comm"], coll["gpus"]) == ("grp", MEMBERS)
            _, sched = cli.get_schedule("grp", "ag")
            assert list(sched.gpus) == MEMBERS                  # rank r runs as GPU MEMBERS[r]
            deadline = time.monotonic() + 10
            while cli.stats()["telemetry"]["accepted"] < accepted + summary["telemetry_sent"]:
                assert time.monotonic() < deadline, "the ranks' samples did not arrive"
                time.sleep(0.05)
            stats = cli.stats()
            assert not any(stats["telemetry"]["rejected"].values())
        requests = {k: stats["requests"].get(k, 0) - before["requests"].get(k, 0)
                    for k in ("telemetry", "telemetry_columns", "get_schedule")}
        # telemetry through the front end only; the schedule fetched here (rank 0 found the
        # collective this test registered: no second ``register``)
        assert requests["telemetry"] == 0 and requests["telemetry_columns"] >= 1 and requests["get_schedule"] >= 1
    finally:
        stop(proc)
