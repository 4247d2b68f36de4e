"""Hostile input, files and options: devices, FIFOs and symlinks to them as topology,
schedule, ``--warm``, state, version or key file; generator shapes too large to build;
numbers beyond every range; capacities and rates no fabric has.  Each must end at once
in one typed error (exit status 2, an ``error:`` line, no traceback), never in a hang,
a MemoryError or a silent acceptance."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mccl_opt.cli import main
from mccl_opt.errors import MCCLError, TopologyError
from mccl_opt.files import read_bounded
from mccl_opt.topology import Topology
from mccl_runtime.protocol import load_key
from mccl_runtime.state import load_state, versions_dir
from tests.test_runtime_manager import TOPO

ROOT = Path(__file__).resolve().parents[1]
TOPO_FILE = str(ROOT / "instances" / "data" / "hpn-1x2x4.json")


def _cli(capsys, *argv: str) -> tuple[int, str]:
    """``mccl ARGV`` in this process: (exit status, stderr); argparse's exits included."""
    t0 = time.monotonic()
    try:
        rc = main(list(argv))
    except SystemExit as exc:
        rc = exc.code
    assert time.monotonic() - t0 < 30, f"mccl {' '.join(argv)} took {time.monotonic() - t0:.0f} s"
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return rc, err


@pytest.fixture()
def hostile(tmp_path) -> dict[str, str]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "zero.json"
    link.symlink_to("/dev/zero")
    return {"device": "/dev/zero", "fifo": str(fifo), "symlink": str(link), "folder": str(tmp_path)}


@pytest.mark.parametrize("kind", ["device", "fifo", "symlink", "folder"])
def test_non_regular_files_are_refused_at_once_by_every_reader(capsys, hostile, kind, tmp_path):
    bad = hostile[kind]
    sched = tmp_path / "s.json"
    assert _cli(capsys, "solve", "allgather", TOPO_FILE, "-o", str(sched))[0] == 0
    for argv in (("topo", "show", bad), ("check", TOPO_FILE, bad),
                 ("solve", "allgather", TOPO_FILE, "--warm", bad),
                 ("export", "msccl", bad, "-o", str(tmp_path / "x.xml"))):
        rc, err = _cli(capsys, *argv)
        assert rc == 2 and err.startswith("error:") and ("regular file" in err or "not a topology" in err
                                                         or "neither" in err), (argv, err)
    with pytest.raises(MCCLError, match="regular file"):
        load_key(bad) if kind != "folder" else read_bounded(bad, MCCLError, "key")


