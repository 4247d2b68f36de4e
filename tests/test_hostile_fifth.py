"""Hostile input, fifth pass (issue 27): cases that still failed after the fourth pass,
each failing on the code of 2026-12-06 before its fix (docs/runtime.md, "Hostile-input
audit, fifth pass").  Every case ends in one typed error (an error reply, exit status 2
with one ``error:`` line saying what to fix), never in a traceback, a hang, a silent
acceptance or a lost write."""

from __future__ import annotations

import json
import os
import time
import tracemalloc
from pathlib import Path

import pytest

from mccl_opt.errors import MCCLError
from mccl_opt.files import parse_cost, read_json
from tests.test_hostile_third import _cli

ROOT = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------ memory of a parse
@pytest.mark.parametrize("text", [
    "[" + ",".join(f'{{"k{i}":0}}' for i in range(20000)) + "]",      # unique keys: 1.13 times the old estimate
    "[" + "1.5," * 20000 + "0]",                                        # floats: 1.02 times
    '["' + "a" * 200000 + '\U0001f600"]',                               # one astral character: 4 bytes a character
    '["\U0001f600",' + "1e1," * 20000 + "0]",
    "[" + "[[]]," * 20000 + "0]",
    "[" + '{"a":{}},' * 20000 + "0]",
])
def test_the_parse_cost_bounds_the_peak_of_a_parse(tmp_path, text):
    """The fourth pass's estimate was below what some shapes take at their peak (objects
    with unique keys 1.13 times it, floats 1.02 times, a text made 4 bytes a character by
    one emoji 2.3 times), so a file accepted under a limit could take more: measured here
    as :func:`read_json` runs (the bytes, the text and the objects together), the peak is
    at most 0.8 times the estimate."""
    f = tmp_path / "x.json"
    f.write_bytes(text.encode())
    cost = parse_cost(text.encode())
    tracemalloc.start()
    try:
        read_json(f, MCCLError, "test", cost)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert 0.1 * cost < peak <= 0.8 * cost, (peak, cost)


# ------------------------------------------------------------------ the state folder and its files
def _saved_state(folder: Path) -> Path:
    from tests.test_runtime_service import Server

    folder.mkdir(mode=0o700)
    state = folder / "state.json"
    from mccl_runtime.state import versions_dir

    with Server(state_path=state) as svc:
        svc.register("w", "ag", "allgather", 0.0)
        assert svc.manager.wait_idle(10.0)
        deadline = time.monotonic() + 10.0          # the job is done; its version is saved by a later turn
        while not (versions_dir(state).is_dir() and any(versions_dir(state).iterdir())):
            assert time.monotonic() < deadline, "the controller never saved the version"
            time.sleep(0.01)
    return state


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770, 0o720])
def test_a_state_folder_others_can_write_is_refused(capsys, tmp_path, mode):
    """The state file was checked, its folder not: in a folder others can write (``/tmp``,
    a shared project folder, even with the sticky bit) another user can plant a state or
    version folder before the controller's first write.  Refused at start and on load,
    with the ``chmod`` that fixes it; the files are left as they were."""
    from mccl_runtime.state import load_state
    from tests.test_runtime_manager import TOPO

    state = _saved_state(tmp_path / "s")
    before = state.read_bytes()
    state.parent.chmod(mode)
    rc, err = _cli(capsys, "controller", "serve", "--topology", "hpn-1x2x4", "--bind", "tcp://127.0.0.1:0",
                   "--state", str(state))
    assert rc == 2 and err.count("error:") == 1 and "can be written by group or others" in err, err
    assert f"chmod go-w {state.parent}" in err
    with pytest.raises(MCCLError, match="its folder .*chmod go-w"):
        load_state(state, TOPO)
    state.parent.chmod(0o700)
    assert state.read_bytes() == before and load_state(state, TOPO) is not None


