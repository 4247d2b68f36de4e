"""The ``mccl`` CLI: topo, check, demo, error handling."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mccl_opt import Topology
from mccl_opt.cli import main


def test_topo_hpn_writes_file_and_prints_table(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["topo", "hpn", "1x2x8", "--fail", "fail2", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "hpn-1x2x8-fail2: 16 GPUs, 10 switches, 64 directed links" in text
    assert Topology.load(out).link("s0h0g0", "s0tor0").capacity_gbps == 50.0


def test_topo_show_json(tmp_path, capsys):
    out = tmp_path / "t.json"
    main(["topo", "hpn", "1x2x4", "-o", str(out)])
    capsys.readouterr()
    assert main(["topo", "show", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (info["gpus"], info["switches"], info["links"]) == (8, 6, 32)


def test_errors_print_message_and_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert main(["topo", "show", str(bad)]) == 2
    assert "error:" in capsys.readouterr().err
    assert main(["topo", "hpn", "1x2"]) == 2
    assert main(["check", str(bad), str(bad)]) == 2


def test_check_accepts_a_valid_schedule_and_rejects_a_broken_one(tmp_path, capsys):
    from instances import full_mesh
    from tests.test_schedule_validate import direct_alltoall

    topo = full_mesh(3)
    tpath, spath = tmp_path / "t.json", tmp_path / "s.json"
    topo.save(tpath)
    sched = direct_alltoall(topo, 2)
    sched.save(spath)
    assert main(["check", str(tpath), str(spath), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["valid"] is True
    d = sched.to_dict(compact=False)
    d["chunks"] = d["chunks"][1:]
    spath.write_text(json.dumps(d))
    assert main(["check", str(tpath), str(spath)]) == 2
    assert "shares sum to 0.5" in capsys.readouterr().err


def test_console_script_and_module_help_run():
    script = Path(sys.executable).with_name("mccl")
    for cmd in ([str(script), "--help"], [sys.executable, "-m", "mccl_opt.cli", "--help"]):
        res = subprocess.run(cmd, capture_output=True, text=True)
        assert res.returncode == 0 and "topo" in res.stdout


@pytest.mark.parametrize("argv", [["topo", "--help"], ["check", "--help"], ["topo", "hpn", "--help"]])
def test_subcommand_help(argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0


def test_topology_argument_reads_files_library_names_and_hpn_names(tmp_path):
    from mccl_opt.cli._inputs import load_topology
    from mccl_opt.errors import TopologyError

    assert load_topology("hpn-1x2x8-fail2").name == "hpn-1x2x8-fail2"
    big = load_topology("hpn-2x4x8-fail1")                # not shipped: generated
    healthy = load_topology("hpn-2x4x8")
    assert big.num_gpus == 64
    assert sum(l.capacity_gbps for l in big.links) < sum(l.capacity_gbps for l in healthy.links)
    path = tmp_path / "t.json"
    big.save(path)
    assert load_topology(str(path)).num_links == big.num_links
    with pytest.raises(TopologyError, match="neither a topology file"):
        load_topology("hpn-2x4")


@pytest.mark.parametrize("text,want", [("512", 512), ("1K", 1024), ("4m", 4 << 20),
                                       ("1G", 1 << 30), ("1.5MiB", 3 << 19), ("2KB", 2048)])
def test_byte_sizes_take_binary_suffixes(text, want):
    from mccl_opt.cli._inputs import format_bytes, parse_bytes

    assert parse_bytes(text) == want
    assert parse_bytes(format_bytes(want)) == want


@pytest.mark.parametrize("bad", ["0", "-1K", "1.5", "1e9", "nan", "K", "1X"])
def test_bad_byte_sizes_are_refused(bad):
    from mccl_opt.cli._inputs import parse_bytes
    from mccl_opt.errors import MCCLError

    with pytest.raises(MCCLError, match="size"):
        parse_bytes(bad)


@pytest.mark.parametrize("argv", [["topo", "ring", "0"], ["topo", "ring", "1.5"],
                                  ["topo", "mesh", "4", "--gbps", "nan"],
                                  ["topo", "irregular", "--seed", "1", "--degrade-prob", "2"],
                                  ["solve", "allgather", "hpn-1x2x4", "--max-chunks", "0"],
                                  ["solve", "alltoall", "hpn-1x2x4", "--time-limit", "inf"]])
def test_bad_numbers_are_usage_errors_naming_what_is_expected(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2 and "expected" in capsys.readouterr().err