def test_a_fifo_never_blocks_a_reader(hostile):
    """In a child process (a blocking open would hang it): refused in well under a second."""
    code = (f"from mccl_opt.files import read_json; from mccl_opt.errors import MCCLError\n"
            f"try:\n    read_json({hostile['fifo']!r}, MCCLError, 'topology')\n"
            f"except MCCLError as e:\n    print('refused', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert out.stdout.startswith("refused") and "regular file" in out.stdout


def test_state_and_version_files_that_are_devices_are_refused(tmp_path):
    state = tmp_path / "state.json"
    state.symlink_to("/dev/zero")
    with pytest.raises(MCCLError, match="regular file"):
        load_state(state, TOPO)
    state.unlink()
    from tests.test_runtime_service import Server, settled

    with Server(state_path=state) as svc:
        svc.register("w", "ag", "allgather", 0.0)
        assert settled(svc)
    data = json.loads(state.read_text())
    name = data["manager"]["collectives"][0]["schedule"]["file"]
    (versions_dir(state) / name).unlink()
    (versions_dir(state) / name).symlink_to("/dev/zero")
    with pytest.raises(MCCLError, match="regular file|is a symlink"):      # a symlink: refused since the fifth pass
        load_state(state, TOPO)


@pytest.mark.parametrize("rate, words", [(1e308, "more than any fabric carries"), (1e9, "total capacity")])
def test_a_version_file_with_an_impossible_rate_is_refused(tmp_path, rate, words):
    """1e308 is refused by every schedule reader; 1e9 Gbps, a rate some fabric could carry,
    by the state's check against this fabric's total capacity."""
    import hashlib

    from tests.test_runtime_service import Server, settled

    state = tmp_path / "state.json"
    with Server(state_path=state) as svc:
        svc.register("w", "ag", "allgather", 0.0)
        assert settled(svc)
    data = json.loads(state.read_text())
    ref = data["manager"]["collectives"][0]["schedule"]
    content = json.loads((versions_dir(state) / ref["file"]).read_text())
    content["schedule"]["rate_gbps"] = content["schedule"]["lp_rate_gbps"] = rate
    raw = json.dumps(content).encode()
    ref["file"] = hashlib.sha256(raw).hexdigest() + ".json"
    (versions_dir(state) / ref["file"]).write_bytes(raw)
    state.write_text(json.dumps(data))
    with pytest.raises(MCCLError, match=words):
        load_state(state, TOPO)


@pytest.mark.parametrize("argv", [
    ("topo", "hpn", "100000x100000x100000"), ("topo", "mesh", "20000"), ("topo", "ring", "2000000"),
    ("topo", "dgx", "--gpus", "1000000", "--nvswitches", "8"),
    ("topo", "irregular", "--seed", "1", "--max-hosts", "100000", "--max-gpus-per-host", "100")])
def test_generators_refuse_huge_shapes_before_allocating(capsys, argv):
    t0 = time.monotonic()
    rc, err = _cli(capsys, *argv)
    assert rc == 2 and "links; at most" in err and time.monotonic() - t0 < 5


def test_solving_a_huge_generated_name_is_refused_up_front(capsys):
    rc, err = _cli(capsys, "solve", "allgather", "hpn-100000x1000x8")
    assert rc == 2 and "links; at most" in err


@pytest.mark.parametrize("argv", [
    ("solve", "allgather", TOPO_FILE, "--max-chunks", str(2 ** 64)),
    ("solve", "alltoall", TOPO_FILE, "--max-chunks", "1" + "0" * 400),
    ("solve", "alltoall", TOPO_FILE, "--max-steps", str(2 ** 64)),
    ("solve", "alltoall", TOPO_FILE, "--time-limit", "1e400"),
    ("solve", "allgather", TOPO_FILE, "--backend", "bogus"),
    ("solve", "alltoall", TOPO_FILE, "--backend", "bogus"),
    ("eval", TOPO_FILE, "-e", "1180591620717411303424"),
    ("eval", TOPO_FILE, "-e", "1" + "0" * 400 + "G"),
    ("eval", TOPO_FILE, "-f", "1"),                           # checked after parsing
    ("eval", TOPO_FILE, "--backend", "bogus"),
    ("warmup", "--backend", "bogus"),
    ("bench", "--max-chunks", str(2 ** 64)),
])
def test_numeric_and_named_options_are_range_checked(capsys, argv):
    rc, err = _cli(capsys, *argv)
    assert rc == 2 and "error" in err, err


def test_export_refuses_a_byte_size_beyond_any_buffer(capsys, tmp_path):
    sched = tmp_path / "s.json"
    assert _cli(capsys, "solve", "allgather", TOPO_FILE, "-o", str(sched))[0] == 0
    for size in (str(2 ** 70), "2000T"):
        rc, err = _cli(capsys, "export", "msccl", str(sched), "-o", str(tmp_path / "x.xml"), "--max-bytes", size)
        assert rc == 2 and "at most" in err and not (tmp_path / "x.xml").exists()


@pytest.mark.parametrize("cap", [1e-320, 5e-324, 1e-7, 1e13, 1e308])
def test_capacities_no_fabric_has_are_refused_at_load(capsys, tmp_path, cap):
    data = json.loads(Path(TOPO_FILE).read_text())
    data["links"][0]["capacity_gbps"] = cap
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(TopologyError, match="capacity_gbps"):
        Topology.load(bad)
    for argv in (("topo", "show", str(bad)), ("solve", "allgather", str(bad)), ("solve", "alltoall", str(bad))):
        rc, err = _cli(capsys, *argv)
        assert rc == 2 and "capacity_gbps" in err


def test_a_schedule_file_whose_rate_beats_its_lp_bound_is_refused_everywhere(capsys, tmp_path):
    sched = tmp_path / "s.json"
    assert _cli(capsys, "solve", "allgather", TOPO_FILE, "-o", str(sched))[0] == 0
    d = json.loads(sched.read_text())
    for rate, lp in ((d["lp_rate_gbps"] * 2, d["lp_rate_gbps"]), (-1.0, 1.0)):
        d["rate_gbps"], d["lp_rate_gbps"] = rate, lp
        sched.write_text(json.dumps(d))
        for argv in (("check", TOPO_FILE, str(sched)), ("solve", "allgather", TOPO_FILE, "--warm", str(sched)),
                     ("export", "msccl", str(sched), "-o", str(tmp_path / "x.xml"))):
            rc, err = _cli(capsys, *argv)
            assert rc == 2 and "lp_rate_gbps" in err, (argv, err)


@pytest.mark.parametrize("argv", [
    # mccl loop's built-in case: each of these ran (a hang, an OverflowError or a numpy
    # ValueError traceback, or a silent NaN) before the flags were range-checked
    ("loop", "--t1-ms", "nan"), ("loop", "--t1-ms", "1e400"), ("loop", "--t1-ms", "10"),
    ("loop", "--size-mib", "1e300"), ("loop", "--duration-ms", "1e300"), ("loop", "--seed", "-1"),
    ("loop", "--probe-period-ms", "nan"), ("loop", "--oob-ms", "-1"), ("loop", "--oob-ms", "nan"),
    ("loop", "--pieces", "nan"),
    ("controller", "frontend", "--topology", TOPO_FILE, "--upstream", "ipc:///nonexistent/x", "--id", "-1"),
    ("controller", "frontend", "--topology", TOPO_FILE, "--upstream", "ipc:///nonexistent/x", "--id", str(1 << 30)),
    ("controller", "frontend", "--topology", TOPO_FILE, "--upstream", "ipc:///nonexistent/x", "--interval", "nan"),
    ("controller", "serve", "--topology", TOPO_FILE, "--shards", str(2 ** 64)),
    ("controller", "serve", "--topology", TOPO_FILE, "--frontends", "-1"),
    ("controller", "serve", "--topology", TOPO_FILE, "--synthesis", "ray://"),
    ("train", "--model", "llama3-405b", "--gpus", "1e400"),
    ("train", "--model", "llama3-405b", "--gpus", "12800000000"),
    ("bench", "--repeat", str(10 ** 20)),                 # ran until killed
    ("bench", "--suite", "lp", "--time-limit", "nan"),    # ran unlimited
    ("bench", "--suite", "lp", "--time-limit", "-1"),     # a GurobiError traceback
])
def test_new_commands_range_check_their_numbers_up_front(capsys, argv):
    t0 = time.monotonic()
    rc, err = _cli(capsys, *argv)
    assert rc == 2 and "error" in err, err
    assert time.monotonic() - t0 < 5                  # refused before any fabric, socket or solve


def test_export_mscclpp_bounds_gpus_per_node(capsys, tmp_path):
    sched = tmp_path / "s.json"
    assert _cli(capsys, "solve", "allgather", TOPO_FILE, "-o", str(sched))[0] == 0
    rc, err = _cli(capsys, "export", "mscclpp", str(sched), "-o", str(tmp_path / "p.json"),
                   "--gpus-per-node", str(10 ** 23))
    assert rc == 2 and "gpus-per-node" in err and not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("field, value, words", [
    ("duration_ms", 1e300, "duration_ms"), ("message_bytes", 1e300, "message_bytes"),
    ("seed", -1, "seed"), ("seed", 2 ** 64, "seed")])
def test_scenario_files_are_held_to_the_same_bounds(field, value, words):
    from mccl_runtime.scenario import ScenarioError, parse_scenario

    data = {"format": "mccl-scenario/1", "topology": TOPO.to_dict(), "collective": "allgather",
            "message_bytes": 1 << 20, "duration_ms": 100, field: value}
    with pytest.raises(ScenarioError, match=words):
        parse_scenario(data)


@pytest.mark.parametrize("collective", ["allgather", "alltoall"])
@pytest.mark.parametrize("edit", ["duplicate", "stranger", "nan", "negative", "string"])
def test_exports_refuse_a_schedule_that_is_not_one_on_the_fabric(capsys, tmp_path, collective, edit):
    """``export teccl-flows --topology`` wrote a schedule with a repeated GPU, and one
    naming a GPU the fabric lacks ended in a KeyError traceback; ``export forestcoll``
    wrote a repeated GPU.  Every exporter now checks the schedule first."""
    sched = tmp_path / "s.json"
    assert _cli(capsys, "solve", collective, TOPO_FILE, "-o", str(sched))[0] == 0
    data = json.loads(sched.read_text())
    gpus = data["gpus"]
    data.update({"duplicate": {"gpus": gpus[:-1] + gpus[:1]}, "stranger": {"gpus": gpus[:-1] + ["zz"]},
                 "nan": {"rate_gbps": math.nan}, "negative": {"rate_gbps": -1.0},
                 "string": {"rate_gbps": "400"}}[edit])
    sched.write_text(json.dumps(data))
    argvs = [("export", "teccl-flows", str(sched), "--topology", TOPO_FILE, "-o", str(tmp_path / "f.json"))]
    if collective == "allgather" and edit != "stranger":      # a renamed GPU is a schedule on its own paths
        argvs.append(("export", "forestcoll", str(sched), "-o", str(tmp_path / "f.xml")))
    for argv in argvs:
        rc, err = _cli(capsys, *argv)
        assert rc == 2 and err.startswith("error:"), (argv, err)
        assert not Path(argv[-1]).exists()


@pytest.mark.parametrize("option", [("--pieces", "1000000"), ("--pieces", str(10 ** 20)), ("--block-kib", "1e400"),
                                    ("--block-kib", "99999999999"), ("--max-real-s", "nan"),
                                    ("--max-real-s", "1e400"), ("--collective-ms", "inf")])
def test_loop_on_gloo_ranks_range_checks_before_launching(capsys, tmp_path, option):
    """``--pieces 1000000`` and a NaN or infinite ``--max-real-s`` ran until killed,
    ``--block-kib 1e400`` ended in a ValueError traceback."""
    pytest.importorskip("torch")
    scn = tmp_path / "s.json"
    scn.write_text(json.dumps({"format": "mccl-scenario/1", "topology": TOPO_FILE, "collective": "allgather",
                               "message_bytes": 1 << 20, "duration_ms": 100, "events": []}))
    t0 = time.monotonic()
    rc, err = _cli(capsys, "loop", "--executor", "gloo", "--scenario", str(scn), *option)
    assert rc == 2 and option[0] in err and time.monotonic() - t0 < 20, err


def _bomb(path: Path, inflated: int) -> None:
    """A gzip file of ``inflated`` zero bytes (about a thousandth of that on disk)."""
    import zlib
    deflate, block = zlib.compressobj(9, zlib.DEFLATED, 31), bytes(1 << 20)
    with open(path, "wb") as f:
        for _ in range(inflated >> 20):
            f.write(deflate.compress(block))
        f.write(deflate.flush())


def test_a_gzip_bomb_is_refused_at_the_cap_without_inflating_it(capsys, monkeypatch, tmp_path):
    """A 256 MiB bomb (256 KiB on disk) against an 8 MiB cap: refused with a message naming
    the cap, and inflating it costs about the cap, not the bomb (a reader that inflates the
    whole member before checking peaks at 256 MiB)."""
    import tracemalloc

    import mccl_opt.files as files
    bomb = tmp_path / "bomb.json.gz"
    _bomb(bomb, 256 << 20)
    assert bomb.stat().st_size < 1 << 20
    monkeypatch.setattr(files, "MAX_JSON_BYTES", 8 << 20)
    tracemalloc.start()
    try:
        with pytest.raises(TopologyError, match="decompresses to more than 8 MiB.*gzip bomb"):
            Topology.load(bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 << 20, f"peak {peak >> 20} MiB while refusing an 8 MiB-capped bomb"
    rc, err = _cli(capsys, "topo", "show", str(bomb))
    assert rc == 2 and "gzip bomb" in err


def test_gzip_members_padding_and_junk_after_a_member(tmp_path):
    """Concatenated gzip members are one file (as ``gzip -c a b`` writes); zero padding
    after the last member is ignored; anything else after it is damage, not ignored."""
    import gzip
    text = json.dumps(TOPO.to_dict()).encode()
    half = len(text) // 2
    f = tmp_path / "t.json.gz"
    f.write_bytes(gzip.compress(text[:half]) + gzip.compress(text[half:]) + bytes(512))
    assert Topology.load(f).to_dict() == TOPO.to_dict()
    f.write_bytes(gzip.compress(text) + b"junk")
    with pytest.raises(TopologyError, match="damaged gzip"):
        Topology.load(f)
