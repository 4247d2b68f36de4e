"""Hostile input, third pass (issue 27): cases beyond tests/test_hostile_*.py, each found
failing on the code of 2026-12-05 and fixed (docs/runtime.md, "Hostile-input audit, third
pass").  Every one must end in one typed error (exit status 2, an ``error:`` line, no
traceback), never in a hang, a crash of the controller's loop or a silent acceptance."""

from __future__ import annotations

import gzip
import json
import re
import time
from pathlib import Path

import pytest

import mccl_opt as mo
from mccl_opt.cli import main
from mccl_opt.errors import ScheduleError, SolveError, TopologyError
from mccl_opt.interop.nccl_xml import parse_nccl_xml
from mccl_opt.interop.nvidia_smi import MAX_DEVICES, parse_nvidia_smi
from mccl_runtime.client import ControllerClient
from mccl_runtime.protocol import ProtocolError
from tests.test_runtime_manager import TOPO, _cable, _manager

ROOT = Path(__file__).resolve().parents[1]
TOPO_FILE = str(ROOT / "instances" / "data" / "hpn-1x2x4.json")


def _cli(capsys, *argv: str) -> tuple[int, str]:
    """``mccl ARGV`` in this process: (exit status, stderr without log lines)."""
    try:
        rc = main(list(argv))
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, "\n".join(line for line in err.splitlines() if " WARNING " not in line)


# ------------------------------------------------------------------ controller options
@pytest.mark.parametrize("argv, words", [
    (("--frontends", "2"), "--frontends needs --estimator ewma"),                  # the default: level
    (("--frontends", "2", "--estimator", "level"), "needs every sample"),
    (("--bind", "tcp://127.0.0.1:70000"), "--bind .*port must be a number in \\[0, 65535\\]"),
    (("--bind", "tcp://127.0.0.1:-1"), "--bind .*port"),
    (("--bind", "tcp://127.0.0.1:abc"), "--bind .*port"),
    (("--bind", "tcp://127.0.0.1"), "--bind .*port"),
    (("--bind", "tcp://127.0.0.1:65530", "--shards", "8"), "plus 7 for the last process"),
    (("--pub-bind", "tcp://127.0.0.1:99999"), "--pub-bind .*port"),
    (("--frontends", "2", "--estimator", "ewma", "--frontend-bind", "tcp://127.0.0.1:65535"),
     "--frontend-bind .*plus 1"),
])
def test_controller_serve_refuses_what_it_cannot_run_before_starting(capsys, argv, words):
    """``--frontends`` with the change-point estimator started the controller, failed its
    front ends and exited 0; port 70000 bound port 4464 (ZeroMQ wraps it), -1 port 65535."""
    t0 = time.monotonic()
    rc, err = _cli(capsys, "controller", "serve", "--topology", TOPO_FILE, *argv)
    assert rc == 2 and err.count("error:") == 1, err
    assert re.search(words, err), err
    assert time.monotonic() - t0 < 10.0                 # refused before anything is started


@pytest.mark.parametrize("upstream", ["bogus://x", "tcp://nohost", "", "tcp://127.0.0.1:99999"])
def test_a_front_end_with_an_upstream_zeromq_refuses_is_a_typed_error(capsys, upstream):
    """A ``ZMQError`` traceback before; a port out of range waited 2 s for no reply."""
    t0 = time.monotonic()
    rc, err = _cli(capsys, "controller", "frontend", "--topology", TOPO_FILE, "--upstream", upstream)
    assert rc == 2 and "error:" in err and "ZMQError" not in err
    assert time.monotonic() - t0 < 1.5
    rc, err = _cli(capsys, "controller", "frontend", "--topology", TOPO_FILE, "--upstream", "tcp://127.0.0.1:1",
                   "--bind", "tcp://127.0.0.1:70000")
    assert rc == 2 and "port must be a number" in err


@pytest.mark.parametrize("endpoint", ["bogus://x", "tcp://nohost", "tcp://127.0.0.1:65536"])
def test_a_client_on_an_endpoint_zeromq_refuses_raises_bad_endpoint(endpoint):
    with pytest.raises(ProtocolError) as err:
        ControllerClient(endpoint, timeout_s=0.5)
    assert err.value.reason == "bad_endpoint" and endpoint in str(err.value)