@pytest.mark.parametrize("attack", ["version symlink", "version mode", "state mode"])
def test_a_state_file_read_is_the_file_checked(tmp_path, attack):
    """Version files were opened by path after an ``lstat`` check, and read twice (the
    digest, then the parse): a version file symlinked to a copy elsewhere (its digest
    matches) was followed, one writable by others was read.  They are now opened with
    ``O_NOFOLLOW``, checked on the open file, and parsed from the bytes whose digest was
    checked."""
    from mccl_runtime.state import load_state, versions_dir
    from tests.test_runtime_manager import TOPO

    state = _saved_state(tmp_path / "s")
    (version,) = list(versions_dir(state).iterdir())
    if attack == "version symlink":
        elsewhere = tmp_path / "elsewhere.json"
        elsewhere.write_bytes(version.read_bytes())
        version.unlink()
        version.symlink_to(elsewhere)
        words = "is a symlink"
    else:
        target = version if attack == "version mode" else state
        target.chmod(0o646)
        words = "can be written by group or others .*chmod go-w"
    with pytest.raises(MCCLError, match=words):
        load_state(state, TOPO)


def test_a_private_read_refuses_a_symlink_on_the_open(tmp_path):
    """``read_bounded(private=True)`` refuses the link at ``open`` (``O_NOFOLLOW``), so a
    link swapped in after a check is refused as well."""
    from mccl_opt.files import read_bounded

    real = tmp_path / "real.json"
    real.write_text("{}")
    real.chmod(0o600)
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert read_bounded(link, MCCLError, "state") == b"{}"                # followed when not private
    with pytest.raises(MCCLError, match="is a symlink; give the file itself"):
        read_bounded(link, MCCLError, "state", private=True)
    assert read_bounded(real, MCCLError, "state", private=True) == b"{}"


# ------------------------------------------------------------------ XML inputs
_LAUGHS = ('<!DOCTYPE algo [<!ENTITY l0 "lol">'
           + "".join(f'<!ENTITY l{i} "' + f"&l{i - 1};" * 10 + '">' for i in range(1, 6)) + "]>")


def _xml_inputs(tmp_path, head: str) -> list[tuple[str, ...]]:
    """``(argv...)`` of every command reading XML, each given a file starting with ``head``."""
    ag = tmp_path / "ag.xml"
    ag.write_text(head + '<algo name="&l5;" coll="allgather"/>')
    trees = tmp_path / "trees.xml"
    trees.write_text(head + '<trees><tree root="&l5;" nchunks="1"/></trees>')
    host = tmp_path / "host.xml"
    host.write_text(head.replace("algo", "system") + (ROOT / "instances/data/hosts/dgx-h100.xml").read_text()
                    .split("?>", 1)[-1])
    return [("check", "hpn-1x2x4", str(ag)), ("check", "hpn-1x2x4", str(trees)),
            ("topo", "nccl", str(host), "-o", str(tmp_path / "t.json"))]


def test_xml_with_entities_is_refused_before_expat_expands_them(capsys, tmp_path):
    """An MSCCL, ForestColl or NCCL XML file with a document type declaration was parsed
    with its entities expanded (expat bounds the amplification to 100 times the input:
    a 10 MB file may expand to 1 GB) or, for a ForestColl file, refused with a misleading
    "not well-formed" message.  Now refused from its bytes, naming what to remove."""
    for argv in _xml_inputs(tmp_path, _LAUGHS):
        rc, err = _cli(capsys, *argv)
        assert rc == 2 and err.count("error:") == 1 and "<!DOCTYPE> declaration" in err and "remove it" in err, \
            (argv, err)
    assert not (tmp_path / "t.json").exists()


def test_the_xml_readers_still_read_their_files(capsys, tmp_path):
    """The bounds refuse none of the project's own XML: the NCCL sample host imports."""
    (host,) = [a for a in _xml_inputs(tmp_path, "") if a[0] == "topo"]
    rc, err = _cli(capsys, *host)
    assert rc == 0, err
    assert json.loads((tmp_path / "t.json").read_text())["format"] == "mccl-topology/1"


@pytest.mark.parametrize("unit", [b"<x/>", b'<x a="1"/>'])
def test_xml_too_costly_to_parse_is_refused_from_its_byte_counts(capsys, tmp_path, unit):
    """20 MB of ``<x/>`` took 530 MB and 8 s to be refused as "missing attribute"; the
    file limit (1 GiB) allowed 27 GB.  ``xml_parse_cost`` (bytes per element and per
    attribute, measured: the peak is at most 0.82 times it) refuses it before expat."""
    from mccl_opt.files import XML_PARSE_BYTES, xml_parse_cost

    n = XML_PARSE_BYTES // xml_parse_cost(unit) + 1000
    f = tmp_path / "big.xml"
    f.write_bytes(b'<algo name="x">' + unit * n + b"</algo>")
    rc, err = _cli(capsys, "check", "hpn-1x2x4", str(f))
    assert rc == 2 and err.count("error:") == 1 and "MiB of XML would take about" in err, err


