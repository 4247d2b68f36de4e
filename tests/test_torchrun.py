"""The README's torchrun example for real: a ``mccl controller serve`` subprocess and a
3-rank gloo job started by ``torchrun -m executor_cuda.torchrun`` that registers its
collective, runs the controller's current schedule and reports telemetry; a rank killed
mid-run is named and nothing hangs.  The job that runs to its end (the controller's current
version, published before it starts; every result checked; telemetry through a front end)
runs over a sub-fabric: tests/test_manager_groups_torchrun.py (a torchrun job costs
seconds: one job carries those checks)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from instances import full_mesh
from mccl_runtime.client import ControllerClient
from tests.procs import stop

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _torchrun() -> list[str]:
    script = Path(sys.executable).parent / "torchrun"
    return [str(script)] if script.exists() else [sys.executable, "-m", "torch.distributed.run"]


@pytest.fixture(scope="module")
def controller(tmp_path_factory) -> Iterator[str]:
    """A ``mccl controller serve`` on a 3-GPU mesh for the module's jobs: its endpoint."""
    where = tmp_path_factory.mktemp("torchrun-controller")
    full_mesh(3).save(where / "t3.json")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mccl_opt.cli", "controller", "serve", "--kernels", "lazy", "--estimator", "ewma", "--topology",
         str(where / "t3.json"), "--bind", "tcp://127.0.0.1:0", "--alpha", "1", "--dwell", "0"],
        cwd=where, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    try:
        line = proc.stdout.readline()
        assert line.startswith("controller on tcp://127.0.0.1:"), line + proc.stderr.read()
        yield line.split()[2]
    finally:
        stop(proc)


def _job(endpoint: str, cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        _torchrun() + ["--standalone", "--nproc-per-node", "3", "-m", "executor_cuda.torchrun",
                       "--controller", endpoint, "--iters", "8", "--numel", "1000", *extra],
        cwd=cwd, env=ENV, capture_output=True, text=True, timeout=120)


def test_outside_torchrun_says_how_to_start_it(tmp_path):
    env = {k: v for k, v in ENV.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run([sys.executable, "-m", "executor_cuda.torchrun", "--controller",
                           "tcp://127.0.0.1:9"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2
    assert "error: RANK and WORLD_SIZE are not set: start this with torchrun" in done.stderr


def _rank_pids(launcher: int) -> dict[int, int]:
    """``{RANK: pid}`` of the workers torchrun (pid ``launcher``) started (Linux /proc)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0") if ppid == launcher else []
        except (OSError, ValueError, IndexError):
            continue
        rank = [e[5:] for e in env if e.startswith(b"RANK=")]
        if rank:
            out[int(rank[0])] = int(entry)
    return out


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="finds the ranks through /proc")
def test_a_rank_killed_under_torchrun_is_named_and_nothing_hangs(controller, tmp_path):
    """Issue 27, end to end: SIGKILL rank 1 of a 3-rank job mid-run.  The survivors each
    print one ``error:`` line naming their rank and the collective (no Python traceback of
    ours), torchrun names rank 1 as the root cause, and the job ends well within 2x the
    executor's per-collective timeout (10 s)."""
    import signal

    endpoint = controller
    with ControllerClient(endpoint, timeout_s=10.0) as cli:
        before = cli.stats()["telemetry"]["accepted"]
        job = subprocess.Popen(
            _torchrun() + ["--standalone", "--nproc-per-node", "3", "-m", "executor_cuda.torchrun",
                           "--controller", endpoint, "--iters", "1000000", "--numel", "1000"],
            cwd=tmp_path, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)
        try:
            deadline = time.monotonic() + 90
            while cli.stats()["telemetry"]["accepted"] < before + 50:     # collectives are running
                assert job.poll() is None and time.monotonic() < deadline, "the job never ran"
                time.sleep(0.2)
            ranks = _rank_pids(job.pid)
            assert sorted(ranks) == [0, 1, 2], ranks
            killed = time.monotonic()
            os.kill(ranks[1], signal.SIGKILL)
            out, err = job.communicate(timeout=60)
        finally:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
                job.wait(10)
    assert time.monotonic() - killed < 20.0
    assert job.returncode != 0
    ours = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert ours, err[-2000:]
    for line in ours:                            # each survivor: its rank and the collective
        assert re.match(r"error: rank [02]: the allgather collective world/ag (failed|was stopped) at iteration \d+",
                        line), line
    assert "executor_cuda" not in "".join(ln for ln in err.splitlines() if ln.startswith('  File "'))
    assert re.search(r"rank\s*: 1 \(local_rank: 1\)\s+exitcode\s*: -9", err), err[-2000:]
