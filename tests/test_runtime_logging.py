"""Controller logging (``mccl controller serve -v`` / ``--log-level``): one info line per
decision (registration, drift and re-synthesis start, publish with rates and synthesis
seconds, abort, supersede, timeout, failure), debug adds telemetry ingest, warning
(the default) stays quiet."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from mccl_runtime.client import ControllerClient
from mccl_runtime.decision_log import describe
from mccl_runtime.manager import Event
from tests.test_runtime_manager import TOPO
from tests.test_runtime_service import Server, _degraded

ROOT = Path(__file__).resolve().parents[1]


def _wait_version(cli: ControllerClient, version: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while cli.get_schedule("world", "ag")[0] < version:
        assert time.monotonic() < deadline, f"version {version} never published"
        time.sleep(0.02)


def _messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "mccl.controller"]


def test_info_logs_one_line_per_decision(caplog):
    with caplog.at_level(logging.INFO, logger="mccl.controller"):
        with Server() as svc, ControllerClient(svc.endpoint, timeout_s=5.0) as cli:
            cli.register("world", "ag", "allgather")
            _wait_version(cli, 1)
            cli.push_telemetry(_degraded(time.time()))
            _wait_version(cli, 2)
    lines = _messages(caplog)
    assert "registered world/ag (allgather); synthesizing the first schedule" in lines
    first = [m for m in lines if m.startswith("world/ag: published v1")]
    assert len(first) == 1 and "first schedule, synthesis" in first[0]
    drift = [m for m in lines if "re-synthesis started" in m]
    assert len(drift) == 1
    assert drift[0].startswith("world/ag v1: s0h0g0->s0tor0 400 -> 50 Gbps, "
                               "s0tor0->s0h0g0 400 -> 50 Gbps (Algorithm 1: max delta 0.875 > Gamma 0.1")
    second = [m for m in lines if m.startswith("world/ag: published v2")]
    assert len(second) == 1 and " Gbps on the measured fabric, synthesis " in second[0]
    before, after = second[0].split("(rate ")[1].split(" Gbps")[0].split(" -> ")
    assert float(after) > float(before)           # the new schedule avoids the 50 Gbps NIC
    assert not any(m.startswith("telemetry:") for m in lines)     # debug only


def test_debug_adds_ingest_counts_and_warning_is_quiet(caplog):
    with caplog.at_level(logging.DEBUG, logger="mccl.controller"):
        with Server() as svc, ControllerClient(svc.endpoint, timeout_s=5.0) as cli:
            cli.push_telemetry(_degraded(time.time()))
    assert any(m.startswith("telemetry: 2 samples: {'accepted': 2") for m in _messages(caplog))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="mccl.controller"):
        with Server(key=b"0123456789abcdef-test-key") as svc, \
                ControllerClient(svc.endpoint, timeout_s=5.0, key=b"0123456789abcdef-test-key") as cli:
            cli.register("world", "ag", "allgather")
            _wait_version(cli, 1)
    assert _messages(caplog) == []


def test_describe_every_outcome():
    ev = lambda action, detail, v=3: Event(0.0, "w", "ag", action, v, detail)  # noqa: E731
    rates = {"rate_before": 6.25, "rate_after": 44.5, "synth_s": 0.0123}
    assert describe(ev("aborted", {**rates, "reason": "no_gain"})) == \
        "w/ag: re-synthesis aborted (no gain; rate 6.25 -> 44.5 Gbps on the measured fabric, " \
        "synthesis 0.0123 s); keeping v3"
    assert "the drift cleared" in describe(ev("aborted", {**rates, "reason": "cleared"}))
    assert describe(ev("superseded", {**rates, "moved": 0.5})) == \
        "w/ag: re-synthesis superseded (capacities moved 0.5 since it started; synthesis " \
        "0.0123 s); restarting on the latest estimate"
    assert describe(ev("timeout", {"time_limit_s": 60.0})) == \
        "w/ag: re-synthesis abandoned after the 60.0 s time bound; keeping v3"
    assert describe(ev("failed", {"error": "bad"})) == "w/ag: re-synthesis failed (bad); keeping v3"
    assert describe(ev("aborted", {"reason": "no_gain", "bound": 50.0, "rate_before": 50.0})) == \
        "w/ag: no re-synthesis (rate 50 Gbps is at the single-vertex bound 50 Gbps: no schedule can " \
        "gain); keeping v3"
    assert "match a known fabric" in describe(ev("resynthesis", {"flagged": False, "capacity": "known"}))
    assert describe(ev("published", {**rates, "known_fabric": True}, 4)) == \
        "w/ag: published v4 (rate 6.25 -> 44.5 Gbps on the measured fabric, a known fabric's " \
        "schedule reused)"
    gained = describe(ev("resynthesis", {"flagged": False, "max_delta": 0.0, "worst_link": None,
                                         "x_min": 1.0}), 0.1, ["a->b 50 -> 400 Gbps"])
    assert gained == ("w/ag v3: a->b 50 -> 400 Gbps (a link gained capacity above the "
                      "schedule's); re-synthesis started")
    lost = describe(ev("resynthesis", {"flagged": False, "max_delta": 0.07, "worst_link": None, "x_min": 1.0,
                                       "capacity": "lost"}), 0.1, ["a->b 400 -> 356 Gbps"])
    assert lost == ("w/ag v3: a->b 400 -> 356 Gbps (its rate fell below the schedule's synthesis "
                    "capacities, max delta 0.07); re-synthesis started")
    assert describe(ev("held", {"synth_s": 0.0123, "pending": [["a", "b"]]})) == \
        "w/ag: re-synthesis done (synthesis 0.0123 s), held while a->b is still being confirmed; keeping v3"


def test_cli_serve_verbose_logs_decisions(tmp_path):
    """The real command line, with -v and the default ``--kernels eager``: the kernels are
    loaded before the registration and the first job, and these are logged with timestamps
    on stderr; SIGTERM ends it cleanly."""
    topo_file = tmp_path / "t.json"
    TOPO.save(topo_file)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mccl_opt.cli", "controller", "serve", "--estimator", "ewma", "--topology", str(topo_file),
         "--bind", "tcp://127.0.0.1:0", "--collective", "world/ag:allgather", "-v"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        line = proc.stdout.readline()
        assert line.startswith("controller on tcp://127.0.0.1:"), line + proc.stderr.read()
        with ControllerClient(line.split()[2], timeout_s=10.0) as cli:
            _wait_version(cli, 1, 30.0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    loaded = err.index("INFO mccl.controller: synthesizer kernels loaded before serving (")
    registered = err.index("INFO mccl.controller: registered world/ag (allgather)")
    assert loaded < registered < err.index("INFO mccl.controller: world/ag: published v1 (first schedule, synthesis ")


def test_changed_links_names_the_moved_links_and_counts_the_rest():
    from types import SimpleNamespace

    from mccl_runtime.decision_log import changed_links

    old = TOPO.arrays.capacity.astype(float)
    m = old.copy()
    m[[0, 2, 3, 5, 7]] *= [0.5, 0.95, 2.0, 0.1, 0.0]       # link 2 moved 5 %: under Gamma
    coll = SimpleNamespace(synth_capacity=old)
    manager = SimpleNamespace(get=lambda comm, name: coll, topo=TOPO,
                              store=SimpleNamespace(measured=lambda: m))
    out = changed_links(manager, Event(0.0, "w", "ag", "resynthesis", 1, {}), 0.1)
    link = TOPO.links
    assert out[:3] == [f"{link[a].src}->{link[a].dst} {old[a]:.4g} -> {m[a]:.4g} Gbps"
                       for a in (0, 3, 5)]
    assert out[3:] == ["1 more links"]
    coll.synth_capacity = None                                 # no schedule yet
    assert changed_links(manager, Event(0.0, "w", "ag", "resynthesis", 0, {}), 0.1) == []