# ------------------------------------------------------------------ a schedule's bottleneck
def _edit_bottleneck(d: dict, how: str) -> str:
    """Edit the ``bottleneck`` of schedule dict ``d`` as ``how`` says; the words of the refusal."""
    first = d["bottleneck"][0]
    edits = {
        "no such link": (lambda: d["bottleneck"].append({"src": "nope", "dst": first["dst"], "chunks": 1,
                                                         "base_slack": 0.0}), "no link of"),
        "negative chunks": (lambda: first.update(chunks=-5), "'chunks' must be >= 0"),
        "slack above 1": (lambda: first.update(base_slack=7.0), "'base_slack' .* in \\[0, 1\\]"),
        "negative slack": (lambda: first.update(base_slack=-3.0), "'base_slack' .* in \\[0, 1\\]"),
        "infinite slack": (lambda: first.update(base_slack=1e999), "finite number"),
        "a link twice": (lambda: d["bottleneck"].extend(d["bottleneck"] * 5000), "listed twice"),
        "a list as node": (lambda: first.update(src=[first["src"]]), "node ids \\(strings\\)"),
    }
    edit, words = edits[how]
    edit()
    return words


HOWS = ["no such link", "negative chunks", "slack above 1", "negative slack", "infinite slack", "a link twice",
        "a list as node"]


@pytest.fixture(scope="module")
def ag_schedule() -> dict:
    import mccl_opt as mo

    topo = mo.Topology.load(ROOT / "instances" / "data" / "hpn-1x2x4.json")
    return mo.solve_allgather(topo).to_dict()


@pytest.mark.parametrize("how", HOWS)
def test_an_edited_bottleneck_is_refused_by_export(capsys, tmp_path, ag_schedule, how):
    """A schedule's bottleneck cut (paper §3.2: what Algorithm 1 watches) was read as
    given: a link that does not exist, negative chunk counts, slacks of 7 or -3, a link
    listed 25000 times, a list as a node id (read as its text): ``export msccl`` wrote
    them out and the controller resumed them.  Now refused by every reader."""
    d = json.loads(json.dumps(ag_schedule))
    words = _edit_bottleneck(d, how)
    f = tmp_path / "s.json"
    f.write_text(json.dumps(d).replace("Infinity", "1e999"))
    for topo in ((), ("--topology", str(ROOT / "instances" / "data" / "hpn-1x2x4.json"))):
        out = tmp_path / "out.xml"
        rc, err = _cli(capsys, "export", "msccl", str(f), "-o", str(out), *topo)
        assert rc == 2 and err.count("error:") == 1, (how, err)
        import re
        assert re.search(words, err), (how, err)
        assert not out.exists()


@pytest.mark.parametrize("how", HOWS)
def test_an_edited_bottleneck_in_a_version_file_is_refused_on_resume(tmp_path, ag_schedule, how):
    """The same edits in a controller version file (its digest recomputed): the resume
    refuses the state with one message naming the field, leaving the files as they were."""
    import hashlib

    from mccl_runtime.state import load_state, versions_dir
    from tests.test_runtime_manager import TOPO

    state = _saved_state(tmp_path / "s")
    data = json.loads(state.read_text())
    ref = data["manager"]["collectives"][0]["schedule"]
    content = json.loads((versions_dir(state) / ref["file"]).read_text())
    words = _edit_bottleneck(content["schedule"], how)
    raw = json.dumps(content).replace("Infinity", "1e999").encode()
    ref["file"] = hashlib.sha256(raw).hexdigest() + ".json"
    (versions_dir(state) / ref["file"]).write_bytes(raw)
    state.write_text(json.dumps(data))
    before = state.read_bytes()
    with pytest.raises(MCCLError, match=words):
        load_state(state, TOPO)
    assert state.read_bytes() == before


