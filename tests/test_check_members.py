"""``mccl check TOPOLOGY SCHEDULE --members ...``: a communicator's schedule, synthesized
on the sub-fabric its members induce (:func:`mccl_opt.subfabric.induced`), is checked
there against the whole fabric's file."""

from __future__ import annotations

import dataclasses
import json

import pytest

import mccl_opt as mo
from mccl_opt.cli import main
from mccl_opt.cli._inputs import load_topology
from mccl_opt.subfabric import induced

WHOLE = load_topology("hpn-1x2x8")
MEMBERS = list(WHOLE.gpus[:8]) + [WHOLE.gpus[8], WHOLE.gpus[9]]       # host 0 and two GPUs of host 1


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("members")
    sub = induced(WHOLE, MEMBERS).topology
    paths = {"sub": sub}
    for name, sched in (("a2a", mo.solve_alltoall(sub)), ("ag", mo.solve_allgather(sub))):
        paths[name] = folder / f"{name}.json"
        sched.save(paths[name])
    broken = mo.Schedule.load(paths["a2a"])
    paths["broken"] = folder / "broken.json"
    dataclasses.replace(broken, chunks=broken.chunks[1:]).save(paths["broken"])   # a block short
    for spec in ("hpn-1x2x8", "hpn-1x2x8-fail2"):
        paths[spec] = folder / f"{spec}.json"
        load_topology(spec).save(paths[spec])
    return paths


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["check", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("sched", ["a2a", "ag"])
def test_a_communicators_schedule_is_valid_on_its_sub_fabric_of_the_whole_fabric(capsys, files, sched):
    topo = str(files["hpn-1x2x8"])
    rc, _, err = _run(capsys, topo, str(files[sched]))                # the whole fabric: refused, with a hint
    assert rc == 2 and "10 GPUs" in err and "--members schedule" in err
    for members in (",".join(MEMBERS), "schedule", " , ".join(MEMBERS)):
        rc, out, err = _run(capsys, topo, str(files[sched]), "--members", members, "--json")
        info = json.loads(out)
        assert rc == 0 and info["valid"] and info["rate_as_stated"], err
        assert info["fabric"] == files["sub"].name and info["members"] == len(MEMBERS)
    rc, out, _ = _run(capsys, topo, str(files[sched]), "--members", "schedule")
    assert rc == 0 and "the sub-fabric its 10 members induce in hpn-1x2x8 (members from the schedule)" in out
    assert f"OK: {files[sched]} is a valid" in out


def test_the_rate_is_recomputed_on_the_sub_fabric_of_a_degraded_fabric(capsys, files):
    degraded = str(files["hpn-1x2x8-fail2"])
    rc, out, _ = _run(capsys, degraded, str(files["a2a"]), "--members", "schedule", "--json")
    info = json.loads(out)
    stated = mo.Schedule.load(files["a2a"]).rate_gbps
    assert rc == 0 and not info["rate_as_stated"] and info["rate_gbps"] < stated
    rc, _, err = _run(capsys, degraded, str(files["a2a"]), "--members", "schedule", "--strict")
    assert rc == 2 and "differs from rate_gbps" in err


@pytest.mark.parametrize("members, words", [
    (",".join(reversed(MEMBERS)), ["rank 0"]),                      # other rank order
    (",".join(MEMBERS[:-1]), ["has 9"]),
    (",".join(MEMBERS[:-1] + ["nope"]), ["'nope'", "not a node"]),
    (",".join(MEMBERS[:-1] + [MEMBERS[0]]), ["listed twice"]),
    (",".join(MEMBERS) + ",", ["empty entry"]),
    ("s0h0g0,s0h1g1", ["connected sub-fabric"]),
])
def test_members_that_do_not_fit_are_one_error_line(capsys, files, members, words):
    rc, out, err = _run(capsys, str(files["hpn-1x2x8"]), str(files["a2a"]), "--members", members)
    assert rc == 2 and out == "" and err.startswith("error:") and all(w in err for w in words), err


def test_a_schedule_that_is_invalid_on_the_sub_fabric_is_refused(capsys, files):
    rc, _, err = _run(capsys, str(files["hpn-1x2x8"]), str(files["broken"]), "--members", "schedule")
    assert rc == 2 and err.startswith("error:")
    # --members schedule needs a strict subset: a whole-fabric schedule is checked without it
    whole = files["a2a"].with_name("whole.json")
    mo.solve_alltoall(WHOLE).save(whole)
    assert _run(capsys, str(files["hpn-1x2x8"]), str(whole))[0] == 0
    rc, _, err = _run(capsys, str(files["hpn-1x2x8"]), str(whole), "--members", "schedule")
    assert rc == 2 and "not a strict subset" in err
