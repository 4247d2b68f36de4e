"""Every ``mccl`` command of the README works after a plain ``pip install`` (README "Command
line"): a wheel of the checkout is installed with its dependencies into a fresh
virtualenv, and each command found in the README's shell blocks runs, in README order,
from a folder outside the checkout.  Minutes of work (pip, the first kernel compilation,
``mccl eval``, ``mccl bench``): that test is marked ``slow_install``, left out of ``make
test``; run it with ``make test-install``.

How a README line becomes a command (:func:`runnable`): a line of a ``sh``/``bash``
block that starts with ``mccl``; the comment after ``#`` dropped; optional ``[...]``
groups dropped; of the alternatives ``a|b`` the first kept.  A command ending in ``&``,
and ``mccl controller serve``, runs in the background: it must print ``controller on``,
then stops on SIGTERM with exit 0.  Input files that the README uses but never writes
(a scenario, a workload profile) are written first from :data:`INPUTS`.  Every command
must exit 0 without a traceback.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from bench.bench_first_run import build_wheel, clean_env, fresh_install

ROOT = Path(__file__).resolve().parents[1]

#: inputs the README's commands read but no README command writes
INPUTS = {
    "s.json": {"format": "mccl-scenario/1", "topology": "hpn 1x2x4", "collective": "allgather",
               "message_bytes": 16777216, "duration_ms": 300,
               "events": [{"t_ms": 20, "links": [{"src": "s0h0g0", "dst": "s0tor0",
                                                  "capacity_gbps": 50, "both_directions": True}]}]},
    "profile.json": {"format": "mccl-workload/1", "name": "llama-like", "compute_share": 0.66,
                     "collectives": [{"name": "fsdp-ag", "kind": "allgather", "bytes": 16777216,
                                      "count": 126},
                                     {"name": "moe", "kind": "alltoall", "bytes": 33554432,
                                      "count": 58}]},
}

_BLOCK = re.compile(r"^```(?:sh|bash|shell|console)\s*\n(.*?)^```", re.M | re.S)


def readme_commands(text: str) -> list[str]:
    """The ``mccl ...`` lines of the README's shell blocks, continuation lines joined."""
    out = []
    for block in _BLOCK.findall(text):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().removeprefix("$ ")
            if line.startswith("mccl "):
                out.append(line)
    return out


def runnable(line: str) -> tuple[list[str], bool]:
    """``(argv, background)`` of a README line (module docstring)."""
    line = re.sub(r"\s#.*$", "", line).strip()
    background = line.endswith("&")
    line = line.rstrip("&").strip()
    while re.search(r"\[[^\[\]]*\]", line):
        line = re.sub(r"\s*\[[^\[\]]*\]", "", line)
    argv = [re.sub(r"^([^|]+)\|.*$", r"\1", word) for word in shlex.split(line)]
    return argv, background or argv[:3] == ["mccl", "controller", "serve"]


def test_runnable_reads_the_readme_notation():
    assert runnable("mccl solve alltoall t.json -o a2a.json [--warm old.json] [--backend gurobi]"
                    "   # a comment") == (["mccl", "solve", "alltoall", "t.json", "-o", "a2a.json"],
                                          False)
    assert runnable("mccl export mps --model compact|master|switch-removal t.json -o m.mps [--lp]") \
        == (["mccl", "export", "mps", "--model", "compact", "t.json", "-o", "m.mps"], False)
    assert runnable("mccl controller serve --topology t.json &")[1]
    assert readme_commands("```sh\nmccl topo hpn 1x2x8 \\\n  -o t.json\nls\n```\n"
                           "```\nmccl not-shell\n```\n") == ["mccl topo hpn 1x2x8    -o t.json"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_SERVE_HEAD_LINES = 1 + 16     # `--shards N` prints a line per shard before `controller on`


def _serve(argv: list[str], cwd: Path, env: dict[str, str]) -> str:
    """Run a background command until it says ``controller on``, then SIGTERM it."""
    argv = [re.sub(r"tcp://127\.0\.0\.1:\d+", f"tcp://127.0.0.1:{_free_port()}", a) for a in argv]
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        head: list[str] = []
        while len(head) < _SERVE_HEAD_LINES and not head[-1:] == [""]:
            head.append(proc.stdout.readline())
            if head[-1].startswith("controller on "):
                break
        line = head[-1]
        if not line.startswith("controller on "):  # stop it before reading its stderr (else: a hang)
            proc.kill()
            assert False, f"{argv}: {''.join(head)}{proc.communicate(timeout=30)[1]}"
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
        err = proc.stderr.read()
        assert rc == 0 and "Traceback" not in err, f"{argv}: exit {rc}\n{err}"
        return line.strip()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


@pytest.mark.slow_install
def test_every_readme_command_after_a_wheel_install(tmp_path):
    bindir = fresh_install(build_wheel(tmp_path / "dist"), tmp_path / "venv")
    work = tmp_path / "work"
    work.mkdir()
    env = clean_env(PATH=f"{bindir}:{clean_env()['PATH']}")
    where = subprocess.run([str(bindir / "python"), "-c", "import mccl_opt; print(mccl_opt.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(tmp_path / "venv")), f"not the installed wheel: {where}"
    commands = readme_commands((ROOT / "README.md").read_text())
    assert len(commands) >= 15 and commands[0].startswith("mccl warmup")
    timings = []
    for line in commands:
        argv, background = runnable(line)
        for arg in argv:
            if arg in INPUTS and not (work / arg).exists():
                (work / arg).write_text(json.dumps(INPUTS[arg]))
        argv = [str(bindir / "mccl")] + argv[1:]
        start = time.perf_counter()
        if background:
            _serve(argv, work, env)
        else:
            done = subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True,
                                  timeout=900)
            assert done.returncode == 0 and "Traceback" not in done.stderr, \
                f"{line}\nexit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        timings.append((time.perf_counter() - start, " ".join(runnable(line)[0])))
    print("\nwall s  README command (installed wheel, outside the checkout)")
    for seconds, cmd in timings:
        print(f"{seconds:6.1f}  {cmd}")