def test_a_warm_schedule_with_an_edited_bottleneck_is_no_warm_start(capsys, tmp_path, ag_schedule):
    """``--warm`` with a bottleneck naming no link: reported, and the solve runs cold (as
    for any warm schedule invalid on the fabric); the other edits are refused outright."""
    for how in HOWS:
        d = json.loads(json.dumps(ag_schedule))
        _edit_bottleneck(d, how)
        f = tmp_path / "w.json"
        f.write_text(json.dumps(d).replace("Infinity", "1e999"))
        rc, err = _cli(capsys, "solve", "allgather", "hpn-1x2x4", "--warm", str(f), "-o", str(tmp_path / "o.json"))
        if how == "no such link":
            assert rc == 0 and "no link of" in err and "solving cold" in err, err
        else:
            assert rc == 2 and err.count("error:") == 1, (how, err)


# ------------------------------------------------------------------ number options
#: (argv before the option, option): every integer and float option, each with a value
#: the command takes (so only the spelling differs)
NUMBER_OPTIONS = [
    (("solve", "allgather", "hpn-1x2x2"), "--max-chunks", "10"),
    (("solve", "alltoall", "hpn-1x2x2"), "--max-steps", "4"),
    (("solve", "alltoall", "hpn-1x2x2"), "--time-limit", "5"),
    (("eval", "hpn-1x2x2", "-b", "1K", "-e", "4K"), "--stepfactor", "2"),
    (("eval", "hpn-1x2x2", "-b", "1K", "-e", "4K"), "--event-limit", "64"),
    (("bench", "--suite", "allgather", "--sizes", "1x2x4"), "--repeat", "1"),
    (("topo", "ring"), "--gbps", "100"),
    (("topo", "ring", "4"), "--latency-us", "1"),
    (("topo", "dgx"), "--gpus", "8"),
    (("topo", "irregular"), "--seed", "1"),
    (("topo", "nccl", "dgx-h100"), "--smp-gbps", "320"),
    (("topo", "nccl", "dgx-h100"), "--nic-latency-us", "0.5"),
    (("topo", "nvidia-smi", "dgx-h100"), "--pcie-gbps", "100"),
    (("loop",), "--noise", "0.01"),
    (("loop",), "--size-mib", "1"),
    (("loop",), "--seed", "1"),
    (("loop",), "--cold-gpus", "0"),
    (("controller", "serve", "--topology", "hpn-1x2x2"), "--workers", "0"),
    (("controller", "serve", "--topology", "hpn-1x2x2"), "--alpha", "0.5"),
    (("controller", "frontend", "--topology", "hpn-1x2x2", "--upstream", "ipc:///nonexistent/x"), "--id", "3"),
]


def _spellings(good: str) -> list[str]:
    """``good`` spelled as Python's ``int``/``float`` read it but a user would not type it."""
    arabic = good.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))
    fullwidth = good.translate(str.maketrans("0123456789", "０１２３４５６７８９"))
    return [arabic, fullwidth, "+" + good, f" {good} ", good[0] + "_" + good[1:] if len(good) > 1 else good + "_0",
            "nan", "inf", "1" + "0" * 400]


@pytest.mark.parametrize("before, option, good", NUMBER_OPTIONS, ids=[o for _, o, _ in NUMBER_OPTIONS])
def test_a_number_option_is_read_only_in_ascii_digits(capsys, before, option, good):
    """``int()`` and ``float()`` read other scripts' digits, ``+5``, ``1_000`` and spaces:
    ``--max-chunks ١٠`` solved with 10 chunks, ``--smp-gbps ١٢٠`` imported a fabric,
    ``--nic-latency-us 1e300`` was accepted.  Each spelling is now one argparse error
    naming the option, before any work."""
    from mccl_opt.cli import build_parser, main

    if before[:2] == ("topo", "ring"):
        before = ("topo", "ring", "4")
    args = build_parser().parse_args([*before, option, good])          # the plain spelling is read
    assert float(getattr(args, option.lstrip("-").replace("-", "_"))) == float(good)
    for text in _spellings(good):
        argv = [*before, option, text]
        with pytest.raises(SystemExit) as exc:
            main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and f"argument {option}" in err.replace("-f/--stepfactor", "--stepfactor") \
            and "ASCII digits" in err and "Traceback" not in err, (argv, err)