# ------------------------------------------------------------------ synthesis jobs
@pytest.mark.parametrize("synth, words", [
    (lambda *a: None, "returned NoneType, not a schedule"),
    (lambda *a: "schedule", "returned str, not a schedule"),
    (lambda *a: {}["k"], "raised KeyError"),
])
def test_a_synthesizer_returning_garbage_or_raising_fails_its_job_not_the_manager(synth, words):
    """Each raised an AttributeError or KeyError out of ``ScheduleManager.poll`` (the
    controller's decision loop); now the job is ``failed`` and version 1 stays."""
    store, mgr = _manager(synth)
    try:
        store.ingest(_cable("s0h0g0", "s0tor0", 50.0, 1.0), now=1.0)
        mgr.step(1.0)
        events = mgr.poll(1.0, wait_s=5.0)
        assert [e.action for e in events] == ["failed"] and words in events[0].detail["error"]
        assert mgr.get("world", "ag").version == 1 and mgr.counters["failures"] == 1
    finally:
        mgr.close()


def garbage_factory():
    """A worker's synthesizer that returns no schedule (module level: workers import it)."""
    return lambda kind, topo, warm, time_limit_s: ["not", "a", "schedule"]


def test_a_worker_process_returning_a_malformed_result_is_a_solve_error():
    from concurrent.futures import Future

    import numpy as np

    from mccl_runtime.pool import SynthesisPool, job_result
    pool = SynthesisPool(TOPO, garbage_factory, workers=1)
    try:
        future = pool.submit("allgather", np.asarray(TOPO.arrays.capacity, dtype=float), None, None)
        with pytest.raises(SolveError, match="returned list, not a schedule"):
            job_result(future)
    finally:
        pool.shutdown()
    odd: Future = Future()
    odd.set_result(("schedule", 1.0, None))                   # a result of the wrong shape
    with pytest.raises(SolveError, match="not \\(schedule, seconds, profile\\)"):
        job_result(odd)


# ------------------------------------------------------------------ importers
def _smi(devices: list[str], rel: str = "NV1") -> str:
    head = "\t" + "\t".join(devices) + "\tCPU Affinity\tNUMA Affinity\n"
    return head + "".join(d + "\t" + "\t".join("X" if e == d else rel for e in devices) + "\t0-1\t0\n"
                          for d in devices)


@pytest.mark.parametrize("text, words", [
    (_smi(["GPU0", "GPU0", "GPU1"]), "GPU0 appears twice"),
    ("\tGPU0\tGPU1\nGPU0\tNV1\tX\nGPU1\tX\tNV1\n", "X in its own column"),
    ("\tGPU0\tGPU1\nGPU0\tX\tNV2\nGPU1\tNV1\tX\n", "symmetric"),
    (_smi(["GPU0", "GPU1"], "NV0"), "1 to 18 NVLinks"),
    (_smi(["GPU0", "GPU1"], "NV99999999999999999999"), "1 to 18 NVLinks"),
    (_smi([f"GPU{i}" for i in range(MAX_DEVICES + 1)], "SYS"), "1025 devices"),
])
def test_nvidia_smi_matrices_no_nvidia_smi_prints_are_refused(text, words):
    """All were read (a repeated device made 5 nodes of 3 columns; 2000 devices took 3 s)."""
    t0 = time.monotonic()
    with pytest.raises(TopologyError, match=words):
        parse_nvidia_smi(text, "h")
    assert time.monotonic() - t0 < 2.0


_GPU = ('<pci busid="{b}" class="0x030000" link_speed="16.0 GT/s PCIe" link_width="16">'
        '<gpu dev="{d}" sm="90"/></pci>')


@pytest.mark.parametrize("xml, words", [
    ('<system><cpu numaid="0">' + _GPU.format(b="0000:01:00.0", d=0) + _GPU.format(b="0000:01:00.0", d=1)
     + "</cpu></system>", "two GPUs share a PCI busid"),
    ('<system><cpu numaid="0">' + _GPU.format(b="0000:01:00.0", d=0) + '</cpu><cpu numaid="0">'
     + _GPU.format(b="0000:02:00.0", d=1) + "</cpu></system>", "two <cpu> elements share a numaid"),
    ('<system><cpu numaid="0">' + _GPU.format(b="0000:01:00.0", d=0) + "</cpu>"
     + _GPU.format(b="0000:02:00.0", d=1) + "</system>", "'0000:02:00.0' is not under a <cpu>"),
])
def test_nccl_xml_that_names_one_thing_twice_or_nowhere_is_refused_with_what_to_fix(xml, words):
    """Before: a self-loop link ``cpu0 -> cpu0`` or "GPU h0g0 cannot reach h0g1", far from
    the cause."""
    with pytest.raises(TopologyError, match=words):
        parse_nccl_xml(xml)