@pytest.mark.parametrize("argv", [
    ("topo", "nccl", "dgx-h100", "--smp-gbps", "1e300"),
    ("topo", "nccl", "dgx-h100", "--nic-latency-us", "1e300"),
    ("topo", "nvidia-smi", "dgx-h100", "--nic-gbps", "1e-320"),
    ("topo", "ring", "4", "--gbps", "1e13"),
    ("eval", "hpn-1x2x2", "--event-limit", str(10 ** 23)),
])
def test_bandwidths_latencies_and_limits_are_range_checked(capsys, tmp_path, argv):
    """Bandwidth and latency options took any positive number (``--nic-latency-us 1e300``
    made a fabric whose every path costs 1e300 µs); they now take what a topology file
    may hold, [1e-6, 1e12] Gbps and [0, 1e6] µs, and ``--event-limit`` at most 2^20."""
    rc, err = _cli(capsys, *argv, *(("-o", str(tmp_path / "t.json")) if argv[0] == "topo" else ()))
    assert rc == 2 and ("at most" in err or "in [" in err), err
    assert not (tmp_path / "t.json").exists()


# ------------------------------------------------------------------ a sync that fails after the rename
@pytest.mark.parametrize("first", [True, False])
def test_a_folder_sync_failing_after_the_rename_leaves_the_previous_state(tmp_path, monkeypatch, first):
    """The state file is renamed into place, then its folder synced; when that sync
    failed (``EIO``) the client was told the registration failed, but the renamed file
    stayed: after a restart the refused registration was back.  The previous file (or
    none, for the first write) is now put back before the error is reported."""
    import errno

    import mccl_runtime.state as state_module
    from mccl_runtime.client import ControllerClient
    from mccl_runtime.protocol import ProtocolError
    from tests.test_runtime_service import Server

    state = tmp_path / "state.json"
    real, broken = state_module._sync_dir, [False]

    def sync(folder, *fd):
        if broken[0] and folder == state.parent:
            raise OSError(errno.EIO, "Input/output error", str(folder))
        real(folder, *fd)

    monkeypatch.setattr(state_module, "_sync_dir", sync)
    with Server(state_path=state) as svc, ControllerClient(svc.endpoint, timeout_s=5.0) as cli:
        if not first:
            cli.register("w", "keep", "allgather")
        before = state.read_bytes() if state.exists() else None
        broken[0] = True
        with pytest.raises(ProtocolError) as err:
            cli.register("w", "lost", "allgather")
        assert err.value.reason == "not_persisted" and "Input/output error" in str(err.value)
        assert (state.read_bytes() if state.exists() else None) == before
        assert not list(tmp_path.glob(".state.json.*.tmp"))
        broken[0] = False
    with Server(state_path=state) as svc:
        assert sorted(c.name for c in svc.manager.collectives()) == ([] if first else ["keep"])


# ------------------------------------------------------------------ one client, every slot
def test_one_client_cannot_take_every_collective_slot():
    """One client could register all 256 collectives, leaving none for the others.  A
    signed client now has a quota (64 by default: 4 here), an AllReduce counting two,
    refused with a message saying so; another client still registers, and the total
    cap holds."""
    from mccl_runtime.client import ControllerClient
    from mccl_runtime.protocol import ProtocolError
    from tests.test_runtime_service import KEY, Server

    with Server(key=KEY, max_collectives=7, max_client_collectives=4) as svc, \
            ControllerClient(svc.endpoint, key=KEY, timeout_s=5.0) as greedy, \
            ControllerClient(svc.endpoint, key=KEY, timeout_s=5.0) as other:
        greedy.register("w", "ar", "allreduce")                  # two slots
        greedy.register("w", "a", "allgather")
        with pytest.raises(ProtocolError, match="at most 4 per client") as err:
            greedy.register("w", "ar2", "allreduce")              # 3 + 2 > 4: all or nothing
        assert err.value.reason == "rejected"
        greedy.register("w", "b", "allgather")                    # 4 of 4
        with pytest.raises(ProtocolError, match="per client"):
            greedy.register("w", "c", "alltoall")
        other.register("x", "a", "allgather")
        other.register("x", "ar", "allreduce")                    # 7 of 7
        with pytest.raises(ProtocolError, match="at most 7"):
            other.register("x", "b", "allgather")
        assert len(greedy.list()) == 7


# ------------------------------------------------------------------ samples dated ahead
@pytest.mark.parametrize("estimator", ["ewma", "level"])
def test_a_sample_dated_within_the_skew_tolerance_hides_no_later_sample(estimator):
    """A sample up to 0.5 s after the controller's now is accepted (clock skew), and was
    kept with its time: every sample of that channel until then was ``stale``.  A key
    holder sending a degraded reading dated 0.49 s ahead every 0.49 s hid every genuine
    recovery of the link.  The time is now taken as the controller's now, so the next
    genuine sample is applied; the last sample time never passes now."""
    from mccl_runtime.telemetry import MeasurementStore
    from tests.test_runtime_manager import TOPO

    now = [1000.0]
    store = MeasurementStore(TOPO, alpha=1.0, estimator=estimator, clock=lambda: now[0])
    link = TOPO.links[0]

    def sample(gbps: float, t: float) -> list[dict]:
        return [{"kind": "link", "src": link.src, "dst": link.dst, "gbps": gbps, "t": t}]

    assert store.ingest(sample(1.0, 1000.49), now[0]).to_dict()["accepted"] == 1
    for k in range(1, 5):
        now[0] = 1000.0 + 0.1 * k
        report = store.ingest(sample(link.capacity_gbps, now[0]), now[0]).to_dict()
        assert report == {"accepted": 1, "rejected": {}}, (k, report)
        assert store.last_sample_t()[0] <= now[0]
    assert store.ingest(sample(1.0, now[0] + 0.51), now[0]).to_dict()["rejected"] == {"future": 1}


# ------------------------------------------------------------------ an export without --topology
@pytest.mark.parametrize("exporter", [("export", "msccl"), ("export", "mscclpp"), ("export", "forestcoll")])
def test_an_export_checks_hops_on_the_fabric_the_schedule_names(capsys, tmp_path, exporter):
    """Without ``--topology`` an export checked a schedule on its own paths only, where
    every hop is a link: a path jumping between two GPUs that no link joins was
    exported.  A schedule naming a library or generated fabric with its GPUs is now
    checked on that fabric."""
    import mccl_opt as mo

    topo = mo.Topology.load(ROOT / "instances" / "data" / "hpn-1x2x4.json")
    coll = "allgather" if exporter[1] == "forestcoll" else "alltoall"
    sched = (mo.solve_allgather if coll == "allgather" else mo.solve_alltoall)(topo)
    d = sched.to_dict(compact=False)
    assert d["topology"] == "hpn-1x2x4"
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(d))
    if coll == "alltoall":
        chunk = next(c for c in d["chunks"] if c["src"] == "s0h0g0" and c["dst"] == "s0h1g0")
        chunk["path"] = ["s0h0g0", "s0h1g0"]                       # two GPUs of two hosts: no link
    else:
        edge = d["chunks"][0]["edges"][0]
        edge["path"] = [edge["path"][0], edge["path"][-1]]             # the first path as one hop
        assert not topo.has_link(*edge["path"])
    bad.write_text(json.dumps(d))
    out = tmp_path / "out"
    assert _cli(capsys, *exporter, str(good), "-o", str(out))[0] == 0
    out.unlink()
    rc, err = _cli(capsys, *exporter, str(bad), "-o", str(out))
    assert rc == 2 and err.count("error:") == 1 and "the fabric the schedule names" in err, err
    assert not out.exists()