# ------------------------------------------------------------------ files
def test_a_bomb_behind_a_good_gzip_member_is_refused_too(tmp_path, monkeypatch):
    """The cap counts every member (``gzip -c good bomb``); an empty member is empty
    text, a header alone is truncated."""
    import zlib

    import mccl_opt.files as files
    monkeypatch.setattr(files, "MAX_JSON_BYTES", 4 << 20)
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    bomb = b"".join(deflate.compress(bytes(1 << 20)) for _ in range(16)) + deflate.flush()
    f = tmp_path / "t.json.gz"
    f.write_bytes(gzip.compress(json.dumps(TOPO.to_dict()).encode()) + bomb)
    with pytest.raises(TopologyError, match="decompresses to more than 4 MiB"):
        mo.Topology.load(f)
    f.write_bytes(gzip.compress(b""))
    with pytest.raises(TopologyError, match="malformed JSON"):
        mo.Topology.load(f)
    f.write_bytes(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03")
    with pytest.raises(TopologyError, match="truncated"):
        mo.Topology.load(f)


def test_a_schedule_stating_rate_and_lp_rate_1e308_is_refused_everywhere(capsys, tmp_path):
    """``rate = lp_rate = 1e308`` passed ``rate <= lp_rate`` and was read by ``--warm`` and
    the exports (the second pass left it open); now no reader takes a rate above 1e18 Gbps."""
    sched = tmp_path / "s.json"
    assert _cli(capsys, "solve", "allgather", TOPO_FILE, "-o", str(sched))[0] == 0
    data = json.loads(sched.read_text())
    data["rate_gbps"] = data["lp_rate_gbps"] = 1e308
    sched.write_text(json.dumps(data))
    with pytest.raises(ScheduleError, match="more than any fabric carries"):
        mo.Schedule.load(sched)
    for argv in (("check", TOPO_FILE, str(sched)), ("solve", "allgather", TOPO_FILE, "--warm", str(sched)),
                 ("export", "msccl", str(sched), "-o", str(tmp_path / "x.xml"))):
        rc, err = _cli(capsys, *argv)
        assert rc == 2 and "more than any fabric carries" in err, (argv, err)
    assert not (tmp_path / "x.xml").exists()


@pytest.mark.parametrize("edit", ["topology", "schedule", "state"])
def test_a_key_twice_in_one_object_is_refused_by_every_file_reader(capsys, tmp_path, edit):
    """Python's ``json`` kept the last value of a repeated key silently: a hand-edited
    ``"capacity_gbps"`` written twice loaded as whichever came last."""
    from mccl_runtime.state import load_state
    from tests.test_runtime_service import Server, settled

    if edit == "topology":
        text = json.dumps(TOPO.to_dict())
        f = tmp_path / "t.json"
        f.write_text(text.replace('"capacity_gbps": ', '"capacity_gbps": 1, "capacity_gbps": ', 1))
        with pytest.raises(TopologyError, match="'capacity_gbps' appears twice"):
            mo.Topology.load(f)
        rc, err = _cli(capsys, "topo", "show", str(f))
        assert rc == 2 and "appears twice" in err
    elif edit == "schedule":
        f = tmp_path / "s.json"
        mo.solve_allgather(TOPO).save(f)
        f.write_text(f.read_text().replace('"rate_gbps":', '"rate_gbps":1,"rate_gbps":', 1))
        with pytest.raises(ScheduleError, match="'rate_gbps' appears twice"):
            mo.Schedule.load(f)
    else:
        state = tmp_path / "state.json"
        with Server(state_path=state) as svc:
            svc.register("w", "ag", "allgather", 0.0)
            assert settled(svc)
        state.write_text(state.read_text().replace('"format":', '"format":"x","format":', 1))
        with pytest.raises(mo.MCCLError, match="'format' appears twice"):
            load_state(state, TOPO)


@pytest.mark.parametrize("reader, data, words", [
    ("teccl", {"capacity": [[False, True], [True, False]]}, "true/false"),
    ("teccl", {"capacity": [[5, 1], [1, 0]]}, "capacity\\[0\\]\\[0\\] = 5: a node has no link to itself"),
    ("taccl", {"links": [[1, 1], [1, 0]], "invbws": [[1, 1], [1, 1]]}, "links\\[0\\]\\[0\\] = 1: a node has no link"),
    ("teccl", {"capacity": [[0] * 4097] * 4097}, "4097 rows; a matrix of at most 4096 nodes"),
])
def test_capacity_matrices_with_booleans_self_links_or_no_end_are_refused(reader, data, words):
    """``true`` read as capacity 1 (8 Gbps), a diagonal entry was dropped silently, and a
    dense matrix had no size limit (3000 nodes: 9 million cells, 4 s)."""
    from mccl_opt.interop.capacity_matrix import from_taccl, from_teccl
    with pytest.raises(TopologyError, match=words):
        (from_teccl if reader == "teccl" else from_taccl)(data)


@pytest.mark.parametrize("edit, words", [
    (lambda d: d.update(graph={"name": {"a": 1}}), "'name' must be a string"),
    (lambda d: d["links"][0].update(latency_us=1e300), "latency_us must be a finite number in \\[0, 1e\\+06\\]"),
])
def test_a_networkx_graph_with_an_object_name_or_a_latency_of_eons_is_refused(capsys, tmp_path, edit, words):
    """The name was taken as its ``str()``; a 1e300 µs latency was read and evaluated."""
    data = {"directed": True, "multigraph": False, "graph": {}, "nodes": [{"id": 0}, {"id": 1}],
            "links": [{"source": 0, "target": 1, "capacity": 10}, {"source": 1, "target": 0, "capacity": 10}]}
    edit(data)
    f = tmp_path / "g.json"
    f.write_text(json.dumps(data))
    rc, err = _cli(capsys, "topo", "networkx", str(f), "-o", str(tmp_path / "t.json"))
    assert rc == 2 and re.search(words, err), err
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("edit, words", [
    (('i_chunks="1"', 'i_chunks="10000000000"'), "at most 4194304 chunks"),
    (('s_chunks="0"', 's_chunks="300000000"'), "at most 4194304 chunks"),
    (('s_chunks="0"', 's_chunks="-1"'), "each >= 0"),
    (('ngpus="8"', 'ngpus="10000000"'), "ngpus=10000000 but 8 <gpu> elements"),
    (('<gpu id="0"', '<gpu id="\u0660"'), "'id' must be an integer"),          # an Arabic-Indic zero
])
def test_msccl_xml_declaring_huge_buffers_or_odd_digits_is_refused_before_allocating(capsys, tmp_path, edit, words):
    """``mccl check T algo.xml`` with ``i_chunks="10000000000"`` built a label per chunk
    and was killed at 23.7 GB; ``ngpus`` was compared after building ``range(ngpus)``;
    ``int()`` took any script's digits."""
    sched, xml = tmp_path / "s.json", tmp_path / "a.xml"
    assert _cli(capsys, "solve", "allgather", TOPO_FILE, "-o", str(sched))[0] == 0
    assert _cli(capsys, "export", "msccl", str(sched), "-o", str(xml))[0] == 0
    text = xml.read_text()
    assert edit[0] in text
    xml.write_text(text.replace(*edit, 1))
    t0 = time.monotonic()
    rc, err = _cli(capsys, "check", TOPO_FILE, str(xml))
    assert rc == 2 and words in err, err
    assert time.monotonic() - t0 < 5.0


@pytest.mark.parametrize("k", ["abc", "1e3", "\u0661"])
def test_forestcoll_trees_with_a_k_that_is_no_whole_number_are_refused(k):
    """``<trees k="abc">`` ended in a ValueError traceback; ``int()`` read "١" as 1."""
    from mccl_opt.interop.forestcoll import from_forestcoll_xml
    xml = f'<trees k="{k}">' + "".join(f'<tree root="{g}" nchunks="1"></tree>' for g in TOPO.gpus) + "</trees>"
    with pytest.raises(ScheduleError, match="k must be a whole number"):
        from_forestcoll_xml(xml, TOPO)


@pytest.mark.parametrize("edit, words", [
    ({"collectives": [{"kind": "allgather", "bytes": 1e308, "count": 1e308}]}, "'bytes' must be a positive number at most"),
    ({"collectives": [{"kind": "allgather", "bytes": 1024, "count": 1e308}]}, "'count' must be a positive number at most 1e\\+09"),
    ({"compute_share": False}, "'compute_share' must be a number"),
])
def test_a_workload_profile_with_sizes_beyond_any_run_is_refused(edit, words):
    """``mccl loop --workload``: 1e308 calls of 1e308 bytes made every time infinite and
    the speedup NaN; ``false`` was read as a compute share of 0."""
    from mccl_opt.errors import MCCLError
    from mccl_runtime.workload import load_workload
    profile = {"format": "mccl-workload/1", "compute_share": 0.5,
               "collectives": [{"kind": "allgather", "bytes": 1024, "count": 1}], **edit}
    with pytest.raises(MCCLError, match=words):
        load_workload(profile)