# ------------------------------------------------------------------ what a state may hold
@pytest.mark.parametrize("edit, words", [
    ("601 collectives", "holds 601 collectives; a controller serves at most 256"),
    ("an escape sequence in a name", "name must be printable"),
    ("a 100 kB name", "name must be printable, .* at most 128 characters"),
    ("an NFD communicator", "comm must be printable, in Unicode NFC form"),
])
def test_a_state_holding_what_no_registration_could_is_refused(tmp_path, edit, words):
    """A state file was resumed with 601 collectives (the cap is 256, each one then
    synthesized) and with names no registration accepts (a terminal escape sequence
    printed in every log line, 100 kB names).  The resume now checks them as a
    registration does; the file is left as it was."""
    from mccl_runtime.state import load_state
    from tests.test_runtime_manager import TOPO

    state = _saved_state(tmp_path / "s")
    data = json.loads(state.read_text())
    first = data["manager"]["collectives"][0]
    empty = dict(first, version=0, schedule=None, last_decision_t=None)
    extra = {"601 collectives": [dict(empty, name=f"x{i}") for i in range(600)],
             "an escape sequence in a name": [dict(empty, name="a\n\x1b[31mred")],
             "a 100 kB name": [dict(empty, name="y" * 100_000)],
             "an NFD communicator": [dict(empty, comm="we\u0301")]}[edit]
    data["manager"]["collectives"] += extra
    state.write_text(json.dumps(data))
    before = state.read_bytes()
    with pytest.raises(MCCLError, match=words):
        load_state(state, TOPO)
    assert state.read_bytes() == before


@pytest.mark.parametrize("argv", [
    ("controller", "serve", "--topology", "hpn-1x2x2", "--bind", "tcp://127.0.0.1:0", "--key-file", ""),
    ("controller", "serve", "--topology", "hpn-1x2x2", "--bind", "tcp://127.0.0.1:0", "--state", " "),
    ("controller", "frontend", "--topology", "hpn-1x2x2", "--upstream", "ipc:///nonexistent/x", "--key-file", ""),
])
def test_an_empty_key_or_state_path_is_no_silent_default(capsys, argv):
    """``--key-file "$KEY"`` with ``KEY`` unset served without a key (every local process
    could then inject telemetry), ``--state ""`` without a state; both now refused."""
    from mccl_opt.cli import main

    with pytest.raises(SystemExit) as exc:
        main(list(argv))
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "an empty path" in err and "Traceback" not in err, err


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_a_key_file_of_another_user_is_refused(tmp_path):
    """A key file owned by another user (mode 600, read by a controller running as root)
    was taken: its owner can rewrite the key and forge any message."""
    from mccl_runtime.protocol import load_key

    key = tmp_path / "key"
    key.write_text("0123456789abcdef0123456789abcdef")
    key.chmod(0o600)
    assert len(load_key(key)) == 32
    os.chown(key, 12345, 12345)
    with pytest.raises(MCCLError, match="belongs to user id 12345"):
        load_key(key)


@pytest.mark.parametrize("argv", [
    ("topo", "hpn", "1x2x\u0662"), ("topo", "hpn", "1x2x+2"), ("topo", "hpn", "1x2x2_0"),
    ("solve", "allgather", "hpn-1x2x\u0662"), ("topo", "show", "hpn-1x\uff12x2"),
])
def test_a_fabric_shape_is_read_only_in_ascii_digits(capsys, argv):
    """``hpn-1x2x٢`` built and solved HPN 1x2x2 (``int()`` and ``\\d`` read other
    scripts' digits): a shape or generated name is now read in ASCII digits only."""
    rc, err = _cli(capsys, *argv)
    assert rc == 2 and err.count("error:") == 1 and ("ASCII digits" in err or "neither a topology file" in err), err


def test_a_te_ccl_file_is_read_only_in_ascii_digits():
    """TE-CCL flow lines were matched with ``\\d`` (any script's digits) and read with
    ``int()``: ``Chunk ٠ from ٠ ...`` was chunk 0 of GPU 0.  Now such a line is refused,
    quoted, with the form it should have."""
    import mccl_opt as mo
    from mccl_opt.errors import ScheduleError
    from mccl_opt.interop.teccl_flows import from_teccl_flows, to_teccl_flows

    topo = mo.Topology.load(ROOT / "instances" / "data" / "hpn-1x2x4.json")
    data = to_teccl_flows(mo.solve_allgather(topo), topo)
    assert from_teccl_flows(data, topo).collective == "allgather"
    data["7-Flows"][0] = data["7-Flows"][0].replace("Chunk 0 from 0", "Chunk \u0660 from \u0660", 1)
    assert "\u0660" in data["7-Flows"][0]
    with pytest.raises(ScheduleError, match="is not 'Chunk c from S traveled over"):
        from_teccl_flows(data, topo)
